"""The engine wrapper against TextWorld's own PddlEnv, and the two wordings."""

from __future__ import annotations

import json
import random

import pytest
from agentrl_env_alfworld.data import GameLibrary
from agentrl_env_alfworld.game import Engine, GameFileError, goal_of, read_game


@pytest.fixture(scope="module")
def library(cache_dir) -> GameLibrary:
    return GameLibrary(cache_dir=cache_dir)


@pytest.fixture(scope="module")
def logic(library) -> tuple[str, str]:
    domain, grammar = library.logic_files()
    return domain.read_text(), grammar.read_text()


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()


def test_same_text_as_textworld_pddlenv(library, logic, engine):
    """Intro, admissible commands, feedback and win flag equal PddlEnv + AlfredDemangler."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    reference = AlfredDemangler(PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True)))
    rng = random.Random(3)
    for split, index in [("std", 0), ("std", 66), ("train", 5)]:
        data = read_game(library.game_file(library.ref(split, index)), logic)
        game = engine.load(data)
        reference.load(data)
        state = reference.reset()
        assert game.intro == state.feedback
        assert game.admissible == state["admissible_commands"]
        # random commands, an unknown one, then the walkthrough (so the win flag flips too)
        walkthrough = [w.replace("move ", "put ").replace(" to ", " in/on ") if w.startswith("move ") else w
                       for w in data["walkthrough"]]
        commands = [rng.choice(game.admissible) for _ in range(6)] + ["xyzzy"]
        for command in commands:
            assert game.step(command) == reference.step(command)[0].feedback
            assert game.admissible == reference.state["admissible_commands"]
        game = engine.load(data)
        state = reference.reset()
        for command in walkthrough:
            feedback = game.step(command)
            state, _, _ = reference.step(command)
            assert feedback == state.feedback
            assert game.won == state["won"]
        assert game.won


def test_agentbench_wording(library, logic, engine):
    game = engine.load(read_game(library.game_file(library.ref("std", 0)), logic))
    assert game.intro.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert game.intro.endswith("Your task is to: put a pencil in shelf.")
    go = next(c for c in game.admissible if c.startswith("go to "))
    assert game.step(go).startswith("You arrive at loc ")
    take = next(c for c in game.admissible if c.startswith("take "))
    game.step(take)
    assert any(c.startswith("put ") and " in/on " in c for c in game.admissible)
    assert not any(c.startswith("move ") for c in game.admissible)
    assert game.step("dance") == "Nothing happens."


def test_native_wording(library, engine):
    game = engine.load(read_game(library.game_file(library.ref("std", 0))))
    go = next(c for c in game.admissible if c.startswith("go to "))
    feedback = game.step(go)
    assert feedback.startswith("You arrive at ") and not feedback.startswith("You arrive at loc ")
    take = next(c for c in game.admissible if c.startswith("take "))
    game.step(take)
    assert any(c.startswith("move ") and " to " in c for c in game.admissible)


def test_goal_and_bad_files(tmp_path):
    assert goal_of('"task": [\n {\n "rhs": "Your task is to: heat some egg and put it in garbagecan."\n }\n]') == (
        "heat some egg and put it in garbagecan"
    )
    with pytest.raises(GameFileError, match="no 'Your task is to"):
        goal_of('"task": []')
    bad = tmp_path / "game.tw-pddl"
    bad.write_text("{not json")
    with pytest.raises(GameFileError, match="cannot read game file"):
        read_game(bad)
    bad.write_text(json.dumps({"grammar": "", "walkthrough": []}))
    with pytest.raises(GameFileError, match="lacks pddl_domain, pddl_problem"):
        read_game(bad)
