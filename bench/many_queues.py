"""Issue 49's targets, many queues: a ``pushgate dev-cluster`` beside a gateway on the embedded store.

Per round, the same client (httpx, keep-alive, ``--producers`` concurrent tasks) runs the same
steps against a ``pushgate serve`` on the embedded store and then against a ``pushgate
dev-cluster`` (etcd, 3 nodes, 2 managers, a gateway; queues RF 3 sync; ``--partitions N``
sets its pools' partitions), each started in a temporary directory and stopped by PID /
process group at the end of its turn:

1. create ``--few`` queues, let the cluster settle, and read each node's threads, open files
   and RSS from ``/proc/PID`` and etcd's key count; create the rest (``--queues`` in all)
   and print the rate; read them again (per queue: RSS and etcd keys). At both sizes, every
   server process's CPU over ``--idle`` seconds with nothing asked of it (what holding the
   queues costs: the monitor's samples, the sweeps, watches and checks);
2. ``GET /v1/queues?limit=1000`` and SQS ``ListQueues`` ``MaxResults=1000`` (``--lists``
   times each; the median), ``GET`` one queue (``--gets`` times, a random queue each; p50);
3. one send to each queue from ``--producers`` producers: the rate and how many were refused;
   then idle CPU again, each queue holding its message;
4. ``--consumers`` WebSocket consumers (manual ack), one per queue, each until it got and
   acked every message acknowledged to its queue;
   on the cluster, the partitions whose leader changed with no fault since the first queues
   settled (``leader changes, no fault``: a lease or a quorum lost to a process stalled by
   the steps' load, what a shorter ``--lease-ttl`` risks);
5. on the cluster only, ``--faults`` (``stop``, ``kill``): SIGSTOP or SIGKILL of a node that
   leads partitions (the most; a follower's fault would fail nothing over), then
   every producer sends to the queues that took no send begun after the signal, until all
   have (or ``--fault-timeout``): the time of the last queue (the target) and the median,
   bounded below by the producers' rate (the floor printed beside it). Meanwhile each
   partition the node led is asked, on its new leader, for the stats of all its queues in one
   request until it answers (a leader answers only once it serves every queue named): when
   the last did (``every queue served``, what the failover costs a queue whatever the
   producers' rate; ``probe's own answer``: the same request asked again at once, the part
   of that figure the answer itself costs), and how many sends were refused though begun after
   their queue's partition had its new leader key (0: no queue waits past its partition). A
   frozen node gets SIGCONT once all queues took a send; a killed one stays dead;
6. on the cluster, every queue is peeked: an acknowledged send neither delivered to a
   consumer nor found is lost (must be 0);
7. after the cluster's turn, the embedded store's create and send steps again, on a gateway
   of its own: its rates and CPU a create and a send are the mean of its two turns, so that
   the host's drift between the turns cancels (``bracket``); both are printed.

A step that fails (a 503, a timeout) is counted and printed, never retried for the figure.
It prints the machine, the fdatasync cost of the temporary directory's disk and the load
average, a table per round (cluster / embedded ratios beside the issue's targets) and the
ranges over ``--rounds``.

    .venv/bin/python bench/many_queues.py --queues 300 --rounds 2
    .venv/bin/python bench/many_queues.py --queues 100 --consumers 50 --faults stop,kill
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from backend_store.cluster.client.node_pool import NodePool
from backend_store.cluster.coordination import pools
from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.layout import Layout, LeaderRecord, unpack
from backend_store.errors import PushgateError
from backend_store.types import QueueName, TenantId
from bench.dev_cluster_failover import _CHILD, start
from bench.push_common import cpu_seconds, fdatasync_cost, machine, percentiles, start_gateway, stop
from bench.sqs_bench import SqsClient
from gateway.dev_cluster import LEASE_TTL_S

REPO = Path(__file__).resolve().parents[1]
# After a fault: a send's timeout (past the gateway's 10 s request deadline) and the pause
# before a refused queue is tried again.
_FAULT_SEND_TIMEOUT_S = 30.0
_REFUSED_PAUSE_S = 0.05
# Bound of each figure as the issue gives it: (bound, at least?) on the ratio or the value.
TARGETS: dict[str, tuple[float, bool]] = {
    "create/s": (0.5, True),
    "GET /v1/queues ms": (100, False),
    "ListQueues ms": (100, False),
    "GET queue p50 ms": (5, False),
    "send/s": (0.8, True),
    "RSS KiB/queue": (5, False),
    "etcd keys/queue": (1, False),
    "threads N/few": (1.1, False),
    "files N/few": (1.1, False),
    "stop: last queue s": (3, False),
    "stop: every queue served s": (3, False),
    "stop: refused after led again": (0, False),
    "kill: last queue s": (3, False),
    "kill: every queue served s": (3, False),
    "kill: refused after led again": (0, False),
    "lost": (0, False),
    "leader changes, no fault": (0, False),
}
RATIOS = {
    "create/s",
    "send/s",
    "server CPU us/create",
    "server CPU us/send",
    "idle CPU ms/s N",
    "idle CPU ms/s N holding",
}


@dataclass
class System:
    """One side of the comparison: a gateway's URL and key, and the processes to read."""

    name: str
    url: str
    key: str
    gateway_data: Path
    processes: dict[str, int]  # name -> PID of the processes whose threads and files count
    etcd: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    # name -> PID of every server process, whose CPU a create and a send counts (etcd and the
    # managers too: the figures of earlier sessions that left them out were short).
    servers: dict[str, int] = field(default_factory=dict)


