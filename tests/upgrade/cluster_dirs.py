"""A whole cluster run from data directories that outlive it: one etcd member, three nodes, a
manager and a gateway on ``cluster://``, each a process group of its own, stopped by PID.

The upgrade test needs a cluster stopped by one release and started by the next on the same
directories (``root/etcd``, ``root/nodes/n{i}``, ``root/gateway``); ports are new on every
start (etcd keeps its member's peer address, which a single member never dials).
``code``: the checkout whose ``pushgate`` runs (None: this one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.local_ports import free_ports

REPO = Path(__file__).resolve().parents[2]
_PUSHGATE = [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())"]


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer 200 within {timeout_s:.0f}s")


@dataclass
class ClusterDirs:
    root: Path
    logs: Path
    code: Path | None = None
    manager_args: Sequence[str] = ()
    timeout_s: float = 60.0
    etcd_endpoint: str = ""
    url: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def _launch(self, name: str, argv: Sequence[str]) -> None:
        env = dict(os.environ)
        if self.code is not None:
            env["PYTHONPATH"] = str(self.code)
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                list(argv),
                cwd=self.code or REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> ClusterDirs:
        self.logs.mkdir(parents=True, exist_ok=True)
        client, peer, gateway, *nodes = free_ports(6)
        self.etcd_endpoint = endpoint = f"127.0.0.1:{client}"
        self._launch(
            "etcd",
            [
                "etcd", "--name", "m0", "--data-dir", str(self.root / "etcd"),
                "--listen-client-urls", f"http://{endpoint}", "--advertise-client-urls", f"http://{endpoint}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"m0=http://127.0.0.1:{peer}",
            ],
        )  # fmt: skip
        _wait_http(f"http://{endpoint}/health", self.timeout_s)
        for i, port in enumerate(nodes):
            data = str(self.root / "nodes" / f"n{i}")
            argv = [*_PUSHGATE, "node", "--data", data, "--listen", f"127.0.0.1:{port}", "--etcd", endpoint]
            self._launch(f"n{i}", [*argv, "--id", f"n{i}"])
        self._launch("m0", [*_PUSHGATE, "manager", "--etcd", endpoint, "--id", "m0", *self.manager_args])
        self.url = f"http://127.0.0.1:{gateway}"
        store = f"cluster://{endpoint}?replication_factor=3"
        data = str(self.root / "gateway")
        self._launch(
            "gateway", [*_PUSHGATE, "serve", "--data", data, "--port", str(gateway), "--store", store]
        )
        _wait_http(f"{self.url}/readyz", self.timeout_s)
        return self

    def stop(self) -> None:
        """Gateway, manager, nodes, then etcd: each SIGTERM, then SIGKILL after 20 s."""
        for name in [n for n in self.procs if n != "etcd"] + ["etcd"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def log_tails(self, chars: int = 4000) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}"
            for path in sorted(self.logs.iterdir())
        )
