"""The simulated network: TCP connections between processes, with delays, losses and cuts.

Every byte between two processes goes through a :class:`Pipe` (one direction of one
connection). A pipe behaves as TCP over a bad network does, and no better:

- **Delay and reordering.** Each write takes a latency drawn from the seeded generator
  (a spike now and then, more on a host made slow); within one connection bytes arrive in
  order (TCP reassembles), while different connections, and etcd's replies to different
  calls, overtake each other freely.
- **Loss.** A lost segment costs a retransmission timeout (200 ms, doubling while the path
  stays cut, at most 1.6 s); nothing is lost for good while both ends live.
- **Partitions**, one-way or both: a cut direction (:meth:`Network.cut`) delivers nothing
  until it heals, then everything held, in order; a new connection across it times out.
- **Resets** (:meth:`Network.reset`): both ends see the connection drop and what was in
  flight is gone; senders then dial again and resend, which is how duplicated frames reach
  the protocol (TCP itself never duplicates).
- A frozen process's socket buffers fill: what it sends and receives is held until it thaws.
  A killed one's kernel closes its sockets (a FIN after what it had sent; a reset for
  whatever arrives later).

Streams (:meth:`Network.open_connection`) are real ``asyncio.StreamReader`` /
``StreamWriter`` pairs on a :class:`SimTransport`, so the node protocol's production code
(:class:`~backend_store.cluster.protocol.stream.NodeStream`) runs on them unchanged.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from .kernel import Process, Trace

RTO_S = 0.2
MAX_RTO_S = 1.6

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]

_FIN = object()
_RST = object()


class Pipe:
    """One direction of a connection: items from ``src`` to whatever ``deliver`` feeds on
    ``dst``, in order."""

    def __init__(
        self,
        network: Network,
        src: Process,
        dst: str,
        deliver: Callable[[Any], None],
        receiver: Callable[[], Process | None],
    ) -> None:
        self.network = network
        self.src = src
        self.dst = dst
        self._deliver = deliver
        self._receiver = receiver
        self._queue: deque[tuple[float, Any]] = deque()
        self._last_at = 0.0
        self._armed = False
        self._held_in: list[Any] = []  # arrived at a frozen receiver

    def send(self, item: Any) -> None:
        loop = asyncio.get_running_loop()
        at = max(loop.time() + self.network.latency(self.src.name, self.dst), self._last_at + 1e-6)
        self._last_at = at
        self._queue.append((at, item))
        if not self._armed:
            self._armed = True
            loop.call_at(at, self._pump, RTO_S)

    def discard(self) -> None:
        """Drop what is in flight (a reset)."""
        self._queue.clear()
        self._held_in.clear()

    def _pump(self, rto: float) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            at, item = self._queue[0]
            if at > loop.time():
                loop.call_at(at, self._pump, RTO_S)
                return
            if not self.network.passes(self.src.name, self.dst):
                # Retransmitted until the path heals (TCP does not give up in seconds).
                loop.call_later(rto, self._pump, min(rto * 2, MAX_RTO_S))
                return
            self._queue.popleft()
            self._arrive(item)
        self._armed = False

    def _arrive(self, item: Any) -> None:
        receiver = self._receiver()
        if receiver is not None and receiver.frozen:
            if not self._held_in:
                receiver.on_thaw(self._release)
            self._held_in.append(item)
            return
        if self._held_in:
            self._held_in.append(item)
            return
        self._deliver(item)

    def _release(self) -> None:
        held, self._held_in = self._held_in, []
        for item in held:
            self._deliver(item)


class SimTransport(asyncio.Transport):
    """One end of a simulated TCP connection, under an asyncio stream protocol."""

    def __init__(self, network: Network, proc: Process, peer_host: str, label: str) -> None:
        super().__init__()
        self.network = network
        self.proc = proc
        self.peer_host = peer_host
        self.label = label
        self.peer: SimTransport | None = None
        self.pipe: Pipe | None = None  # our sending direction
        self.protocol: asyncio.BaseProtocol | None = None
        self._closing = False
        self._lost = False
        self._held_out: list[Any] = []  # written while our process was frozen

    # asyncio.Transport ------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not self.proc.alive or self.pipe is None:
            return
        self._send(bytes(data))

    def _send(self, item: Any) -> None:
        assert self.pipe is not None
        if self.proc.frozen:
            if not self._held_out:
                self.proc.on_thaw(self._release_out)
            self._held_out.append(item)
            return
        self.pipe.send(item)

    def _release_out(self) -> None:
        held, self._held_out = self._held_out, []
        if self.pipe is not None:
            for item in held:
                self.pipe.send(item)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self.pipe is not None and self.proc.alive:
            self._send(_FIN)
        asyncio.get_running_loop().call_soon(self._connection_lost, None)

    def abort(self) -> None:
        """A reset from this end: what is in flight either way is dropped."""
        self._closing = True
        if self.pipe is not None:
            self.pipe.discard()
            self.pipe.send(_RST)
        if self.peer is not None and self.peer.pipe is not None:
            self.peer.pipe.discard()
        asyncio.get_running_loop().call_soon(self._connection_lost, ConnectionResetError("reset"))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return not self._closing

    # The network's side -----------------------------------------------------------

    def killed(self) -> None:
        """Our process died: its kernel closes the socket (FIN after what was sent)."""
        if not self._closing and self.pipe is not None:
            self._closing = True
            self.pipe.send(_FIN)
        self._connection_lost(None)

    def receive(self, item: Any) -> None:
        if not self.proc.alive:
            # The process died: its closed socket answers whatever still arrives with a reset.
            if item is not _RST and item is not _FIN and self.pipe is not None:
                self.pipe.send(_RST)
            return
        if self._lost:
            return
        protocol = self.protocol
        assert isinstance(protocol, asyncio.Protocol)
        if item is _FIN:
            protocol.eof_received()
            if self._closing:
                self._connection_lost(None)
        elif item is _RST:
            self._closing = True
            if self.pipe is not None:
                self.pipe.discard()
            self._connection_lost(ConnectionResetError("connection reset by peer"))
        else:
            protocol.data_received(item)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self.protocol is not None:
            self.protocol.connection_lost(exc)


class Network:
    """Hosts, their listening services, and the state of every path between them."""

    def __init__(self, rng: random.Random, trace: Trace) -> None:
        self.rng = rng
        self.trace = trace
        self.processes: dict[str, Process] = {}
        self._services: dict[tuple[str, str], tuple[Process, Handler]] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._slow: dict[str, float] = {}  # host -> extra one-way delay (s)
        self.loss = 0.0  # chance a write is lost once (retransmitted after RTO_S)
        self.spikes = 0.002  # chance a write is delayed by a spike (5-300 ms)
        self._transports: dict[str, list[SimTransport]] = {}

    # Paths --------------------------------------------------------------------------

    def passes(self, src: str, dst: str) -> bool:
        return (src, dst) not in self._blocked

    def cut(self, src: str, dst: str) -> None:
        """Nothing from ``src`` reaches ``dst`` (one direction) until :meth:`heal`."""
        self._blocked.add((src, dst))

    def heal(self, src: str, dst: str) -> None:
        self._blocked.discard((src, dst))

    def heal_all(self) -> None:
        self._blocked.clear()
        self._slow.clear()
        self.loss = 0.0

    def blocked(self) -> list[tuple[str, str]]:
        return sorted(self._blocked)

    def set_slow(self, host: str, extra_s: float) -> None:
        if extra_s > 0:
            self._slow[host] = extra_s
        else:
            self._slow.pop(host, None)

    def latency(self, src: str, dst: str) -> float:
        rng = self.rng
        delay = 0.0002 + rng.random() * 0.0008 + self._slow.get(src, 0.0) + self._slow.get(dst, 0.0)
        if self.spikes and rng.random() < self.spikes:
            delay += 0.005 + rng.random() * 0.3
        if self.loss and rng.random() < self.loss:
            delay += RTO_S
        return delay

    # Processes and services ---------------------------------------------------------------

    def attach(self, proc: Process) -> None:
        """``proc`` is now the process on its host (a restart replaces the previous one)."""
        self.processes[proc.name] = proc
        proc.on_kill(lambda: self._killed(proc))

    def listen(self, proc: Process, service: str, handler: Handler) -> None:
        self._services[(proc.name, service)] = (proc, handler)

    def _killed(self, proc: Process) -> None:
        for key in [k for k, (p, _) in self._services.items() if p is proc]:
            del self._services[key]
        for transport in self._transports.pop(proc.name, []):
            if transport.proc is proc:
                transport.killed()

    def pipe(
        self,
        src: Process,
        dst: str,
        deliver: Callable[[Any], None],
        receiver: Callable[[], Process | None],
    ) -> Pipe:
        return Pipe(self, src, dst, deliver, receiver)

    async def open_connection(
        self, proc: Process, host: str, service: str, *, timeout_s: float = 2.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Dial ``service`` on ``host``: one round trip; ``ConnectionRefusedError`` if
        nothing listens there, ``TimeoutError`` if the path is cut either way."""
        loop = asyncio.get_running_loop()
        rtt = self.latency(proc.name, host) + self.latency(host, proc.name)
        if not (self.passes(proc.name, host) and self.passes(host, proc.name)):
            await asyncio.sleep(timeout_s)
            raise TimeoutError(f"connect to {host} timed out")
        await asyncio.sleep(rtt)
        await proc.awake()
        if not proc.alive:
            raise ConnectionRefusedError("the dialling process is dead")
        found = self._services.get((host, service))
        if found is None or not found[0].alive:
            raise ConnectionRefusedError(f"nothing listens for {service} on {host}")
        server, handler = found
        label = f"{proc.name}->{host}/{service}"
        ours = SimTransport(self, proc, host, label)
        theirs = SimTransport(self, server, proc.name, label)
        ours.peer, theirs.peer = theirs, ours
        ours.pipe = Pipe(self, proc, host, theirs.receive, lambda: server)
        theirs.pipe = Pipe(self, server, proc.name, ours.receive, lambda: proc)
        self._transports.setdefault(proc.name, []).append(ours)
        self._transports.setdefault(host, []).append(theirs)
        self._prune(proc.name)
        self._prune(host)
        reader, writer = _stream(loop, ours)
        server_reader, server_writer = _stream(loop, theirs)
        server.spawn(_serve(server, handler, server_reader, server_writer, proc.name), f"serve {label}")
        return reader, writer

    def _prune(self, host: str) -> None:
        transports = self._transports.get(host, [])
        if len(transports) > 64:
            self._transports[host] = [t for t in transports if not t._lost]

    def reset(self, host: str, peer: str | None = None) -> int:
        """Reset the connections of ``host`` (to ``peer`` only, if given); return how many."""
        count = 0
        for transport in list(self._transports.get(host, [])):
            if transport._lost or (peer is not None and transport.peer_host != peer):
                continue
            transport.abort()
            count += 1
        return count

    def connections(self, host: str) -> list[SimTransport]:
        return [t for t in self._transports.get(host, []) if not t._lost]


async def _serve(
    server: Process, handler: Handler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
) -> None:
    await server.awake()
    await handler(reader, writer, peer)


def _stream(
    loop: asyncio.AbstractEventLoop, transport: SimTransport
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader = asyncio.StreamReader(limit=2**24, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport.protocol = protocol
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer
