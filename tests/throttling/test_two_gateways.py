"""Two real ``pushgate serve`` processes on one data directory, sharing one real Redis.

What they share: rate-limit counters, wake-ups (a message sent through A reaches a
consumer on B by pub/sub, not by B's safety poll), limit changes and revocations
(applied by both within a second, including ones made by ``pushgate admin --redis``).
The last test kills Redis under them and starts it again.

Latencies are printed (``-s``), never asserted; waits that must beat the safety poll
(5 s) are deadlines on an event, set below it so that a delivery by poll fails.
"""

from __future__ import annotations

import asyncio
import os
import queue as queue_module
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from tests.conftest import scaled, wait_for
from tests.fixtures.redis_server import RedisServer
from tests.gateway.conftest import problem_code
from tests.gateway.processes import REPO, ServeProcess, serve

# Below the dispatcher's safety poll and the long-poll recheck (5 s): a wake-up that
# did not cross over would be caught by the poll only after this.
BEFORE_SAFETY_POLL_S = 4.0


@dataclass
class Pair:
    data_dir: Path
    redis: RedisServer
    a: ServeProcess
    b: ServeProcess
    key: str


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    redis = RedisServer(tmp_path_factory.mktemp("redis")).start()
    data_dir = tmp_path_factory.mktemp("shared-data")
    a = b = None
    try:
        a = serve(data_dir, "--redis", redis.url)
        b = serve(data_dir, "--redis", redis.url)
        assert a.key is not None and b.key is None  # B opened the store A created
        yield Pair(data_dir, redis, a, b, a.key)
    finally:
        for process in (a, b):
            if process is not None:
                process.terminate()
        redis.kill()


@pytest.fixture
async def http(pair: Pair) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    headers = {"Authorization": f"Bearer {pair.key}"}
    async with (
        httpx.AsyncClient(base_url=pair.a.url, headers=headers, timeout=scaled(30)) as a,
        httpx.AsyncClient(base_url=pair.b.url, headers=headers, timeout=scaled(30)) as b,
    ):
        yield a, b


@pytest.fixture
def queue() -> str:
    return "x" + uuid.uuid4().hex[:10]


def output_of(process: ServeProcess) -> list[str]:
    """What the process printed so far (after it started serving)."""
    while True:
        try:
            process.output.append(process.lines.get_nowait())
        except queue_module.Empty:
            return process.output


