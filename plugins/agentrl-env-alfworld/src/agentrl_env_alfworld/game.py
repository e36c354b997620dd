"""One ALFWorld game on TextWorld's PDDL engine (runs inside a game worker process).

This is what ``textworld.envs.PddlEnv`` wrapped in alfworld's ``AlfredDemangler`` does, built
from the same engine classes (``GameLogic``, ``PddlState``, the context-sensitive grammar and
alfworld's ``Demangler``) with two differences that matter at scale:

* the PDDL problem is translated once per episode: ``PddlEnv`` translates it four times
  (``load`` and ``reset`` each build a state, and each state translates a second time for the
  replanner, which the environment never calls);
* the fast-downward library is loaded once per process (``PddlEnv`` copies and loads
  ``libdownward.so`` for every environment object and never unloads it).

The library keeps the current task in process-global state, so a process plays one game at a
time. ``tests/test_game.py`` checks the text against ``PddlEnv`` itself.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_GOAL_RE = re.compile(r'"task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*"Your task is to: (.*?)"')
NOTHING_HAPPENS = "Nothing happens."


class GameFileError(ValueError):
    """A game file that cannot be played (malformed JSON or grammar)."""


def goal_of(grammar: str) -> str:
    """The goal text a game's grammar states, without the final period."""
    match = _GOAL_RE.search(grammar)
    if match is None:
        raise GameFileError("the game's grammar has no 'Your task is to: ...' rule")
    return match.group(1).rstrip(".")


def read_game(path: str | Path, logic: tuple[str, str] | None = None) -> dict[str, Any]:
    """Read a ``game.tw-pddl`` file; with ``logic`` (domain, grammar) use that wording.

    AgentBench's grammar states the goal as ``UNKNOWN GOAL``, filled in per game as
    ALFWorld's ``add_task_to_grammar`` does, with the goal text of the game's own grammar.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise GameFileError(f"cannot read game file {path}: {exc}") from exc
    missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if k not in data]
    if missing:
        raise GameFileError(f"game file {path} lacks {', '.join(missing)}")
    if logic is not None:
        domain, grammar = logic
        data["grammar"] = grammar.replace("UNKNOWN GOAL", goal_of(data["grammar"]))
        data["pddl_domain"] = domain
    return data


_PARSED: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
_PARSED_MAX = 4096


def _memoized(module: str, parse: Any) -> Any:
    def cached(text: str, rule_name: str = "", **kwargs: Any) -> Any:
        if kwargs:  # tracing and other options: leave alone
            return parse(text, rule_name=rule_name, **kwargs)
        key = (module, text, rule_name)
        if key in _PARSED:
            _PARSED.move_to_end(key)
        else:
            _PARSED[key] = parse(text, rule_name=rule_name)
            if len(_PARSED) > _PARSED_MAX:
                _PARSED.popitem(last=False)
        return copy.deepcopy(_PARSED[key])

    return cached


@contextlib.contextmanager
def _engine_shortcuts() -> Iterator[None]:
    """Memoize pure work while our code drives the engine (undone on exit).

    * TextWorld parses every template and condition string with TatSu each time it derives
      text (every command of every step). A string always parses the same way, so parses are
      cached (bounded) and handed out as deep copies, because derivation mutates them.
    * ``PddlState`` translates each problem a second time (``optimize=True``) only for its
      replanner, which we never call; it gets the first translation instead.

    TextWorld's output is unchanged: tests compare it with ``PddlEnv`` run without these.
    """
    import fast_downward
    import textworld.logic
    from textworld.envs.pddl import textgen

    originals = (textgen._parse_and_convert, textworld.logic._parse_and_convert, fast_downward.pddl2sas)
    translated: dict[tuple[str, str], Any] = {}

    def translate(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        key = (domain, problem)
        if key not in translated:
            translated.clear()
            translated[key] = originals[2](domain, problem, verbose=verbose)
        return translated[key]

    textgen._parse_and_convert = _memoized("textgen", originals[0])
    textworld.logic._parse_and_convert = _memoized("logic", originals[1])
    fast_downward.pddl2sas = translate
    try:
        yield
    finally:
        textgen._parse_and_convert, textworld.logic._parse_and_convert, fast_downward.pddl2sas = originals


class Engine:
    """Owns the process's fast-downward library; plays one :class:`Game` at a time."""

    def __init__(self) -> None:
        import fast_downward

        self.lib = fast_downward.load_lib()

    def load(self, data: dict[str, Any]) -> Game:
        return Game(self.lib, data)


class Game:
    """A running game: ``intro``, ``admissible`` commands, ``step(command)``, ``won``."""

    def __init__(self, lib: Any, data: dict[str, Any]) -> None:
        from textworld.envs.pddl.logic import GameLogic, PddlState

        with _engine_shortcuts():
            try:
                self._logic = GameLogic(domain=data["pddl_domain"], grammar=data["grammar"])
            except Exception as exc:  # TatSu raises its own parse errors
                raise GameFileError(f"the game's grammar does not parse: {exc}") from exc
            self._state = PddlState(lib, data["pddl_problem"], self._logic)
            self._setup(data)

    def _setup(self, data: dict[str, Any]) -> None:
        from alfworld.agents.utils.misc import Demangler
        from textworld.generator.game import EntityInfo

        entities = {v.name: EntityInfo(v.name, v.type) for fact in self._state.facts for v in fact.arguments}
        demangler = Demangler(game_infos=entities, shuffle=False)
        for info in entities.values():
            info.definite, info.indefinite = "the", "a"
            info.name = demangler.demangle_alfred_name(info.id)
        self._entities = entities
        self._names = {k: info.name for k, info in entities.items()}
        self.walkthrough = list(data.get("walkthrough") or [])
        self.intro = self._derive("#intro#", {}, {})
        self.moves = 0
        self._refresh()

    @property
    def won(self) -> bool:
        return bool(self._state.check_goal())

    def _context(self, variables: dict, mapping: dict) -> dict[str, Any]:
        return {
            "state": self._state,
            "facts": list(self._state.facts),
            "variables": variables,
            "mapping": mapping,
            "entity_infos": self._entities,
        }

    def _derive(self, rule: str, variables: dict, mapping: dict) -> str:
        return self._logic.grammar.derive(rule, self._context(variables, mapping))

    def _variables(self, action: Any) -> dict:
        return {ph.name: self._entities[var.name] for ph, var in action.mapping.items()}

    def _refresh(self) -> None:
        self._actions = list(self._state.all_applicable_actions())
        self._commands = []
        for action in self._actions:
            action.command_template = self._derive(action.command_template, self._variables(action), action.mapping)
            self._commands.append(action.format_command(self._names))
        # Sorted and without duplicates, as TextWorld lists them.
        self.admissible = sorted(set(self._commands))

    def step(self, command: str) -> str:
        """Apply ``command`` (exactly as listed in ``admissible``); return the feedback."""
        with _engine_shortcuts():
            return self._step(command.strip())

    def _step(self, command: str) -> str:
        try:
            position = self._commands.index(command)
        except ValueError:
            feedback = NOTHING_HAPPENS
        else:
            action = self._actions[position]
            self._state.apply(action)
            feedback = self._derive(action.feedback_rule, self._variables(action), action.mapping)
            self.moves += 1
        self._refresh()
        return feedback
