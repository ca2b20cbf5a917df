"""Shared pieces of the push benchmarks: start a real gateway (``pushgate serve``) or a
baseline server in its own process, read a process's RSS, summarise latencies."""

from __future__ import annotations

import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.local_ports import free_port as free_port  # noqa: E402  (a script from a checkout; re-exported)


def machine() -> str:
    cpus = os.cpu_count()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.node()}: {cpus} CPUs {model}, Python {platform.python_version()}, {platform.platform()}"
    )


def fdatasync_cost(directory: Path, count: int = 200) -> str:
    """p50 / p90 / p99 of a 4 KiB write and fdatasync in ``directory``."""
    path = directory / "fdatasync-probe"
    took: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(count):
            os.pwrite(fd, os.urandom(4096), 0)
            began = time.perf_counter()
            os.fdatasync(fd)
            took.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    cuts = statistics.quantiles(took, n=100, method="inclusive")
    return f"fdatasync of 4 KiB: p50 {cuts[49]:.2f} / p90 {cuts[89]:.2f} / p99 {cuts[98]:.2f} ms"


# Profilers attached to gateways by start_gateway, by the gateway's PID.
_profilers: dict[int, subprocess.Popen[bytes]] = {}


def start_gateway(
    data_dir: Path, store: str | None = None, env: dict[str, str] | None = None, tree: Path = REPO
) -> tuple[subprocess.Popen[str], str, str]:
    """``pushgate serve`` on a free port (uvicorn, uvloop, httptools, sans-I/O websockets);
    ``store``: its ``--store`` URL (default: the embedded store in ``data_dir``); ``env``:
    more environment variables; ``tree``: the source tree it runs from (``python -m`` finds
    the packages of its working directory first: another commit's, from ``git archive``)."""
    # PUSHGATE_BENCH_PROFILE=file.prof runs the gateway under cProfile (written at exit).
    profile = os.environ.get("PUSHGATE_BENCH_PROFILE")
    prefix = ["-m", "cProfile", "-o", profile, "-m", "gateway.cli"] if profile else []
    proc = subprocess.Popen(
        [
            sys.executable,
            *(prefix or ["-m", "gateway.cli"]),
            "serve",
            "--data",
            str(data_dir),
            "--port",
            "0",
            *(["--store", store] if store else []),
        ],
        cwd=tree,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert proc.stdout is not None
    key = url = ""
    deadline = time.monotonic() + 60
    while not url and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "Bootstrap admin key" in line:
            key = line.rsplit(" ", 1)[1].strip()
        if "serving on" in line:
            url = line.rsplit(" ", 1)[1].strip()
    if not (key and url):
        proc.kill()
        raise SystemExit("the gateway did not start")
    if spy := os.environ.get("PUSHGATE_BENCH_PYSPY"):
        # py-spy attached to the gateway (all threads, collapsed stacks), written when stop() ends it;
        # PUSHGATE_BENCH_PYSPY_RATE samples per second (default 200: more slows the gateway).
        py_spy = str(Path(sys.executable).with_name("py-spy"))
        command = [
            py_spy,
            "record",
            "--pid",
            str(proc.pid),
            "--format",
            "raw",
            "--rate",
            os.environ.get("PUSHGATE_BENCH_PYSPY_RATE", "200"),
            "-o",
            spy,
        ]
        if os.environ.get("PUSHGATE_BENCH_PYSPY_GIL"):
            # Only samples holding the GIL: where the CPU goes (otherwise waits in C, such as
            # fsync or a thread waiting for work, show as busy).
            command.append("--gil")
        _profilers[proc.pid] = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, url, key


def start_dev_cluster(data_dir: Path, nodes: int = 3) -> tuple[subprocess.Popen[str], str, str, list[int]]:
    """``pushgate dev-cluster`` (etcd, ``nodes`` node processes, two managers, a gateway on
    ``cluster://``; queues replicated three times, sync) in its own process group: the
    command, the gateway's URL, the admin key, and the PIDs of its processes (the gateway
    first), whose CPU is the cluster's."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "dev-cluster",
            "--data",
            str(data_dir),
            "--nodes",
            str(nodes),
            "--port",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    assert proc.stdout is not None
    url = key = ""
    pids: dict[str, int] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        words = line.split()
        if line.startswith("Bootstrap admin key"):
            key = words[-1]
        elif " pid " in line and "exited" not in line:  # "n1  127.0.0.1:port  pid N ..."
            pids[words[0]] = int(line.split(" pid ", 1)[1].split()[0])
        elif line.startswith("ready: the gateway serves"):
            url = words[4]
            gateway = [pid for name, pid in pids.items() if name.startswith("gateway")]
            return (
                proc,
                url,
                key,
                gateway + [pid for name, pid in pids.items() if not name.startswith("gateway")],
            )
    stop_group(proc)
    raise SystemExit("pushgate dev-cluster did not become ready")


def stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGINT to a process started in its own session (it stops its children), then its group."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def serve(
    data_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """``pushgate serve --data DIR --port 0 EXTRA...``: the process and its URL, once it serves
    (no bootstrap key awaited: for a second gateway on a store, or one that needs none)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--data", str(data_dir), "--port", "0", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "serving on" in line:
            return proc, line.rsplit(" ", 1)[1].strip()
    proc.kill()
    raise SystemExit(f"pushgate serve {' '.join(extra)} did not start")


def start_script(script: str, *args: str) -> subprocess.Popen[str]:
    """Run ``python <script> <args>`` from the repository (a baseline server, a client)."""
    return subprocess.Popen([sys.executable, script, *args], cwd=REPO, text=True)


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


def create_queue(url: str, key: str, name: str, **attributes: object) -> None:
    response = httpx.put(
        f"{url}/v1/queues/{name}", json=attributes, headers={"Authorization": f"Bearer {key}"}
    )
    response.raise_for_status()


def fill_queue(url: str, key: str, name: str, count: int, body: str) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        for start in range(0, count, 100):
            batch = [{"body": body} for _ in range(min(100, count - start))]
            client.post(f"/v1/queues/{name}/messages", json={"messages": batch}).raise_for_status()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of each thread of a process so far, by thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _stat_cpu_seconds(task / "stat")
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return out


def _stat_cpu_seconds(stat: Path) -> float:
    """utime + stime of a ``/proc`` ``stat`` file, in seconds."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpus: set[int]) -> None:
    """Run every thread of a process (and the threads it starts later) on ``cpus`` only."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 of samples (in the samples' unit)."""
    if not samples:
        return float("nan"), float("nan")
    if len(samples) < 2:
        return samples[0], samples[0]
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[98]


def stop(proc: subprocess.Popen[str]) -> None:
    if (profiler := _profilers.pop(proc.pid, None)) is not None:
        profiler.send_signal(signal.SIGINT)
        profiler.wait(30)
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
