"""``pushgate dev-cluster --tls`` as a user runs it: certificates made in ``DIR/tls`` and
printed, a gateway serving through mutual TLS to its node and to etcd, a node and etcd
refusing plaintext, and
``pushgate admin --store`` with the printed store URL reaching the node.

One node (the leader links' TLS is tests/cluster/test_tls.py's): etcd, a node, two
managers and a gateway, stopped with SIGINT as Ctrl-C would.
"""

from __future__ import annotations

import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from backend_store.cluster.protocol.address import split_address
from backend_store.cluster.protocol.connection import Connection
from backend_store.cluster.protocol.wire import Hello
from tests.conftest import scaled
from tests.fixtures.dev_cluster import REPO, start_dev_cluster


def _plaintext_answer(address: str) -> list[object]:
    """What a node sends back to a plaintext gateway's hello (read to the end)."""
    conn = Connection("plaintext-gateway")
    with socket.create_connection(split_address(address), timeout=scaled(10)) as sock:
        sock.sendall(conn.data_to_send())
        peer = Connection("reader")
        while data := sock.recv(65536):
            peer.receive_data(data)
        return [e for e in peer.events_received() if isinstance(e, Hello)]


def test_dev_cluster_with_tls_runs_the_node_protocol_and_etcd_over_mutual_tls(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cluster = start_dev_cluster(data, nodes=1, extra=["--tls"])
    try:
        tls = data / "tls"
        assert f"CA {tls / 'ca.pem'}; certificates and keys in {tls}" in cluster.text()
        for member in ("node-1", "gateway"):
            assert (tls / f"{member}.pem").is_file()
            assert stat.S_IMODE((tls / f"{member}-key.pem").stat().st_mode) == 0o600
        assert f"tls_cert={tls / 'gateway.pem'}" in cluster.store_url

        headers = {"Authorization": f"Bearer {cluster.admin_key}"}
        with httpx.Client(base_url=cluster.gateway_url, headers=headers, timeout=scaled(30)) as http:
            assert http.put("/v1/queues/secured", json={}).status_code == 201
            sent = http.post("/v1/queues/secured/messages", json={"messages": [{"body": "over tls"}]})
            assert sent.status_code == 200, sent.text
            got = http.post("/v1/queues/secured/receive", json={"max": 10, "wait_s": 0})
            assert [m["body"] for m in got.json()["messages"]] == ["over tls"]

        # The node's port is TLS only: a plaintext hello gets nothing back, and the node says so.
        assert _plaintext_answer(cluster.addresses["node-1"]) == []
        node_log = data / "logs" / "node-1.log"
        deadline = time.monotonic() + scaled(10)
        while "refused a TLS connection from 127.0.0.1:" not in node_log.read_text(errors="replace"):
            assert time.monotonic() < deadline, node_log.read_text(errors="replace")[-2000:]
            time.sleep(0.05)

        # etcd is TLS only too, and wants a certificate of the cluster's CA: plain HTTP to its
        # port is refused, and so is TLS without a client certificate.
        etcd = cluster.addresses["etcd"]
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://{etcd}/health", timeout=scaled(10))
        anonymous = ssl.create_default_context(cafile=tls / "ca.pem")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"https://{etcd}/health", verify=anonymous, timeout=scaled(10))

        # The admin CLI with the printed URL reaches the node too (a delete goes to the leader).
        admin = [sys.executable, "-m", "gateway.cli", "admin", "--data", str(data / "gateway")]
        admin += ["--store", cluster.store_url, "delete-queue", "--tenant", "default", "secured"]
        done = subprocess.run(
            admin, cwd=REPO, capture_output=True, text=True, timeout=scaled(60), check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert '"deleted":"secured"' in done.stdout.replace(" ", "")
    finally:
        cluster.stop()
