"""Message move tasks (StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask).

A move task is Pushgate's redrive (``DeadLetters.redrive``, the same call as ``POST
/v1/queues/{queue}/redrive``) run in chunks by the gateway that started it: each chunk moves
each message exactly once, in one atomic step of the store, so a task cut short (a cancel, a
gateway that stops) never moves a message twice; moving what is left is another task.

A task's record lives in the store's metadata (namespace :data:`NAMESPACE`), so any gateway
lists it and cancels it. A cancel is a key of its own (namespace :data:`CANCELS`), never a
change to the record: the running gateway rewrites the record after each chunk, and a
cancel written into it between the runner's read and its write was lost (the task ran to
``COMPLETED``; tests/sqs/test_move_tasks.py, once requests stopped waiting 40 ms each). The
runner looks for the key before each chunk; a ``RUNNING`` record with one is listed as
``CANCELLING``. A ``RUNNING`` record not updated for :data:`STALE_S` belongs to a gateway
that stopped: it is listed as ``FAILED``.

Like AWS, a task moves at most the messages its source held when it started
(``ApproximateNumberOfMessagesToMove``), one task per source at a time, and at most
``MaxNumberOfMessagesPerSecond`` a second when that is given.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from backend_store.backend import Backend, DeadLetters
from backend_store.errors import PushgateError
from backend_store.types import QueueName, TenantId

from .errors import SqsError

logger = logging.getLogger("pushgate.sqs")

NAMESPACE = "sqs_move_tasks"
CANCELS = "sqs_move_task_cancels"
RUNNING, COMPLETED, CANCELLING, CANCELLED, FAILED = (
    "RUNNING",
    "COMPLETED",
    "CANCELLING",
    "CANCELLED",
    "FAILED",
)
STALE_S = 60.0
# Messages per redrive call when no rate is given.
CHUNK = 1000
# AWS's bounds on MaxNumberOfMessagesPerSecond.
MAX_RATE = 500


@dataclass(slots=True)
class MoveTask:
    """One task's record (times in epoch milliseconds, as AWS gives them)."""

    handle: str
    tenant: str
    source: str
    destination: str
    rate: int | None
    to_move: int
    moved: int
    status: str
    started_ms: int
    updated_ms: int
    failure: str | None = None

    def key(self) -> str:
        return _key(TenantId(self.tenant), QueueName(self.source), self.handle)


def _key(tenant: TenantId, source: QueueName, handle: str) -> str:
    return f"{tenant}/{source}/{handle}"


def handle_parts(handle: str) -> tuple[QueueName, str]:
    """The source queue and the token a task handle names (``ResourceNotFoundException`` else)."""
    source, sep, token = handle.rpartition(":")
    if not sep or not source or not token:
        raise SqsError(
            "ResourceNotFoundException", "The resource that you specified for the TaskHandle does not exist."
        )
    return QueueName(source), handle


