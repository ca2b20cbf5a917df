"""When a node writes its record again (``node/publication.py``), sans-I/O."""

from __future__ import annotations

from backend_store.cluster.coordination.layout import NodeRecord
from backend_store.cluster.node.publication import Publication

A = NodeRecord("127.0.0.1:1", "up", {}, None, {}, None, {})
B = NodeRecord("127.0.0.1:1", "up", {}, None, {7: "not in the map"}, None, {})


def write(publication: Publication, record: NodeRecord, now: float, incarnation: int = 0) -> bool:
    """One round of the node's ``_publish``: whether the record was written."""
    if not publication.due(now, incarnation) or not publication.wanted(record):
        return False
    publication.written(record, now)
    return True


def test_an_unchanged_record_is_not_written_again() -> None:
    publication = Publication(every_s=0.5)
    assert write(publication, A, 0.0)
    assert not write(publication, A, 0.2)
    assert not write(publication, A, 10.0)


def test_a_changed_record_is_written_at_most_every_interval() -> None:
    publication = Publication(every_s=0.5)
    assert write(publication, A, 0.0)
    assert not write(publication, B, 0.3)
    assert write(publication, B, 0.5)


def test_asked_it_is_written_at_once_changed_or_not() -> None:
    publication = Publication(every_s=0.5)
    assert write(publication, A, 0.0)
    publication.ask()
    assert write(publication, A, 0.1)
    assert not write(publication, A, 0.2)  # the request was used up


def test_a_request_made_while_the_record_is_built_stands_for_the_next_round() -> None:
    publication = Publication(every_s=0.5)
    assert publication.due(0.0, 0)
    publication.ask()  # e.g. a stray found while the positions were read
    publication.written(A, 0.0)
    assert write(publication, A, 0.1)


def test_after_the_incarnation_is_raised_the_record_is_written_again_unchanged() -> None:
    """After etcd went back in time a promotion counts only records written since the raise;
    the record etcd holds may be the snapshot's (simulation seed ``restore`` 90601)."""
    publication = Publication(every_s=0.5)
    assert write(publication, A, 0.0, incarnation=1)
    assert write(publication, A, 0.1, incarnation=2)
    assert not write(publication, A, 0.2, incarnation=2)


def test_a_raise_seen_while_the_record_is_built_is_written_for_at_the_next_round() -> None:
    publication = Publication(every_s=0.5)
    assert write(publication, A, 0.0, incarnation=1)
    publication.ask()
    assert publication.due(0.1, 1)
    publication.written(A, 0.1)  # built under incarnation 1 while the raise to 2 landed
    assert write(publication, A, 0.2, incarnation=2)
