"""The alert engine: on every sample, check each rule and fire or resolve alerts.

States per (rule, subject): ok -> pending (past the threshold, waiting ``for_s``) ->
firing -> resolving (back at or below the clear level, waiting ``for_s``) -> ok. Values
between the clear level and the threshold change nothing (hysteresis), so an alert does
not flap around its threshold. Rules are re-read from the store on every evaluation, so
rules set by ``pushgate admin`` or another gateway apply within one sample.

With a :class:`~web_console.alerts.shared.SharedAlerts` (the gateway always passes one),
firing alerts and the history live in the store's metadata: every gateway on the store
evaluates, but each transition is claimed in the store by exactly one of them, which alone
records it (history, log line, transition counter, webhook); the others adopt the state.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from backend_store.errors import PushgateError
from web_console.monitor import DepthHistory, QueueSample, RateHistory, Snapshot
from web_console.monitor.history import PER_TURN

from .defaults import install_defaults
from .evaluation import breaches, cleared, observe
from .rules import AlertRule
from .shared import SharedAlerts
from .store import RuleStore
from .webhook import WebhookNotifier

log = logging.getLogger("pushgate.alerts")


@dataclass(frozen=True, slots=True)
class Alert:
    """An alert that is firing (in :meth:`AlertEngine.active`)."""

    rule_id: str
    kind: str
    tenant: str
    subject: str
    value: float
    threshold: float
    since: float
    description: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """A transition kept in the history (and POSTed to the webhook): ``state`` is fired or resolved."""

    at: float
    state: str
    rule_id: str
    kind: str
    tenant: str
    subject: str
    value: float
    threshold: float
    description: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Track:
    rule: AlertRule
    firing: bool = False
    since: float | None = None  # when the pending crossing (either way) began
    fired_at: float = 0.0
    value: float = 0.0


class AlertEngine:
    def __init__(
        self,
        rules: RuleStore,
        history: DepthHistory,
        *,
        notifier: WebhookNotifier | None = None,
        history_size: int = 200,
        on_change: Callable[[], None] | None = None,
        shared: SharedAlerts | None = None,
        rates: RateHistory | None = None,
        defaults_for: str | None = None,
    ) -> None:
        self.store = rules
        self.depth_history = history
        self.rates = rates
        # The tenant that gets the default rules on a fresh store (None: no defaults).
        self._defaults_for = defaults_for
        self.notifier = notifier
        self.rules: list[AlertRule] = []
        self.history: deque[AlertEvent] = deque(maxlen=history_size)
        self.transitions: Counter[tuple[str, str]] = Counter()
        self.evaluations = 0
        # (rule id, subject) -> state, for subjects away from rest (pending, firing, resolving).
        self._tracks: dict[tuple[str, str], _Track] = {}
        # The snapshot and rules evaluated last: what the next snapshot's changes are against.
        self._evaluated_at = -1.0
        self._evaluated_rules: set[AlertRule] = set()
        # One evaluation at a time: they pause between turns (``advancing``), and two
        # samples' listeners may run at once.
        self._evaluating = asyncio.Lock()
        self._published: list[Alert] = []
        self._on_change = on_change
        self.shared = shared

    # Reading ----------------------------------------------------------------------

    def active(self, tenant: str | None = None) -> list[Alert]:
        """Firing alerts (of one tenant, or all), oldest first, as of the last finished
        evaluation: never half-way through one, so the history shown beside them (written
        after each transition's claim) agrees."""
        return [a for a in self._published if tenant is None or a.tenant == tenant]

    def _publish(self) -> None:
        out = []
        for (rule_id, subject), track in self._tracks.items():
            rule = track.rule
            if not track.firing:
                continue
            out.append(
                Alert(
                    rule_id,
                    rule.kind,
                    rule.tenant,
                    subject,
                    track.value,
                    rule.threshold,
                    track.fired_at,
                    rule.description,
                )
            )
        self._published = sorted(out, key=lambda a: (a.since, a.rule_id, a.subject))

    def recent(self, tenant: str | None = None) -> list[AlertEvent]:
        """The kept history, newest first."""
        return [e for e in reversed(self.history) if tenant is None or e.tenant == tenant]

    def webhook_outcomes(self) -> dict[str, int]:
        return dict(self.notifier.outcomes) if self.notifier is not None else {}

    # Evaluating ---------------------------------------------------------------------

    async def on_sample(self, snapshot: Snapshot) -> None:
        """A sampler listener: reload the rules, then evaluate them against ``snapshot``
        (sharing the outcome with the other gateways of the store when ``shared`` is set),
        letting the event loop run between turns of the evaluation."""
        async with self._evaluating:
            await self._on_sample(snapshot)

    async def _on_sample(self, snapshot: Snapshot) -> None:
        try:
            if self._defaults_for is not None:
                await install_defaults(self.store, self._defaults_for)
                self._defaults_for = None  # once per process (the store remembers it for good)
            self.rules = await self.store.list()
        except PushgateError as exc:
            log.warning("cannot read alert rules, keeping the last ones: %s", exc.detail)
        if self.shared is None:
            events: list[AlertEvent] = []
            for _ in self.advancing(snapshot, events):
                await asyncio.sleep(0)
            self._recorded(events)
            return
        try:
            await self._evaluate_shared(snapshot, self.shared)
        except PushgateError as exc:
            log.warning("cannot share alert state, evaluating again at the next sample: %s", exc.detail)
        finally:
            self._publish()

    async def _evaluate_shared(self, snapshot: Snapshot, shared: SharedAlerts) -> None:
        active = await shared.active()
        self._adopt(active, snapshot.at)
        recorded = []
        advanced: list[AlertEvent] = []
        for _ in self.advancing(snapshot, advanced):
            await asyncio.sleep(0)
        for event in advanced:
            if event.state == "fired":
                alert = self._alert_of(event)
                won = await shared.claim_fired(alert.to_dict())
            else:
                won = await shared.claim_resolved(event.tenant, event.rule_id, event.subject)
            if won:
                await shared.append(event.to_dict())
                self._record(event)
                recorded.append(event)
        self.history.clear()
        self.history.extend(AlertEvent(**doc) for doc in await shared.history())
        if recorded and self._on_change is not None:
            self._on_change()

    def _adopt(self, active: dict[tuple[str, str], dict[str, Any]], now: float) -> None:
        """Make the local states agree with what the store says is firing: another gateway
        fired or resolved it, or this one restarted."""
        rules = {r.id: r for r in self.rules}
        for key, doc in active.items():
            track = self._tracks.get(key)
            rule = rules.get(key[0])
            if track is None:
                if rule is None:
                    # Its rule is gone: a track of it lets advance() resolve (and delete) it.
                    rule = AlertRule(doc["rule_id"], doc["tenant"], doc["kind"], doc["threshold"])
                track = self._tracks[key] = _Track(rule, value=doc["value"])
            if not track.firing:
                track.firing, track.since, track.fired_at = True, None, doc["since"]
        for key, track in self._tracks.items():
            if track.firing and key not in active:
                track.firing, track.since = False, None

    def _alert_of(self, event: AlertEvent) -> Alert:
        return Alert(
            event.rule_id,
            event.kind,
            event.tenant,
            event.subject,
            event.value,
            event.threshold,
            event.at,
            event.description,
        )

    def evaluate(self, snapshot: Snapshot) -> list[AlertEvent]:
        """Advance every (rule, subject) state with ``snapshot`` and record the transitions
        here (one gateway, no sharing); return them."""
        events = self.advance(snapshot)
        self._recorded(events)
        return events

    def _recorded(self, events: list[AlertEvent]) -> None:
        for event in events:
            self._record(event)
        self._publish()
        if events and self._on_change is not None:
            self._on_change()

    def advance(self, snapshot: Snapshot) -> list[AlertEvent]:
        """Advance every (rule, subject) state with ``snapshot``; return the transitions
        (not recorded: :meth:`evaluate` or the shared claim does that)."""
        events: list[AlertEvent] = []
        for _ in self.advancing(snapshot, events):
            pass
        return events

    def advancing(self, snapshot: Snapshot, events: list[AlertEvent]) -> Iterator[None]:
        """:meth:`advance` a turn at a time, adding the transitions to ``events``: a pause
        (a ``yield``) after every ``PER_TURN`` queues observed and subjects stepped, for the
        event loop to run others (at 10,000 queues an evaluation in one go held a
        gateway's loop 40-80 ms). Readers see the states of the last finished evaluation
        (:meth:`active`), never those of one paused.

        Only what can move is looked at: a queue rule evaluates the queues whose sample
        changed since the snapshot evaluated before (``Snapshot.changed``) and the subjects
        it tracks (pending, firing or resolving). An unchanged queue that was at rest stays
        at rest: its value is the same, or for a windowed rule (``dlq_growth``,
        ``dead_lettered``) can only fall as its last change leaves the window. A rule new
        or changed since then, or a snapshot that does not follow the one evaluated before,
        evaluates every queue. So a tick at thousands of idle queues costs per change, not
        per queue."""
        now = snapshot.at
        rules = self.rules  # an add_rule during a pause is evaluated next time, whole
        live: set[tuple[str, str]] = set()
        follows = snapshot.changed is not None and snapshot.previous_at == self._evaluated_at
        tracked: dict[str, list[str]] = {}
        for rule_id, subject in self._tracks:
            tracked.setdefault(rule_id, []).append(subject)
        for rule in rules:
            queues: list[QueueSample] | None = None
            if follows and not rule.system and rule in self._evaluated_rules:
                assert snapshot.changed is not None
                queues = list(snapshot.changed)
                for subject in tracked.get(rule.id, ()):
                    q = snapshot.queue(rule.tenant, subject[len(rule.tenant) + 1 :])
                    if q is not None:
                        queues.append(q)
            if rule.system:
                values = observe(rule, snapshot, self.depth_history, self.rates)
            else:
                values = {}
                every = snapshot.queues if queues is None else queues
                for start in range(0, len(every), PER_TURN):
                    part = every[start : start + PER_TURN]
                    values.update(observe(rule, snapshot, self.depth_history, self.rates, part))
                    yield
            for n, (subject, value) in enumerate(values.items(), 1):
                if n % PER_TURN == 0:
                    yield
                key = (rule.id, subject)
                live.add(key)
                track = self._tracks.get(key)
                if track is None:
                    if not breaches(rule, value):
                        continue  # at rest, and stays so: nothing to track
                    track = self._tracks[key] = _Track(rule)
                track.rule, track.value = rule, value
                event = self._step(rule, subject, track, value, now)
                if event is not None:
                    events.append(event)
                if not track.firing and track.since is None:
                    del self._tracks[key]  # back at rest
        # A rule deleted, or a subject gone (queue deleted, node removed): resolve what fired.
        for key in [k for k in self._tracks if k not in live]:
            gone = self._tracks.pop(key)
            if gone.firing:
                events.append(self._event(gone.rule, key[1], "resolved", gone.value, now))
        self._evaluated_at = snapshot.at
        self._evaluated_rules = set(rules)
        self.evaluations += 1

    def _step(
        self, rule: AlertRule, subject: str, track: _Track, value: float, now: float
    ) -> AlertEvent | None:
        if not track.firing:
            if not breaches(rule, value):
                track.since = None
                return None
            if track.since is None:
                track.since = now
            if now - track.since < rule.hold_s:
                return None
            track.firing, track.since, track.fired_at = True, None, now
            return self._event(rule, subject, "fired", value, now)
        if not cleared(rule, value):
            track.since = None
            return None
        if track.since is None:
            track.since = now
        if now - track.since < rule.for_s:
            return None
        track.firing, track.since = False, None
        return self._event(rule, subject, "resolved", value, now)

    @staticmethod
    def _event(rule: AlertRule, subject: str, state: str, value: float, now: float) -> AlertEvent:
        return AlertEvent(
            now, state, rule.id, rule.kind, rule.tenant, subject, value, rule.threshold, rule.description
        )

    def _record(self, event: AlertEvent) -> None:
        self.history.append(event)
        self.transitions[(event.kind, event.state)] += 1
        log.warning(
            "alert %s: %s %s on %s (value %g, threshold %g)",
            event.state,
            event.rule_id,
            event.kind,
            event.subject,
            event.value,
            event.threshold,
        )
        if self.notifier is not None:
            self.notifier.enqueue({"alert": event.to_dict()})

    # Rules (the admin API and the console call these) -------------------------------

    async def add_rule(self, rule: AlertRule) -> AlertRule:
        await self.store.put(rule)
        self.rules = await self.store.list()
        return rule

    async def delete_rule(self, tenant: str, rule_id: str) -> None:
        await self.store.delete(tenant, rule_id)
        self.rules = await self.store.list()

    async def list_rules(self, tenant: str) -> list[AlertRule]:
        return await self.store.list(tenant)
