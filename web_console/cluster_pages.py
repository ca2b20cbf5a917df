"""The cluster's pages: nodes, one node (with drain and undrain), and the partition map.

For the operator tenant's admins (as the nodes page always was). Each page renders a
live part from a template fragment (``_nodes_live.html``, ...) and its stream sends the
same fragment, rendered again from each new sample, so the page and the stream cannot
disagree and the script only swaps it in. A drain is asked for through the one injected
callable (``ConsoleDeps.drain``; the gateway's ``gateway/cluster_operator.py``), checked
like every console action (session, origin, CSRF token) and confirmed by typing the
node's id, audited, and then followed live: the node page's partitions leave it as the
managers move them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import jinja2
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend_store.errors import PushgateError

from .charts import line_chart
from .deps import ConsoleDeps
from .monitor import NodeSample, PartitionSample, Snapshot
from .session import Session
from .views import back_to, growth_text, page_bounds, size_text

Page = Callable[[Request, Session], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


class ConsoleHost(Protocol):
    """What these pages use of the console (``app.Console`` is one): its guards, its
    templates and its samples; the narrowest door, so the console imports these pages and
    never the other way round."""

    deps: ConsoleDeps
    templates: jinja2.Environment
    page_max_age_s: float

    def page(self, handler: Page) -> Endpoint: ...

    def action(self, handler: Page) -> Endpoint: ...

    def stream(self, events: Callable[[Request, Session], AsyncIterator[bytes]]) -> Endpoint: ...

    def refused(self, message: str, status: int) -> Response: ...

    def render(
        self, template: str, session: Session | None, status: int = 200, **context: Any
    ) -> Response: ...

    def samples(self, session: Session) -> AsyncIterator[Snapshot | bytes]: ...


# A replica this many log entries behind its leader is shown in red (the default
# replication_lag alert fires at 10,000 for a whole node).
LAG_WARN = 1000
PARTITIONS_PER_PAGE = 200


@dataclass(frozen=True, slots=True)
class PartitionListing:
    """One page of the partition map, filtered by queue or tenant name and by node."""

    items: list[PartitionSample]
    query: str
    node: str
    page: int
    pages: int
    per_page: int
    total: int

    @classmethod
    def of(cls, partitions: Sequence[PartitionSample], params: Mapping[str, str]) -> PartitionListing:
        query = params.get("q", "").strip()[:80]
        node = params.get("node", "").strip()[:80]
        matching = [
            p
            for p in sorted(partitions, key=lambda p: (p.tenant, p.queue, p.index))
            if (not query or query.lower() in f"{p.tenant}/{p.queue}".lower())
            and (not node or p.replica(node) is not None)
        ]
        page, pages, per_page, start = page_bounds(len(matching), params, PARTITIONS_PER_PAGE)
        return cls(matching[start : start + per_page], query, node, page, pages, per_page, len(matching))

    def params(self, page: int) -> str:
        parts = [f"page={page}"]
        if self.query:
            parts.append(f"q={quote(self.query)}")
        if self.node:
            parts.append(f"node={quote(self.node)}")
        if self.per_page != PARTITIONS_PER_PAGE:
            parts.append(f"per_page={self.per_page}")
        return "&".join(parts)


class ClusterPages:
    def __init__(self, console: ConsoleHost) -> None:
        self.console = console
        self.deps = console.deps

    def routes(self) -> list[Route]:
        page, action, stream = self.console.page, self.console.action, self.console.stream
        return [
            Route("/nodes", page(self.nodes), methods=["GET"]),
            Route("/nodes/events", stream(self.nodes_events), methods=["GET"]),
            Route("/nodes/{node}", page(self.node), methods=["GET"]),
            Route("/nodes/{node}/events", stream(self.node_events), methods=["GET"]),
            Route("/nodes/{node}/drain", action(self.drain), methods=["POST"]),
            Route("/nodes/{node}/undrain", action(self.undrain), methods=["POST"]),
            Route("/partitions", page(self.partitions), methods=["GET"]),
            Route("/partitions/events", stream(self.partitions_events), methods=["GET"]),
        ]

    # What each page shows -------------------------------------------------------

    def _nodes_context(self, snapshot: Snapshot) -> dict[str, Any]:
        stored = self.deps.sampler.storage_history
        return {
            "cluster": snapshot.cluster,
            "nodes": snapshot.nodes,
            "storage": snapshot.storage,
            "identity": snapshot.identity,
            "partition_count": len(snapshot.partitions),
            "growth": {n.id: growth_text(stored.growth_per_hour(n.id)) for n in snapshot.nodes},
            "store_growth": growth_text(stored.growth_per_hour("store")),
        }

    def _node_context(self, snapshot: Snapshot, node: NodeSample) -> dict[str, Any]:
        stored = self.deps.sampler.storage_history
        placed = [(p, p.replica(node.id)) for p in snapshot.partitions_on(node.id)]
        return {
            "node": node,
            "placed": sorted(placed, key=lambda pr: pr[0].id),
            "growth": growth_text(stored.growth_per_hour(node.id)),
            "storage_chart": line_chart(
                stored.points(node.id), snapshot.at, stored.span_s, what="Bytes stored", show=size_text
            ),
            "lag_warn": LAG_WARN,
        }

    def _partitions_context(self, snapshot: Snapshot, params: Mapping[str, str]) -> dict[str, Any]:
        return {
            "cluster": snapshot.cluster,
            "listing": PartitionListing.of(snapshot.partitions, params),
            "lag_warn": LAG_WARN,
        }

    # Pages ----------------------------------------------------------------------

    async def nodes(self, request: Request, session: Session) -> Response:
        snapshot = await self.deps.sampler.fresh(self.console.page_max_age_s)
        return self.console.render("nodes.html", session, **self._nodes_context(snapshot))

    async def node(self, request: Request, session: Session) -> Response:
        if not session.operator:
            return self.console.render("nodes.html", session, cluster=False, storage=None)
        snapshot = await self.deps.sampler.fresh(self.console.page_max_age_s)
        node = snapshot.node(request.path_params["node"])
        if node is None:
            return self.console.render("notfound.html", session, status=404, what="node")
        return self.console.render(
            "node.html",
            session,
            can_drain=self.deps.drain is not None,
            notice=request.query_params.get("notice"),
            error=request.query_params.get("error"),
            **self._node_context(snapshot, node),
        )

    async def partitions(self, request: Request, session: Session) -> Response:
        snapshot = await self.deps.sampler.fresh(self.console.page_max_age_s)
        return self.console.render(
            "partitions.html", session, **self._partitions_context(snapshot, request.query_params)
        )

    # Drain and undrain (POST, CSRF-checked by the action guard) ------------------------

    async def drain(self, request: Request, session: Session) -> Response:
        return await self._set_drain(request, session, drain=True)

    async def undrain(self, request: Request, session: Session) -> Response:
        return await self._set_drain(request, session, drain=False)

    async def _set_drain(self, request: Request, session: Session, *, drain: bool) -> Response:
        if not session.operator:
            return self.console.refused("Only the operator tenant's admins may drain nodes.", 403)
        snapshot = await self.deps.sampler.fresh(self.console.page_max_age_s)
        node = snapshot.node(request.path_params["node"])
        if node is None:  # only a node the cluster shows: the id goes into an etcd key
            return self.console.render("notfound.html", session, status=404, what="node")
        back = f"/console/nodes/{quote(node.id)}"
        if self.deps.drain is None:
            return back_to(back, "This gateway does not run on a cluster: nothing to drain.", "error")
        if drain and request.state.form.get("confirm") != node.id:
            return back_to(back, "Not drained: type the node's id to confirm.", "error")
        try:
            await self.deps.drain(node.id, drain)
        except PushgateError as exc:
            return back_to(back, f"The drain request failed: {exc.detail}", "error")
        if self.deps.audit is not None:
            action = "node.drain_requested" if drain else "node.drain_withdrawn"
            await self.deps.audit(session, action, node.id, {"placed": node.placed, "state": node.state})
        await self.deps.sampler.sample()
        if drain:
            message = (
                f"Drain of {node.id} requested: the managers move its {node.placed} partition(s) "
                "off it. This page follows them."
            )
        else:
            message = f"Drain of {node.id} withdrawn."
        return back_to(back, message)

    # Live streams: the page's fragment, rendered again from each sample ---------------

    async def nodes_events(self, request: Request, session: Session) -> AsyncIterator[bytes]:
        async for snapshot in self._operator_samples(session):
            if isinstance(snapshot, bytes):
                yield snapshot
                continue
            yield _fragments(
                {"nodes-live": self._fragment("_nodes_live.html", session, self._nodes_context(snapshot))}
            )

    async def node_events(self, request: Request, session: Session) -> AsyncIterator[bytes]:
        node_id = request.path_params["node"]
        async for snapshot in self._operator_samples(session):
            if isinstance(snapshot, bytes):
                yield snapshot
                continue
            node = snapshot.node(node_id)
            if node is None:
                yield b"event: gone\ndata: {}\n\n"
                return
            html = self._fragment("_node_live.html", session, self._node_context(snapshot, node))
            yield _fragments({"node-live": html})

    async def partitions_events(self, request: Request, session: Session) -> AsyncIterator[bytes]:
        params = request.query_params
        async for snapshot in self._operator_samples(session):
            if isinstance(snapshot, bytes):
                yield snapshot
                continue
            context = self._partitions_context(snapshot, params)
            yield _fragments({"partitions-live": self._fragment("_partitions_live.html", session, context)})

    async def _operator_samples(self, session: Session) -> AsyncIterator[Snapshot | bytes]:
        if not session.operator:
            yield b"event: gone\ndata: {}\n\n"
            return
        async for item in self.console.samples(session):
            yield item

    def _fragment(self, template: str, session: Session, context: Mapping[str, Any]) -> str:
        return self.console.templates.get_template(template).render(session=session, **context)


def _fragments(parts: Mapping[str, str]) -> bytes:
    """One live event: element id -> its new inner HTML (rendered and escaped by Jinja)."""
    return b"event: fragments\ndata: " + orjson.dumps(parts) + b"\n\n"