class MoveTasks:
    """Start, list and cancel move tasks; runs the ones this gateway started."""

    def __init__(self, backend: Backend, clock: Callable[[], float] = time.time) -> None:
        self._backend = backend
        self._clock = clock
        self._running: dict[str, asyncio.Task[None]] = {}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _dead_letters(self) -> DeadLetters:
        if not isinstance(self._backend, DeadLetters):
            raise SqsError("UnsupportedOperation", "This store cannot move messages.")
        return self._backend

    async def _save(self, task: MoveTask) -> None:
        task.updated_ms = self._now_ms()
        await self._backend.meta_put(NAMESPACE, task.key(), orjson.dumps(asdict(task)))

    async def _load(self, key: str) -> MoveTask | None:
        raw = await self._backend.meta_get(NAMESPACE, key)
        return None if raw is None else MoveTask(**orjson.loads(raw))

    def _as_listed(self, task: MoveTask, cancelled: bool) -> MoveTask:
        if task.status == RUNNING and cancelled:
            task.status = CANCELLING
        if task.status in (RUNNING, CANCELLING) and self._now_ms() - task.updated_ms > STALE_S * 1000:
            task.status, task.failure = FAILED, "the gateway running the task stopped"
        return task

    async def list(self, tenant: TenantId, source: QueueName) -> list[MoveTask]:
        """The source's tasks, the most recent first."""
        prefix = f"{tenant}/{source}/"
        found = await self._backend.meta_list(NAMESPACE, prefix)
        cancels = {key for key, _ in await self._backend.meta_list(CANCELS, prefix)}
        tasks = [MoveTask(**orjson.loads(raw)) for _, raw in found]
        tasks = [self._as_listed(task, task.key() in cancels) for task in tasks]
        return sorted(tasks, key=lambda t: t.started_ms, reverse=True)

    async def start(
        self, tenant: TenantId, source: QueueName, destination: QueueName, rate: int | None, to_move: int
    ) -> MoveTask:
        dead_letters = self._dead_letters()
        if any(t.status in (RUNNING, CANCELLING) for t in await self.list(tenant, source)):
            raise SqsError(
                "InvalidParameterValue",
                "There is already a task running. Only one active task is allowed for a source queue arn at a given time.",
            )
        now = self._now_ms()
        handle = f"{source}:{secrets.token_urlsafe(12)}"
        task = MoveTask(handle, tenant, source, destination, rate, to_move, 0, RUNNING, now, now)
        await self._save(task)
        runner = asyncio.create_task(self._run(task, dead_letters))
        self._running[handle] = runner
        runner.add_done_callback(lambda _: self._running.pop(handle, None))
        return task

    async def cancel(self, tenant: TenantId, handle: str) -> MoveTask:
        source, handle = handle_parts(handle)
        key = _key(tenant, source, handle)
        task = await self._load(key)
        cancelled = await self._backend.meta_get(CANCELS, key) is not None
        if task is None or self._as_listed(task, cancelled).status != RUNNING:
            raise SqsError(
                "ResourceNotFoundException",
                "The resource that you specified for the TaskHandle does not exist.",
            )
        await self._backend.meta_put(CANCELS, key, b"")
        task.status = CANCELLING
        return task

    async def _run(self, task: MoveTask, dead_letters: DeadLetters) -> None:
        tenant, source, to = TenantId(task.tenant), QueueName(task.source), QueueName(task.destination)
        try:
            while task.moved < task.to_move:
                if await self._backend.meta_get(CANCELS, task.key()) is not None:
                    task.status = CANCELLED
                    break
                chunk = min(task.rate or CHUNK, task.to_move - task.moved)
                started = time.monotonic()
                moved = await dead_letters.redrive(tenant, source, to, chunk)
                task.moved += moved
                if moved == 0:
                    break
                await self._save(task)
                if task.rate is not None:
                    await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
            if task.status == RUNNING:
                task.status = COMPLETED
        except PushgateError as exc:
            task.status, task.failure = FAILED, str(exc.detail)
        except Exception:
            logger.exception("message move task %s failed", task.handle)
            task.status, task.failure = FAILED, "internal error"
        try:
            await self._save(task)
            # The record says how it ended now: a cancel that came too late to stop it is moot.
            await self._backend.meta_delete(CANCELS, task.key())
        except PushgateError:
            logger.warning("message move task %s: its final state could not be saved", task.handle)


def listed(task: MoveTask, arn: Callable[[str], str]) -> dict[str, Any]:
    """A task as ListMessageMoveTasks returns it (``arn`` names a queue of the task's tenant)."""
    out: dict[str, Any] = {
        "TaskHandle": task.handle,
        "Status": task.status,
        "SourceArn": arn(task.source),
        "DestinationArn": arn(task.destination),
        "ApproximateNumberOfMessagesMoved": task.moved,
        "ApproximateNumberOfMessagesToMove": task.to_move,
        "StartedTimestamp": task.started_ms,
    }
    if task.rate is not None:
        out["MaxNumberOfMessagesPerSecond"] = task.rate
    if task.failure is not None:
        out["FailureReason"] = task.failure
    return out
