"""Every lease renewal of one coordinator on one long-lived etcd ``LeaseKeepAlive`` stream.

aetcd's ``refresh_lease`` opens a new gRPC stream for each renewal and ends it after the
answer. Each lease holder renews a third of a TTL after its last renewal, so at the dev
cluster's 1 s lease its five holders renewed 15 times a second, and a stream per renewal cost
about 1 ms more CPU between etcd and the holder than a request on a stream kept open (measured
at 10 renewals a second: etcd 17.3 against 14.7 ms a second, the Python client 20.2 against
12.8; bench/README.md, session 82).

etcd serves a ``LeaseKeepAlive`` stream's requests one at a time and answers each in order
(its ``leaseKeepAlive`` loop: receive, renew, send), so answers are matched to renewals in the
order they were written, and each answer's lease id is checked against its renewal's. A
lease etcd no longer holds is answered with TTL 0, which the session takes as lost.

Anything that goes wrong ends the stream: an error or the stream's end, an answer nobody
waits for or for another lease, a renewal not answered within its deadline. Every renewal
waiting on it then fails with :class:`~.coordinator.CoordinatorUnavailable` (the session
retries, ``etcd_coordinator.EtcdSession``), and the next renewal opens another stream, which
gRPC's round robin may place on another etcd member. The stream is a plain gRPC call on the
client's channel through aetcd's generated ``LeaseStub``, as the watches' ``WatchStub``
streams are (``etcd_coordinator._WatchStream``), and is stopped by cancelling the call, never
by cancelling a task waiting inside gRPC.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

import grpc
from aetcd import rpc

from .coordinator import CoordinatorUnavailable

# Errors a write on a stream gRPC has ended can raise (grpc.aio raises the call's status, or
# InvalidStateError / UsageError once the call is done).
_WRITE_ERRORS = (grpc.RpcError, asyncio.InvalidStateError, grpc.aio.UsageError)


class LeaseKeepAlive:
    """One ``LeaseKeepAlive`` stream; ``renew`` until ``broken``, then make another."""

    def __init__(self, channel: Any) -> None:
        self._call = rpc.LeaseStub(channel).LeaseKeepAlive()
        # Renewals written and not yet answered, oldest first: (lease id, the future of its TTL).
        self._waiting: collections.deque[tuple[int, asyncio.Future[int]]] = collections.deque()
        self._writing = asyncio.Lock()
        self._why_broken: str | None = None
        self._reader = asyncio.create_task(self._read(), name="etcd-lease-keepalive")

    @property
    def broken(self) -> bool:
        return self._why_broken is not None

    async def renew(self, lease_id: int, timeout_s: float) -> int:
        """The lease's TTL as etcd answers a renewal (0: etcd no longer holds it)."""
        if self._why_broken is not None:
            raise self._ended()
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                # gRPC takes one write at a time on a call; the order of the writes is the
                # order of the answers.
                async with self._writing:
                    if self._why_broken is not None:  # ended while this renewal waited to write
                        raise self._ended()
                    self._waiting.append((lease_id, answer))
                    await self._call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                return await answer
        except _WRITE_ERRORS as exc:
            self._end(f"{type(exc).__name__}: {exc}")
            raise self._ended() from None
        except TimeoutError:
            # The answer may still come, after the next renewal's: no renewal can be matched
            # on this stream any more.
            self._end(f"a renewal not answered within {timeout_s:g} s")
            raise CoordinatorUnavailable(
                f"etcd: no answer to a lease renewal within {timeout_s:g} s"
            ) from None
        except asyncio.CancelledError:
            self._end("a renewal was cancelled")  # its answer could be taken for the next one's
            raise
        finally:
            answer.cancel()  # nobody waits for it any more: the reader sets nothing on it

    async def close(self) -> None:
        self._end("closed")
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    def _ended(self) -> CoordinatorUnavailable:
        return CoordinatorUnavailable(f"etcd: the keep-alive stream ended ({self._why_broken})")

    def _end(self, why: str) -> None:
        if self._why_broken is None:
            self._why_broken = why
        self._call.cancel()  # ends the reader's read; it fails the renewals still waiting

    async def _read(self) -> None:
        why = "the stream ended"
        try:
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF:
                    break
                if not self._waiting:
                    why = f"an answer for lease {reply.ID:x} nobody waits for"
                    break
                lease_id, answer = self._waiting[0]
                if lease_id != reply.ID:  # left waiting: it fails with the others below
                    why = f"an answer for lease {reply.ID:x} where {lease_id:x} was asked"
                    break
                self._waiting.popleft()
                if not answer.done():
                    answer.set_result(int(reply.TTL))
        except grpc.RpcError as exc:
            why = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            why = "the stream was cancelled"  # _end(), or the channel closed
        finally:
            self._end(why)
            while self._waiting:
                _, answer = self._waiting.popleft()
                if not answer.done():
                    answer.set_exception(self._ended())
