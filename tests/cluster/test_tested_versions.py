"""Reliance on aetcd's internals (coordination/etcd_tls.py) is held to the tested releases
(the range logic itself: tests/gateway/test_tested_versions.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grpc
import pytest

from backend_store.cluster.coordination.etcd_tls import TESTED_AETCD, TlsClient
from backend_store.errors import ConfigurationError
from backend_store.tested_versions import require

REPO = Path(__file__).resolve().parents[2]


def test_an_untested_aetcd_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigurationError) as refused:
        require(TESTED_AETCD, installed="1.1.0")
    assert refused.value.code == "configuration_error"
    assert "aetcd 1.1.0 is installed" in refused.value.detail
    assert "pip install 'aetcd>=1.0,<1.1'" in refused.value.detail


def test_the_installed_aetcd_is_tested_and_a_tls_client_builds() -> None:
    require(TESTED_AETCD)
    TlsClient(host="127.0.0.1", port=2379, credentials=grpc.ssl_channel_credentials())


def test_the_package_bound_is_the_tested_range() -> None:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [aetcd] = [d for d in dependencies if d.startswith("aetcd")]
    assert re.sub(r"\s", "", aetcd.split(";")[0]) == f"aetcd{TESTED_AETCD.specifier}"
