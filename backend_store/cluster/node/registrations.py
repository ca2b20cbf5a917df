"""Which other nodes' records a node has heard from since it registered (sans-I/O).

A node record stands under its node's lease, so a registration in etcd says the node is
alive only as long as etcd's leases say the truth. An etcd restored from a backup brings
the backup's records back under the backup's leases, which etcd keeps alive for one more
TTL although the processes that held them may be long gone. When every process was down
during the restore, a node that starts first finds its voters "registered" by those relics,
and their positions as they were at the backup: simulation seed ``down`` 38 (session 86)
had n1, dead before p1's later term, restart first on the restored map that still
designated it, count n2's and n3's relics as a majority of the voters, and lead from LSN 9
without LSNs 10-11 that n2 and n3 had acknowledged under epoch 54.

So a node counts a voter only on a record written after its own registration: live nodes
write theirs again whenever they see a new registration of another node (a new lease or a
new key), and relics never do. A heard voter counts once it has also published what its
copy holds (``leadership.heard_copies``, rule 9).
"""

from __future__ import annotations

from ..coordination.coordinator import PrefixState


class Registrations:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        # The mod revision of this node's record as its session first wrote it (None: not
        # known yet, and nobody else is heard).
        self.own_revision: int | None = None
        self._revisions: dict[str, int] = {}  # node id -> its record's mod revision
        self._leases: dict[str, tuple[int, int]] = {}  # node id -> (create revision, lease)

    def observe(self, state: PrefixState) -> bool:
        """Take a state of ``nodes/``; whether another node registered anew since the last
        (this node then writes its own record again, for that node to hear it)."""
        revisions: dict[str, int] = {}
        leases: dict[str, tuple[int, int]] = {}
        for key, entry in state.entries.items():
            node_id = key[len(state.prefix) :]
            revisions[node_id] = entry.mod_revision
            leases[node_id] = (entry.create_revision, entry.lease)
        anew = any(leases[n] != self._leases.get(n) for n in leases if n != self.node_id)
        self._revisions, self._leases = revisions, leases
        if self.own_revision is not None and state.revision < self.own_revision:
            # etcd went back to before this node registered (restored while it ran): the
            # records written from now on are heard, none of those the restore brought back.
            self.own_revision = state.revision
        return anew

    def registered(self, revision: int | None) -> None:
        """This node's session wrote its record at ``revision`` (None: not known)."""
        self.own_revision = revision

    def heard(self) -> set[str]:
        """This node, and every node whose record was written after this node registered."""
        own = self.own_revision
        if own is None:
            return {self.node_id}
        return {self.node_id} | {n for n, rev in self._revisions.items() if rev > own}
