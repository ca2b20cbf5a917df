"""The operator console: server-rendered pages (Jinja2), live over Server-Sent Events.

Mounted by the gateway at ``/console``; see docs/console.md. Every page works without
JavaScript (the numbers are in the HTML); a small script only applies the live stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from backend_store.attributes import check_queue_name
from backend_store.backend import DeadLetters, QueuePlacements
from backend_store.errors import PushgateError
from backend_store.types import QueueName, TenantId

from .alerts import KINDS, QUEUE_KINDS, THRESHOLD_MEANING, parse_rule
from .charts import depth_chart, rates_chart
from .cluster_pages import LAG_WARN, ClusterPages
from .deps import ConsoleDeps
from .monitor import Snapshot
from .monitor.cluster_sample import PartitionSample
from .session import Session, SessionCodec, same_origin
from .views import Listing, age_text, alert_row, back_to, queue_row, size_text

HERE = Path(__file__).parent
# A page shows stats at most this old (a queue created a moment ago is on the next load).
PAGE_MAX_AGE_S = 1.0
PING_S = 15.0
# How often a live stream checks its session's credential again (as push connections do).
RECHECK_S = 2.0
PEEK_ROWS = 20

Page = Callable[[Request, Session], Awaitable[Response]]


class Console:
    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps
        self.sessions = SessionCodec(deps.secret, secure=deps.secure_cookies)
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["size"] = size_text
        self.templates.filters["age"] = age_text
        self.page_max_age_s = PAGE_MAX_AGE_S
        self.cluster_pages = ClusterPages(self)

    def app(self) -> Starlette:
        page, action = self.page, self.action
        return Starlette(
            exception_handlers={PushgateError: self._store_error, 404: self._not_found},
            routes=[
                Route("/", page(self.overview), methods=["GET"]),
                Route("/login", self.login_form, methods=["GET"]),
                Route("/login", self.login, methods=["POST"]),
                Route("/logout", action(self.logout), methods=["POST"]),
                Route("/events", self.stream(self.overview_events), methods=["GET"]),
                Route("/queues/{queue}", page(self.queue), methods=["GET"]),
                Route("/queues/{queue}/events", self.stream(self.queue_events), methods=["GET"]),
                Route("/queues/{queue}/redrive", action(self.redrive), methods=["POST"]),
                Route("/queues/{queue}/purge", action(self.purge), methods=["POST"]),
                *self.cluster_pages.routes(),
                Route("/alerts", page(self.alerts), methods=["GET"]),
                Route("/alerts/rules", action(self.add_rule), methods=["POST"]),
                Route("/alerts/rules/{rule_id}/delete", action(self.delete_rule), methods=["POST"]),
                Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
            ],
        )

    # Guards ---------------------------------------------------------------------

    def page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if session is None:
                return RedirectResponse("/console/login", status_code=303)
            return await handler(request, session)

        return endpoint

    def action(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        """A state-changing form post: a session, our own origin and its CSRF token, or 403."""

        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if session is None:
                return self.refused("You are not logged in.", 403)
            form = await request.form()
            token = form.get("csrf")
            if not same_origin(request) or not session.csrf_ok(token if isinstance(token, str) else None):
                return self.refused(
                    "The form's CSRF token is missing or wrong. Reload the page and retry.", 403
                )
            request.state.form = form
            return await handler(request, session)

        return endpoint

    def stream(
        self, events: Callable[[Request, Session], AsyncIterator[bytes]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if session is None:
                return Response("not logged in\n", status_code=401, media_type="text/plain")
            return StreamingResponse(
                events(request, session),
                media_type="text/event-stream",
                headers={"cache-control": "no-store", "x-accel-buffering": "no"},
            )

        return endpoint

    async def _session(self, request: Request) -> Session | None:
        """The request's session, if its cookie is good and its credential still stands."""
        session = self.sessions.read(request)
        if session is None or not await self._still_valid(session):
            return None
        return session

    async def _still_valid(self, session: Session) -> bool:
        return self.deps.recheck is None or await self.deps.recheck(session)

    async def _store_error(self, request: Request, exc: Exception) -> Response:
        # The store cannot answer (map full, closed, a corrupt record): say so, not a bare 500.
        detail = exc.detail if isinstance(exc, PushgateError) else "store error"
        return self.refused(f"The store cannot answer right now ({detail}). Retry in a moment.", 503)

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        # A console URL that does not exist: a console page, with the navigation when logged in.
        if isinstance(exc, HTTPException) and exc.status_code != 404:
            return Response(exc.detail, status_code=exc.status_code)
        session = await self._session(request)
        return self.render("notfound.html", session, status=404, what=None, path=request.url.path)

    def refused(self, message: str, status: int) -> Response:
        return self.render("refused.html", None, status=status, message=message)

    def render(self, template: str, session: Session | None, status: int = 200, **context: Any) -> Response:
        html = self.templates.get_template(template).render(session=session, **context)
        return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})

    # Login ------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self.render("login.html", None, error=None)

    async def login(self, request: Request) -> Response:
        if not same_origin(request):
            return self.refused("Cross-site login refused.", 403)
        form = await request.form()
        token = form.get("token")
        if not isinstance(token, str) or not token.strip():
            return self.render("login.html", None, status=401, error="Enter an admin API key or JWT.")
        principal = await self.deps.authenticate(token.strip())
        if principal is None:
            return self.render("login.html", None, status=401, error="That key or token is not valid.")
        if "admin" not in principal.scopes:
            # A manage: key changes only the queues it names; the console shows the whole tenant.
            return self.render(
                "login.html",
                None,
                status=403,
                error="The console needs a key with the admin scope (a manage:, send: or receive: key "
                "works only on the queues it names, through the API).",
            )
        session = self.sessions.new(principal, principal.tenant == self.deps.operator_tenant)
        response = RedirectResponse("/console/", status_code=303)
        self.sessions.write(response, session)
        return response

    async def logout(self, request: Request, session: Session) -> Response:
        response = RedirectResponse("/console/login", status_code=303)
        self.sessions.clear(response)
        return response

    # Pages --------------------------------------------------------------------------

    async def overview(self, request: Request, session: Session) -> Response:
        snapshot = await self.deps.sampler.fresh(PAGE_MAX_AGE_S)
        listing = Listing.of(snapshot.for_tenant(session.tenant), request.query_params)
        alerts = [alert_row(a) for a in self.deps.alerts.active(session.tenant)]
        return self.render(
            "overview.html",
            session,
            listing=listing,
            queues=[queue_row(q) for q in listing.queues],
            alerts=alerts,
            stream=f"/console/events?{listing.params(listing.page)}",
        )

    async def queue(self, request: Request, session: Session) -> Response:
        name = _queue_param(request)
        if name is None:
            return self.render("notfound.html", session, status=404, what="queue")
        snapshot = await self.deps.sampler.fresh(PAGE_MAX_AGE_S)
        sample = snapshot.queue(session.tenant, name)
        if sample is None:
            try:
                await self.deps.store.get_queue(TenantId(session.tenant), QueueName(name))
            except PushgateError:
                return self.render("notfound.html", session, status=404, what="queue")
            snapshot = await self.deps.sampler.sample()
            sample = snapshot.queue(session.tenant, name)
            if sample is None:
                return self.render("notfound.html", session, status=404, what="queue")
        sources = [q.name for q in snapshot.for_tenant(session.tenant) if q.dead_letter_queue == name]
        peeked: list[Any] = []
        if isinstance(self.deps.store, DeadLetters):
            peeked = await self.deps.store.peek(TenantId(session.tenant), QueueName(name), PEEK_ROWS)
        consumers = self.deps.consumers(session.tenant, name) if self.deps.consumers else None
        return self.render(
            "queue.html",
            session,
            q=sample,
            row=queue_row(sample),
            **self._queue_figures(snapshot, session, name),
            cluster=snapshot.cluster,
            sources=sources,
            peeked=peeked,
            consumers=consumers,
            alerts=[
                alert_row(a)
                for a in self.deps.alerts.active(session.tenant)
                if a.subject == f"{session.tenant}/{name}"
            ],
            notice=request.query_params.get("notice"),
        )

    def _queue_figures(self, snapshot: Snapshot, session: Session, name: str) -> dict[str, Any]:
        """The queue page's charts and partitions: rendered for the page and for its stream."""
        sampler = self.deps.sampler
        depth, rates = sampler.history, sampler.rates
        return {
            "chart": depth_chart(depth.points(session.tenant, name), snapshot.at, depth.span_s),
            "rates_chart": rates_chart(rates.rates(session.tenant, name), snapshot.at, rates.span_s),
            "partitions": self._partitions_of(snapshot, session, name),
            "lag_warn": LAG_WARN,
        }

    def _partitions_of(self, snapshot: Snapshot, session: Session, name: str) -> list[PartitionSample]:
        """A queue's partitions: those named for it in the map, or on shared partitions the
        ones its placement names (the map names them by pool, not by queue), each once (a
        queue with more partitions than its pool names some twice)."""
        store = self.deps.store
        if isinstance(store, QueuePlacements):
            placement = store.placement_of(TenantId(session.tenant), QueueName(name))
            if placement is not None:
                by_id = {p.id: p for p in snapshot.partitions}
                return [by_id[pid] for pid in dict.fromkeys(placement) if pid in by_id]
        return snapshot.partitions_of(session.tenant, name)

    async def alerts(self, request: Request, session: Session) -> Response:
        engine = self.deps.alerts
        return self.render(
            "alerts.html",
            session,
            active=[alert_row(a) for a in engine.active(session.tenant)],
            history=engine.recent(session.tenant),
            rules=await engine.list_rules(session.tenant),
            kinds=KINDS if session.operator else QUEUE_KINDS,
            meaning=THRESHOLD_MEANING,
            notice=request.query_params.get("notice"),
            error=request.query_params.get("error"),
        )

    # Actions (POST, CSRF-checked) ---------------------------------------------------------

    async def redrive(self, request: Request, session: Session) -> Response:
        name = _queue_param(request)
        form = request.state.form
        to = str(form.get("to", ""))
        if name is None or not isinstance(self.deps.store, DeadLetters):
            return self.render("notfound.html", session, status=404, what="queue")
        try:
            limit = max(1, min(10_000, int(str(form.get("max", "1000")))))
            moved = await self.deps.store.redrive(
                TenantId(session.tenant), QueueName(name), QueueName(to), limit
            )
        except (PushgateError, ValueError) as exc:
            return back_to(f"/console/queues/{name}", f"Redrive failed: {getattr(exc, 'detail', exc)}")
        await self.deps.sampler.sample()
        return back_to(f"/console/queues/{name}", f"Moved {moved} message(s) to {to}.")

    async def purge(self, request: Request, session: Session) -> Response:
        name = _queue_param(request)
        if name is None:
            return self.render("notfound.html", session, status=404, what="queue")
        if request.state.form.get("confirm") != name:
            return back_to(f"/console/queues/{name}", "Not purged: type the queue's name to confirm.")
        try:
            purged = await self.deps.store.purge_queue(TenantId(session.tenant), QueueName(name))
        except PushgateError as exc:
            return back_to(f"/console/queues/{name}", f"Purge failed: {exc.detail}")
        if self.deps.audit is not None:
            await self.deps.audit(session, "queue.purged", name, {"purged": purged})
        await self.deps.sampler.sample()
        return back_to(f"/console/queues/{name}", f"Purged {purged} message(s).")

    async def add_rule(self, request: Request, session: Session) -> Response:
        form = request.state.form
        body: dict[str, Any] = {"kind": form.get("kind")}
        try:
            for field in ("threshold", "for_s", "clear", "window_s"):
                raw = str(form.get(field) or "").strip()
                if raw:
                    body[field] = float(raw)
            queue = str(form.get("queue") or "").strip()
            if queue:
                body["queue"] = queue
            description = str(form.get("description") or "").strip()
            if description:
                body["description"] = description
            rule = parse_rule(session.tenant, body, allow_system=session.operator)
        except ValueError:
            return back_to(
                "/console/alerts", "Numbers only in threshold, for, clear and window.", key="error"
            )
        except PushgateError as exc:
            return back_to("/console/alerts", exc.detail, key="error")
        await self.deps.alerts.add_rule(rule)
        return back_to("/console/alerts", f"Rule {rule.id} added.")

    async def delete_rule(self, request: Request, session: Session) -> Response:
        try:
            await self.deps.alerts.delete_rule(session.tenant, request.path_params["rule_id"])
        except PushgateError as exc:
            return back_to("/console/alerts", exc.detail, key="error")
        return back_to("/console/alerts", "Rule deleted.")

    # Live streams ---------------------------------------------------------------------

    async def overview_events(self, request: Request, session: Session) -> AsyncIterator[bytes]:
        async for snapshot in self.samples(session):
            if isinstance(snapshot, bytes):
                yield snapshot
                continue
            listing = Listing.of(snapshot.for_tenant(session.tenant), request.query_params)
            # The caption and the pager again from this sample: queues created or deleted
            # since the page's own change the count of pages too.
            fragments = {
                part: self.templates.get_template(f"_{part.replace('-', '_')}.html").render(
                    session=session, listing=listing
                )
                for part in ("queue-caption", "queue-pager")
            }
            doc = {
                "at": snapshot.at,
                "queues": [queue_row(q) for q in listing.queues],
                "fragments": fragments,
                "alerts": [alert_row(a) for a in self.deps.alerts.active(session.tenant)],
            }
            yield b"event: overview\ndata: " + orjson.dumps(doc) + b"\n\n"

    async def queue_events(self, request: Request, session: Session) -> AsyncIterator[bytes]:
        name = _queue_param(request)
        async for snapshot in self.samples(session):
            if isinstance(snapshot, bytes):
                yield snapshot
                continue
            sample = snapshot.queue(session.tenant, name or "")
            if sample is None:
                # Not sampled yet (created a moment ago), or deleted: ask the store which.
                try:
                    await self.deps.store.get_queue(TenantId(session.tenant), QueueName(name or ""))
                except PushgateError:
                    yield b"event: gone\ndata: {}\n\n"
                    return
                continue
            figures = self._queue_figures(snapshot, session, sample.name)
            fragments = {"rates-chart": figures["rates_chart"]}
            if snapshot.cluster:
                template = self.templates.get_template("_queue_partitions.html")
                fragments["queue-partitions"] = template.render(session=session, q=sample, **figures)
            doc = {
                "at": snapshot.at,
                "queue": queue_row(sample),
                "chart": figures["chart"],
                "fragments": fragments,
                "alerts": [
                    alert_row(a)
                    for a in self.deps.alerts.active(session.tenant)
                    if a.subject == f"{session.tenant}/{sample.name}"
                ],
            }
            yield b"event: queue\ndata: " + orjson.dumps(doc) + b"\n\n"

    async def samples(self, session: Session) -> AsyncIterator[Snapshot | bytes]:
        """Each new snapshot (the current one first), with a comment ping when idle."""
        sampler = self.deps.sampler
        yield b"retry: 2000\n\n"
        last = 0.0
        checked = time.monotonic()
        with sampler.watching():
            while session.expires > time.time():
                if time.monotonic() - checked >= RECHECK_S:
                    if not await self._still_valid(session):
                        return  # the key was revoked: the browser reconnects and is refused
                    checked = time.monotonic()
                snapshot = await sampler.next_sample(last, PING_S)
                if snapshot is None:
                    return  # the server is shutting down: end the stream (the browser reconnects)
                if snapshot.at > last:
                    last = snapshot.at
                    yield snapshot
                else:
                    yield b": ping\n\n"


def _queue_param(request: Request) -> str | None:
    name: str = request.path_params["queue"]
    try:
        check_queue_name(name)
    except PushgateError:
        return None
    return name


def build_console(deps: ConsoleDeps) -> Starlette:
    """The console as an ASGI app, to mount at ``/console``."""
    return Console(deps).app()


__all__ = ["Console", "build_console"]
