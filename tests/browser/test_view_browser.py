"""``agentrl view`` as a user sees it: the real command, Debian's Chromium driven by Playwright.

Over the fixture training run (tests/core/data/view/calc-run, a real run: its make_run.py):
list and filter trajectories, open one turn by turn with its tool calls and coloured tokens,
compare two steps of a task, the training curves, a step committed while the page is open,
and the token's address-then-cookie login. Screenshots go to $AGENTRL_VIEW_SCREENSHOTS
(docs/images refreshes the README's), else to the test's temporary folder.
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "core" / "data" / "view" / "calc-run"
CHROMIUM = os.environ.get("AGENTRL_CHROMIUM", "/usr/bin/chromium")
READY = "body[data-ready='1']"


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium is not installed at {CHROMIUM}: run tests/browser/ci_setup.sh as root "
                    "(apt-get install chromium), or set AGENTRL_CHROMIUM to a Chromium binary")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.fixture()
def shots(tmp_path):
    out = Path(os.environ.get("AGENTRL_VIEW_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def serve(root: Path, tmp_path: Path, *extra: str, env: dict | None = None):
    port_file = tmp_path / "port.json"
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_core.cli.main", "view", str(root), "--port", "0",
                             "--port-file", str(port_file), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "agentrl view did not start within 60 s"
        time.sleep(0.1)
    url = json.loads(port_file.read_text())["url"]
    while True:  # the port file is written just before uvicorn accepts
        try:
            httpx.get(url + "static/style.css", timeout=5)
            break
        except httpx.ConnectError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    return proc, url


@pytest.fixture()
def viewer(tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE, root / "calc-run")
    proc, url = serve(root, tmp_path, "--tokenizer", str(FIXTURE / "tokenizer"))
    yield root, url
    proc.terminate()
    proc.wait(timeout=30)


def api(url, path, **params):
    r = httpx.get(url + "api/" + path, params=params, timeout=30)
    r.raise_for_status()
    return r.json()


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(url)
    page.wait_for_selector(READY)
    return page, errors


def navigate(page, hash_: str) -> None:
    page.evaluate("document.body.dataset.ready = ''")
    page.evaluate(f"location.hash = {hash_!r}")
    page.wait_for_selector(READY)


def test_browse_filter_open_compare_and_plot(browser, viewer, shots):
    root, url = viewer
    page, errors = open_page(browser, url)
    everything = api(url, "trajectories", run="calc-run", limit=100)
    # the run list, the steps, and the listing the API gives
    assert page.locator("#runs li.active .name").inner_text() == "calc-run"
    steps = api(url, "steps", run="calc-run")
    assert page.locator("#steps tr.clickable").count() == len(steps)
    tasks = api(url, "tasks", run="calc-run")
    assert page.locator("#tasks tr.clickable td:first-child").all_inner_texts() == [t["task"] for t in tasks]
    assert page.locator("#trajectory-list tr.clickable").count() == len(everything["trajectories"])
    assert page.locator("#count").inner_text().startswith(f"{everything['total']} trajectories")
    page.screenshot(path=str(shots / "view-trajectories.png"))

    # filter by status with the select, then by reward with the inputs
    status = max(everything["statuses"], key=everything["statuses"].get)
    page.evaluate("document.body.dataset.ready = ''")
    page.select_option("select[name=status]", status)
    page.wait_for_selector(READY)
    cells = page.locator("#trajectory-list tr.clickable td:nth-child(7)").all_inner_texts()
    assert cells and set(cells) == {status} and len(cells) == min(100, everything["statuses"][status])
    page.evaluate("document.body.dataset.ready = ''")
    page.fill("input[name=min_reward]", "1")
    page.locator("input[name=min_reward]").dispatch_event("change")
    page.wait_for_selector(READY)
    expected = api(url, "trajectories", run="calc-run", status=status, min_reward=1)["total"]
    assert page.locator("#trajectory-list tr.clickable").count() == min(100, expected)
    rewards = page.locator("#trajectory-list tr.clickable td:nth-child(8)").all_inner_texts()
    assert all(float(r) >= 1 for r in rewards)

    # one trajectory, turn by turn, with its tool calls; tokens coloured by mask, then ratio
    listed = api(url, "trajectories", run="calc-run", kind="train", limit=2000)["trajectories"]
    chosen = next(t for t in listed if t["num_tool_calls"] and t["reward"] and t["reward"] >= 1)
    full = api(url, "trajectory", run="calc-run", id=chosen["id"])
    navigate(page, f"#run=calc-run&tab=trajectory&id={chosen['id']}")
    names = page.locator("#conversation .tool-call .fn").all_inner_texts()
    assert [n.removeprefix("⚙ ").strip() for n in names] == [c["name"] for c in full["tool_calls"]]
    assert page.locator("#conversation .msg").count() == len(full["messages"])
    spans = page.locator("#tokens span.t")
    assert spans.count() == full["num_tokens"]
    assert "".join(spans.all_inner_texts()).replace("↵", "") == "".join(full["tokens"]["text"])
    first_trained = full["tokens"]["loss_mask"].index(1)
    token = page.locator(f"#tokens span[data-i='{first_trained}']")
    by_mask = token.evaluate("el => el.style.background")
    assert by_mask and page.locator("#tokens span.off").count() == full["num_tokens"] - sum(full["tokens"]["loss_mask"])
    page.evaluate("document.body.dataset.ready = ''")
    page.select_option("#coloring", "ratios")
    page.wait_for_selector(READY)
    token = page.locator(f"#tokens span[data-i='{first_trained}']")
    assert token.evaluate("el => el.style.background") != by_mask
    ratio = full["tokens"]["ratios"][first_trained]
    shown = dict(line.rsplit(" ", 1) for line in token.get_attribute("title").splitlines()[2:])
    assert float(shown["ratios"]) == pytest.approx(ratio, abs=5e-5)
    page.screenshot(path=str(shots / "view-trajectory.png"), full_page=True)

    # compare two steps of the same task
    page.evaluate("document.body.dataset.ready = ''")
    page.click("#compare-button")
    page.wait_for_selector(READY)
    sides = page.locator("#compare .compare-side")
    assert sides.count() == 2
    shown = [sides.nth(i).get_attribute("data-step") for i in range(2)]
    assert shown[0] != shown[1] and str(chosen["step"]) in shown
    assert page.locator("#compare .compare-side .msg").count() > 0
    page.screenshot(path=str(shots / "view-compare.png"), full_page=True)

    # the training curves, drawn inline from metrics.jsonl
    navigate(page, "#run=calc-run&tab=curves")
    metrics = api(url, "metrics", run="calc-run")
    chart = page.locator("#charts svg[data-key='reward']")
    points = [r for r in metrics["rows"] if "reward" in r]
    assert chart.locator("circle").count() == len(points)
    assert page.locator("#charts svg").count() >= 2
    page.screenshot(path=str(shots / "view-curves.png"), full_page=True)
    assert not errors, errors
    for name in ("trajectories", "trajectory", "compare", "curves"):
        assert (shots / f"view-{name}.png").stat().st_size > 20_000  # a drawn page, not a blank one


def test_a_step_committed_while_the_page_is_open_appears(browser, viewer):
    root, url = viewer
    db = root / "calc-run" / "trajectories.sqlite"
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA journal_mode=WAL")
    last = writer.execute("SELECT max(step) FROM trajectories WHERE kind = 'train'").fetchone()[0]
    rows = writer.execute("SELECT * FROM trajectories WHERE kind = 'train' AND step = ?", (last,)).fetchall()
    with writer:
        writer.execute("DELETE FROM tokens WHERE trajectory_id IN "
                       "(SELECT id FROM trajectories WHERE kind = 'train' AND step = ?)", (last,))
        writer.execute("DELETE FROM trajectories WHERE kind = 'train' AND step = ?", (last,))
    page, errors = open_page(browser, url)
    step_cells = "#steps tr.clickable td:nth-child(2)"
    assert str(last) not in page.locator("#steps tr.clickable").filter(has_text="train").locator("td:nth-child(2)").all_inner_texts()
    with writer:  # the run commits its next step; the page refreshes every 5 s
        writer.executemany(f"INSERT INTO trajectories VALUES ({', '.join('?' * len(rows[0]))})", rows)
    page.wait_for_function(
        "([sel, step]) => [...document.querySelectorAll(sel)].some((td) => td.textContent === step && "
        "td.previousSibling.textContent === 'train')", arg=[step_cells, str(last)], timeout=20_000)
    writer.close()
    assert not errors, errors


def test_with_a_token_the_address_logs_in_once(browser, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE, root / "calc-run")
    proc, url = serve(root, tmp_path, env={"AGENTRL_TOKEN": "view-test-token"})
    try:
        page = browser.new_page()
        response = page.goto(url)
        assert response.status == 401
        page.goto(url + "?token=view-test-token")
        page.wait_for_selector(READY)
        assert "token" not in page.url  # dropped from the address bar, kept in an HttpOnly cookie
        assert page.locator("#runs li.active .name").inner_text() == "calc-run"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
