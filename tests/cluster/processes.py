"""Real cluster processes for tests and benchmarks: ``pushgate node`` and ``pushgate manager``
as child processes, each in its own process group (stopped by PID, frozen with SIGSTOP), on
free loopback ports, coordinated through a real etcd under a key prefix of their own.

:class:`ClusterHarness` starts them, writes queue attributes to etcd as a gateway would, and
finds partition leaders from etcd; :meth:`ClusterHarness.send_until_ok` is what a gateway's
client does with a send: retry the same message (same dedupe id) on whoever leads now.

With ``start(..., proxied=True)`` every node sits behind TCP proxies the test controls
(:class:`~.network.ClusterNetwork`): ``addresses`` are then the proxies others dial,
``listen`` the nodes' real ports, and ``network.isolate(node)`` cuts one off.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend_store.cluster.client.node_pool import NodePool
from backend_store.cluster.coordination import pools
from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import (
    Layout,
    LeaderRecord,
    NodeRecord,
    PartitionRecord,
    pack,
    unpack,
)
from backend_store.errors import PushgateError, StaleEpoch, Unavailable
from backend_store.types import Epoch, NewMessage, PeekedMessage, QueueName, SendResult, TenantId
from gateway.local_ports import free_ports

from .network import ClusterNetwork

REPO = Path(__file__).resolve().parents[2]


def _scale() -> float:
    return float(os.environ.get("PUSHGATE_TEST_TIMEOUT_SCALE", "1"))


@dataclass
class ClusterProcess:
    """One ``pushgate node`` or ``pushgate manager`` child; restartable with the same arguments."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    # Run before the command, which it must exec in its place (the PID stays the node's):
    # tests/cluster/test_full_disks.py puts a node's data on a small tmpfs of its own.
    wrapper: Sequence[str] = ()

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*self.wrapper, sys.executable, "-m", "gateway.cli", *self.argv],
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL (no clean-up: the lease expires after its TTL)."""
        if self.running:
            self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=10 * _scale())

    def stop(self) -> None:
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGCONT)  # a frozen one must run to exit
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5 * _scale())
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 12000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def _warnings(log: str) -> str:
    """A process's log lines at WARNING or above, without its task dump (``pushgate.tasks``);
    of a traceback, only its last line (what was raised)."""
    return "\n".join(
        line
        for line in log.splitlines()
        if (" WARNING " in line or " ERROR " in line or " CRITICAL " in line or _RAISED.match(line))
        and "pushgate.tasks" not in line
    )


@dataclass
class ClusterHarness:
    endpoints: list[str]
    root: Path
    prefix: str
    lease_ttl: float = 2.0
    nodes: dict[str, ClusterProcess] = field(default_factory=dict)
    # What other nodes and gateways dial (a proxy when proxied), and the real listen address.
    addresses: dict[str, str] = field(default_factory=dict)
    listen: dict[str, str] = field(default_factory=dict)
    network: ClusterNetwork | None = None
    managers: list[ClusterProcess] = field(default_factory=list)
    coordinator: EtcdCoordinator | None = None
    pool: NodePool | None = None

    @property
    def layout(self) -> Layout:
        return Layout(self.prefix)

    async def start(
        self,
        nodes: int = 3,
        managers: int = 1,
        *,
        running: int | None = None,
        proxied: bool = False,
        node_args: Sequence[str] | Callable[[str], Sequence[str]] = (),
        manager_args: Sequence[str] = (),
        client_tls: ssl.SSLContext | None = None,
    ) -> ClusterHarness:
        """Start ``managers`` and the first ``running`` (default: all) of ``nodes`` nodes; the
        others are ready to ``start()`` later (a node joining). ``proxied``: each node behind
        proxies the test controls (``self.network``). ``node_args``: more options for every node
        (or a function of the node's name giving them); ``manager_args`` for every manager
        (``--partitions 4``). ``client_tls``: ``self.pool`` dials
        the nodes with it."""
        self.coordinator = await EtcdCoordinator(self.endpoints).connect()
        self.pool = NodePool("test-gateway", timeout_s=3 * _scale(), tls=client_tls)
        etcd = ",".join(self.endpoints)
        ports = free_ports(nodes)
        if proxied:
            self.network = ClusterNetwork(self.endpoints)
        for i in range(nodes):
            name = f"n{i}"
            address = self.listen[name] = self.addresses[name] = f"127.0.0.1:{ports[i]}"
            argv = ["node", "--data", str(self.root / name), "--listen", address]
            if self.network is None:
                argv += ["--etcd", etcd]
            else:
                links = await self.network.add_node(name, address)
                self.addresses[name] = links.advertise
                argv += ["--advertise", links.advertise, "--etcd", links.etcd_endpoints]
            extra = node_args(name) if callable(node_args) else node_args
            argv += ["--id", name, "--prefix", self.prefix, "--lease-ttl", str(self.lease_ttl), *extra]
            self.nodes[name] = ClusterProcess(name, [*argv, "--log-level", "info"], self.root / f"{name}.log")
        for i in range(managers):
            argv = ["manager", "--etcd", etcd, "--id", f"m{i}", "--prefix", self.prefix]
            argv += ["--lease-ttl", str(self.lease_ttl), "--log-level", "info", *manager_args]
            self.managers.append(ClusterProcess(f"m{i}", argv, self.root / f"m{i}.log"))
        started = list(self.nodes.values())[:running]
        for proc in [*started, *self.managers]:
            proc.start()
        # A test's first queue is placed on the nodes live at that moment: wait for them all,
        # or a slow start (a loaded machine) leaves it with fewer replicas than it asked for.
        await self.wait_registered([proc.name for proc in started])
        return self

    async def wait_registered(self, names: Sequence[str]) -> None:
        """Until each named node has registered itself in etcd."""

        async def registered() -> bool:
            return set(names) <= (await self.node_records()).keys()

        await self.wait_for(f"nodes {', '.join(names)} to register", registered)

    async def close(self) -> None:
        for proc in [*self.managers, *self.nodes.values()]:
            proc.stop()
        if self.pool is not None:
            await self.pool.close()
        if self.coordinator is not None:
            await self.coordinator.close()
        if self.network is not None:
            await self.network.close()

    def logs(self) -> str:
        # Each live process logs its tasks and where they wait (SIGUSR1), for a hang's diagnosis.
        asked = [p for p in [*self.managers, *self.nodes.values()] if p.running]
        before = {p.name: p.log_path.stat().st_size if p.log_path.exists() else 0 for p in asked}
        for proc in asked:
            proc.signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5 * _scale()
        while time.monotonic() < deadline and any(
            "pushgate.tasks" not in p.log_path.read_text(errors="replace")[before[p.name] :] for p in asked
        ):
            time.sleep(0.05)
        everyone = [*self.nodes.values(), *self.managers]
        # Warnings first, nodes before managers: CI keeps a failure's first lines, and the
        # task dumps and INFO lines (a watch re-opening, a link closing) are long.
        brief = "\n".join(f"--- {p.name}: warnings and errors\n{_warnings(p.log_tail())}" for p in everyone)
        whole = "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in everyone)
        return f"{brief}\n=== the logs' ends, with each live process's tasks (SIGUSR1)\n{whole}"

    # etcd, as a gateway and an operator see it ---------------------------------------------

    async def create_queue(self, tenant: str, queue: str, attributes: dict[str, Any]) -> None:
        assert self.coordinator is not None
        await self.coordinator.put(self.layout.queue(tenant, queue), pack(attributes))

    async def manager_command(self, *args: str) -> None:
        """A one-shot ``pushgate manager`` (``--drain NODE``, ``--undrain NODE``)."""
        argv = ["manager", "--etcd", ",".join(self.endpoints), "--prefix", self.prefix, *args]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli",
            *argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), 30 * _scale())
        assert proc.returncode == 0, output.decode(errors="replace")

    async def partitions(self) -> dict[int, PartitionRecord]:
        assert self.coordinator is not None
        state = await self.coordinator.read_prefix(self.layout.partitions)
        return {int(k): PartitionRecord.unpack(v) for k, v in state.values().items() if k.isdigit()}

    async def node_records(self) -> dict[str, NodeRecord]:
        assert self.coordinator is not None
        state = await self.coordinator.read_prefix(self.layout.nodes)
        return {k: NodeRecord.unpack(v) for k, v in state.values().items()}

    async def leader(self, partition: int) -> tuple[str, str, Epoch] | None:
        """(node id, address, epoch) of the partition's leader key, if any."""
        assert self.coordinator is not None
        entry = await self.coordinator.get(self.layout.leader(partition))
        if entry is None:
            return None
        record = LeaderRecord.unpack(entry.value)
        return record.node, record.address, record.epoch(entry.create_revision)

    async def wait_for(self, what: str, check: Any, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout * _scale()
        while True:
            try:
                value = await check()
            except CoordinatorUnavailable:  # etcd slow under load (its fsyncs): ask again
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{await self.summary()}{self.logs()}")
            await asyncio.sleep(0.05)

    async def summary(self) -> str:
        """What etcd holds now of each node and partition, a line each: put ahead of the logs
        on a timeout, since CI shows a failure's first and last lines only (a late-restore
        failure of session 44's CI left its node logs in the cut middle)."""
        try:
            records = await self.node_records()
            partitions = await self.partitions()
            leaders = {pid: await self.leader(pid) for pid in partitions}
        except Exception as exc:  # a diagnosis that fails must not hide the timeout it explains
            return f"(etcd not read: {type(exc).__name__}: {exc})\n"
        lines = [
            f"node {n}: {r.state} replicas={sorted(r.replicas)} strays={sorted(r.strays)}"
            + (f" refusal={r.refusal!r}" if r.refusal else "")
            for n, r in sorted(records.items())
        ]
        for pid, rec in sorted(partitions.items()):
            leader = leaders[pid]
            lines.append(
                f"partition {pid} ({rec.tenant}/{rec.queue}#{rec.index}): members={list(rec.members)}"
                f" leader={leader[0] if leader else None}"
            )
        missing = sorted(set(self.nodes) - set(records))
        if missing:
            lines.append(f"no record in etcd: {missing}")
        return "".join(f"{line}\n" for line in lines)

    async def partition_of(self, tenant: str, queue: str, index: int = 0) -> int:
        """The partition holding partition ``index`` of the queue: its placement's (a queue
        on a pool, docs/cluster.md "Shared partitions"), or its own (made before pools)."""

        async def find() -> int | None:
            assert self.coordinator is not None
            entry = await self.coordinator.get(self.layout.queue(tenant, queue))
            placed = pools.placement(unpack(entry.value)) if entry is not None else None
            if placed is not None:
                return placed[index] if index < len(placed) else None
            for pid, rec in (await self.partitions()).items():
                if (rec.tenant, rec.queue, rec.index) == (tenant, queue, index):
                    return pid
            return None

        pid: int = await self.wait_for(f"a partition for {queue}", find)
        return pid

    async def serving_leader(self, partition: int, *, not_node: str | None = None) -> tuple[str, str, Epoch]:
        async def find() -> tuple[str, str, Epoch] | None:
            found = await self.leader(partition)
            return found if found is not None and found[0] != not_node else None

        leader: tuple[str, str, Epoch] = await self.wait_for(f"a leader of partition {partition}", find)
        return leader

    # Requests, as a gateway makes them --------------------------------------------------------

    async def call(self, partition: int, op: str, **kwargs: Any) -> Any:
        """``op`` on the partition's current leader (no retry)."""
        assert self.pool is not None
        found = await self.leader(partition)
        if found is None:
            raise Unavailable(f"partition {partition} has no leader")
        node, address, epoch = found
        return await self.pool.client(node, address).call(op, partition, epoch, **kwargs)

    async def send_until_ok(
        self, partition: int, tenant: str, queue: str, body: str, timeout: float = 30
    ) -> SendResult:
        """Send one message, retrying it (same dedupe id) through failovers until acknowledged."""
        deadline = time.monotonic() + timeout * _scale()
        message = NewMessage(body.encode(), dedupe_id=body)
        while True:
            try:
                (result,) = await self.call(
                    partition, "send", tenant=TenantId(tenant), queue=QueueName(queue), messages=[message]
                )
            except (Unavailable, StaleEpoch) as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"send of {body} never acknowledged: {exc}\n{self.logs()}") from None
                await asyncio.sleep(0.05)
                continue
            if isinstance(result, PushgateError):
                raise result
            assert isinstance(result, SendResult)
            return result

    async def call_until_ok(self, partition: int, op: str, timeout: float = 30, **kwargs: Any) -> Any:
        """An idempotent ``op`` (a read) retried through failovers, as a gateway retries it."""
        deadline = time.monotonic() + timeout * _scale()
        while True:
            try:
                return await self.call(partition, op, **kwargs)
            except (Unavailable, StaleEpoch) as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{op} never answered: {exc}\n{self.logs()}") from None
                await asyncio.sleep(0.05)

    async def read_log(self, partition: int, tenant: str, queue: str) -> list[PeekedMessage]:
        """Every message the partition's leader holds for the queue, in order (a peek: changes
        nothing, so it is retried safely through a leader change; up to 1,000)."""
        peeked: list[PeekedMessage] = await self.call_until_ok(
            partition, "peek", tenant=TenantId(tenant), queue=QueueName(queue), max_messages=1000
        )
        assert len(peeked) < 1000, "more messages than one peek shows"
        return peeked

    async def read_queue(self, partition: int, tenant: str, queue: str) -> list[str]:
        """The bodies of :meth:`read_log`."""
        return [m.body.decode() for m in await self.read_log(partition, tenant, queue)]
