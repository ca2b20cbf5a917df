"""aetcd's internals (coordination/etcd_tls.py) on the tested releases, and on any other: a
plaintext client is aetcd's own, public ``connect`` without a word; TLS keeps its re-done
connect after one warning, never falling back to plaintext (TLS against a real etcd on an
untested release: tests/cluster/test_etcd_tls.py). The range logic itself:
tests/gateway/test_tested_versions.py."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import aetcd
import grpc
import pytest

from backend_store.cluster.coordination.etcd_tls import TESTED_AETCD, EtcdTls, TlsClient, etcd_client
from backend_store.tested_versions import ReleaseCheck
from tests.fixtures.certificates import Pair

REPO = Path(__file__).resolve().parents[2]


def _release(version: str) -> ReleaseCheck:
    """What the process's check says with aetcd ``version`` installed."""
    return ReleaseCheck(lambda distribution: version)


def test_the_installed_aetcd_is_tested_and_a_tls_client_builds() -> None:
    assert ReleaseCheck().tested(TESTED_AETCD)
    TlsClient(host="127.0.0.1", port=2379, credentials=grpc.ssl_channel_credentials())


def test_an_untested_aetcd_is_aetcds_own_client_in_plaintext_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = etcd_client("127.0.0.1", 2379, timeout_s=1.0, options={}, tls=None, releases=_release("1.7.0"))
    assert type(client) is aetcd.Client
    assert not caplog.records


def test_an_untested_aetcd_keeps_tls_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(Pair("etcd's CA", days=1).cert_pem)
    tls = EtcdTls(ca)
    releases = _release("1.7.0")
    with caplog.at_level(logging.WARNING, "pushgate.dependencies"):
        for _ in range(2):
            client = etcd_client("127.0.0.1", 2379, timeout_s=1.0, options={}, tls=tls, releases=releases)
            assert isinstance(client, TlsClient)
    [warning] = caplog.records
    assert warning.getMessage().startswith(
        "aetcd 1.7.0 is not a release this Pushgate was tested with (aetcd>=1.0,<1.1), where "
        "coordination/etcd_tls.py redoes aetcd.Client.connect"
    )
    assert "TLS is never dropped to plaintext" in warning.getMessage()


def test_the_package_bound_is_below_the_next_major_release() -> None:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [aetcd_bound] = [d for d in dependencies if d.startswith("aetcd")]
    assert re.sub(r"\s", "", aetcd_bound.split(";")[0]) == f"aetcd>={TESTED_AETCD.lowest},<2"