@dataclass
class Round:
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class CpuSpent:
    """CPU of the client (this process) and of each server process over a step."""

    def __init__(self, system: System) -> None:
        self.servers = dict(system.servers)
        self.client = time.process_time()
        self.before = {name: cpu_seconds(pid) for name, pid in self.servers.items()}

    def per(self, count: int, what: str, out: Round) -> None:
        """Record the step's CPU a ``what`` (``count`` of them): the client and all the
        servers as figures, each kind of server process in a note."""
        f = out.figures
        f[f"client CPU us/{what}"] = (time.process_time() - self.client) / count * 1e6
        kinds: dict[str, float] = {}
        for name, pid in self.servers.items():
            kind = name.rstrip("0123456789-")
            kinds[kind] = kinds.get(kind, 0.0) + (cpu_seconds(pid) - self.before[name]) / count * 1e6
        f[f"server CPU us/{what}"] = sum(kinds.values())
        out.notes.append(f"CPU us/{what}: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(kinds.items())))


async def idle_cpu(system: System, seconds: float, label: str, out: Round) -> None:
    """Every server process's CPU over ``seconds`` of nothing asked (the monitor's samples,
    sweeps, watches and checks, lease renewals): ms a second in all as a figure, by kind of
    process in a note. 0 seconds: not read."""
    if seconds <= 0:
        return
    before = {name: cpu_seconds(pid) for name, pid in system.servers.items()}
    began = time.monotonic()
    await asyncio.sleep(seconds)
    took = time.monotonic() - began
    kinds: dict[str, float] = {}
    for name, pid in system.servers.items():
        kind = name.rstrip("0123456789-")
        kinds[kind] = kinds.get(kind, 0.0) + (cpu_seconds(pid) - before[name]) / took * 1e3
    out.figures[f"idle CPU ms/s {label}"] = sum(kinds.values())
    out.notes.append(
        f"idle CPU ms/s at {label}: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(kinds.items()))
    )


def proc_stats(pid: int) -> tuple[int, int, int, int]:
    """(threads, open files, RSS KiB, anonymous RSS KiB) of a process from /proc.

    RSS counts the pages of the LMDB files a node has mapped and touched (page cache the
    kernel may drop and other processes share); the anonymous part is the process's own heap."""
    fields = {"Threads:": 0, "VmRSS:": 0, "RssAnon:": 0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        words = line.split()
        if words and words[0] in fields:
            fields[words[0]] = int(words[1])
    return fields["Threads:"], len(os.listdir(f"/proc/{pid}/fd")), fields["VmRSS:"], fields["RssAnon:"]


async def settle(system: System, quiet_s: float = 2.0, limit_s: float = 60.0) -> None:
    """Until no node's thread count moved for ``quiet_s`` (partitions opening after creates)."""
    deadline = time.monotonic() + limit_s
    last: list[int] = []
    since = time.monotonic()
    while time.monotonic() < deadline:
        now = [proc_stats(pid)[0] for pid in system.processes.values()]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        await asyncio.sleep(0.25)


async def etcd_keys(system: System) -> int:
    etcd = await EtcdCoordinator([system.etcd]).connect()
    try:
        return len((await etcd.read_prefix(Layout().prefix)).entries)
    finally:
        await etcd.close()


Step = Callable[[httpx.AsyncClient, str], Awaitable[None]]


async def pool(work: list[str], producers: list[httpx.AsyncClient], step: Step) -> float:
    """Run ``step`` over ``work``, a task per producer, each on its own client; the wall time."""
    items = iter(work)

    async def worker(http: httpx.AsyncClient) -> None:
        for item in items:
            await step(http, item)

    began = time.perf_counter()
    await asyncio.gather(*(worker(http) for http in producers))
    return time.perf_counter() - began


@contextlib.asynccontextmanager
async def clients(system: System, n: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``n`` clients of one keep-alive connection each. One client with ``n`` connections
    spent 4.5-7 ms of CPU a request at 64 (httpcore's pool asks every connection whether it
    expired, two system calls each, for every request; and without ``sniffio`` installed it
    searched ``sys.path`` for it four times a request): the client, not the server, set the rates
    (session 57: 130-200 sends a second on the embedded store; 630-700 after).
    Idle connections are dropped before the server's keep-alive timeout (uvicorn's 5 s, httpx's
    default expiry too): reused as the server closes one, a request fails with ReadError,
    which was counted as a refusal (one create in each round at 2,000 queues, session 51)."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=2.0)
    headers = {"Authorization": f"Bearer {system.key}"}
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=system.url, headers=headers, limits=limits, timeout=60)
            )
            for _ in range(n)
        ]


