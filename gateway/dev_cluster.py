"""``pushgate dev-cluster --data DIR [--nodes 3] [--port 8080]``: a whole cluster on this machine.

In the foreground: one etcd member (Debian's ``etcd`` binary, free loopback ports, a
temporary data directory), ``--nodes`` backend nodes, two managers (one leads, one stands
by) and a gateway on ``cluster://``. Each child runs in its own process group; Ctrl-C (or
SIGTERM) stops them all, gateway first and etcd last, by process group, then exits.
Every address and PID is printed, so one can kill a node and watch the cluster fail over.

With ``--tls`` it first makes a throwaway CA and a certificate for etcd, each node, each
manager and the gateway in ``DIR/tls`` (``backend_store/cluster/protocol/tls_certs.py``), and every
connection runs mutual TLS with them: the node protocol (node ports, leader links, the
gateway's node clients) and etcd's (etcd serves TLS only, to clients with a certificate of
that CA).

Each pool of queues has one partition unless ``--partitions N`` says otherwise (a manager's
own default is one per node): a pool's partitions spread its leaders over machines, and here
every node shares this machine's cores, so each partition more only adds commits. On a
2-core machine at 10,000 queues, one partition cost the cluster about half the CPU a send of
three and sent 0.75-0.99x the embedded store's rate against 0.66-0.68x; the price is a longer
first pass for the new leader after a failover, over all the queues (docs/cluster.md, section
13, "On one machine, one partition a pool"). Kill the node leading it to watch a failover
(``GET /v1/cluster`` names it).

``--lease-ttl`` is how long a dead leader goes unnoticed: 1 s here by default, where a
node's own default is 2 (docs/cluster.md, section 7, "Choosing the lease TTL": every process
of a dev cluster is on one machine, so no network's delays count against it, and at 1 s a
failover at 10,000 queues took 1.2-2.1 s where 2 s took 2.0-3.2). etcd grants no lease
shorter than 1.5 times its election timeout (rounded up to whole seconds: 2 s at its
default 1,000 ms), so the dev cluster starts its etcd with an election timeout that grants
the TTL asked (:func:`etcd_election_timeout_ms`; one member, so the timeout elects nothing
here).

etcd's state lives only as long as the run, so the nodes' partitions do too: a new run on
the same ``DIR`` starts from an empty cluster (it clears what an earlier run left in
``DIR``, and refuses a non-empty ``DIR`` that no dev cluster made). Logs of the nodes,
managers and etcd are in ``DIR/logs``; the gateway logs to this terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from backend_store.cluster.protocol.tls import TlsFiles
from backend_store.cluster.protocol.tls_certs import make_cluster_certificates

from .local_ports import free_port, free_ports

MARKER = ".pushgate-dev-cluster"
STOP_TIMEOUT_S = 10.0
START_TIMEOUT_S = 30.0
LEASE_TTL_S = 1  # --lease-ttl's default (module docstring)
# etcd's defaults: its election timeout, and the heartbeat interval it counts ticks in.
ETCD_ELECTION_MS = 1000
ETCD_HEARTBEAT_MS = 100


def etcd_election_timeout_ms(lease_ttl_s: float) -> int:
    """The election timeout (ms, at etcd's 100 ms heartbeat) at which etcd grants a
    ``lease_ttl_s`` lease: etcd's shortest lease is ``ceil(3 * ticks // 2 * heartbeat)``
    seconds (``ticks`` = election timeout / heartbeat), 2 s at its default 1,000 ms; leases
    are whole seconds. Never above etcd's default."""
    granted_ms = max(1, round(lease_ttl_s)) * 1000
    ticks = min(ETCD_ELECTION_MS // ETCD_HEARTBEAT_MS, granted_ms // ETCD_HEARTBEAT_MS * 2 // 3)
    return ticks * ETCD_HEARTBEAT_MS


@dataclass
class Child:
    """One process of the cluster, in a process group of its own."""

    name: str
    argv: list[str]
    address: str = ""
    log_path: Path | None = None  # None: this terminal
    process: subprocess.Popen[bytes] | None = None
    reported_exit: bool = False

    def start(self) -> None:
        if self.log_path is None:
            self.process = subprocess.Popen(self.argv, start_new_session=True)
            return
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self) -> None:
        """SIGTERM to its group, then SIGKILL if it has not exited within the timeout."""
        if self.process is None:
            return
        self.signal_group(signal.SIGCONT)  # a process someone froze must run to exit
        self.signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.process.wait()


@dataclass
class DevCluster:
    data: Path
    nodes: int = 3
    port: int = 8080
    host: str = "127.0.0.1"
    lease_ttl_s: float = LEASE_TTL_S
    tls: bool = False
    partitions: int = 1  # the managers' --partitions (module docstring: why one)
    log_level: str = "warning"  # the nodes' and managers' --log-level
    children: list[Child] = field(default_factory=list)
    etcd_dir: Path | None = None

    @property
    def logs(self) -> Path:
        return self.data / "logs"

    def prepare(self) -> None:
        """Make ``DIR`` ready for a new run (clear an earlier run's state, never anyone else's)."""
        if self.data.exists() and any(self.data.iterdir()) and not (self.data / MARKER).exists():
            raise SystemExit(
                f"pushgate dev-cluster: --data {self.data} is not empty and was not made by dev-cluster"
            )
        for name in ("nodes", "gateway", "logs", "tls"):
            if (self.data / name).exists():
                shutil.rmtree(self.data / name)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.data / MARKER).write_text("made by pushgate dev-cluster; cleared at its next start\n")

    def pushgate(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gateway.cli", *args]

    def start(self) -> None:
        if shutil.which("etcd") is None:
            raise SystemExit("pushgate dev-cluster: needs etcd on PATH (Debian: apt-get install etcd-server)")
        self.prepare()
        # etcd's state lives for this run only, so in memory when the machine has it: etcd
        # fsyncs every write, and on a busy disk its 2 s leases expired.
        shm = Path("/dev/shm")
        in_memory = shm.is_dir() and os.access(shm, os.W_OK)
        self.etcd_dir = Path(tempfile.mkdtemp(prefix="pushgate-etcd-", dir=shm if in_memory else None))
        client, peer = free_ports(2)
        endpoint = f"127.0.0.1:{client}"
        certificates = self._certificates()
        etcd_files = certificates.get("etcd")
        scheme = "https" if etcd_files else "http"
        etcd_tls = (
            []
            if etcd_files is None
            else ["--cert-file", str(etcd_files.cert), "--key-file", str(etcd_files.key),
                  "--trusted-ca-file", str(etcd_files.ca), "--client-cert-auth"]
        )  # fmt: skip
        etcd = Child(
            "etcd",
            [
                "etcd",
                "--name", "dev",
                "--data-dir", str(self.etcd_dir / "member"),
                "--listen-client-urls", f"{scheme}://{endpoint}",
                "--advertise-client-urls", f"{scheme}://{endpoint}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"dev=http://127.0.0.1:{peer}",
                "--election-timeout", str(etcd_election_timeout_ms(self.lease_ttl_s)),
                "--heartbeat-interval", str(ETCD_HEARTBEAT_MS),
                "--log-level", "warn",
                *etcd_tls,
            ],
            endpoint,
            self.logs / "etcd.log",
        )  # fmt: skip
        self._launch(etcd)
        self._wait(
            etcd, f"{scheme}://{endpoint}/health", lambda r: r.json().get("health") == "true", etcd_files
        )
        node_ports = free_ports(self.nodes)
        for i in range(1, self.nodes + 1):
            address = f"127.0.0.1:{node_ports[i - 1]}"
            node_dir = self.data / "nodes" / f"node-{i}"
            argv = self.pushgate("node", "--data", str(node_dir), "--listen", address, "--etcd", endpoint)
            argv += ["--lease-ttl", str(self.lease_ttl_s), "--log-level", self.log_level]
            if (files := certificates.get(f"node-{i}")) is not None:
                argv += [
                    "--tls-cert",
                    str(files.cert),
                    "--tls-key",
                    str(files.key),
                    "--tls-ca",
                    str(files.ca),
                    *_etcd_tls_flags(files),
                ]
            self._launch(
                Child(f"node-{i}", [*argv, "--id", f"node-{i}"], address, self.logs / f"node-{i}.log")
            )
        for i in (1, 2):
            argv = self.pushgate("manager", "--etcd", endpoint, "--id", f"manager-{i}")
            argv += ["--lease-ttl", str(self.lease_ttl_s), "--log-level", self.log_level]
            argv += ["--partitions", str(self.partitions)]
            if (files := certificates.get(f"manager-{i}")) is not None:
                argv += _etcd_tls_flags(files)
            self._launch(Child(f"manager-{i}", argv, "", self.logs / f"manager-{i}.log"))
        port = self.port or free_port(self.host)
        url = f"http://{self.host}:{port}"
        store = f"cluster://{endpoint}"
        if (files := certificates.get("gateway")) is not None:
            paths = {"tls_cert": files.cert, "tls_key": files.key, "tls_ca": files.ca}
            paths |= {"etcd_cert": files.cert, "etcd_key": files.key, "etcd_ca": files.ca}
            store += "?" + "&".join(f"{name}={quote(str(path), safe='/')}" for name, path in paths.items())
        argv = self.pushgate(
            "serve", "--data", str(self.data / "gateway"), "--host", self.host, "--port", str(port),
            "--store", store,
        )  # fmt: skip
        gateway = Child("gateway", argv, url)
        self._launch(gateway)
        self._wait(gateway, f"{url}/readyz", lambda r: r.status_code == 200)
        print(f"store URL  {store}", flush=True)
        print(f"ready: the gateway serves {url} (Ctrl-C stops the cluster)", flush=True)

    def _certificates(self) -> dict[str, TlsFiles]:
        """With ``--tls``: a CA and certificates for etcd, every node and manager and the
        gateway, in DIR/tls."""
        if not self.tls:
            return {}
        members = [
            "etcd",
            *(f"node-{i}" for i in range(1, self.nodes + 1)),
            "manager-1",
            "manager-2",
            "gateway",
        ]
        made = make_cluster_certificates(self.data / "tls", members, hosts=("127.0.0.1", "localhost"))
        ca = made["gateway"].ca
        print(f"{'tls':<10} {'mutual TLS':<24} CA {ca}; certificates and keys in {ca.parent}", flush=True)
        return made

    def _launch(self, child: Child) -> None:
        self.children.append(child)
        child.start()
        where = child.address or "-"
        log = f"  log {child.log_path}" if child.log_path else ""
        print(f"{child.name:<10} {where:<24} pid {child.pid}{log}", flush=True)

    def _wait(self, child: Child, url: str, ok: object, tls: TlsFiles | None = None) -> None:
        """Until ``ok(GET url)``; ``tls``: over TLS, with that client certificate."""
        assert callable(ok)
        verify: ssl.SSLContext | bool = True
        if tls is not None:
            verify = ssl.create_default_context(cafile=tls.ca)
            verify.load_cert_chain(tls.cert, tls.key)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not child.running():
                raise SystemExit(f"pushgate dev-cluster: {child.name} exited during start-up (see its log)")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if ok(httpx.get(url, timeout=1, verify=verify)):
                    return
            time.sleep(0.1)
        raise SystemExit(f"pushgate dev-cluster: {child.name} not ready after {START_TIMEOUT_S:g}s")

    def watch(self, stop: list[int]) -> int:
        """Until a stop signal: report children that exit; the gateway's exit ends the run."""
        while not stop:
            for child in self.children:
                if not child.running() and not child.reported_exit:
                    child.reported_exit = True
                    code = child.process.returncode if child.process is not None else None
                    print(f"{child.name} (pid {child.pid}) exited with {code}", flush=True)
                    if child.name == "gateway":
                        return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        if self.etcd_dir is not None:
            shutil.rmtree(self.etcd_dir, ignore_errors=True)


def _etcd_tls_flags(files: TlsFiles) -> list[str]:
    """A node's or manager's flags for etcd over mutual TLS, with its own certificate."""
    return ["--etcd-ca", str(files.ca), "--etcd-cert", str(files.cert), "--etcd-key", str(files.key)]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="pushgate dev-cluster",
        description="Run etcd, backend nodes, two managers and a gateway on this machine (docs/cluster.md).",
    )
    parser.add_argument("--data", type=Path, required=True, help="directory for the nodes, gateway and logs")
    parser.add_argument("--nodes", type=int, default=3, help="backend nodes (default 3)")
    parser.add_argument(
        "--port", type=int, default=8080, help="the gateway's port (default 8080; 0: a free one)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="the gateway's address (default 127.0.0.1)")
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=LEASE_TTL_S,
        help="etcd lease TTL of nodes and managers in whole seconds: how long a dead leader goes unnoticed"
        f" (default {LEASE_TTL_S}; etcd here is started to grant it)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="make a throwaway CA and certificates in DIR/tls and run the node protocol over mutual TLS",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        default=1,
        help="the shared partitions each pool of queues has (the managers' --partitions; default 1:"
        " the nodes share this machine's cores, so more only add commits)",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["error", "warning", "info", "debug"],
        help="the nodes' and managers' log level (default warning; info adds each term's start and"
        " first pass, promotions and plans), in DIR/logs",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 9:
        parser.error("--nodes must be between 1 and 9")
    if args.partitions < 1:
        parser.error("--partitions must be 1 or more")
    cluster = DevCluster(
        args.data.resolve(),
        args.nodes,
        args.port,
        args.host,
        args.lease_ttl,
        args.tls,
        args.partitions,
        log_level=args.log_level,
    )
    stop: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        stop.append(signum)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        cluster.start()
        code = cluster.watch(stop)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        code = 2
    finally:
        print("stopping the cluster", flush=True)
        cluster.stop()
    return code
