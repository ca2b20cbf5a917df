"""deploy/systemd/: every unit passes ``systemd-analyze verify`` without a warning, and each
long-running role restarts on failure, raises its open-file limit and reloads on SIGHUP (that
SIGHUP stops no role: tests/cluster/test_reload_signal.py, tests/gateway/test_tls_reload.py).

The units name the image's layout (/opt/pushgate, docs/deploy.md); verify checks that their
commands exist, so it runs on a root holding that layout and the machine's own system units."""

from __future__ import annotations

import configparser
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = sorted((REPO / "deploy" / "systemd").glob("pushgate-*"))
SERVERS = ["pushgate-gateway.service", "pushgate-node.service", "pushgate-manager.service"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A file system root with the system's units, /bin/kill and /bin/sh, and an executable
    /opt/pushgate/bin/pushgate (this checkout's, as the image installs it)."""
    shutil.copytree("/usr/lib/systemd/system", tmp_path / "usr/lib/systemd/system", symlinks=True)
    (tmp_path / "bin").mkdir()
    for program in ("kill", "sh"):
        found = shutil.which(program)
        assert found is not None, program
        shutil.copy(found, tmp_path / "bin" / program)
    pushgate = tmp_path / "opt/pushgate/bin/pushgate"
    pushgate.parent.mkdir(parents=True)
    pushgate.write_text(f"#!{sys.executable}\nfrom gateway.cli import main\nraise SystemExit(main())\n")
    pushgate.chmod(pushgate.stat().st_mode | stat.S_IXUSR)
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(unit, units / unit.name)
    return tmp_path


def test_every_unit_verifies_clean(root: Path) -> None:
    assert {u.name for u in UNITS} >= {
        *SERVERS,
        "pushgate-usage-report.service",
        "pushgate-usage-report.timer",
    }
    verified = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", *(u.name for u in UNITS)],
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0 and verified.stderr == "" and verified.stdout == "", verified.stderr


@pytest.mark.parametrize("name", SERVERS)
def test_a_server_restarts_on_failure_has_its_open_file_limit_and_reloads_on_sighup(name: str) -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "deploy" / "systemd" / name)
    service = unit["Service"]
    assert service["Restart"] == "on-failure"
    assert int(service["LimitNOFILE"]) >= 65536
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["User"] == "pushgate"