# Why requests were refused: (step, status and problem code or error) -> how many, and one
# detail of each, printed with the round (a 503 without a fault is a bug to find).
REFUSALS: dict[tuple[str, str], int] = {}
REFUSAL_DETAIL: dict[tuple[str, str], str] = {}


async def ok(call: Awaitable[httpx.Response], step: str = "") -> httpx.Response | None:
    """The answer if it was a 2xx, else None (refusals and timeouts are counted, not raised)."""
    try:
        answer = await call
    except httpx.HTTPError as exc:
        why, detail = type(exc).__name__, str(exc)
    else:
        if answer.is_success:
            return answer
        try:
            problem = answer.json()
        except ValueError:
            problem = {}
        why = f"{answer.status_code} {problem.get('code', '')}".strip()
        detail = str(problem.get("detail", answer.text[:200]))
    if step:
        REFUSALS[(step, why)] = REFUSALS.get((step, why), 0) + 1
        REFUSAL_DETAIL.setdefault((step, why), detail[:300])
    return None


def names(n: int) -> list[str]:
    return [f"q{i:05d}" for i in range(n)]


def creator(system: System) -> tuple[Step, list[int]]:
    """A create step and its refusals' count (a list of one, read after the step)."""
    refused = [0]

    async def create(http: httpx.AsyncClient, queue: str) -> None:
        if await ok(http.put(f"/v1/queues/{queue}", json=system.attributes), "create") is None:
            refused[0] += 1

    return create, refused


async def timed_creates(
    system: System, queues: list[str], producers: list[httpx.AsyncClient], create: Step, out: Round
) -> None:
    """``create/s`` and each process's CPU a create, over creating ``queues``."""
    spent = CpuSpent(system)
    wall = await pool(queues, producers, create)
    spent.per(len(queues), "create", out)
    out.figures["create/s"] = len(queues) / wall


async def timed_sends(
    system: System, queues: list[str], producers: list[httpx.AsyncClient], out: Round
) -> dict[str, set[str]]:
    """One send to each of ``queues``: ``send/s``, each process's CPU a send and the
    refusals; the bodies acknowledged to each queue."""
    acked: dict[str, set[str]] = {q: set() for q in queues}
    counter = itertools.count()
    refused = 0

    async def send(http: httpx.AsyncClient, queue: str) -> None:
        nonlocal refused
        body = f"{queue}:{next(counter)}"
        if await ok(http.post(f"/v1/queues/{queue}/messages", json={"body": body}), "send") is None:
            refused += 1
        else:
            acked[queue].add(body)

    # The client's own CPU a send (this process): when it nears 1e6 / send/s, the
    # client, not the server, sets the rate.
    spent = CpuSpent(system)
    out.figures["send/s"] = len(queues) / await pool(queues, producers, send)
    spent.per(len(queues), "send", out)
    progress(system, f"sent one message to each queue ({refused} refused)")
    out.figures["send refused"] = refused
    return acked


