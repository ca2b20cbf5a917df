"""etcd over TLS (``etcd_tls.py``): against a real etcd that serves TLS only and asks every
client for a certificate of its CA (``--client-cert-auth``), as a production etcd does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend_store.cluster.client.cluster_settings import parse_cluster_url
from backend_store.cluster.coordination.coordinator import CoordinatorUnavailable
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from backend_store.cluster.coordination.etcd_tls import EtcdTls
from backend_store.cluster.protocol.tls import TlsFiles
from backend_store.cluster.protocol.tls_certs import make_cluster_certificates
from backend_store.errors import ConfigurationError
from backend_store.tested_versions import ReleaseCheck
from tests.conftest import scaled
from tests.fixtures.etcd_server import etcd_cluster, unique_prefix


class TlsEtcd:
    def __init__(self, endpoints: list[str], ours: TlsFiles, theirs: TlsFiles) -> None:
        self.endpoints = endpoints
        self.ours = ours  # a client certificate of etcd's CA
        self.theirs = theirs  # one of another CA


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsEtcd]:
    root = tmp_path_factory.mktemp("etcd-tls")
    ours = make_cluster_certificates(root / "ours", ["etcd", "client"])
    theirs = make_cluster_certificates(root / "theirs", ["client"], ca_name="Another CA")
    with etcd_cluster(root / "data", tls=ours["etcd"]) as cluster:
        yield TlsEtcd(cluster.endpoints, ours["client"], theirs["client"])


async def test_a_client_with_the_ca_and_a_certificate_of_it_reads_and_writes(tls_etcd: TlsEtcd) -> None:
    files = tls_etcd.ours
    key = unique_prefix("tls") + "/k"
    async with EtcdCoordinator(tls_etcd.endpoints, tls=EtcdTls(files.ca, files.cert, files.key)) as etcd:
        await etcd.put(key, b"over tls")
        entry = await etcd.get(key)
        assert entry is not None and entry.value == b"over tls"


async def test_a_watch_follows_events_over_tls(tls_etcd: TlsEtcd) -> None:
    """The watch's stream is a plain gRPC call on the client's channel (etcd_coordinator.py):
    over TLS it is that channel's, with this process's certificate."""
    files = tls_etcd.ours
    prefix = unique_prefix("tls-watch") + "/"
    async with EtcdCoordinator(tls_etcd.endpoints, tls=EtcdTls(files.ca, files.cert, files.key)) as etcd:
        states = etcd.watch_prefix(prefix, reread_every_s=600)
        try:
            assert (await asyncio.wait_for(anext(states), scaled(5))).values() == {}
            await etcd.put(prefix + "a", b"over tls")
            state = await asyncio.wait_for(anext(states), scaled(5))
            assert state.values() == {"a": b"over tls"} and state.changed == frozenset({prefix + "a"})
        finally:
            await states.aclose()


async def test_an_untested_aetcd_release_still_reads_and_writes_over_tls(tls_etcd: TlsEtcd) -> None:
    """What an aetcd release other than the tested one runs (tests/cluster/test_tested_versions.py
    has its warning): the same TLS connect, never plaintext."""
    files = tls_etcd.ours
    key = unique_prefix("tls") + "/untested"
    untested = ReleaseCheck(lambda distribution: "1.9.0")
    tls = EtcdTls(files.ca, files.cert, files.key)
    async with EtcdCoordinator(tls_etcd.endpoints, tls=tls, releases=untested) as etcd:
        await etcd.put(key, b"over tls")
        entry = await etcd.get(key)
        assert entry is not None and entry.value == b"over tls"


@pytest.mark.parametrize("who", ["plaintext", "no client certificate", "another CA's certificate"])
async def test_anyone_else_is_refused(tls_etcd: TlsEtcd, who: str) -> None:
    ours, theirs = tls_etcd.ours, tls_etcd.theirs
    tls = {
        "plaintext": None,
        "no client certificate": EtcdTls(ours.ca),
        # Trusts another CA (so not etcd's certificate), and presents a certificate etcd's CA
        # did not sign.
        "another CA's certificate": EtcdTls(theirs.ca, theirs.cert, theirs.key),
    }[who]
    async with EtcdCoordinator(tls_etcd.endpoints, timeout_s=1.0, tls=tls) as etcd:
        with pytest.raises(CoordinatorUnavailable):
            await etcd.get(unique_prefix("tls") + "/k")


def test_options_that_do_not_go_together_are_said_at_once(tmp_path: Path) -> None:
    names = "--etcd-ca, --etcd-cert and --etcd-key"
    assert EtcdTls.from_options(None, None, None, names=names) is None
    with pytest.raises(ConfigurationError, match="needs the CA"):
        EtcdTls.from_options(None, "c.pem", "k.pem", names=names)
    with pytest.raises(ConfigurationError, match="together"):
        EtcdTls.from_options("ca.pem", "c.pem", None, names=names)
    with pytest.raises(ConfigurationError, match="cannot read"):
        EtcdTls(tmp_path / "missing.pem").credentials()
    _, settings = parse_cluster_url("cluster://127.0.0.1:2379/?etcd_ca=%2Fe%2Fca.pem&etcd_timeout_s=3")
    assert settings.etcd_tls() == EtcdTls(Path("/e/ca.pem")) and settings.etcd_timeout_s == 3.0
    with pytest.raises(ConfigurationError, match="together"):
        parse_cluster_url("cluster://127.0.0.1:2379/?etcd_ca=ca.pem&etcd_cert=c.pem")
