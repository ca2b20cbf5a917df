"""Every code block of the README and docs/ runs, as written, against a real gateway.

One gateway per document (uvicorn on a free port, its data directory ``data/`` inside a
fresh working directory, as in the README: ``cat data/bootstrap-admin-key`` works), and the
document's blocks run in order, so a later block sees what an earlier one created. The
only change made to a block: the gateway's documented address ``:8080`` becomes the test
gateway's port. How each kind runs:

- ``sh``: ``bash -euo pipefail``, in the working directory, with ``.venv`` linked to the
  running interpreter's environment (so ``.venv/bin/pushgate`` works as in a clone);
- ``python``: saved to a file and run with the same interpreter;
- ``js``: a module script in a Chromium page on ``http://localhost:8000`` (the page server's
  origin, which the README allows; the test allows it from the start), ``prompt()`` answered
  with the bootstrap key, ``console.log`` as output;
- ``html``: the page itself, served at ``http://localhost:8000/``; its visible text is the output.

Port 8000 is the documented page server's: the test runs a real one on a free port and
changes ``:8000`` to it, as it does ``:8080``. (A page that Playwright's routing made up would
not do: Chromium treats it as public and refuses its requests to a loopback gateway.) A
``text`` block right after a block is its expected output (``...`` matches anything). The
rules for writing blocks are in tests/newcomer/doc_blocks.py.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway, start_gateway

from .doc_blocks import Block, DocError, matches, parse

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "clients" / "js" / "README.md"])
BLANK = "<!doctype html><html><head><meta charset='utf-8'><title>docs</title></head><body></body></html>"


def _id(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_every_block_follows_the_rules() -> None:
    problems = []
    for path in DOCUMENTS:
        try:
            blocks = parse(path)
        except DocError as exc:
            problems.append(str(exc))
            continue
        for block in blocks:
            if block.not_run is not None and len(block.not_run) < 10:
                problems.append(f"{block.where}: say why the block cannot run")
    assert problems == [], "\n".join(problems)


class PageServer(http.server.ThreadingHTTPServer):
    """Answers every GET with ``html``: the documented ``python3 -m http.server 8000``."""

    html = BLANK

    def __init__(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = server.html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.port: int = self.server_address[1]
        self.thread = threading.Thread(target=self.serve_forever, name="doc-pages", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join()


class DocRunner:
    """Runs one document's blocks against one gateway."""

    def __init__(self, workdir: Path, gateway: RunningGateway, chromium: Browser, pages: PageServer) -> None:
        self.workdir = workdir
        self.gateway = gateway
        self.chromium = chromium
        self.pages = pages
        self.page_origin = f"http://localhost:{pages.port}"
        (workdir / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
        tenants = gateway.services.authenticator.tenants
        gateway.call(tenants.set_origins("default", [self.page_origin]))

    def substitute(self, text: str) -> str:
        """The documented ports (gateway 8080, page server 8000) become the test's."""
        return text.replace(":8080", f":{self.gateway.port}").replace(":8000", f":{self.pages.port}")

    def source(self, block: Block) -> str:
        return self.substitute(block.source)

    def run(self, block: Block) -> str:
        if block.lang == "sh":
            return self._process(["bash", "-euo", "pipefail", "-c", self.source(block)], block)
        if block.lang == "python":
            script = self.workdir / "example.py"
            script.write_text(self.source(block))
            return self._process([sys.executable, str(script)], block)
        return self._browser(block)

    def _process(self, args: list[str], block: Block) -> str:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(
            args, cwd=self.workdir, env=env, capture_output=True, text=True, timeout=scaled(90), check=False
        )
        assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def _browser(self, block: Block) -> str:
        key = self.gateway.admin_key
        self.pages.html = self.source(block) if block.lang == "html" else BLANK
        context = self.chromium.new_context()
        try:
            page = context.new_page()
            page.set_default_timeout(scaled(20) * 1000)
            logs: list[str] = []
            errors: list[str] = []
            page.on("console", lambda message: logs.append(message.text))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("dialog", lambda dialog: dialog.accept(key))
            page.goto(f"{self.page_origin}/")
            if block.lang == "js":
                page.add_script_tag(
                    content=self.source(block) + "\nwindow.__docBlockDone = true;\n", type="module"
                )
                self._wait(page, "() => window.__docBlockDone === true", errors, logs, block)
                assert errors == [], f"{block.where}: {errors}"
                return "\n".join(logs)
            if block.expected is not None:
                self._wait(
                    page,
                    f"() => document.body.innerText.includes({block.expected.split('...')[0].strip()!r})",
                    errors,
                    logs,
                    block,
                )
            assert errors == [], f"{block.where}: {errors}"
            text: str = page.inner_text("body")
            return text
        finally:
            context.close()

    @staticmethod
    def _wait(page: Page, condition: str, errors: list[str], logs: list[str], block: Block) -> None:
        try:
            page.wait_for_function(condition, timeout=scaled(20) * 1000)
        except Exception:
            raise AssertionError(f"{block.where} never finished: errors {errors}, console {logs}") from None


@pytest.fixture
def runner(tmp_path: Path, chromium: Browser) -> Iterator[DocRunner]:
    gateway = start_gateway(tmp_path / "data")
    pages = PageServer()
    try:
        yield DocRunner(tmp_path, gateway, chromium, pages)
    finally:
        pages.stop()
        gateway.stop()


def _has_runnable_blocks(path: Path) -> bool:
    try:
        return any(b.runs for b in parse(path))
    except DocError:
        return False  # test_every_block_follows_the_rules reports it


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if _has_runnable_blocks(p)], ids=_id)
def test_document_blocks_run(path: Path, runner: DocRunner) -> None:
    for block in parse(path):
        if not block.runs:
            continue
        output = runner.run(block)
        if block.expected is not None:
            expected = runner.substitute(block.expected)
            assert matches(expected, output), (
                f"{block.where}: the output differs from the text block after it.\n"
                f"--- expected\n{expected}\n--- got\n{output}"
            )