async def measure(system: System, args: argparse.Namespace, out: Round) -> None:
    f = out.figures
    few, every = names(args.few), names(args.queues)
    async with clients(system, args.producers) as producers:
        http = producers[0]  # for the steps one request at a time
        create, refused = creator(system)
        await pool(few, producers, create)
        await settle(system)
        # Each partition's term now, to count the leader changes no fault caused (a lease
        # lost to a stalled process under the steps' load: ``--lease-ttl``'s price).
        terms = await leader_terms(system) if system.etcd else {}
        await idle_cpu(system, args.idle, "few", out)
        before = {n: proc_stats(p) for n, p in system.processes.items()}
        keys_before = await etcd_keys(system) if system.etcd else 0
        progress(system, f"settled at {args.few} queues; creating the rest")
        await timed_creates(system, every[args.few :], producers, create, out)
        progress(system, f"created {len(every):,} queues ({refused[0]} refused)")
        f["create refused"] = refused[0]

        async def ensure(http: httpx.AsyncClient, queue: str) -> None:
            for _ in range(5):
                if await ok(http.get(f"/v1/queues/{queue}")) is not None:
                    break
                await create(http, queue)

        await pool(every, producers, ensure)  # the queues refused above, for the steps after (not timed)
        await settle(system)
        await idle_cpu(system, args.idle, "N", out)
        after = {n: proc_stats(p) for n, p in system.processes.items()}
        grown = len(every) - args.few
        f["threads few"] = max(t for t, _, _, _ in before.values())
        f["threads N"] = max(t for t, _, _, _ in after.values())
        f["files few"] = max(o for _, o, _, _ in before.values())
        f["files N"] = max(o for _, o, _, _ in after.values())
        f["threads N/few"] = max(after[n][0] / before[n][0] for n in before)
        f["files N/few"] = max(after[n][1] / before[n][1] for n in before)
        f["RSS KiB/queue"] = max((after[n][2] - before[n][2]) / grown for n in before)
        f["anon RSS KiB/queue"] = max((after[n][3] - before[n][3]) / grown for n in before)
        if system.etcd:
            f["etcd keys/queue"] = (await etcd_keys(system) - keys_before) / grown

        f["GET /v1/queues ms"], listed = await timed_list(
            lambda: http.get("/v1/queues", params={"limit": 1000}, timeout=300),
            lambda answer: len(answer.json()["queues"]),
            args.lists,
        )
        out.notes.append(f"GET /v1/queues?limit=1000 answered {listed} queues")
        aws = await asyncio.to_thread(aws_credentials, system)
        sqs = SqsClient(http, system.url, *aws)
        f["ListQueues ms"], listed = await timed_list(
            lambda: sqs_list(sqs), lambda answer: len(answer.json().get("QueueUrls", [])), args.lists
        )
        out.notes.append(f"ListQueues MaxResults=1000 answered {listed} queue URLs")

        took: list[float] = []
        for queue in random.sample(every, min(args.gets, len(every))):
            began = time.perf_counter()
            if await ok(http.get(f"/v1/queues/{queue}")) is not None:
                took.append((time.perf_counter() - began) * 1000)
        f["GET queue p50 ms"] = percentiles(took)[0]
        progress(system, "listed and read")

        acked = await timed_sends(system, every, producers, out)
        counter = itertools.count(len(every))  # the faults' bodies, numbered past the step's
        # Each queue now holds a message (an inbox whose owner is offline): what holding them
        # costs, the retention sweep's passes over them included.
        await idle_cpu(system, args.idle, "N holding", out)

        delivered: set[str] = set()
        if args.consumers:
            got, last = await consume(system, every[: args.consumers], acked, delivered, args)
            f["consumers served"] = got
            f["consumers: last s"] = last

        if system.etcd:
            now = await leader_terms(system)
            f["leader changes, no fault"] = sum(1 for p, term in terms.items() if now.get(p, term) != term)
        for fault in [x for x in args.faults.split(",") if x] if system.etcd else []:
            await one_fault(system, producers, fault, every, acked, counter, args, out)
            progress(system, f"{fault}: every queue took a send, or the time was up")
            await asyncio.sleep(args.settle)
        if system.etcd:
            f["lost"], unread = await lost(producers, every, acked, delivered)
            if unread:
                out.notes.append(f"{unread} queues could not be peeked: their messages are not counted")


