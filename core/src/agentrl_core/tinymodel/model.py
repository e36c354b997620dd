"""``agentrl model init``: a small Qwen2 model with its own tokenizer, built locally.

There is no model hub here, so tests, the quickstart and the learning benchmark start from
a model made on the spot:

* a byte-level BPE tokenizer trained with ``tokenizers`` on the task texts that installed
  environment plugins ship in their ``data/`` folders (DB, KG, OS, WebShop, ALFWorld when
  those plugins are installed; :func:`corpus_sources`) plus synthetic tool-call
  conversations, using Qwen2's pre-tokenizer (NFC, the Qwen2 split regex, byte level), so
  every digit is its own token and JSON punctuation merges like Qwen's;
* Qwen2.5's special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``,
  ``<tool_call>``, ``</tool_call>``, ...), plus ``<tool_response>``/``</tool_response>``
  as ordinary added tokens (as Qwen3 has them);
* the Qwen2.5-style chat template of :mod:`agentrl_core.tinymodel.chat_template`;
* a randomly initialised ``Qwen2ForCausalLM`` (tied embeddings, fp32 safetensors).

The result is a normal Hugging Face directory: ``AutoTokenizer.from_pretrained(path)`` and
``AutoModelForCausalLM.from_pretrained(path)`` load it exactly as they load a real
Qwen2.5-*-Instruct checkpoint, which is the only other thing the engine ever loads.
"""

from __future__ import annotations

import json
import logging
import os
import random
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl_core.tinymodel.chat_template import QWEN25_CHAT_TEMPLATE

log = logging.getLogger(__name__)

__all__ = ["MODEL_SIZES", "SPECIAL_TOKENS", "init_model", "training_corpus", "corpus_sources"]

# Qwen2.5's added tokens in Qwen's order; ``special`` as in Qwen2.5's tokenizer.json
# (tool-call and FIM markers are not special there, so decoding keeps them).
SPECIAL_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
]

