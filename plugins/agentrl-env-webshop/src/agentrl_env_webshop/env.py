"""The ``webshop`` environment: AgentBench-FC's WebShop task over a local shop simulation.

Tools ``search_action(keywords)`` and ``click_action(value)``; 20 rounds. The first user
message is ``"The initial observation:\\n<page>\\n\\nAvailable Actions:\\n<dict>"`` and each tool
result ``"Action: search[...]\\n\\nObservation:\\n<page>\\n\\nAvailable Actions:\\n<dict>"``, as in
AgentBench's ``webshop`` task. "Buy Now" ends the episode (status ``completed``) with
WebShop's reward; success is reward 1. An invalid click or search gets an error line above
the unchanged page and counts in ``metrics.invalid_turns``; the episode continues.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from agentrl_core.env import Environment, Status, Step, ToolCall, ToolSession, function_tool, run_blocking, tool_result
from agentrl_core.types import Index, Message
from agentrl_env_webshop.config import WebShopConfig
from agentrl_env_webshop.oracle import WebShopOracle, oracle_queries
from agentrl_env_webshop.shop import Shop
from agentrl_env_webshop.site import Outcome, Site

# AgentBench-FC's prompt for the function-calling WebShop task, verbatim.
SYSTEM_PROMPT = """
You are web shopping.
I will give you instructions about what to do.
You have to follow the instructions.
Every round I will give you an observation and a list of available actions,
you have to respond with calling a tool provided based on the state and instruction.
You can use search tool if search is available.
You can click one of the buttons in clickables.
If the action is not valid, perform nothing.
Keywords in search are up to you, but the value in click must be a value in the list of available actions.
Remember that your keywords in search should be carefully designed.
Your should first think about what to do, then call a tool correspondingly.
You should always use a tool, even if you have questions to confirm. You can use whatever tool is available and do not need permission from the user.
"""

TOOLS = [
    function_tool(
        "search_action",
        "Use search functionality with specified keywords.",
        {"keywords": {"type": "string", "description": "The keywords to use in the search function."}},
        required=["keywords"],
    ),
    function_tool(
        "click_action",
        "Click a button or link with a specified value.",
        {"value": {"type": "string", "description": "The value to click from the list of available actions."}},
        required=["value"],
    ),
]

_METRIC_KEYS = ("r_type", "r_att", "r_option", "r_price", "title_score", "w_att", "w_option", "w_price",
                "attribute_matches", "option_matches")
_FLAG_KEYS = ("query_match", "category_match", "purchased_target")


class WebShopSession(ToolSession):
    def __init__(self, env: WebShopEnvironment, goal: Mapping[str, Any]) -> None:
        super().__init__(TOOLS, max_rounds=env.config.max_rounds)
        self.env = env
        self.goal = goal
        self.site: Site | None = None
        self._counted = False

    async def on_start(self) -> Step:
        self.env.live_sessions += 1
        self._counted = True
        shop = self.env.shop
        await run_blocking(shop.index, limiter=self.env.limiter)  # first session builds or loads the index
        self.site = Site(self.goal, shop.by_asin, shop.prices, shop.search, nouns=shop.nouns,
                         show_attrs=self.env.config.show_attrs, search_anywhere=self.env.config.search_anywhere)
        page = f"{self.site.observation()}\n\nAvailable Actions:\n{self.site.available_actions()}"
        return Step([{"role": "system", "content": SYSTEM_PROMPT},
                     {"role": "user", "content": f"The initial observation:\n{page}"}])

    async def on_tool_call(self, call: ToolCall, message: Message) -> Step:
        assert self.site is not None
        if call.name == "search_action":
            argument = call.arguments["keywords"]
            action = f"search[{argument}]"
            outcome: Outcome = await run_blocking(self.site.search, argument, limiter=self.env.limiter)
        else:
            argument = call.arguments["value"]
            action = f"click[{argument}]"
            outcome = await run_blocking(self.site.click, argument, limiter=self.env.limiter)
        if outcome.done:
            content = f"Action: {action}\n\nObservation:\n{outcome.observation}"
            return Step([tool_result(call, content)], status=Status.COMPLETED, reward=outcome.reward,
                        metrics=self._purchase_metrics(outcome))
        observation = outcome.observation
        if not outcome.valid:
            self.invalid_turns += 1
            observation = f"Invalid action: {outcome.error}.\n{observation}"
        content = f"Action: {action}\n\nObservation:\n{observation}\n\nAvailable Actions:\n{self.site.available_actions()}"
        return Step([tool_result(call, content)])

    def _purchase_metrics(self, outcome: Outcome) -> dict[str, Any]:
        metrics: dict[str, Any] = {k: float(outcome.info[k]) for k in _METRIC_KEYS if k in outcome.info}
        metrics.update({k: float(bool(outcome.info.get(k))) for k in _FLAG_KEYS})
        metrics["success"] = float(outcome.reward == 1.0)
        return metrics

    def metrics(self) -> dict[str, Any]:
        base = super().metrics()
        if self.site is not None:
            base.update(self.site.counts)
        return base

    async def on_close(self) -> None:
        if self._counted:
            self.env.live_sessions -= 1


class WebShopEnvironment(Environment):
    name = "webshop"
    tools = TOOLS

    def __init__(self, config: WebShopConfig | None = None) -> None:
        super().__init__(config or WebShopConfig())
        self.concurrency = self.config.concurrency
        self.shop = Shop.load(self.config)
        self.live_sessions = 0
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:  # created inside the event loop
            self._limiter = anyio.CapacityLimiter(self.config.worker_threads)
        return self._limiter

    def index_sets(self) -> dict[str, Sequence[Index]]:
        return self.shop.index_sets

    def goal(self, split: str, index: Index) -> dict[str, Any]:
        return self.shop.goals[int(self.check_index(split, index))]

    async def open(self, split: str, index: Index) -> WebShopSession:
        return WebShopSession(self, self.goal(split, index))

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> WebShopOracle:
        goal = self.goal(split, index)
        product = self.shop.by_asin[goal["asin"]]
        recorded = self.shop.goal_queries(goal["instruction_text"]) if self.shop.kind == "real" else []
        return WebShopOracle(goal, product, oracle_queries(goal, product, recorded), error_rate=error_rate, seed=seed)

    def resource_count(self) -> int:
        return self.live_sessions
