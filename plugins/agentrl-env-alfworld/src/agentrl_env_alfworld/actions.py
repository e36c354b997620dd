"""AgentBench-FC's text conventions for ALFWorld: prompt, action snapping, observations.

Upstream lower-cases the agent's action, keeps its first line, and when it is not an
admissible command replaces it by the admissible command with the highest sentence BLEU
(NLTK's ``sentence_bleu`` with Chen & Cherry smoothing method 4) if that score exceeds
0.01. :func:`sentence_bleu` re-implements exactly that score (tests compare it with NLTK).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

SYSTEM_PROMPT = (
    "Interact with a household to solve a task. Imagine you are an intelligent agent in a household environment "
    "and your target is to perform actions to complete) the task goal. At the beginning of your interactions, you "
    "will be given the detailed description of the current environment and your goal to accomplish. A tool will be "
    "provided for you to use to submit the action you want to take. This tool is the only tool you should and must "
    "take in order to operate any action in the environment. The way you perform action is to place the action "
    "chosen by you in the arguments field of your tool call. For each of your turn, you will be given a list of "
    "actions which you can choose one to perform in this turn. The action you would like to take should be offered "
    'in this format: "the name of your next action", and you should fill it in the argument field of your tool '
    "call. Note that you should always call a tool to operate an action from the given choices. After your each "
    "turn, the environment will give you immediate feedback based on which you plan your next few steps. if the "
    'environment output "Nothing happened", that means the previous action is invalid and you should try more '
    "options.\n Reminder:\n1. the action must be chosen from the given available actions. Any actions except "
    "provided available actions will be regarded as illegal.\n2. Always call the tool to hand in your next action "
    "and think when necessary."
)

NO_TOOL_CALL = "No executable tool calls found. Please call a tool instead"
NO_VALID_TOOL_CALL = "No valid tool calls found. Please call a tool instead."

_BLEU_K = 5  # NLTK SmoothingFunction's default k
_BLEU_ORDER = 4


def available_actions(commands: Sequence[str]) -> str:
    """The suffix upstream appends to the task text and to every observation."""
    return " AVAILABLE ACTIONS: " + "\n".join(commands) + "\n"


def first_prompt(intro: str, commands: Sequence[str]) -> str:
    """The first user message: the intro without TextWorld's banner paragraph, then the actions."""
    observation = "\n".join(intro.split("\n\n")[1:])
    return "Here is your task. " + observation + available_actions(commands)


def strip_arrival(observation: str) -> str:
    """Drop the "You arrive at loc N. " sentence (AgentBench wording) as upstream does."""
    if observation.startswith("You arrive at loc "):
        return observation[observation.find(". ") + 2 :]
    return observation


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def sentence_bleu(reference: Sequence[str], hypothesis: Sequence[str]) -> float:
    """BLEU-4 of ``hypothesis`` against one ``reference`` with smoothing method 4 (as NLTK)."""
    hyp_len, ref_len = len(hypothesis), len(reference)
    precisions: list[tuple[int, int]] = []
    for n in range(1, _BLEU_ORDER + 1):
        hyp, ref = _ngrams(hypothesis, n), _ngrams(reference, n)
        matches = sum(min(count, ref[gram]) for gram, count in hyp.items())
        precisions.append((matches, max(1, sum(hyp.values()))))
    if precisions[0][0] == 0:
        return 0.0
    brevity = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    smoothed, step = [], 1
    for matches, total in precisions:
        if matches == 0 and hyp_len > 1:
            # Method 4: a missing order counts 1 / (2^step * k / ln(len)) matches, step = 1, 2, ...
            smoothed.append(1 / (2**step * _BLEU_K / math.log(hyp_len)) / total)
            step += 1
        else:
            smoothed.append(matches / total)
    # NLTK leaves out orders whose precision is still zero (one-word hypotheses).
    return brevity * math.exp(math.fsum(0.25 * math.log(p) for p in smoothed if p > 0))


def upstream_action(message: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (call id, action text) upstream's task.py reads from an assistant turn, or None.

    Upstream takes the first tool call whatever its name, parses its arguments as JSON and
    uses the first value; a turn where any of that fails, or where the value is not a string
    (upstream's ``process_action`` calls ``.strip()`` on it), is its "no valid tool calls" turn.
    Arguments that are already a mapping are read as their JSON text would be.
    """
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or not calls or not isinstance(calls[0], Mapping):
        return None
    call, function = calls[0], calls[0].get("function")
    if not isinstance(function, Mapping) or "id" not in call:
        return None
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, Mapping) or not arguments:
        return None
    action = next(iter(arguments.values()))
    return (str(call["id"]), action) if isinstance(action, str) else None


def snap_action(text: str, commands: Sequence[str], threshold: float = 0.01) -> str:
    """Upstream's ``process_action``: lower-case, first line, else the closest command by BLEU."""
    action = text.strip().lower().split("\n")[0]
    if not commands or action in commands:
        return action
    hypothesis = action.split()
    best, best_score = None, -1.0
    for command in commands:  # the first of equal scores wins, as numpy's argmax
        score = sentence_bleu(command.split(), hypothesis)
        if score > best_score:
            best, best_score = command, score
    return best if best is not None and best_score > threshold else action
