"""The DB learning benchmark's plumbing, end to end on a very short run (not its +15 point target).

``benchmarks/learning_db.py --quick`` runs the real command line on the DB environment (SQLite):
``agentrl demos --env db`` (mistakes and recovered slips) -> ``agentrl sft`` -> ``agentrl eval``
on dev and the held-out gen-train tables -> ``agentrl train`` on the training tables (Ray,
embedded control plane, hf engine, FSDP2 learner) -> ``agentrl eval``, and writes its JSON and
PNG. This test checks that every stage ran on the tasks it names and that the numbers recorded
are the ones the evaluations and the training run produced. It runs with ``--copy-rounds 1
--rename-rounds 2``: a copy stage on the question tasks under made-up table names, then two
rounds of demonstrations, each with the training tables under other made-up names, and RL
under yet other names; the demonstrations' tables renamed again to names of spelling words
(``--respell``); three spelling questions mixed into the main SFT (``--spell-mix``); RL
sampling at temperature 0.7 and greedy evaluations.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_quick_db_learning_benchmark_runs_every_stage(tmp_path, tiny_model_dir):
    out = tmp_path / "learning_db_quick.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_db.py"), "--quick", "--work", str(tmp_path / "work"),
         "--out", str(out), "--model", str(tiny_model_dir), "--rename-rounds", "2",
         "--copy-rounds", "1", "--spell-mix", "3", "--respell", "--temperature", "0.7", "--eval-temperature", "0"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    params = result["params"]

    sft = result["sft"]
    assert params["rename_rounds"] == 2 and params["copy_rounds"] == 1
    copy = sft["copy_stage"]  # the question tasks only, without mistakes
    assert 0 < copy["demos"] < params["demo_limit"] and copy["sft_steps"] >= 1
    copied = [json.loads(line) for line in (tmp_path / "work" / "copy_demos.jsonl").read_text().splitlines()]
    assert len(copied) == copy["demos"] and all(d["reward"] == 1.0 and d["metrics"]["sql_errors"] == 0 for d in copied)
    assert all(" table is " in d["messages"][1]["content"] for d in copied)
    assert all('"SELECT ' in d["messages"][2]["tool_calls"][0]["function"]["arguments"] for d in copied)
    assert sft["demos"] == 2 * params["demo_limit"] + 3 and 0 < sft["demo_success"] < 1  # a mix of right and wrong
    # --spell-mix 3: three spelling questions of their own seed after the DB demonstrations
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import learning_db

    demos = [json.loads(line) for line in (tmp_path / "work" / "demos.jsonl").read_text().splitlines()]
    assert sft["spell_mixed"] == 3 and demos[-3:] == learning_db.spelling_demos(3, learning_db.SPELL_MIX_SEED_BASE)
    demos = demos[:-3]
    assert all(d["task"] == "db" and d["split"] == "gen-train" for d in demos)
    # each round's demonstrations name other made-up tables, never the source tables' own names
    from agentrl_env_db.env import DBEnvironment

    own = {DBEnvironment().task("gen-train", i).tables[0].name for i in range(params["demo_limit"])}
    prompts = [[m["content"] for m in d["messages"] if m["role"] == "user"][0] for d in demos]
    named = [p.split("The name of this table is ", 1)[1].split(", and the headers")[0] for p in prompts]
    assert len(named) == 2 * params["demo_limit"] and not set(named) & own
    # --respell: every table named by words of the spelling vocabulary, and named so in its SQL
    vocabulary = {w.casefold() for w in learning_db.spelling_words()}
    assert all({w.casefold() for w in re.findall(r"[A-Z]?[a-z]+", n)} <= vocabulary for n in named)  # GolfWinners too
    for d, n in zip(demos, named, strict=True):
        for m in d["messages"]:
            for call in m.get("tool_calls") or []:
                if call["function"]["name"] == "execute_sql" and " FROM " in call["function"]["arguments"]:
                    assert f"`{n}`" in call["function"]["arguments"]
    first, second = named[: params["demo_limit"]], named[params["demo_limit"]:]
    assert sum(a == b for a, b in zip(first, second, strict=True)) <= 1
    assert sft["sft_steps"] >= 1 and sft["sft_final_nll"] > 0
    # copying after the main SFT, alone and after the DB prompt
    assert set(sft["probe_after_sft"]) == {"short", "db_prompt", "dev_names", "dev_names_short"}
    assert [p["questions"] for p in sft["probe_after_sft"].values()] == [params["spell_probe"]] * 2 + [params["dev_probe"]] * 2
    for ev in (result["before"], result["after"]):
        assert set(ev["tasks"]) == {"dev", "gen-heldout"}
        for task in ev["tasks"].values():
            assert len(task["per_repeat"]) == params["eval_repeats"]
            assert task["episodes"] == 3 * params["eval_repeats"] and task["infra_failures"] == 0
            assert 0.0 <= task["success"] <= 1.0 and task["spread"] >= 0.0
            assert task["completed"] == pytest.approx(task["statuses"].get("completed", 0) / task["episodes"])
        assert sum(k["episodes"] for k in ev["dev_by_type"].values()) == 3 * params["eval_repeats"]
    for name, change in result["change"].items():
        assert change == pytest.approx(result["after"]["tasks"][name]["success"] - result["before"]["tasks"][name]["success"])

    train = result["train"]
    assert train["steps"] == params["total_steps"] and not train["interrupted"]
    assert [p["step"] for p in train["curve"]] == list(range(1, train["steps"] + 1))
    assert all(0.0 <= p["reward"] <= 1.0 and p["trajectories"] > 0 for p in train["curve"])
    assert all(0.0 <= p["completed"] <= 1.0 and p["training_reward"] <= 1.0 for p in train["curve"])
    assert Path(train["model"]).name == "final_model" and train["model_step"] == train["steps"]
    config = yaml.safe_load((tmp_path / "work" / "grpo" / "config.yaml").read_text())
    trained = config["tasks"]
    assert trained[0]["env"] == "db" and trained[0]["split"] == "gen-train"
    assert max(trained[0]["indices"]) < params["heldout"][0]  # the held-out tables are never trained on
    assert config["environments"]["db"]["gen_train_rename_seed"] == 2  # RL under names no round used
    assert config["rollout"]["temperature"] == 0.7  # --temperature
    for name in ("eval_sft", "eval_grpo"):  # --eval-temperature 0: greedy evaluations
        assert yaml.safe_load((tmp_path / "work" / name / "config.yaml").read_text())["eval"]["temperature"] == 0.0
    assert result["passed"] is None  # --quick checks the plumbing, never claims the target


def test_spelling_stage_copies_names_made_of_no_db_word(tmp_path, tiny_model_dir):
    # --spell-only: the synthetic stage and its greedy probes, then the result (no DB demonstrations);
    # --spell-db-prompt: its questions after the DB system prompt and tools; --spell-vocab pieces:
    # names of made-up words of the tokenizer's pieces
    out = tmp_path / "spell.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_db.py"), "--quick", "--work", str(tmp_path / "work"),
         "--out", str(out), "--model", str(tiny_model_dir), "--spell-examples", "16", "--spell-db-prompt",
         "--spell-vocab", "pieces", "--spell-only"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    spell = json.loads(out.read_text())["sft"]["spell_stage"]
    assert spell["demos"] == 16 and spell["sft_steps"] == 2  # sft.batch_size 8
    probe = spell["probe"]
    for p in (probe, spell["probe_db_prompt"]):  # the same 8 questions, alone and after the DB prompt
        assert p["questions"] == 8 and p["table_copied"] in {k / 8 for k in range(9)}
        assert all(e["table"] and isinstance(e["generated"], str) for e in p["examples"])
    assert [e["table"] for e in spell["probe_db_prompt"]["examples"]] == [e["table"] for e in probe["examples"]]

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import learning_db
    from agentrl_env_db.env import TOOLS, DBEnvironment
    from agentrl_env_db.tasks import SYSTEM_PROMPT

    records = [json.loads(line) for line in (tmp_path / "work" / "spell_demos.jsonl").read_text().splitlines()]
    words = learning_db.piece_words(str(tiny_model_dir))
    assert records == learning_db.spelling_demos(16, 0, in_db_prompt=True, words=words)  # seed 0: reproducible
    assert all(r["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT} and r["tools"] == TOOLS for r in records)
    short = learning_db.spelling_demos(16, 0, words=words)  # the same questions without the DB prompt
    assert [r["messages"][1:] for r in records] == [r["messages"] for r in short] and short[0]["tools"] is None
    records = short
    env = DBEnvironment()
    for kind in ("dev_names", "dev_names_short"):  # dev's own first 8 tables (quick), after the DB prompt and alone
        dev_probe = spell[f"probe_{kind}"]
        assert dev_probe["questions"] == 8
        assert [e["table"] for e in dev_probe["examples"]] == [env.task("dev", i).tables[0].name
                                                               for i in list(env.index_sets()["dev"])[:6]]
    db_words = {w.casefold() for split, indices in env.index_sets().items() for i in indices
                for t in env.task(split, i).tables for text in (t.name, *t.columns)
                for w in learning_db.SPELL_WORD.findall(text)}
    def table(record):
        return record["messages"][0]["content"].split("The name of this table is ", 1)[1].split(", and the headers")[0]

    for record in records + learning_db.spelling_demos(50, learning_db.SPELL_PROBE_SEED):
        assert not {w.casefold() for w in learning_db.SPELL_WORD.findall(table(record))} & db_words  # no eval name
        query = json.loads(record["messages"][1]["tool_calls"][0]["function"]["arguments"])["query"]
        assert f"FROM `{table(record)}` WHERE `" in query
    probe_tables = {e["table"] for e in probe["examples"]}  # the probe asks about names not trained on
    assert probe_tables and not probe_tables & {table(r) for r in records}
    # the pieces' words: 20,000 made-up words, none a DB word, of the tokenizer's alphabetic pieces
    vocab = {w.casefold() for w in words}
    assert len(vocab) == learning_db.PIECE_WORDS and not vocab & db_words
    split_names = [table(r) for r in records if re.search("[ _]", table(r))]  # all but the CamelCase style
    assert len(split_names) >= 8 and all({w.casefold() for w in re.split("[ _]", n)} <= vocab for n in split_names)


def test_copy_tokens_counts_the_words_a_call_must_respell(tmp_path, tiny_model_dir):
    # hand-made demonstrations first: the counts are known
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import copy_tokens
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def demo(question, arguments, name="execute_sql", content=""):
        call = {"id": "c0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        return {"tools": None, "messages": [{"role": "user", "content": question},
                                            {"role": "assistant", "content": content, "tool_calls": [call]}]}

    # `reef_national_data`: reef follows a backtick in the call, a space in the question (Ġre·ef vs Ġ`·ree·f);
    # national and data follow an underscore in both; the reply's own text repeating the name is not counted
    sql = demo("The name of this table is reef_national_data.", {"query": "SELECT * FROM `reef_national_data`"},
               content="I read reef_national_data.")
    # cabinet follows a space in both (the quote precedes "walk", never read; words have 3 characters or more)
    act = demo("You see a cabinet 1. You can go there.", {"action": "walk go to cabinet 1"}, name="take_action")
    result = copy_tokens.analyse(tokenizer, [sql, act])
    assert (result["tool_calls"], result["copied_words"], result["token_identical"]) == (2, 4, 3)
    assert result["calls_needing_respelling"] == 1 and result["respelled_after_quote_or_bracket"] == 1
    assert result["most_respelled"] == [["reef", 1]] or result["most_respelled"] == [("reef", 1)]

    # then the real command on each environment's oracle demonstrations
    out = tmp_path / "copy.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "copy_tokens.py"), "--quick", "--model",
                           str(tiny_model_dir), "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    envs = json.loads(out.read_text())["environments"]
    assert set(envs) == {"db", "kg", "webshop", "alfworld"}
    for r in envs.values():
        assert r["demonstrations"] == 3 and r["tool_calls"] >= 3 and 0 < r["token_identical"] <= r["copied_words"]
    assert envs["db"]["calls_needing_respelling"] >= 1  # every SELECT names its table after a backtick
    assert envs["alfworld"]["calls_needing_respelling"] == 0  # actions copy names after a space, as read