async def admin_cli(pair: Pair, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUSHGATE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.admin_cli", "--data", str(pair.data_dir), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), scaled(30))
    assert proc.returncode == 0, err.decode()
    doc: dict[str, Any] = orjson.loads(out)
    return doc


async def subscribed(url: str, key: str, queue: str) -> ClientConnection:
    ws = await connect(
        url.replace("http", "ws", 1) + "/v1/ws",
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers={"Authorization": f"Bearer {key}"},
    )
    await ws.send(orjson.dumps({"op": "subscribe", "id": 1, "queue": queue, "prefetch": 10}).decode())
    reply = orjson.loads(await ws.recv())
    assert reply["op"] == "ok" and reply["id"] == 1, reply
    return ws


async def next_message(ws: ClientConnection, deadline_s: float) -> dict[str, Any]:
    async with asyncio.timeout(scaled(deadline_s)):
        while True:
            frame = orjson.loads(await ws.recv())
            if frame["op"] == "message":
                message: dict[str, Any] = frame["message"]
                return message


async def test_rate_limits_are_counted_across_gateways(
    http: tuple[httpx.AsyncClient, httpx.AsyncClient], queue: str
) -> None:
    a, b = http
    assert (await a.put(f"/v1/queues/{queue}", json={})).status_code == 201
    assert (await b.get("/v1/limits")).json()["per_queue"]["send"] is None  # B caches "no limit"
    r = await a.put("/v1/limits", json={"per_queue": {"send": "4/hour"}})
    assert r.status_code == 200

    async def b_sees_it() -> bool:
        return bool((await b.get("/v1/limits")).json()["per_queue"]["send"] == "4/hour")

    await wait_for(b_sees_it, timeout=1.0, what="gateway B to apply A's limit change")
    statuses = [(await gw.post(f"/v1/queues/{queue}/messages", json={"body": "x"})) for gw in (a, b, a, b)]
    assert [r.status_code for r in statuses] == [201] * 4
    assert [r.headers["RateLimit"].split(";")[1] for r in statuses] == ["r=3", "r=2", "r=1", "r=0"]
    for gw in (a, b):
        refused = await gw.post(f"/v1/queues/{queue}/messages", json={"body": "x"})
        assert refused.status_code == 429 and refused.json()["code"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1
    await a.put("/v1/limits", json={"per_queue": None})


async def test_two_gateways_together_stay_within_the_documented_bound(
    pair: Pair, http: tuple[httpx.AsyncClient, httpx.AsyncClient], queue: str
) -> None:
    """docs/throttling.md: N gateways pass a limit by at most N x share (1% of it each); a
    refusal is the usual 429 with Retry-After and the IETF fields; most requests never ask Redis."""
    a, b = http
    assert (await a.put(f"/v1/queues/{queue}", json={})).status_code == 201
    assert (await a.put("/v1/limits", json={"per_queue": {"receive": "1000/hour"}})).status_code == 200

    async def b_sees_it() -> bool:
        return bool((await b.get("/v1/limits")).json()["per_queue"]["receive"] == "1000/hour")

    await wait_for(b_sees_it, timeout=1.0, what="gateway B to apply A's limit change")
    redis = aioredis.Redis.from_url(pair.redis.url)
    scripts_before = await script_calls(redis)
    allowed: list[int] = []
    refusals: list[httpx.Response] = []

    async def client(gw: httpx.AsyncClient) -> None:
        while True:
            r = await gw.post(f"/v1/queues/{queue}/receive", json={"max": 1, "wait_s": 0})
            if r.status_code != 200:
                refusals.append(r)
                return
            allowed.append(1)

    await asyncio.gather(*(client(gw) for gw in (a, b) for _ in range(4)))
    scripts = await script_calls(redis) - scripts_before
    await redis.aclose()
    print(f"\n{len(allowed)} receives allowed of 1000/hour through A and B, {scripts} Redis script calls")
    assert 1000 - 2 * 10 <= len(allowed) <= 1000 + 2 * 10
    assert scripts < len(allowed) / 3
    for r in refusals:
        assert problem_code(r, 429) == "rate_limited"
        assert 1 <= int(r.headers["Retry-After"]) <= 3600
        assert r.headers["RateLimit-Policy"] == '"queue-receive";q=1000;w=3600'
        assert re.fullmatch(r'"queue-receive";r=0;t=\d+', r.headers["RateLimit"])
    await a.put("/v1/limits", json={"per_queue": None})


async def script_calls(redis: aioredis.Redis) -> int:
    """How many Lua script calls the Redis has run (EVALSHA, and EVAL if any)."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


async def test_a_message_sent_through_a_is_pushed_by_b_at_once(
    pair: Pair, http: tuple[httpx.AsyncClient, httpx.AsyncClient], queue: str
) -> None:
    a, _ = http
    await a.put(f"/v1/queues/{queue}", json={})
    ws = await subscribed(pair.b.url, pair.key, queue)
    try:
        latencies = []
        for i in range(5):
            start = time.perf_counter()
            assert (await a.post(f"/v1/queues/{queue}/messages", json={"body": f"m{i}"})).status_code == 201
            message = await next_message(ws, BEFORE_SAFETY_POLL_S)
            latencies.append((time.perf_counter() - start) * 1000)
            assert message["body"] == f"m{i}"
            await ws.send(orjson.dumps({"op": "ack", "receipts": [message["receipt"]]}).decode())
        print(f"\nsend through A -> push from B: {', '.join(f'{ms:.1f}' for ms in latencies)} ms")
    finally:
        await ws.close()


async def test_a_long_poll_on_b_wakes_for_a_send_through_a(
    http: tuple[httpx.AsyncClient, httpx.AsyncClient], queue: str
) -> None:
    a, b = http
    await a.put(f"/v1/queues/{queue}", json={})
    poll = asyncio.ensure_future(b.post(f"/v1/queues/{queue}/receive", json={"wait_s": 20}))

    async def parked() -> bool:
        text = (await b.get("/metrics")).text
        return "pushgate_receive_waiting 1.0" in text

    await wait_for(parked, what="the long-poll to wait on B")
    start = time.perf_counter()
    await a.post(f"/v1/queues/{queue}/messages", json={"body": "wake"})
    async with asyncio.timeout(scaled(BEFORE_SAFETY_POLL_S)):
        r = await poll
    print(f"\nsend through A -> long-poll on B returns: {(time.perf_counter() - start) * 1000:.1f} ms")
    assert [m["body"] for m in r.json()["messages"]] == ["wake"]


async def test_a_retry_through_b_is_answered_by_the_dedupe_front(
    http: tuple[httpx.AsyncClient, httpx.AsyncClient], queue: str
) -> None:
    a, b = http
    await a.put(f"/v1/queues/{queue}", json={})
    first = await a.post(f"/v1/queues/{queue}/messages", json={"body": "once", "dedupe_id": "d1"})
    assert first.status_code == 201
    hits_before = front_hits((await b.get("/metrics")).text)
    retry = await b.post(
        f"/v1/queues/{queue}/messages", json={"body": "once"}, headers={"Idempotency-Key": "d1"}
    )
    assert retry.status_code == 200
    assert retry.json() == {**first.json(), "duplicate": True}
    assert front_hits((await b.get("/metrics")).text) == hits_before + 1
    batch = await b.post(
        f"/v1/queues/{queue}/messages",
        json={"messages": [{"body": "new", "dedupe_id": "d2"}, {"body": "once", "dedupe_id": "d1"}]},
    )
    assert [r["duplicate"] for r in batch.json()["results"]] == [False, True]
    r = await a.post(f"/v1/queues/{queue}/receive", json={"max": 10})
    assert sorted(m["body"] for m in r.json()["messages"]) == ["new", "once"]  # each stored once


def front_hits(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("pushgate_dedupe_front_hits_total "):
            return float(line.split()[1])
    raise AssertionError("no pushgate_dedupe_front_hits_total in /metrics")


async def test_admin_cli_changes_reach_every_gateway_within_a_second(
    pair: Pair, http: tuple[httpx.AsyncClient, httpx.AsyncClient], queue: str
) -> None:
    tenant = "t" + uuid.uuid4().hex[:8]
    await admin_cli(pair, "tenant", "create", tenant)
    created = await admin_cli(pair, "key", "create", "--tenant", tenant, "--scope", "send:* receive:*")
    clients = [
        httpx.AsyncClient(base_url=p.url, headers={"Authorization": f"Bearer {created['key']}"})
        for p in (pair.a, pair.b)
    ]
    try:
        for client in clients:  # both gateways now hold the key (and "no limits") in their caches
            assert (await client.get("/v1/limits")).json()["receive"] is None
        changed = await admin_cli(
            pair, "--redis", pair.redis.url, "limits", "set", "--tenant", tenant, '{"receive": "9/minute"}'
        )
        assert changed["announced"] is True and changed["limits"]["receive"] == "9/minute"
        read = await admin_cli(pair, "limits", "get", "--tenant", tenant)
        assert read == {"tenant": tenant, "limits": changed["limits"]}
        for client in clients:

            async def applied(client: httpx.AsyncClient = client) -> bool:
                return bool((await client.get("/v1/limits")).json()["receive"] == "9/minute")

            await wait_for(applied, timeout=1.0, what="the limit change to apply")
        revoked = await admin_cli(pair, "--redis", pair.redis.url, "key", "revoke", created["key_id"])
        assert revoked["announced"] is True
        for client in clients:

            async def refused(client: httpx.AsyncClient = client) -> bool:
                return (await client.get("/v1/limits")).status_code == 401

            await wait_for(refused, timeout=1.0, what="the revocation to apply")
    finally:
        for client in clients:
            await client.aclose()


async def test_redis_killed_and_restarted_under_two_gateways(
    pair: Pair, http: tuple[httpx.AsyncClient, httpx.AsyncClient], queue: str
) -> None:
    a, b = http
    await a.put(f"/v1/queues/{queue}", json={})
    await a.put("/v1/limits", json={"per_queue": {"send": "1000/hour"}})
    pair.redis.kill()

    async def b_reports_down() -> bool:
        r = await b.get("/readyz")
        return r.status_code == 200 and r.json()["shared_state"]["status"] == "down"

    await wait_for(b_reports_down, what="B to notice Redis is gone")
    # Fail open: both keep serving, without rate-limit fields (nothing could count them).
    for gw in (a, b, a, b):
        r = await gw.post(f"/v1/queues/{queue}/messages", json={"body": "during"})
        assert r.status_code == 201 and "RateLimit" not in r.headers
    assert "pushgate_shared_state_up 0.0" in (await b.get("/metrics")).text
    down_lines = [line for line in output_of(pair.b) if "unreachable" in line]
    assert len(down_lines) == 1, down_lines  # logged once, not per request

    pair.redis.restart()

    async def both_up() -> bool:
        states = [(await gw.get("/readyz")).json()["shared_state"]["status"] for gw in (a, b)]
        return states == ["up", "up"]

    await wait_for(both_up, what="both gateways to use Redis again")
    r = await a.post(f"/v1/queues/{queue}/messages", json={"body": "after"})
    assert r.status_code == 201 and r.headers["RateLimit"].startswith(
        '"queue-send";r=999;'
    )  # counters restarted
    # Wake-ups cross over again.
    await a.post(f"/v1/queues/{queue}/purge")
    ws = await subscribed(pair.b.url, pair.key, queue)
    try:
        await a.post(f"/v1/queues/{queue}/messages", json={"body": "crossed"})
        assert (await next_message(ws, BEFORE_SAFETY_POLL_S))["body"] == "crossed"
    finally:
        await ws.close()
    await a.put("/v1/limits", json={"per_queue": None})
