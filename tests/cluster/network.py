"""A network the test controls between cluster processes: TCP proxies in front of each node and
in front of etcd (:class:`~tests.fixtures.tcp_proxy.TcpProxy`, on the test's event loop).

Each node gets:

- an **inbound proxy** in front of its real ``--listen`` port, which it advertises
  (``--advertise``): its node record in etcd carries the proxy's address, so every other
  node's replication links and every gateway (the harness's pool) dial the proxy. The proxy
  reads each connection's hello, so it knows which node (or gateway) is dialling;
- an **etcd proxy** per etcd endpoint, given to it as ``--etcd``.

:meth:`ClusterNetwork.isolate` cuts one node off from everything else: its inbound proxy is
partitioned for everyone, its etcd proxies too, and every other node's inbound proxy for
connections whose hello names it (its outgoing replication links). What still reaches it is
its real port, which the test may dial directly, as a gateway on its side of the partition
would. The partition blackholes (nothing is closed; see the proxy's docstring), so each side
notices only through its own timeouts, heartbeats and lease.

:meth:`ClusterNetwork.separate` cuts one node off from the other nodes only: replication links
between it and them are held both ways (whoever leads), while etcd and gateways still reach
it, the case where its lease lives on and only check-quorum makes a leader give way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from backend_store.cluster.protocol.wire import HEADER, Hello, WireError, decode_body
from tests.fixtures.tcp_proxy import TcpProxy

_MAX_HELLO = 64 * 1024


async def hello_of(reader: asyncio.StreamReader) -> tuple[str | None, bytes]:
    """Read a node-protocol connection's first frame; the dialler's id if it is a hello."""
    header = await reader.readexactly(HEADER.size)
    (length,) = HEADER.unpack(header)
    if length > _MAX_HELLO:
        raise ValueError(f"a first frame of {length} bytes is no hello")
    body = await reader.readexactly(length)
    try:
        message = decode_body(body)
    except WireError:
        return None, header + body
    return (message.node_id if isinstance(message, Hello) else None), header + body


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@dataclass
class NodeLinks:
    """The proxies of one node: what others dial to reach it, and its way to etcd."""

    inbound: TcpProxy
    etcd: list[TcpProxy]

    @property
    def advertise(self) -> str:
        return self.inbound.address

    @property
    def etcd_endpoints(self) -> str:
        return ",".join(p.address for p in self.etcd)


@dataclass
class ClusterNetwork:
    etcd_endpoints: list[str]
    nodes: dict[str, NodeLinks] = field(default_factory=dict)
    isolated: set[str] = field(default_factory=set)

    async def add_node(self, name: str, listen: str) -> NodeLinks:
        """Proxies for a node listening on ``listen`` (started before the node is)."""
        inbound = await TcpProxy(_port(listen), identify=hello_of).start()
        etcd = [await TcpProxy(_port(endpoint)).start() for endpoint in self.etcd_endpoints]
        self.nodes[name] = links = NodeLinks(inbound, etcd)
        return links

    def isolate(self, name: str) -> None:
        """Cut ``name`` off from the other nodes, the gateways and etcd (both directions)."""
        self.isolated.add(name)
        links = self.nodes[name]
        links.inbound.partition()
        for proxy in links.etcd:
            proxy.partition()
        for other, their in self.nodes.items():
            if other != name:
                their.inbound.partition({name})

    def separate(self, name: str) -> None:
        """Cut ``name`` off from the other nodes only (both directions); its etcd proxies
        and gateways' connections to it stay open."""
        self.isolated.add(name)
        others = {n for n in self.nodes if n != name}
        self.nodes[name].inbound.partition(others)  # their links into it (one of them leading)
        for other in others:
            self.nodes[other].inbound.partition({name})  # its links into them

    def heal(self) -> None:
        """End every partition: held connections and bytes go through."""
        self.isolated.clear()
        for links in self.nodes.values():
            for proxy in (links.inbound, *links.etcd):
                proxy.heal()

    async def close(self) -> None:
        for links in self.nodes.values():
            for proxy in (links.inbound, *links.etcd):
                await proxy.close()
