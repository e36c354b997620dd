"""Which environments ask a model to copy a name as other tokens than it read? (issue 31, item 1)

The DB learning benchmark found why the tiny model never names a dev table: with a
Qwen2-style byte-level tokenizer a word is other tokens after a space (``Ġre·ef``) than after
a backtick or a quote (``Ġ`·ree·f``), so copying a name into SQL means re-spelling its first
word, which a model built from scratch learns only for the words it was shown
(plugins/agentrl-env-db/README.md, "Where copying stops"). This benchmark measures, for each
environment's oracle demonstrations, how much of what the agent writes in its tool calls is
copied from what it read, and how much of that is the same tokens there and here:

* a **copied word** is a word (a letter, then 2 or more letters or digits) of a tool call's
  argument values, as the chat template renders the call, that occurs in an earlier user or
  tool message (the task and the observations; the system prompt and tool schemas are not
  counted);
* it is **token-identical** when the tokens covering it in the call are the tokens covering
  one of its earlier occurrences; otherwise the model must re-spell it (for a word after a
  quote or backtick: its first piece).

A high identical share means copying is attention to the same tokens, which even a small model
can learn; a low one means re-spelling, which the tiny model did not learn for unseen words.

    python benchmarks/copy_tokens.py            # 40 demonstrations per environment, ~1 min
    python benchmarks/copy_tokens.py --quick    # 3 per environment (the CI smoke test)

Writes ``benchmarks/results/copy_tokens.json`` (``copy_tokens_quick.json``). OS is left out:
its demonstrations need Docker, and its commands copy few names.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import RESULTS, ROOT, agentrl, machine, write_result

ENVIRONMENTS = {"db": "gen-train", "kg": "fb-train", "webshop": "bundled-train", "alfworld": "train"}
WORD = re.compile(r"[A-Za-z][A-Za-z0-9]{2,}")


def word_tokens(text: str, offsets: list[tuple[int, int]], ids: list[int], base: int = 0) -> list[tuple[str, tuple[int, ...], int]]:
    """Each word of ``text`` (at ``base`` in the tokenized string) with the ids of the tokens covering it and its position."""
    out = []
    for m in WORD.finditer(text):
        start, end = base + m.start(), base + m.end()
        covering = tuple(i for i, (a, b) in zip(ids, offsets, strict=True) if a < end and b > start)
        out.append((m.group(), covering, m.start()))
    return out


def value_spans(rendered: str, arguments: Any, at: int) -> list[tuple[int, int]]:
    """Where each string value of a tool call's arguments sits in the template's rendering of the
    reply, searched from ``at`` (the call's ``"arguments"``: the reply's text may say the same words)."""
    values: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            values.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(arguments)
    spans = []
    for value in values:
        encoded = json.dumps(value, ensure_ascii=False)[1:-1]  # as tojson writes it inside its quotes
        found = rendered.find(encoded, at)
        if found >= 0 and encoded:
            spans.append((found, found + len(encoded)))
            at = found + len(encoded)
    return spans


def analyse(tokenizer: Any, demos: list[dict[str, Any]]) -> dict[str, Any]:
    """The copied words of ``demos``' tool calls and how many are token-identical (module docstring)."""
    copied = identical = calls = calls_respelling = 0
    first_after_quote = 0  # re-spelled words right after a quote or backtick
    examples: list[dict[str, Any]] = []
    respelled: Counter[str] = Counter()
    for demo in demos:
        messages, tools = demo["messages"], demo.get("tools")
        seen: dict[str, set[tuple[int, ...]]] = {}
        for i, message in enumerate(messages):
            if message["role"] in ("user", "tool") and message.get("content"):
                enc = tokenizer(message["content"], return_offsets_mapping=True, add_special_tokens=False)
                for word, ids, _ in word_tokens(message["content"], enc["offset_mapping"], enc["input_ids"]):
                    seen.setdefault(word, set()).add(ids)
            if message["role"] != "assistant" or not message.get("tool_calls"):
                continue
            prefix = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
            enc = tokenizer(full, return_offsets_mapping=True, add_special_tokens=False)
            reply = full[len(prefix):]
            at = 0
            for call in message["tool_calls"]:
                calls += 1
                arguments = call["function"]["arguments"]
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                at = reply.find('"arguments"', reply.find(json.dumps(call["function"]["name"]), at))
                if at < 0:
                    raise SystemExit(f"the chat template does not render a tool call as expected: {reply!r}")
                needs_respelling = False
                for start, end in value_spans(reply, arguments, at):
                    base = len(prefix) + start
                    for word, ids, pos in word_tokens(reply[start:end], enc["offset_mapping"], enc["input_ids"], base):
                        if word not in seen:
                            continue
                        copied += 1
                        if ids in seen[word]:
                            identical += 1
                            continue
                        respelled[word] += 1
                        needs_respelling = True
                        before = reply[start + pos - 1] if start + pos > 0 else ""
                        first_after_quote += before in "`'\"[("
                        if len(examples) < 8:
                            context = reply[max(0, start + pos - 12): start + pos + len(word) + 4]
                            examples.append({"word": word, "in_call": context,
                                             "tokens_in_call": tokenizer.convert_ids_to_tokens(list(ids)),
                                             "tokens_read": [tokenizer.convert_ids_to_tokens(list(t))
                                                             for t in sorted(seen[word])][:2]})
                calls_respelling += needs_respelling
    return {"demonstrations": len(demos), "tool_calls": calls, "calls_needing_respelling": calls_respelling,
            "calls_needing_respelling_share": calls_respelling / calls if calls else None, "copied_words": copied,
            "token_identical": identical, "identical_share": identical / copied if copied else None,
            "respelled_after_quote_or_bracket": first_after_quote,
            "most_respelled": respelled.most_common(8), "examples": examples}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 demonstrations per environment (the CI smoke test)")
    parser.add_argument("--limit", type=int, default=None, help="demonstrations per environment (default 40)")
    parser.add_argument("--model", default=None, help="an `agentrl model init` model whose tokenizer to use (default: build one)")
    parser.add_argument("--work", default=None, help="work folder (default runs/copy_tokens[_quick])")
    parser.add_argument("--out", default=None, help="result JSON (default benchmarks/results/copy_tokens[_quick].json)")
    args = parser.parse_args()
    limit = args.limit if args.limit is not None else 3 if args.quick else 40
    if limit < 1:
        raise SystemExit(f"--limit {limit}: must be at least 1")
    work = Path(args.work) if args.work else ROOT / "runs" / ("copy_tokens_quick" if args.quick else "copy_tokens")
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / ("copy_tokens_quick.json" if args.quick else "copy_tokens.json")
    load_before, started = os.getloadavg(), time.monotonic()
    model = Path(args.model) if args.model else work / "model"
    if not args.model:
        agentrl(["model", "init", "--out", str(model), "--size", "tiny", "--seed", "0"], work / "logs" / "model_init.log")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    results = {}
    for env, split in ENVIRONMENTS.items():
        demos = work / f"demos_{env}.jsonl"
        agentrl(["demos", "--env", env, "--split", split, "--limit", str(limit), "--error-rate", "0", "--seed", "0",
                 "--out", str(demos)], work / "logs" / f"demos_{env}.log")
        records = [json.loads(line) for line in demos.read_text().splitlines() if line.strip()]
        results[env] = {"split": split, **analyse(tokenizer, records)}
        r = results[env]
        share = "n/a" if r["identical_share"] is None else f"{r['identical_share']:.0%}"
        calls = "n/a" if r["calls_needing_respelling_share"] is None else f"{r['calls_needing_respelling_share']:.0%}"
        print(f"{env}: {r['copied_words']} copied words in {r['tool_calls']} tool calls of {r['demonstrations']} "
              f"demonstrations; token-identical {share}; calls that must re-spell a word {calls}; re-spelled "
              f"after a quote or bracket {r['respelled_after_quote_or_bracket']}", flush=True)
    result = {"benchmark": "copy_tokens", "quick": args.quick, "limit": limit, "tokenizer": str(model),
              "environments": results, "machine": machine(load_before), "wall_s": round(time.monotonic() - started, 1)}
    print(f"\nwrote {write_result(result, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
