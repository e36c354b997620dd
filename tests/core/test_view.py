"""``agentrl view``'s JSON API over a real run (tests/core/data/view/calc-run, made by its make_run.py):
the answers agree with the store and metrics.jsonl read directly, a run still writing is seen
as it writes, and the token rules of our other services hold."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl_core.view.server import COOKIE, build_app

FIXTURE = Path(__file__).parent / "data" / "view" / "calc-run"  # and the tokenizer of the model it trained
EVAL_FIXTURE = FIXTURE.parent / "calc-eval"  # `agentrl eval` of the same model


@pytest.fixture()
def runs(tmp_path):
    """A folder of runs: the fixture training run and evaluation, and a run that has only written metrics so far."""
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE, root / "calc-run")
    shutil.copytree(EVAL_FIXTURE, root / "calc-eval")
    (root / "starting").mkdir()
    (root / "starting" / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')  # mid-write
    (root / "not-a-run").mkdir()
    return root


def get(app, path, headers=None, **params):
    async def call():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get(path, params=params, headers=headers)

    return asyncio.run(call())


def ok(app, path, **params):
    response = get(app, path, **params)
    assert response.status_code == 200, response.text
    return response.json()


def sql(path, query, *args):
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()


def test_the_fixture_is_a_real_training_run():
    rows = sql(FIXTURE / "trajectories.sqlite", "SELECT kind, count(*), count(DISTINCT step) FROM trajectories GROUP BY kind")
    kinds = {k: (n, steps) for k, n, steps in rows}
    assert kinds["train"][1] == 4 and kinds["validation"][1] == 2, kinds
    assert sql(FIXTURE / "trajectories.sqlite", "SELECT count(*) FROM tokens WHERE ratios IS NOT NULL")[0][0] > 0


def test_runs_lists_every_run_under_the_folder(runs):
    data = ok(build_app(runs), "/api/runs")
    by_name = {r["name"]: r for r in data["runs"]}
    assert sorted(by_name) == ["calc-eval", "calc-run", "starting"]
    assert by_name["calc-run"]["store"] and by_name["calc-run"]["finished"] and by_name["calc-run"]["last_step"] == 4
    assert by_name["calc-run"]["kinds"] == dict(sql(runs / "calc-run" / "trajectories.sqlite",
                                                    "SELECT kind, count(*) FROM trajectories GROUP BY kind"))
    assert not by_name["starting"]["store"] and by_name["starting"]["running"]
    # a run folder given directly is the only run
    assert [r["name"] for r in ok(build_app(runs / "calc-run"), "/api/runs")["runs"]] == ["calc-run"]


def test_steps_and_tasks_agree_with_the_store(runs):
    app = build_app(runs)
    db = runs / "calc-run" / "trajectories.sqlite"
    steps = ok(app, "/api/steps", run="calc-run")
    expected = sql(db, "SELECT kind, step, count(*), avg(reward) FROM trajectories GROUP BY kind, step")
    assert sorted((s["kind"], s["step"], s["trajectories"], s["reward"]) for s in steps) == sorted(expected)
    tasks = ok(app, "/api/tasks", run="calc-run", kind="train")
    assert [(t["task"], t["trajectories"]) for t in tasks] == sql(
        db, "SELECT task, count(*) FROM trajectories WHERE kind = 'train' GROUP BY task")


def test_filters_by_status_reward_step_and_group(runs):
    app = build_app(runs)
    db = runs / "calc-run" / "trajectories.sqlite"
    everything = ok(app, "/api/trajectories", run="calc-run", limit=2000)
    assert everything["total"] == sql(db, "SELECT count(*) FROM trajectories")[0][0]
    for status, n in everything["statuses"].items():
        listed = ok(app, "/api/trajectories", run="calc-run", status=status, limit=2000)
        assert listed["total"] == n and {t["status"] for t in listed["trajectories"]} == {status}
    rewards = sorted(r for (r,) in sql(db, "SELECT reward FROM trajectories WHERE reward IS NOT NULL"))
    cut = rewards[len(rewards) // 2]
    high = ok(app, "/api/trajectories", run="calc-run", min_reward=cut, limit=2000)
    assert high["total"] == sum(r >= cut for r in rewards) and all(t["reward"] >= cut for t in high["trajectories"])
    low = ok(app, "/api/trajectories", run="calc-run", max_reward=cut, kind="train", step=2)
    assert low["total"] == sql(db, "SELECT count(*) FROM trajectories WHERE reward <= ? AND kind = 'train' AND step = 2",
                               cut)[0][0]
    group = everything["trajectories"][0]["group_id"]
    in_group = ok(app, "/api/trajectories", run="calc-run", group=group)
    assert {t["group_id"] for t in in_group["trajectories"]} == {group}
    assert in_group["total"] == sql(db, "SELECT count(*) FROM trajectories WHERE group_id = ?", group)[0][0]
    page = ok(app, "/api/trajectories", run="calc-run", limit=3, offset=3)
    assert [t["id"] for t in page["trajectories"]] == [t["id"] for t in everything["trajectories"][3:6]]


def test_groups_show_their_reward_spread(runs):
    app = build_app(runs)
    db = runs / "calc-run" / "trajectories.sqlite"
    groups = ok(app, "/api/groups", run="calc-run", kind="train", step=1)
    expected = sql(db, "SELECT group_id, count(*), min(reward), max(reward) FROM trajectories "
                       "WHERE kind = 'train' AND step = 1 GROUP BY group_id")
    assert sorted((g["group_id"], g["samples"], g["min_reward"], g["max_reward"]) for g in groups) == sorted(expected)


def test_a_trajectory_comes_with_messages_tool_calls_and_decoded_tokens(runs):
    import transformers

    app = build_app(runs, tokenizer=str(FIXTURE / "tokenizer"))
    db = runs / "calc-run" / "trajectories.sqlite"
    (traj_id,) = sql(db, "SELECT t.id FROM trajectories t JOIN tokens k ON k.trajectory_id = t.id WHERE kind = 'train' "
                         "AND json_array_length(tool_calls) > 0 AND k.ratios IS NOT NULL ORDER BY id LIMIT 1")[0]
    t = ok(app, "/api/trajectory", run="calc-run", id=traj_id)
    messages, tool_calls, ids = sql(db, "SELECT messages, tool_calls, input_ids FROM trajectories JOIN tokens ON "
                                        "trajectory_id = id WHERE id = ?", traj_id)[0]
    assert t["messages"] == json.loads(messages) and t["tool_calls"] == json.loads(tool_calls)
    tokens = t["tokens"]
    assert tokens["input_ids"] == json.loads(ids)
    n = len(tokens["input_ids"])
    assert all(len(tokens[k]) == n for k in ("loss_mask", "logprobs", "ratios", "learner_logprobs", "versions", "text"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(FIXTURE / "tokenizer")
    assert "".join(tokens["text"]) == tokenizer.decode(tokens["input_ids"])  # one piece per token, nothing lost
    # the ratio column is exp(learner - sampling) on the loss tokens, null elsewhere
    for m, lp, old, r in zip(tokens["loss_mask"], tokens["learner_logprobs"], tokens["logprobs"], tokens["ratios"],
                             strict=True):
        if m:
            assert r == pytest.approx(2.718281828459045 ** (lp - old), rel=1e-4, abs=1e-5)
        else:
            assert r is None
    # what the compare view offers: the same task index at every step it was rolled out
    same = sql(db, "SELECT id FROM trajectories WHERE task = ? AND CAST(task_index AS TEXT) = CAST(? AS TEXT)",
               t["task"], t["task_index"])
    assert sorted(o["id"] for o in t["same_task"]) == sorted(i for (i,) in same)
    assert len({o["step"] for o in t["same_task"]}) >= 2


def test_the_tokenizer_is_the_run_configs_model_else_the_tokens_are_ids(runs):
    import yaml

    config_path = runs / "calc-run" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    (traj_id,) = sql(runs / "calc-run" / "trajectories.sqlite", "SELECT min(id) FROM trajectories")[0]
    config["model"]["path"] = str(runs / "gone")
    config_path.write_text(yaml.safe_dump(config))
    t = ok(build_app(runs), "/api/trajectory", run="calc-run", id=traj_id)
    assert t["tokens"]["text"] is None and t["tokens"]["input_ids"]
    config["model"]["path"] = str(FIXTURE / "tokenizer")
    config_path.write_text(yaml.safe_dump(config))
    t = ok(build_app(runs), "/api/trajectory", run="calc-run", id=traj_id)
    assert len(t["tokens"]["text"]) == len(t["tokens"]["input_ids"])


def test_an_evaluation_folder_is_a_run_of_eval_episodes(runs):
    app = build_app(runs, tokenizer=str(FIXTURE / "tokenizer"))
    db = runs / "calc-eval" / "trajectories.sqlite"
    (n,) = sql(db, "SELECT count(*) FROM trajectories")[0]
    assert [(s["kind"], s["step"], s["trajectories"]) for s in ok(app, "/api/steps", run="calc-eval")] == [
        ("eval", None, n)]
    groups = ok(app, "/api/groups", run="calc-eval", kind="eval")
    assert sum(g["samples"] for g in groups) == n and {g["samples"] for g in groups} == {2}  # eval.repeats=2
    first = ok(app, "/api/trajectories", run="calc-eval")["trajectories"][0]
    t = ok(app, "/api/trajectory", run="calc-eval", id=first["id"])
    assert t["kind"] == "eval" and t["step"] is None and t["messages"]
    assert t["tokens"]["text"] and t["tokens"]["ratios"] is None  # an evaluation has no learner


def test_metrics_are_the_numeric_scalars_of_metrics_jsonl(runs):
    app = build_app(runs)
    lines = [json.loads(x) for x in (runs / "calc-run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    data = ok(app, "/api/metrics", run="calc-run")
    assert [r["step"] for r in data["rows"]] == sorted({line["step"] for line in lines})
    train = {line["step"]: line for line in lines if "reward" in line}
    assert [r["reward"] for r in data["rows"]] == [train[s]["reward"] for s in sorted(train)]
    # a validation round's line is merged into its step's row
    validation = [line for line in lines if any(k.startswith("val/") for k in line)]
    assert validation
    for line in validation:
        row = next(r for r in data["rows"] if r["step"] == line["step"])
        assert all(row[k] == v for k, v in line.items() if k.startswith("val/"))
    assert "reward" in data["keys"] and "step" not in data["keys"]
    # a line still being written is skipped, not an error
    assert ok(app, "/api/metrics", run="starting")["rows"] == [{"step": 1.0, "reward": 0.5}]


def test_errors_are_one_sentence_with_the_right_status(runs):
    app = build_app(runs)
    r = get(app, "/api/steps", run="nope")
    assert r.status_code == 404 and "calc-eval, calc-run, starting" in r.json()["detail"]
    r = get(app, "/api/steps", run="starting")
    assert r.status_code == 404 and "no trajectory store" in r.json()["detail"]
    r = get(app, "/api/trajectories", run="calc-run", min_reward="high")
    assert r.status_code == 400 and "min_reward" in r.json()["detail"]
    r = get(app, "/api/trajectory", run="calc-run", id=10**9)
    assert r.status_code == 404 and "pruned" in r.json()["detail"]
    assert get(app, "/api/trajectory", run="calc-run", id="x").status_code == 400


def test_the_page_and_its_assets_are_served_without_the_network(runs):
    app = build_app(runs)
    page = get(app, "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in ("/static/app.js", "/static/style.css"):
        assert f'"{asset}"' in page.text
        assert get(app, asset).status_code == 200
    combined = page.text + get(app, "/static/app.js").text + get(app, "/static/style.css").text
    assert "http://" not in combined.replace("http://www.w3.org/2000/svg", "") and "https://" not in combined


def test_a_run_being_written_is_seen_as_it_writes(runs):
    """A viewer opened before a step is committed shows it once the writer commits, without a restart."""
    db = runs / "calc-run" / "trajectories.sqlite"
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA journal_mode=WAL")
    step4 = writer.execute("SELECT * FROM trajectories WHERE kind = 'train' AND step = 4").fetchall()
    tokens4 = writer.execute("SELECT * FROM tokens WHERE trajectory_id IN "
                             "(SELECT id FROM trajectories WHERE kind = 'train' AND step = 4)").fetchall()
    assert step4 and tokens4
    with writer:
        writer.execute("DELETE FROM tokens WHERE trajectory_id IN (SELECT id FROM trajectories WHERE kind = 'train' AND step = 4)")
        writer.execute("DELETE FROM trajectories WHERE kind = 'train' AND step = 4")
    app = build_app(runs)
    assert 4 not in {s["step"] for s in ok(app, "/api/steps", run="calc-run") if s["kind"] == "train"}
    with writer:  # the step's commit, as the run's writer thread makes it; the connection stays open
        writer.executemany(f"INSERT INTO trajectories VALUES ({', '.join('?' * len(step4[0]))})", step4)
        writer.executemany(f"INSERT INTO tokens VALUES ({', '.join('?' * len(tokens4[0]))})", tokens4)
    assert (runs / "calc-run" / "trajectories.sqlite-wal").exists()
    steps = {s["step"]: s for s in ok(app, "/api/steps", run="calc-run") if s["kind"] == "train"}
    assert steps[4]["trajectories"] == len(step4)
    assert ok(app, "/api/trajectory", run="calc-run", id=step4[0][0])["tokens"] is not None
    writer.close()


def test_a_token_is_required_by_header_cookie_or_address(runs):
    app = build_app(runs, token="s3cret")
    assert get(app, "/api/runs").status_code == 401
    assert get(app, "/").status_code == 401
    assert get(app, "/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert get(app, "/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    redirect = get(app, "/", token="s3cret")
    assert redirect.status_code == 303 and redirect.headers["location"] == "/"
    assert f"{COOKIE}=s3cret" in redirect.headers["set-cookie"] and "HttpOnly" in redirect.headers["set-cookie"]
    assert get(app, "/api/runs", headers={"Cookie": f"{COOKIE}=s3cret"}).status_code == 200
    assert get(app, "/api/runs", headers={"Cookie": f"{COOKIE}=nope"}).status_code == 401
    assert get(app, "/", token="wrong").status_code == 401


def agentrl(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60, **kwargs)


def test_the_command_refuses_a_public_address_without_a_token(runs):
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "view", str(runs), "--host", "0.0.0.0"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert "refusing to serve the trajectory viewer on 0.0.0.0 without a token" in out.stderr
    out = agentrl("view", str(runs / "missing"))
    assert out.returncode == 1 and "is not a folder" in out.stderr


def test_the_command_serves_the_api(runs, tmp_path):
    port_file = tmp_path / "port.json"
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_core.cli.main", "view", str(runs), "--port", "0",
                             "--port-file", str(port_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "agentrl view did not start within 60 s"
            time.sleep(0.1)
        url = json.loads(port_file.read_text())["url"]
        assert url.startswith("http://127.0.0.1:")
        runs_seen = None
        while runs_seen is None:
            try:
                runs_seen = httpx.get(url + "api/runs", timeout=10).json()["runs"]
            except httpx.ConnectError:  # the port file is written just before serving starts
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert {r["name"] for r in runs_seen} == {"calc-eval", "calc-run", "starting"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