def aws_credentials(system: System) -> tuple[str, str]:
    """An admin key with SigV4 credentials, made by ``pushgate admin`` on the gateway's data."""
    store = ["--store", f"cluster://{system.etcd}"] if system.etcd else []
    command = [sys.executable, "-m", "gateway.admin_cli", "--data", str(system.gateway_data), *store]
    command += ["key", "create", "--tenant", "default", "--scope", "admin", "--aws"]
    created = json.loads(subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    return created["aws_access_key_id"], created["aws_secret_access_key"]


def progress(system: System, step: str) -> None:
    """A line on stderr as each step ends (a run at 10,000 queues takes a while)."""
    print(f"  {time.strftime('%H:%M:%S')} {system.name}: {step}", file=sys.stderr, flush=True)


async def sqs_list(sqs: SqsClient) -> httpx.Response:
    """ListQueues MaxResults=1000 as a response (SqsClient.call raises on a refusal)."""
    return httpx.Response(200, json=await sqs.call("ListQueues", {"MaxResults": 1000}))


async def timed_list(
    call: Callable[[], Awaitable[httpx.Response]], count: Callable[[httpx.Response], int], repeat: int
) -> tuple[float, int]:
    """Median ms of ``repeat`` calls, and what the last one listed (nan, 0: all refused)."""
    took: list[float] = []
    listed = 0
    for _ in range(repeat):
        began = time.perf_counter()
        with contextlib.suppress(httpx.HTTPError):
            answer = await call()
            if answer.is_success:
                took.append((time.perf_counter() - began) * 1000)
                listed = count(answer)
    return (statistics.median(took) if took else float("nan")), listed


async def consume(
    system: System,
    queues: list[str],
    acked: dict[str, set[str]],
    delivered: set[str],
    args: argparse.Namespace,
) -> tuple[int, float]:
    """One WebSocket consumer per queue until each got and acked its messages: how many did,
    and when the last did (seconds from the first connection)."""
    began = time.perf_counter()
    opening = asyncio.Semaphore(64)
    ends: list[float] = []

    async def consumer(queue: str) -> None:
        wanted = set(acked[queue])
        async with opening:
            ws = await connect(
                system.url.replace("http", "ws", 1) + "/v1/ws",
                subprotocols=[Subprotocol("pushgate.v1")],
                additional_headers={"Authorization": f"Bearer {system.key}"},
                compression=None,
                open_timeout=60,
            )
        async with ws:
            await ws.send(orjson.dumps({"op": "subscribe", "queue": queue, "prefetch": 10}).decode())
            while wanted:
                frame = orjson.loads(await ws.recv())
                batch = {"message": [frame.get("message")], "messages": frame.get("messages")}
                messages = batch.get(frame["op"]) or []
                for m in messages:
                    wanted.discard(m["body"])
                    delivered.add(m["body"])
                if messages:
                    await ws.send(
                        orjson.dumps({"op": "ack", "receipts": [m["receipt"] for m in messages]}).decode()
                    )
        ends.append(time.perf_counter() - began)

    tasks = [asyncio.create_task(consumer(q)) for q in queues]
    done, pending = await asyncio.wait(tasks, timeout=args.fault_timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    served = sum(1 for t in done if not t.cancelled() and t.exception() is None)
    return served, max(ends, default=float("nan"))


async def one_fault(
    system: System,
    producers: list[httpx.AsyncClient],
    fault: str,
    every: list[str],
    acked: dict[str, set[str]],
    counter: itertools.count[int],
    args: argparse.Namespace,
    out: Round,
) -> None:
    """Signal a node; each queue's first acknowledged send begun after the signal.

    A refused send is tried again at once (after ``_REFUSED_PAUSE_S``), before the queues
    not tried yet: a queue refused while its partition had no leader is asked again as soon
    as it may have one, not after every other queue (which measured the producers' floor, not
    the queue: session 50's 53 s). A send's timeout is past the gateway's request deadline, so
    the gateway's answer, not the client giving up, says whether it was taken. A refusal of a
    send begun after the queue's partition had its new leader key is a queue waiting past its
    partition (``refused after led again``: the new leader not serving it yet)."""
    etcd = await EtcdCoordinator([system.etcd]).connect()
    led = await leaders(etcd)
    # A node that leads partitions (the most; of those, the first for a stop and the last for
    # a kill): a follower's fault costs no failover, so it would measure nothing.
    nodes = sorted(n for n in system.processes if n.startswith("node"))
    leading = [sum(1 for n in led.values() if n == node) for node in nodes]
    candidates = [node for node, count in zip(nodes, leading, strict=True) if count == max(leading)]
    victim = candidates[0] if fault == "stop" else candidates[-1]
    pid = system.processes[victim]
    pending = list(every)
    random.shuffle(pending)
    recovered: dict[str, float] = {}
    where = await placements(etcd)
    late: list[str] = []
    signalled = time.monotonic()
    os.killpg(pid, signal.SIGSTOP if fault == "stop" else signal.SIGKILL)
    deadline = signalled + args.fault_timeout
    theirs = {p for p, n in led.items() if n == victim}
    led_at: dict[int, float] = {}
    watcher = asyncio.create_task(led_again(etcd, victim, theirs, deadline, led_at))
    probes = [
        asyncio.create_task(served_again(etcd, victim, p, [q for q in every if where.get(q) == p], deadline))
        for p in theirs
    ]

    async def producer(http: httpx.AsyncClient) -> None:
        while pending and time.monotonic() < deadline:
            queue = pending.pop()
            body = f"{queue}:{next(counter)}"
            began = time.monotonic()
            answer = await ok(
                http.post(f"/v1/queues/{queue}/messages", json={"body": body}, timeout=_FAULT_SEND_TIMEOUT_S)
            )
            if answer is None:
                if began > led_at.get(where.get(queue, -1), float("inf")):
                    late.append(queue)
                pending.append(queue)
                await asyncio.sleep(_REFUSED_PAUSE_S)
            else:
                acked[queue].add(body)
                recovered[queue] = time.monotonic() - signalled

    try:
        await asyncio.gather(*(producer(http) for http in producers))
        last_led = await watcher
        answers = await asyncio.gather(*probes)
        last_served = max((at for at, _ in answers), default=signalled)
        own_call = max((took for _, took in answers), default=float("nan"))
    finally:
        if fault == "stop":
            os.killpg(pid, signal.SIGCONT)
        else:
            del system.processes[victim]
        for task in [watcher, *probes]:
            task.cancel()
        await etcd.close()
    out.figures[f"{fault}: partitions led again s"] = last_led - signalled
    out.figures[f"{fault}: every queue served s"] = last_served - signalled
    # What the probe's answer costs by itself, part of the figure above (served_again).
    out.figures[f"{fault}: probe's own answer s"] = own_call
    # One send to each queue takes this long at the rate measured before any fault: the
    # "last queue" figure cannot be lower, however fast the partitions fail over.
    out.figures[f"{fault}: floor at send/s s"] = len(every) / out.figures["send/s"]
    out.notes.append(f"{fault}: {len(theirs)} partitions were led by {victim}")
    took = sorted(recovered.values())
    out.figures[f"{fault}: last queue s"] = took[-1] if len(took) == len(every) else float("inf")
    out.figures[f"{fault}: p50 s"] = statistics.median(took) if took else float("nan")
    out.figures[f"{fault}: queues without a send"] = len(every) - len(took)
    # The producers' own rate while the fault lasted (the floor above is the rate before it).
    out.figures[f"{fault}: send/s during"] = len(took) / took[-1] if took else 0.0
    out.figures[f"{fault}: refused after led again"] = len(late)
    if late:
        out.notes.append(f"{fault}: refused after their partition's new leader: {sorted(set(late))[:10]}")
    out.notes.append(f"{fault}: signalled {victim}")


async def leaders(etcd: EtcdCoordinator) -> dict[int, str]:
    """Partition -> the node whose leader key it holds."""
    state = await etcd.read_prefix(Layout().leaders)
    out: dict[int, str] = {}
    for key, value in state.values().items():
        with contextlib.suppress(ValueError, PushgateError):
            out[int(key)] = LeaderRecord.unpack(value).node
    return out


async def leader_terms(system: System) -> dict[str, int]:
    """Partition -> its leader key's create revision (its term's epoch): a changed one is a
    new term."""
    async with EtcdCoordinator([system.etcd]) as etcd:
        state = await etcd.read_prefix(Layout().leaders)
    return {key[len(state.prefix) :]: entry.create_revision for key, entry in state.entries.items()}


async def placements(etcd: EtcdCoordinator) -> dict[str, int]:
    """Queue name -> the partition it is placed on (the bench's queues have one each)."""
    out: dict[str, int] = {}
    for key, value in (await etcd.read_prefix(Layout().queues)).values().items():
        with contextlib.suppress(PushgateError):
            placed = pools.placement(unpack(value))
            if placed:
                out[key.rsplit("/", 1)[-1]] = placed[0]
    return out


async def served_again(
    etcd: EtcdCoordinator, victim: str, partition: int, queues: list[str], deadline: float
) -> tuple[float, float]:
    """When the partition's new leader served every one of ``queues`` (placed on
    ``partition``, which ``victim`` led): one ``queue_stats`` request naming them all, asked
    over the node protocol again every 20 ms until it is answered (inf: not by the deadline).

    A leader answers it only once every queue it names is applied in its term and its first
    entry committed (a committed read), and refuses it at once before (``not_leader``): so
    its answer is the moment every queue of the partition takes requests, at one request per
    partition. Asking each queue on its own instead (session 57) sent up to 3,750 peeks every
    20 ms into the new leader as it began its term, and measured how fast one Python process
    pushes those through a node more than the failover. The producers' floor does not bound
    this: it is what the partition's failover and its new term cost each queue (and, under
    the producers' load, what a request waits at a node).

    Also how long the same request took when asked again at once (the second value, nan if
    it failed): the answer's own cost (counting every queue, sending the counts back, this
    busy process reading them), which the first answer's moment includes: at 10,000 queues a
    partition, 0.08-0.25 s of it (bench/README.md, "Session 77")."""
    nodes = NodePool("bench-probe", timeout_s=5)
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(CoordinatorUnavailable, PushgateError):
                entry = await etcd.get(Layout().leader(partition))
                record = LeaderRecord.unpack(entry.value) if entry is not None else None
                if entry is not None and record is not None and record.node != victim:
                    client, epoch = (
                        nodes.client(record.node, record.address),
                        record.epoch(entry.create_revision),
                    )
                    names = [QueueName(q) for q in queues]
                    await client.call(
                        "queue_stats", partition, epoch, tenant=TenantId("default"), names=names
                    )
                    answered = time.monotonic()
                    try:
                        await client.call(
                            "queue_stats", partition, epoch, tenant=TenantId("default"), names=names
                        )
                    except PushgateError:
                        return answered, float("nan")
                    return answered, time.monotonic() - answered
            await asyncio.sleep(0.02)
        return float("inf"), float("nan")
    finally:
        await nodes.close()


async def led_again(
    etcd: EtcdCoordinator, victim: str, partitions: set[int], deadline: float, led_at: dict[int, float]
) -> float:
    """When each of ``partitions`` had a leader key naming another node than ``victim``, into
    ``led_at`` (polled every 50 ms); when the last did (inf: not by the deadline)."""
    waiting = set(partitions)
    while waiting and time.monotonic() < deadline:
        with contextlib.suppress(CoordinatorUnavailable):
            now = await leaders(etcd)
            for p in [p for p in waiting if now.get(p) not in (None, victim)]:
                led_at[p] = time.monotonic()
                waiting.discard(p)
        if waiting:
            await asyncio.sleep(0.05)
    return float("inf") if waiting else time.monotonic()


async def lost(
    producers: list[httpx.AsyncClient],
    every: list[str],
    acked: dict[str, set[str]],
    delivered: set[str],
) -> tuple[int, int]:
    """Acknowledged sends neither delivered nor found by a peek; and queues that could not be read."""
    missing = 0
    unread = 0

    async def check(http: httpx.AsyncClient, queue: str) -> None:
        nonlocal missing, unread
        for _ in range(20):
            answer = await ok(http.get(f"/v1/queues/{queue}/peek", params={"max": 100}))
            if answer is not None:
                found = {m["body"] for m in answer.json()["messages"]}
                missing += len(acked[queue] - delivered - found)
                return
            await asyncio.sleep(0.5)
        unread += 1

    await pool(every, producers, check)
    return missing, unread


def run_embedded(args: argparse.Namespace, root: Path, *, again: bool = False) -> Round:
    """The embedded store's turn; ``again``: only its create and send steps, on a gateway of
    its own, after the cluster's turn (``bracket``)."""
    out = Round()
    data = root / ("embedded-again" if again else "embedded")
    proc, url, key = start_gateway(data)
    try:
        name = "embedded again" if again else "embedded"
        system = System(name, url, key, data, {"gateway": proc.pid}, servers={"gateway": proc.pid})
        asyncio.run(rates(system, args, out) if again else measure(system, args, out))
    finally:
        stop(proc)
        out.notes.extend(refusals())
    return out


async def rates(system: System, args: argparse.Namespace, out: Round) -> None:
    """The create and send steps of ``measure`` alone, as it takes them."""
    few, every = names(args.few), names(args.queues)
    async with clients(system, args.producers) as producers:
        create, refused = creator(system)
        await pool(few, producers, create)
        await settle(system)
        await timed_creates(system, every[args.few :], producers, create, out)
        progress(system, f"created {len(every):,} queues ({refused[0]} refused)")
        await timed_sends(system, every, producers, out)


# The figures taken before and after the cluster's turn; the others come from the first turn.
BRACKETED = (
    "create/s",
    "send/s",
    "server CPU us/create",
    "server CPU us/send",
    "client CPU us/create",
    "client CPU us/send",
)


def bracket(before: Round, after: Round) -> Round:
    """The embedded store's figures with its rates and CPU the mean of its turns before and
    after the cluster's. This host's speed drifts by a quarter within minutes (the same
    cluster driver: 891 and 1,235 sends a second a quarter of an hour apart, the client's
    own CPU a send 974 and 707 us, session 78), so a ratio against one turn taken minutes
    before the cluster's moved with the host: a linear drift cancels in the mean of a turn
    on each side. Both turns are printed, and how far apart they were."""
    out = Round(dict(before.figures), [*before.notes, *(f"again: {n}" for n in after.notes)])
    for k in BRACKETED:
        first, second = before.figures.get(k), after.figures.get(k)
        if first is not None and second is not None:
            out.figures[k] = (first + second) / 2
            out.notes.append(
                f"{k}: {first:,.0f} before the cluster, {second:,.0f} after ({second / first:.2f}x)"
            )
    return out


def run_cluster(args: argparse.Namespace, root: Path) -> Round:
    out = Round()
    data = root / "cluster"
    extra = ["--partitions", str(args.partitions)] if args.partitions else []
    extra += ["--lease-ttl", str(args.lease_ttl)]
    if args.keep is not None:
        extra += ["--log-level", "info"]  # a kept round's failover timeline: each term's start and pass
    proc, printed = start(data, *extra)
    children = {m[1]: (m[2], int(m[3])) for m in _CHILD.finditer(printed)}
    try:
        url = printed.split("ready: the gateway serves ", 1)[1].split()[0]
        key = next(
            line.split()[-1] for line in printed.splitlines() if line.startswith("Bootstrap admin key")
        )
        nodes = {n: pid for n, (_, pid) in children.items() if n.startswith("node")}
        attributes = {"replication_factor": 3, "replication_mode": "sync"}
        servers = {n: pid for n, (_, pid) in children.items()}
        system = System(
            "cluster", url, key, data / "gateway", nodes, children["etcd"][0], attributes, servers
        )
        asyncio.run(measure(system, args, out))
    finally:
        out.notes.extend(refusals())
        for pid in [pid for n, (_, pid) in children.items() if n.startswith("node")]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def refusals() -> list[str]:
    """The refusals counted since the last call, by step and why, with one detail each."""
    notes = [
        f"{count} {step} refused: {why} ({REFUSAL_DETAIL[(step, why)]})"
        for (step, why), count in sorted(REFUSALS.items())
    ]
    REFUSALS.clear()
    REFUSAL_DETAIL.clear()
    return notes


def show(embedded: Round, cluster: Round) -> None:
    keys = list(dict.fromkeys([*cluster.figures, *embedded.figures]))
    print(f"{'measure':<28} {'embedded':>11} {'cluster':>11} {'cluster/emb':>11}  target")
    for k in keys:
        e, c = embedded.figures.get(k), cluster.figures.get(k)
        ratio = f"{c / e:>11.2f}" if k in RATIOS and e and c is not None else " " * 11
        bound = TARGETS.get(k)
        target = (
            ""
            if bound is None
            else ("ratio " if k in RATIOS else "") + ("≥ " if bound[1] else "≤ ") + f"{bound[0]:g}"
        )
        print(f"{k:<28} {_fmt(e):>11} {_fmt(c):>11} {ratio}  {target}")
    for note in embedded.notes:
        print(f"  embedded: {note}")
    for note in cluster.notes:
        print(f"  cluster: {note}")
    needed = cpu_for_ratio(embedded, 0.8)
    if needed is not None and "server CPU us/send" in cluster.figures:
        measured = cluster.figures["server CPU us/send"]
        print(
            f"  sends: 0.8x needs the cluster's servers' CPU a send <= {needed:,.0f} us (measured {measured:,.0f})"
        )


def cpu_for_ratio(embedded: Round, ratio: float) -> float | None:
    """The cluster's servers' CPU a send at which its sends reach ``ratio`` times the
    embedded store's, both turns near CPU-bound: the rate goes as 1 / (C + S) (C the
    client's CPU a send, S the servers'), so S <= (C + E) / ratio - C. A cost both turns pay
    is a larger share of the embedded turn: cutting it lowers the ratio (bench/README.md,
    "Session 81")."""
    e, c = embedded.figures.get("server CPU us/send"), embedded.figures.get("client CPU us/send")
    if not e or not c:
        return None
    return (c + e) / ratio - c


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def summary(rounds: list[tuple[Round, Round]]) -> None:
    print(f"\nranges over {len(rounds)} rounds (min-max)")
    keys = list(dict.fromkeys(k for _, c in rounds for k in c.figures))
    for k in keys:
        values = [c.figures[k] for _, c in rounds if k in c.figures]
        line = f"  {k:<28} cluster {_fmt(min(values))}-{_fmt(max(values))}"
        if k in RATIOS:
            ratios = [c.figures[k] / e.figures[k] for e, c in rounds if e.figures.get(k)]
            if ratios:
                line += f"; cluster/embedded {min(ratios):.2f}-{max(ratios):.2f}"
        print(line)


@contextlib.contextmanager
def round_directory(keep: Path | None, n: int) -> Iterator[Path]:
    """A temporary directory for a round, or ``keep/round-N``, kept after the round."""
    if keep is not None:
        root = keep / f"round-{n + 1}"
        root.mkdir(parents=True)
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="pushgate-many-") as tmp:
        yield Path(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queues", type=int, default=10_000, help="queues in all (default 10,000)")
    parser.add_argument(
        "--few", type=int, default=10, help="queues at the first reading of threads and files"
    )
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument(
        "--consumers", type=int, default=1000, help="WebSocket consumers, one per queue (0: none)"
    )
    parser.add_argument(
        "--faults", default="stop,kill", help="on the cluster, in order: stop, kill (empty: none)"
    )
    parser.add_argument("--fault-timeout", type=float, default=60.0)
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds after a fault before the next step"
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=20.0,
        help="seconds of idle CPU read at --few queues, at --queues, and once each holds a message (0: none)",
    )
    parser.add_argument("--lists", type=int, default=3)
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cluster-only", action="store_true", help="skip the embedded store")
    parser.add_argument(
        "--lease-ttl",
        type=int,
        default=LEASE_TTL_S,
        help=f"the nodes' and managers' lease in whole seconds (dev-cluster's --lease-ttl; default {LEASE_TTL_S})",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        help="the cluster's partitions a pool (dev-cluster's --partitions; default its own)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="run each round in DIR/round-N and keep it (every process's log; nodes and managers at info)",
    )
    args = parser.parse_args()
    args.consumers = min(args.consumers, args.queues)
    args.few = min(args.few, args.queues)
    print(machine())
    print(f"partitions a pool: {args.partitions or 'dev-cluster default'}; lease TTL {args.lease_ttl} s")
    rounds: list[tuple[Round, Round]] = []
    for n in range(args.rounds):
        with round_directory(args.keep, n) as root:
            print(
                f"\nround {n + 1}: {fdatasync_cost(root)}; load average {os.getloadavg()[0]:.1f}", flush=True
            )
            embedded = Round() if args.cluster_only else run_embedded(args, root)
            cluster = run_cluster(args, root)
            if not args.cluster_only:
                embedded = bracket(embedded, run_embedded(args, root, again=True))
            print(
                f"{args.queues:,} queues, {args.producers} producers; load average now {os.getloadavg()[0]:.1f}"
            )
            show(embedded, cluster)
            rounds.append((embedded, cluster))
            sys.stdout.flush()
    summary(rounds)
    print(json.dumps([{"embedded": e.figures, "cluster": c.figures} for e, c in rounds]))


if __name__ == "__main__":
    main()
