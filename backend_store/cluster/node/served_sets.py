"""The voting set each copy here was last served on, and in which incarnation of the cluster
(``DATA/sets/<id>``).

A replica replaced while its node was dead leaves no receipt (node/receipts.py): the dead
node deletes nothing. If etcd is then restored from a backup taken before the replacement,
the restored set names the replaced node again, and its copy, back with the host, is older
than the set that replaced it. With the newer set's copies down, that copy and one other
replica made a majority of the restored set, and a replica without what the newer set
acknowledged led (simulation seed ``returns`` 255, session 38: p1 moved from n3 to n4; n4
and n2 acknowledged LSN 22; etcd was restored to before the move; n4 and n2 were down; n3
came back and n1 led from LSN 19).

The members of the newer set were served on it, and remember it here. A set is replaced
by one of a newer incarnation (a restored etcd raised it) only once this copy holds an
entry it got in that incarnation (:class:`ServedSets`): until then, the restored set may be
older than what this copy was served on. A node publishes the sets of
its copies that are of an earlier incarnation than the cluster's (``NodeRecord.served_sets``),
and the manager promotes after a restore only when a majority of each has been heard
(manager/election.py).

One file per partition: msgpack, written to a new file, fsynced and renamed into place.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import msgpack

from ...types import epoch_incarnation
from ..coordination.layout import ServedSet
from .durable_file import numbered_files, write_durably

log = logging.getLogger("pushgate.cluster")

SETS_DIR = "sets"


class ServedSets:
    """The sets kept for a node's copies (``kept``, as on its disk), and when each copy
    began to be served in the cluster's incarnation.

    A set of an earlier incarnation is replaced once the copy holds an entry it got while
    served in the current one: an entry of a leader of this incarnation, or any entry
    appended after this process first served the copy in it (a leader whose term went on
    across the restore ships on the restored set, and log matching puts what it held
    before under every entry it ships; simulation seed ``all`` 130837, where n3 led p2 at
    one epoch from before the restore to after it). Until then the restored set may be
    older than what the copy was served on."""

    def __init__(self, kept: dict[int, ServedSet]) -> None:
        self.kept = kept
        # pid -> (incarnation, the copy's last LSN when first served in it by this process)
        self._since: dict[int, tuple[int, int]] = {}

    def served(
        self, pid: int, voters: tuple[str, ...], incarnation: int, last_epoch: int, last_lsn: int
    ) -> ServedSet | None:
        """The copy of ``pid`` is served on ``voters`` in ``incarnation``, its last entry
        ``(last_epoch, last_lsn)``: the set to keep now (write it, then :meth:`keep` it),
        or None to keep the one kept."""
        served = ServedSet(voters, incarnation)
        kept = self.kept.get(pid)
        if kept is None:
            return served
        if kept.incarnation == incarnation:
            return None if set(kept.voters) == set(voters) else served
        if kept.incarnation > incarnation:
            return None  # this process has not read the raised incarnation yet
        since = self._since.get(pid)
        if since is None or since[0] != incarnation:
            self._since[pid] = (incarnation, last_lsn)
            since = self._since[pid]
        if epoch_incarnation(last_epoch) >= incarnation or last_lsn > since[1]:
            return served
        return None

    def keep(self, pid: int, served: ServedSet) -> None:
        self.kept[pid] = served
        self._since.pop(pid, None)

    def forget(self, pid: int) -> bool:
        """Drop what is kept of ``pid`` (its copy is deleted); whether there was a set."""
        self._since.pop(pid, None)
        return self.kept.pop(pid, None) is not None

    def earlier(self, held: Collection[int], incarnation: int) -> dict[int, ServedSet]:
        """The sets a node publishes: those of copies it holds (``held``: served or stray)
        that are of an incarnation before ``incarnation``, the cluster's."""
        return {pid: s for pid, s in self.kept.items() if pid in held and s.incarnation < incarnation}


def read_served_sets(data_dir: Path) -> dict[int, ServedSet]:
    """Every set kept under ``data_dir`` (one that cannot be read is logged and skipped)."""
    out: dict[int, ServedSet] = {}
    for pid, path in numbered_files(data_dir / SETS_DIR):
        try:
            found = ServedSet.from_doc(msgpack.unpackb(path.read_bytes(), raw=False))
        except (OSError, KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
            log.warning("ignoring the unreadable served set %s: %s", path, exc)
            continue
        out[pid] = found
    return out


def keep_served_set(data_dir: Path, partition: int, served: ServedSet) -> None:
    write_durably(data_dir / SETS_DIR / str(partition), msgpack.packb(served.to_doc(), use_bin_type=True))


def forget_served_set(data_dir: Path, partition: int) -> None:
    (data_dir / SETS_DIR / str(partition)).unlink(missing_ok=True)
