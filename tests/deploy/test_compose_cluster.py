"""The README's container deployment, end to end: its three commands build deploy/Containerfile,
bring deploy/compose.yaml's cluster up (etcd, three nodes, two managers, Redis, two gateways)
and report usage on it. Messages go in and out through both gateways, before and after one
node's container (the queue's leader) is killed, and the report reads both gateways' files.

No registry is reachable here: the base image is Debian's own packages (mmdebstrap into
``podman import``) and Python packages come from a wheelhouse on the host
(tests/fixtures/container_images.py). The cluster runs under its own compose project name and
is torn down by it; nothing else on the machine is touched. Needs root, podman, podman-compose,
runc and mmdebstrap (scripts/test installs them; docs/testing.md)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend_store.cluster.coordination.pools import place
from gateway.local_ports import free_ports
from tests.conftest import scaled
from tests.fixtures.container_images import REPO, base_image, podman_environment, wheelhouse
from tests.newcomer import doc_blocks

# From nothing on a loaded 2-core VM: the base image and the wheelhouse about 4 minutes each,
# the image 4-5 (docs/testing.md); with both cached, 2-4 minutes in all.
pytestmark = pytest.mark.timeout(1800)

README_BLOCKS = ("podman build ", "podman-compose -f deploy/compose.yaml up", "pushgate usage report")


def readme_commands() -> list[str]:
    """The README's three deployment commands, in order, as written."""
    blocks = [b.source.strip() for b in doc_blocks.parse(REPO / "README.md") if b.lang == "sh"]
    found = []
    for start in README_BLOCKS:
        matching = [b for b in blocks if start in b]
        assert len(matching) == 1, f"README.md: one sh block with {start!r} expected, found {matching}"
        found.append(matching[0])
    return found


@dataclass
class Deployment:
    project: str
    env: dict[str, str]
    gateways: list[str]  # base URLs of gateway-1 and gateway-2

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, check=check)

    def shell(self, command: str) -> subprocess.CompletedProcess[str]:
        """A README command, with ``-p PROJECT`` given to podman-compose."""
        command = command.replace("podman-compose ", f"podman-compose -p {self.project} ", 1)
        return subprocess.run(
            ["bash", "-c", command],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=scaled(900),
        )

    def logs(self) -> str:
        names = self.podman(
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            f"label=io.podman.compose.project={self.project}",
            check=False,
        )
        out = []
        for name in names.stdout.split():
            logged = self.podman("logs", "--tail", "30", name, check=False)
            out.append(f"--- {name}\n{logged.stdout}{logged.stderr}")
        return "\n".join(out)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    assert os.geteuid() == 0, "the deployment test runs podman as root (docs/testing.md)"
    env = podman_environment(tmp_path)
    with ThreadPoolExecutor(2) as pool:  # from nothing, each takes minutes: side by side
        base_made, wheels_made = pool.submit(base_image, env), pool.submit(wheelhouse)
        base, wheels = base_made.result(), wheels_made.result()
    run = uuid.uuid4().hex[:8]
    image = f"localhost/pushgate-test:{run}"
    ports = free_ports(2)  # below the ephemeral range, as every test's (docs/testing.md)
    env |= {
        "PUSHGATE_IMAGE": image,
        "PUSHGATE_ETCD_IMAGE": base,
        "PUSHGATE_REDIS_IMAGE": base,
        "PUSHGATE_GATEWAY_1_PORT": str(ports[0]),
        "PUSHGATE_GATEWAY_2_PORT": str(ports[1]),
    }
    d = Deployment(f"pushgate-test-{run}", env, [f"http://127.0.0.1:{p}" for p in ports])
    build, up, _ = readme_commands()
    # The README's build, offline: the base made above, Python packages from the wheelhouse, and
    # this run's tag (plus one kept between runs, so podman's layer cache keeps the layers).
    offline = (
        f"-t {image} -t localhost/pushgate-test:latest --build-arg BASE_IMAGE={base} "
        f"--volume {wheels}:/wheels:ro --build-arg 'PIP_OPTIONS=--no-index --find-links /wheels'"
    )
    assert " -t localhost/pushgate " in build
    built = d.shell(build.replace("-t localhost/pushgate", offline, 1))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    try:
        started = d.shell(up)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        yield d
    finally:
        down = d.shell("podman-compose -f deploy/compose.yaml down -v")
        d.podman("rmi", image, check=False)
        assert down.returncode == 0, down.stderr[-3000:]
        left = d.podman("ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={d.project}")
        assert left.stdout.strip() == "", f"containers left behind: {left.stdout}"


def wait_until_healthy(d: Deployment) -> None:
    deadline = time.monotonic() + scaled(120)
    for url in d.gateways:
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{url}/healthz never answered\n{d.logs()}"
            time.sleep(0.5)
    # The image's HEALTHCHECK (on /healthz) passes in a gateway's container, compose.yaml's
    # (the port accepts) in a node's; without systemd podman runs them only when asked.
    for service in ("gateway-1", "gateway-2", "node-1", "node-2", "node-3"):
        while (check := d.podman("healthcheck", "run", d.container(service), check=False)).returncode:
            assert time.monotonic() < deadline, f"{service}: {check.stdout}{check.stderr}\n{d.logs()}"
            time.sleep(0.5)


