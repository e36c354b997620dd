"""The run's tokenizer: ``model.path`` with ``model.chat_template`` and ``model.trust_remote_code`` applied.

Training, SFT and evaluation encode conversations with this tokenizer, so a chat template
given in the config replaces the checkpoint's everywhere tokens are made on our side (the
SGLang driver passes it to the server too; the hf engine's OpenAI route keeps the
checkpoint's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl_core.errors import ConfigError

__all__ = ["load_tokenizer", "read_chat_template"]


def read_chat_template(value: str) -> str:
    """``model.chat_template``: a path to a Jinja file, or the template text itself."""
    if "{%" in value or "{{" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    raise ConfigError(f"model.chat_template {value!r} is neither a file nor a Jinja template; give the path of a "
                      ".jinja file or the template text")


def load_tokenizer(path: str, model: Any = None) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` with the ``model`` config section's template and trust flag."""
    from transformers import AutoTokenizer

    trust = bool(getattr(model, "trust_remote_code", False))
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    template = getattr(model, "chat_template", None)
    if template:
        tokenizer.chat_template = read_chat_template(template)
    return tokenizer
