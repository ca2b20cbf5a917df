"""``pushgate serve`` as a child process: start it, read what it prints, stop it."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import scaled

REPO = Path(__file__).resolve().parents[2]
_SERVING = re.compile(r"Pushgate serving on (https?://\S+)")
_KEY = re.compile(r"Bootstrap admin key \(shown once\): (\S+)")


class ServeProcess:
    def __init__(
        self, args: Sequence[str], *, cwd: Path = REPO, env: dict[str, str] | None = None, shell: bool = False
    ):
        self.proc = subprocess.Popen(
            args if not shell else args[0],
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            shell=shell,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        self.url = ""
        self.key: str | None = None

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.put(line)

    def wait_until_serving(self, timeout: float) -> ServeProcess:
        deadline = time.monotonic() + scaled(timeout)
        while not self.url:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line:
                self.output.append(line)
                if m := _KEY.search(line):
                    self.key = m.group(1)
                if m := _SERVING.search(line):
                    self.url = m.group(1)
            if time.monotonic() > deadline or (not line and self.proc.poll() is not None):
                self.stop()
                raise RuntimeError("pushgate serve did not start:\n" + "".join(self.output))
        return self

    def wait_for_line(self, text: str, timeout: float) -> str:
        """The next line the process prints that holds ``text`` (lines before it are kept in
        ``output``); an AssertionError after ``timeout`` seconds (scaled)."""
        deadline = time.monotonic() + scaled(timeout)
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.output.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout} s:\n" + "".join(self.output[-20:]))

    def terminate(self) -> int:
        """SIGTERM the whole session (a shell's child too) and wait for the exit code."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        code = self.proc.wait(scaled(30))
        self._pump_thread.join(scaled(5))
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._pump_thread.join(scaled(5))


def serve(data_dir: Path, *extra: str, env: dict[str, str] | None = None) -> ServeProcess:
    args = [sys.executable, "-m", "gateway.cli", "serve", "--data", str(data_dir), "--port", "0", *extra]
    return ServeProcess(args, env=env).wait_until_serving(30)


def admin(data_dir: Path, *args: str, store_url: str | None = None) -> dict[str, Any]:
    """Run ``pushgate admin --data DIR ...`` as its own process, as an operator would (with
    ``--store URL`` when the gateway was given one: a cluster keeps its keys in etcd), and
    return the JSON object it prints."""
    store = [] if store_url is None else ["--store", store_url]
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "admin", "--data", str(data_dir), *store, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=True,
    )
    result: dict[str, Any] = orjson.loads(done.stdout)
    return result
