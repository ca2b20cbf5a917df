"""A Spark standalone cluster on this machine: a master and one worker, started from
pyspark's own ``bin/spark-class`` (no Spark installation needed), for trying the report on
a real cluster (``--master spark://...``), for the tests and for ``bench/usage_report.py``.

Each process is started in a process group of its own and stopped through it, so the
executors the worker launched for an application go with it. The master's REST submission
server is off (its fixed port 6066 would clash between two clusters on one machine); the
master's web UI is on, on the port given, because its ``/json/`` page says when the worker
has registered. Logs and the worker's directories go under ``work_dir``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark


def spark_class() -> Path:
    """pyspark's ``bin/spark-class``: runs a Spark JVM class with pyspark's jars."""
    return Path(pyspark.__file__).parent / "bin" / "spark-class"


class ClusterError(Exception):
    """The cluster did not come up; the message names its log."""


@dataclass
class StandaloneCluster:
    work_dir: Path
    master_port: int
    master_web_port: int
    cores: int = 1
    memory: str = "2g"  # the worker's to hand out: an executor takes 1g by default
    host: str = "127.0.0.1"
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(spark_class().parent.parent),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOG_DIR": str(self.work_dir / "logs"),
            "SPARK_LOCAL_DIRS": str(self.work_dir / "local"),
            "SPARK_WORKER_DIR": str(self.work_dir / "worker"),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def _start(self, name: str, *args: str) -> None:
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
        with log:
            self.processes.append(
                subprocess.Popen(
                    [str(spark_class()), *args],
                    env=self._env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    def state(self) -> dict[str, object] | None:
        """The master's ``/json/`` page, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.master_web_port}/json/", timeout=5) as r:
                doc: dict[str, object] = json.load(r)
                return doc
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def _wait(self, what: str, log: str, worker: bool, deadline: float) -> None:
        while True:
            state = self.state()
            if state is not None and (not worker or int(str(state.get("aliveworkers", 0))) >= 1):
                return
            for proc in self.processes:
                if proc.poll() is not None:
                    raise ClusterError(f"the {what} exited ({proc.returncode}): see {self.work_dir / log}")
            if time.monotonic() > deadline:
                raise ClusterError(f"no {what} after the deadline: see {self.work_dir / log}")
            time.sleep(0.2)

    def start(self, timeout_s: float = 180.0) -> str:
        """Start the master, then the worker; return the master URL once the worker has
        registered. On failure everything started is stopped."""
        for sub in ("logs", "local", "worker"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        try:
            self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.host,
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_web_port),
            )
            self._wait("master", "master.log", False, deadline)
            self._start(
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                self.host,
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                "0",
                "--work-dir",
                str(self.work_dir / "worker"),
                self.url,
            )
            self._wait("registered worker", "worker.log", True, deadline)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM each process group (the worker's first: it stops the executors it
        launched, which are in its group too), then SIGKILL a group still there after
        ``timeout_s``."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes.clear()

    @contextlib.contextmanager
    def running(self, timeout_s: float = 180.0) -> Iterator[str]:
        self.start(timeout_s)
        try:
            yield self.url
        finally:
            self.stop()
