"""Upstream's text conventions: BLEU snapping, prompt and observation formatting."""

from __future__ import annotations

import math
import random

import pytest
from agentrl_env_alfworld.actions import (
    available_actions,
    first_prompt,
    sentence_bleu,
    snap_action,
    strip_arrival,
    upstream_action,
)

COMMANDS = ["examine desk 1", "go to desk 1", "go to desk 2", "inventory", "look", "take alarmclock 1 from desk 2"]


def test_bleu_hand_computed_three_of_four_words():
    # "go to desk" vs "go to desk 1": 1-, 2-, 3-gram precision 1; no 4-gram, so method 4 counts
    # 1 / (2^1 * 5 / ln 3) for it; brevity exp(1 - 4/3).
    expected = math.exp(-1 / 3) * (math.log(3) / 10) ** 0.25
    assert sentence_bleu(["go", "to", "desk", "1"], ["go", "to", "desk"]) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.41252, abs=1e-5)


def test_bleu_hand_computed_two_words():
    # "take apple" vs a 6-word reference: p1 = p2 = 1; 3- and 4-grams absent: ln2/10 and ln2/20.
    expected = math.exp(1 - 6 / 2) * (math.log(2) / 10 * math.log(2) / 20) ** 0.25
    score = sentence_bleu(["take", "apple", "1", "from", "countertop", "1"], ["take", "apple"])
    assert score == pytest.approx(expected, rel=1e-12)


def test_bleu_edge_cases():
    assert sentence_bleu(["look"], ["look"]) == 1.0
    assert sentence_bleu(["look"], ["inventory"]) == 0.0
    assert sentence_bleu(["go", "to", "desk", "1"], []) == 0.0
    # a longer hypothesis has no brevity penalty; its extra word lowers the unigram precision
    assert sentence_bleu(["go", "to", "desk", "1"], ["go", "to", "desk", "1", "now"]) < 1.0


def test_bleu_matches_nltk_reference_implementation():
    from nltk.translate.bleu_score import SmoothingFunction
    from nltk.translate.bleu_score import sentence_bleu as nltk_bleu

    smoothing = SmoothingFunction().method4
    vocab = ["go", "to", "take", "from", "put", "in/on", "cabinet", "1", "2", "3", "desklamp", "the", "a", "use", "open", "close", "apple"]
    rng = random.Random(7)
    for _ in range(3000):
        ref = [rng.choice(vocab) for _ in range(rng.randint(1, 8))]
        hyp = [rng.choice(vocab) for _ in range(rng.randint(0, 8))]
        assert sentence_bleu(ref, hyp) == pytest.approx(nltk_bleu([ref], hyp, smoothing_function=smoothing), abs=1e-12)


def test_snap_lowercases_and_keeps_the_first_line():
    assert snap_action("  Go To Desk 1\nthen take the clock", COMMANDS) == "go to desk 1"


def test_snap_to_closest_command_and_ties_take_the_first():
    assert snap_action("go to the desk 2", COMMANDS) == "go to desk 2"
    # "go to desk" scores the same against desk 1 and desk 2: the first listed wins (numpy argmax)
    assert snap_action("go to desk", COMMANDS) == "go to desk 1"
    assert snap_action("pick up alarmclock 1 from desk 2", COMMANDS) == "take alarmclock 1 from desk 2"


def test_no_overlap_is_sent_unchanged():
    assert snap_action("Xyzzy", COMMANDS) == "xyzzy"
    assert snap_action("dance", []) == "dance"
    # a threshold above every score keeps the text as it is
    assert snap_action("go to the desk 2", COMMANDS, threshold=0.99) == "go to the desk 2"


def test_prompt_and_observation_texts():
    intro = (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
        "you see a desk 1.\n\nYour task is to: examine the alarmclock with the desklamp."
    )
    assert first_prompt(intro, ["go to desk 1", "look"]) == (
        "Here is your task. You are in the middle of a room. Looking quickly around you, you see a desk 1.\n"
        "Your task is to: examine the alarmclock with the desklamp. AVAILABLE ACTIONS: go to desk 1\nlook\n"
    )
    assert available_actions([]) == " AVAILABLE ACTIONS: \n"
    assert strip_arrival("You arrive at loc 24. On the desk 2, you see a alarmclock 1.") == (
        "On the desk 2, you see a alarmclock 1."
    )
    # only AgentBench's "loc N" sentence is dropped, as upstream
    assert strip_arrival("You arrive at desk 2. On the desk 2, you see nothing.").startswith("You arrive at desk 2.")


def _call(name, arguments, call_id="c7"):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (_call("take_action", '{"action": "go to desk 1"}'), ("c7", "go to desk 1")),
        # upstream reads any tool and the first value, whatever its key
        (_call("go_to_drawer", '{"target": "drawer 1", "n": 3}'), ("c7", "drawer 1")),
        (_call("take_action", {"action": "look"}), ("c7", "look")),  # already parsed
        (_call("go to drawer 1", "{}"), None),  # no argument: upstream's arguments[0] raises
        (_call("take_action", '{"drawer": 3}'), None),  # not a string: .strip() raises
        (_call("take_action", '["look"]'), None),  # not an object
        (_call("take_action", "{look"), None),  # not JSON
        ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "take_action", "arguments": '{"action": "look"}'}}]}, None),  # no call id
        ({"role": "assistant", "content": "look"}, None),
    ],
)
def test_upstream_action_reads_turns_as_agentbench(message, expected):
    assert upstream_action(message) == expected
