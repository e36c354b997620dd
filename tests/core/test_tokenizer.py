"""model.chat_template and model.trust_remote_code reach the tokenizer the run encodes with."""

from __future__ import annotations

import pytest

from agentrl_core.config import ModelConfig
from agentrl_core.errors import ConfigError
from agentrl_core.rollout.tokenizer import load_tokenizer

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def test_a_configured_chat_template_replaces_the_checkpoints(tiny_model_dir, tmp_path):
    plain = load_tokenizer(str(tiny_model_dir), ModelConfig(path=str(tiny_model_dir)))
    assert "<|im_start|>" in plain.chat_template  # the checkpoint's own
    inline = load_tokenizer(str(tiny_model_dir), ModelConfig(chat_template=TEMPLATE))
    messages = [{"role": "user", "content": "hi"}]
    assert inline.apply_chat_template(messages, tokenize=False) == "<user>hi"
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    from_file = load_tokenizer(str(tiny_model_dir), ModelConfig(chat_template=str(tmp_path / "t.jinja")))
    assert from_file.chat_template == TEMPLATE
    with pytest.raises(ConfigError, match="model.chat_template 'nope.jinja' is neither a file nor a Jinja template"):
        load_tokenizer(str(tiny_model_dir), ModelConfig(chat_template="nope.jinja"))


def test_trust_remote_code_is_passed_on(tiny_model_dir, monkeypatch):
    import transformers

    seen = {}
    real = transformers.AutoTokenizer.from_pretrained

    def recording(path, **kwargs):
        seen.update(kwargs)
        return real(path)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", recording)
    load_tokenizer(str(tiny_model_dir), ModelConfig(trust_remote_code=True))
    assert seen == {"trust_remote_code": True}