def bootstrap_key(d: Deployment) -> str:
    """The admin key the first gateway to start made, from its data volume."""
    deadline = time.monotonic() + scaled(60)
    while True:
        for service in ("gateway-1", "gateway-2"):
            key = d.podman(
                "exec", d.container(service), "cat", "/var/lib/pushgate/bootstrap-admin-key", check=False
            )
            if key.returncode == 0 and key.stdout.strip():
                return key.stdout.strip()
        assert time.monotonic() < deadline, f"no bootstrap key\n{d.logs()}"
        time.sleep(0.5)


def send(client: httpx.Client, url: str, body: str) -> None:
    """A send with a dedupe id, retried while a failover may answer 503 (docs/cluster.md)."""
    deadline = time.monotonic() + scaled(60)
    while True:
        r = client.post(f"{url}/v1/queues/orders/messages", json={"body": body, "dedupe_id": body})
        if r.status_code < 300:
            return
        assert r.status_code == 503 and time.monotonic() < deadline, f"send {body}: {r.status_code} {r.text}"
        time.sleep(0.2)


def receive_all(client: httpx.Client, url: str, bodies: set[str]) -> None:
    """Receive and ack until every body in ``bodies`` came (and nothing else)."""
    deadline = time.monotonic() + scaled(60)
    left = set(bodies)
    while left:
        assert time.monotonic() < deadline, f"never received {sorted(left)} through {url}"
        r = client.post(f"{url}/v1/queues/orders/receive", json={"max": 10, "wait_s": 2})
        if r.status_code == 503:
            continue
        assert r.status_code == 200, r.text
        messages = r.json()["messages"]
        for m in messages:
            assert m["body"] in left, f"unexpected {m['body']!r} through {url}"
            left.discard(m["body"])
        if messages:
            acked = client.post(
                f"{url}/v1/queues/orders/ack", json={"receipts": [m["receipt"] for m in messages]}
            )
            assert acked.status_code == 200 and acked.json()["failed"] == [], acked.text


def placed_partitions(doc: dict[str, Any], queue: str) -> list[dict[str, Any]]:
    """The partition a one-partition queue created on the pool lives on: placed as the
    gateway places it (coordination/pools.py), over the pool's slots in ``GET /v1/cluster``."""
    slots = sorted((p for p in doc["partitions"] if p["tenant"] == ""), key=lambda p: p["index"])
    (pid,) = place("default", queue, 1, [p["id"] for p in slots])
    return [p for p in slots if p["id"] == pid]


def test_the_readme_cluster_serves_through_both_gateways_survives_a_node_and_reports_usage(
    deployment: Deployment,
) -> None:
    d = deployment
    wait_until_healthy(d)
    headers = {"Authorization": f"Bearer {bootstrap_key(d)}"}
    one, two = d.gateways
    with httpx.Client(headers=headers, timeout=scaled(30)) as client:
        # A PUT is repeatable (200 when the queue exists alike): a 503 on a cluster just up (a
        # partition's first leader changing, seen once in five runs) is retried, as a client would.
        deadline = time.monotonic() + scaled(60)
        while (created := client.put(f"{one}/v1/queues/orders", json={})).status_code == 503:
            assert time.monotonic() < deadline, created.text
            time.sleep(0.5)
        assert created.status_code in (200, 201), created.text
        assert created.json()["attributes"]["replication_factor"] == 3  # compose.yaml's store URL

        send(client, one, "a")
        receive_all(client, two, {"a"})
        send(client, two, "b")
        receive_all(client, one, {"b"})
        send(client, one, "kept")  # acknowledged before the kill, received after it

        cluster = client.get(f"{two}/v1/cluster").json()
        (partition,) = placed_partitions(cluster, "orders")
        assert len(partition["followers"]) == 2
        d.podman("kill", d.container(partition["leader"]))

        send(client, one, "c")
        send(client, two, "d")
        receive_all(client, two, {"kept", "c"} | {"d"})
        after = client.get(f"{one}/v1/cluster").json()
        (moved,) = placed_partitions(after, "orders")
        assert moved["epoch"] > partition["epoch"]

    # Both gateways' usage files in the shared directory (flushed every 10 s), then the report.
    deadline = time.monotonic() + scaled(60)
    while True:
        listing = d.podman(
            "exec", d.container("gateway-1"), "find", "/var/lib/pushgate-usage", "-name", "*.parquet"
        )
        if all(f"gateway_{n}" in listing.stdout for n in (1, 2)):  # names: docs/usage.md
            break
        assert time.monotonic() < deadline, f"usage files: {listing.stdout}"
        time.sleep(1)
    report = d.shell(readme_commands()[2])
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert "gateway_1" in report.stdout and "gateway_2" in report.stdout, (
        report.stdout + report.stderr[-3000:]
    )
    written = d.podman("exec", d.container("gateway-1"), "find", "/var/lib/pushgate/reports", "-type", "f")
    assert written.stdout.strip(), "the report wrote nothing"
