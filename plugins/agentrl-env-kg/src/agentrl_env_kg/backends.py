"""Where SPARQL queries run: an embedded Oxigraph store or any SPARQL 1.1 endpoint.

Both return rows of plain strings: IRIs under the Freebase namespace lose the prefix
(``m.0km5c``), literals give their lexical form, and, as upstream, a ``-08:00`` time zone
suffix is dropped. So the same tool calls give the same observations on either backend.

* :class:`EmbeddedBackend` runs each query in a worker thread (the event loop keeps
  serving), at most ``threads`` at once, and gives up on a query after ``timeout`` seconds
  (the thread finishes in the background; Oxigraph cannot interrupt a query).
* :class:`SparqlBackend` POSTs queries with httpx (``application/sparql-results+json``),
  with connect and read timeouts and a bounded connection pool.

A query the server rejects or that times out raises :class:`QueryError` (the agent's tool
call gets an error observation); an unreachable or failing service raises
:class:`BackendError` (the session ends as ``task error``).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence

import anyio
import anyio.to_thread
import httpx

from agentrl_core.errors import EnvError
from agentrl_env_kg.lisp import NS

log = logging.getLogger(__name__)

Rows = list[tuple[str, ...]]


class BackendError(EnvError):
    """The knowledge-graph service failed (an infrastructure problem, not the agent's)."""


class QueryError(Exception):
    """One query failed or timed out; the agent is told and the episode goes on."""


def clean(value: str) -> str:
    return value.removeprefix(NS).replace("-08:00", "")


class Backend(abc.ABC):
    name = ""

    @abc.abstractmethod
    async def select(self, query: str, *, max_rows: int | None = None) -> Rows:
        """Run a SELECT query; each row holds the projected variables' values, in order."""

    async def aclose(self) -> None:
        """Release connections and handles."""


class EmbeddedBackend(Backend):
    name = "embedded"

    def __init__(self, store, *, timeout: float = 30.0, threads: int = 4) -> None:
        self.store = store
        self.timeout = timeout
        self.limiter = anyio.CapacityLimiter(threads)

    def _run(self, query: str, max_rows: int | None) -> Rows:
        try:
            solutions = self.store.query(query)
        except SyntaxError as exc:
            raise QueryError(f"invalid SPARQL: {exc}") from None
        names = [v.value for v in solutions.variables]
        rows: Rows = []
        for solution in solutions:
            rows.append(tuple(_term(solution[n]) for n in names))
            if max_rows is not None and len(rows) >= max_rows:
                break
        return rows

    async def select(self, query: str, *, max_rows: int | None = None) -> Rows:
        try:
            with anyio.fail_after(self.timeout):
                return await anyio.to_thread.run_sync(
                    self._run, query, max_rows, limiter=self.limiter, abandon_on_cancel=True
                )
        except TimeoutError:
            raise QueryError(f"the query took longer than {self.timeout:g} s") from None
        except OSError as exc:
            raise BackendError(f"the embedded knowledge-graph store failed: {exc}") from exc

    async def aclose(self) -> None:
        self.store = None  # the last reference closes the database


def _term(term) -> str:
    if term is None:
        return ""
    return clean(term.value)


class SparqlBackend(Backend):
    name = "sparql"

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_connections: int = 32,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def select(self, query: str, *, max_rows: int | None = None) -> Rows:
        try:
            response = await self._client.post(
                self.endpoint,
                data={"query": query},
                headers={"Accept": "application/sparql-results+json"},
            )
        except httpx.TimeoutException:
            raise QueryError(f"the query took longer than {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise BackendError(f"the SPARQL endpoint {self.endpoint} is unreachable: {exc}") from exc
        if response.status_code >= 500 and "timeout" not in response.text.lower():
            raise BackendError(f"the SPARQL endpoint {self.endpoint} answered HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code != 200:
            raise QueryError(f"the SPARQL endpoint rejected the query (HTTP {response.status_code}): {response.text[:200]}")
        try:
            data = response.json()
            names: Sequence[str] = data["head"]["vars"]
            bindings = data["results"]["bindings"]
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"the SPARQL endpoint {self.endpoint} sent an unexpected response: {exc}") from exc
        rows: Rows = []
        for binding in bindings:
            rows.append(tuple(clean(binding[n]["value"]) if n in binding else "" for n in names))
            if max_rows is not None and len(rows) >= max_rows:
                break
        return rows

    async def aclose(self) -> None:
        await self._client.aclose()