# Qwen2's pre-tokenizer: digits split one by one (\p{N}), letters in words, punctuation runs.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# size -> (BPE vocabulary before added tokens, Qwen2Config fields)
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab=4096,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    # between the two (as BERT's miniatures name them: tiny < mini < small), about 4.5x tiny's
    # compute: for tasks where tiny lacks the capacity and small's SFT takes hours on a CPU
    "mini": dict(
        vocab=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "small": dict(
        vocab=4096,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
}

# A plugin chooses what of its data the tiny model's tokenizer learns from with a file
# ``data/tokenizer_corpus.json``: {"order": 10, "files": [[relpath, max_chars], ...],
# "archives": [[relpath.tar.xz, members], ...]}. Without one, its text files are sampled.
CORPUS_MANIFEST = "tokenizer_corpus.json"
CORPUS_SUFFIXES = (".json", ".jsonl", ".txt", ".tsv")
CORPUS_CHARS_PER_FILE = 150_000  # plugins without a manifest
CORPUS_CHARS_PER_SOURCE = 1_200_000


def corpus_sources(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Folders whose texts the tokenizer is trained on, in a fixed order.

    ``data_dir`` if given, else ``$AGENTRL_DATA_DIR``, else the ``data/`` folder of every
    installed agentrl plugin package (found from the ``agentrl`` entry points without
    importing them), ordered by their manifest's ``order`` and then by package name. Nothing
    outside installed packages is read.
    """
    if data_dir is not None:
        path = Path(data_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"--data-dir {path} is not a folder")
        return [path]
    env_dir = os.environ.get("AGENTRL_DATA_DIR")
    if env_dir and Path(env_dir).is_dir():
        return [Path(env_dir)]
    from importlib.metadata import entry_points

    from agentrl_core.datafiles import package_data_dir

    packages = sorted({ep.value.split(":")[0].split(".")[0] for ep in entry_points(group="agentrl")})
    found = []
    for package in packages:
        try:
            folder = package_data_dir(package)
        except (ImportError, ValueError):  # a broken distribution: its data is not used
            continue
        if folder is not None and folder.is_dir():
            found.append(folder)
    return sorted(found, key=lambda folder: (_manifest(folder).get("order", 1000), str(folder)))


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / CORPUS_MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _read_text(path: Path, limit: int) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        yield from f.read(limit).splitlines(keepends=True)


def _archive_texts(path: Path, members: int) -> Iterator[str]:
    with tarfile.open(path, "r:xz") as tf:
        for member in [m for m in tf.getmembers() if m.isfile()][:members]:
            handle = tf.extractfile(member)
            if handle is not None:
                yield from handle.read().decode("utf-8", "replace").splitlines(keepends=True)


def _source_files(folder: Path, manifest: dict[str, Any]) -> Iterator[str]:
    """The text files of one source (its manifest's list, or a sample of every text file)."""
    if manifest:
        for relpath, limit in manifest.get("files", []):
            if (folder / relpath).is_file():
                yield from _read_text(folder / relpath, limit)
            else:
                log.warning("tokenizer corpus: %s is missing, skipped", folder / relpath)
        return
    budget = CORPUS_CHARS_PER_SOURCE
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in CORPUS_SUFFIXES):
        if budget <= 0:
            return
        lines = list(_read_text(path, min(budget, CORPUS_CHARS_PER_FILE)))
        budget -= sum(len(line) for line in lines)
        yield from lines


def _source_archives(folder: Path, manifest: dict[str, Any]) -> Iterator[str]:
    for relpath, members in manifest.get("archives", []):
        if (folder / relpath).is_file():
            yield from _archive_texts(folder / relpath, members)


_TOOL_NAMES = [
    "calculate", "submit_answer", "execute_sql", "commit_final_answer", "bash_action", "finish_action",
    "answer_action", "get_relations", "get_neighbors", "intersection", "get_attributes", "argmax", "argmin",
    "count", "search_action", "click_action", "take_action",
]


def _synthetic_conversations(n: int, seed: int) -> Iterator[str]:
    """Chat-template renderings of tool-using conversations (arithmetic like ``calc``)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    template = env.from_string(QWEN25_CHAT_TEMPLATE)
    rng = random.Random(seed)
    tools = [
        {"type": "function", "function": {
            "name": name, "description": f"Call {name.replace('_', ' ')} with its arguments.",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "description": "left operand"},
                "op": {"type": "string", "enum": ["+", "-", "*"], "description": "operator"},
                "b": {"type": "integer", "description": "right operand"},
                "answer": {"type": "integer", "description": "the value of the whole expression"},
            }, "required": ["a", "op", "b"], "additionalProperties": False},
        }}
        for name in _TOOL_NAMES
    ]
    for _ in range(n):
        value = rng.randint(1, 20)
        ops = [(rng.choice("+-*"), rng.randint(1, 20)) for _ in range(rng.randint(1, 4))]
        expr = str(value)
        for i, (op, b) in enumerate(ops):
            expr = f"({expr} {op} {b})" if i < len(ops) - 1 else f"{expr} {op} {b}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful calculator agent. Evaluate the expression one "
             "operation at a time, innermost parentheses first."},
            {"role": "user", "content": f"Compute {expr}"},
        ]
        for i, (op, b) in enumerate(ops):
            result = value + b if op == "+" else value - b if op == "-" else value * b
            call = {"id": f"call_{i}", "type": "function",
                    "function": {"name": "calculate", "arguments": json.dumps({"a": value, "op": op, "b": b})}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"Result: {result}"})
            value = result
        call = {"id": "call_end", "type": "function",
                "function": {"name": "submit_answer", "arguments": json.dumps({"answer": value})}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": "call_end", "content": rng.choice(["Correct.", "Incorrect."])})
        chosen = rng.sample(tools, k=rng.randint(1, 3))
        yield template.render(messages=messages, tools=chosen, add_generation_prompt=False)


def training_corpus(data_dir: str | os.PathLike | None = None, seed: int = 0) -> list[str]:
    """The texts the tokenizer is trained on: plugins' data (see :func:`corpus_sources`) and
    synthetic tool-call conversations."""
    sources = corpus_sources(data_dir)
    texts: list[str] = []
    if not sources:
        log.warning("no environment plugin with data is installed (and no --data-dir); "
                    "training the tokenizer on synthetic text only")
    manifests = [_manifest(folder) for folder in sources]
    for folder, manifest in zip(sources, manifests, strict=True):  # every source's files first,
        texts.extend(_source_files(folder, manifest))
    for folder, manifest in zip(sources, manifests, strict=True):  # then the archives (game files)
        texts.extend(_source_archives(folder, manifest))
    texts.extend(_synthetic_conversations(2000, seed))
    return texts


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A Qwen2-pipeline byte-level BPE trained on ``texts``, with Qwen2.5's added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                                     fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, s in SPECIAL_TOKENS if s])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, s in SPECIAL_TOKENS if not s])
    return tokenizer


def init_model(out_dir: str | os.PathLike, size: str = "tiny", seed: int = 0, *, data_dir: str | os.PathLike | None = None) -> Path:
    """Build a tokenizer and a randomly initialised Qwen2 model of ``size`` into ``out_dir``.

    Deterministic for a given ``seed`` and corpus. Returns the directory.
    """
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(MODEL_SIZES)}")
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = dict(MODEL_SIZES[size])
    bpe_vocab = spec.pop("vocab")
    raw = train_tokenizer(training_corpus(data_dir, seed), bpe_vocab)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
        split_special_tokens=False,
    )
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    _set_tokenizer_class(out / "tokenizer_config.json")

    vocab_size = raw.get_vocab_size()  # no padding rows: every id the model can sample decodes to text
    endoftext, im_end = raw.token_to_id("<|endoftext|>"), raw.token_to_id("<|im_end|>")
    config = Qwen2Config(
        vocab_size=vocab_size,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        use_sliding_window=False,
        attention_dropout=0.0,
        hidden_act="silu",
        initializer_range=0.02,
        **spec,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext,
        do_sample=True, temperature=0.8, top_p=1.0,
    )
    model.save_pretrained(out, safe_serialization=True)
    (out / "agentrl_model.json").write_text(json.dumps({"size": size, "seed": seed, "made_by": "agentrl model init"}))
    log.info("wrote a %s Qwen2 model (%d parameters, vocabulary %d) to %s", size,
             sum(p.numel() for p in model.parameters()), vocab_size, out)
    return out


def _set_tokenizer_class(path: Path) -> None:
    """Name Qwen2's tokenizer class, as real Qwen2.5 checkpoints do (same pipeline, same loading path)."""
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
