"""Dependencies relied on beyond their public API (docs/http.md): a release of uvicorn or
``websockets`` that was never tested stops ``pushgate serve`` with a sentence saying what to
install, never with a traceback or a fast path that silently does something else; and the
bounds ``pyproject.toml`` gives pip are the ranges the modules check."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from backend_store.errors import ConfigurationError
from backend_store.tested_versions import VersionRange, require
from gateway.ws_server_protocol import TESTED_UVICORN
from gateway.ws_websockets_internals import TESTED_WEBSOCKETS
from tests.conftest import scaled

from .processes import REPO

pytestmark = pytest.mark.embedded_only

RELIANCES = [TESTED_UVICORN, TESTED_WEBSOCKETS]


def test_the_installed_versions_are_the_tested_ones() -> None:
    for tested in RELIANCES:
        installed = importlib.metadata.version(tested.distribution)
        assert tested.admits(installed), f"{tested.distribution} {installed} is not {tested.specifier}"


def test_pyproject_bounds_each_reliance_to_its_tested_range() -> None:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for tested in RELIANCES:
        bounds = [
            m.group(1).replace(" ", "")
            for d in dependencies
            if (m := re.fullmatch(rf"{tested.distribution}(?:\[[^]]*\])?(.*)", d))
        ]
        assert bounds == [tested.specifier]


@pytest.mark.parametrize(
    ("version", "admitted"),
    [
        ("0.53.9", False),
        ("0.54", True),
        ("0.54.0", True),
        ("0.54.7", True),
        ("0.55.0rc1", False),
        ("0.55.0", False),
        ("1.0.0", False),
    ],
)
def test_a_range_admits_from_its_lowest_up_to_below_its_bound(version: str, admitted: bool) -> None:
    tested = VersionRange("uvicorn", "0.54", "0.55", "a reliance")
    assert tested.admits(version) is admitted
    if admitted:
        require(tested, version)
    else:
        with pytest.raises(ConfigurationError, match=re.escape(f"uvicorn {version} is installed")):
            require(tested, version)


def _fake_distribution(root: Path, name: str, version: str) -> Path:
    """A directory whose metadata says ``name`` ``version`` is installed (first on the path,
    it is what ``importlib.metadata`` finds; the code imported is still the real one)."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.mark.parametrize(
    ("tested", "version"),
    [(TESTED_UVICORN, "0.55.0"), (TESTED_UVICORN, "0.53.0"), (TESTED_WEBSOCKETS, "17.5")],
    ids=["uvicorn-newer", "uvicorn-older", "websockets-newer"],
)
def test_serve_refuses_an_untested_version_in_one_line(
    tmp_path: Path, tested: VersionRange, version: str
) -> None:
    fake = _fake_distribution(tmp_path / "site", tested.distribution, version)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    args = [sys.executable, "-m", "gateway.cli", "serve", "--data", str(tmp_path / "data"), "--port", "0"]
    done = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=scaled(60), check=False
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"pushgate serve: {tested.distribution} {version} is installed, but this Pushgate was tested "
        f"only with {tested.distribution}{tested.specifier}: {tested.reliance}; install a tested "
        f"version (pip install '{tested.distribution}{tested.specifier}')"
    )
    assert "Traceback" not in done.stdout
