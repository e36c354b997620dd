"""``agentrl model init``: a Qwen2 directory that the standard HF loaders read like a real checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import transformers

CALC_TOOLS = [
    {"type": "function", "function": {
        "name": "calculate", "description": "Apply one arithmetic operation.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "op": {"type": "string"},
                                                        "b": {"type": "integer"}}, "required": ["a", "op", "b"]}}},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


def test_loads_with_auto_classes_as_qwen2(tiny_model_dir, tokenizer):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tokenizer)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert sorted(gen["eos_token_id"]) == sorted(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))


def test_qwen_special_tokens_are_single_ids(tokenizer):
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == token
    # tool-call markers survive decoding with skip_special_tokens (they are not special in Qwen2.5)
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


def test_digits_are_single_tokens_and_text_round_trips(tokenizer):
    ids = tokenizer.encode("-1234 + 56", add_special_tokens=False)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    # Qwen2's pre-tokenizer: one token per digit; "Ġ" is byte-level's space
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["1", "2", "3", "4", "5", "6"]
    for text in ("Compute ((12 + 7) * 3) - 5", 'SELECT "Name" FROM t WHERE x = \'ü\';', "  two  spaces\n\ttab"):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_tools_and_tool_calls_like_qwen25(tokenizer):
    messages = [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "Compute 12 + 7"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "calculate", "arguments": '{"a": 12, "op": "+", "b": 7}'}},
            {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": {"a": 1, "op": "-", "b": 2}}},
        ]},
        {"role": "tool", "tool_call_id": "c0", "content": "Result: 19"},
        {"role": "tool", "tool_call_id": "c1", "content": "Result: -1"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=CALC_TOOLS, tokenize=False, add_generation_prompt=True)
    tool_json = json.dumps(CALC_TOOLS[0], ensure_ascii=False)
    assert text == (
        "<|im_start|>system\nBe exact.\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + tool_json +
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nCompute 12 + 7<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"a\": 12, \"op\": \"+\", \"b\": 7}}"
        "\n</tool_call>\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"a\": 1, \"op\": \"-\", \"b\": 2}}"
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nResult: 19\n</tool_response>\n<tool_response>\nResult: -1\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_cli_writes_a_deterministic_model(tmp_path, tiny_model_dir):
    # the fixture's corpus: no plugin data (an empty folder), whatever this venv has installed
    (tmp_path / "no_plugin_data").mkdir()
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "model", "init", "--out", str(tmp_path / "m"),
                          "--data-dir", str(tmp_path / "no_plugin_data")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        assert (tmp_path / "m" / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def _plugin_with_data(root, package, manifest, files):
    """An installed distribution whose package ships ``data/`` (as environment plugins do)."""
    from agentrl_core.testing import temporary_distribution

    pkg = root / package
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text("")
    for relpath, text in files.items():
        (pkg / "data" / relpath).write_text(text)
    if manifest is not None:
        (pkg / "data" / "tokenizer_corpus.json").write_text(json.dumps(manifest))
    return temporary_distribution(root, package.replace("_", "-"), entry_points={package: f"{package}.plugin"},
                                  modules={})


def test_tokenizer_corpus_comes_from_installed_plugins_data(tmp_path, monkeypatch):
    from agentrl_core.tinymodel.model import corpus_sources, training_corpus

    monkeypatch.delenv("AGENTRL_DATA_DIR", raising=False)
    with _plugin_with_data(tmp_path / "a", "zz_env_late", {"order": 90, "files": [["t.txt", 5]]},
                           {"t.txt": "LATE-TEXT\n", "ignored.txt": "NOT LISTED\n"}), \
         _plugin_with_data(tmp_path / "b", "zz_env_early", {"order": 1, "files": [["t.txt", 100], ["gone.txt", 9]]},
                           {"t.txt": "EARLY-TEXT\n"}), \
         _plugin_with_data(tmp_path / "c", "zz_env_plain", None, {"x.jsonl": "PLAIN-TEXT\n", "y.bin": "BINARY\n"}):
        sources = [s for s in corpus_sources() if s.parent.name.startswith("zz_env_")]
        assert [s.parent.name for s in sources] == ["zz_env_early", "zz_env_late", "zz_env_plain"]  # manifest order first
        texts = "".join(training_corpus())
    assert "EARLY-TEXT" in texts and "LATE-" in texts and "LATE-TEXT" not in texts  # 5 characters of t.txt
    assert "NOT LISTED" not in texts  # a manifest lists exactly what is read
    assert "PLAIN-TEXT" in texts and "BINARY" not in texts  # without one: the text files
    assert texts.index("EARLY-TEXT") < texts.index("LATE-") < texts.index("PLAIN-TEXT")


def test_tokenizer_corpus_data_dir_must_exist(tmp_path):
    from agentrl_core.tinymodel.model import corpus_sources

    with pytest.raises(FileNotFoundError, match="is not a folder"):
        corpus_sources(tmp_path / "missing")


@pytest.mark.parametrize(("size", "millions"), [("tiny", "1.3"), ("mini", "5.8"), ("small", "27")])
def test_sizes_have_the_documented_parameter_counts(size, millions):
    # core/docs/engine.md's table and `agentrl model init --help` give these numbers
    import torch

    from agentrl_core.tinymodel.model import MODEL_SIZES

    spec = dict(MODEL_SIZES[size])
    spec.pop("vocab")
    config = transformers.Qwen2Config(vocab_size=4120, tie_word_embeddings=True, **spec)
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    assert f"{sum(p.numel() for p in model.parameters()) / 1e6:.2g}" == millions


def test_cli_lists_every_size_and_refuses_others(tmp_path):
    from agentrl_core.tinymodel.model import MODEL_SIZES

    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "model", "init", "--out", str(tmp_path / "m"),
                          "--size", "huge"], capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice: 'huge'" in out.stderr
    assert all(f"'{size}'" in out.stderr for size in MODEL_SIZES)
    assert not (tmp_path / "m").exists()
