"""Equal documents are held once, unequal ones never share (node/shared_docs.py): a queue
given another queue's document would apply that queue's attributes."""

from __future__ import annotations

from typing import Any

import pytest

from backend_store.cluster.node.shared_docs import SharedDocs


def test_equal_documents_are_one_and_unequal_ones_stay_apart() -> None:
    docs = SharedDocs()
    first = docs.share({"placement": [1], "tags": {"a": "b"}, "retention_s": 60})
    assert docs.share({"placement": [1], "tags": {"a": "b"}, "retention_s": 60}) is first
    assert len(docs) == 1
    # Values Python calls equal but that are not the same attribute: 1, 1.0 and True.
    unequal: list[dict[str, Any]] = [
        {"placement": [1], "tags": {"a": "b"}, "retention_s": 60.0},
        {"placement": [1], "tags": {"a": "b"}, "retention_s": True},
        {"placement": [2], "tags": {"a": "b"}, "retention_s": 60},
        {"placement": [1], "tags": {"a": b"b"}, "retention_s": 60},
    ]
    held = [docs.share(doc) for doc in unequal]  # a document lives while a queue holds it
    for doc, shared in zip(unequal, held, strict=True):
        assert shared is not first and shared == doc
        assert type(shared["retention_s"]) is type(doc["retention_s"])
    assert len(docs) == 1 + len(unequal)


@pytest.mark.parametrize("odd", [{1, 2}, object()])
def test_a_document_msgpack_cannot_pack_is_still_held_correctly(odd: Any) -> None:
    docs = SharedDocs()
    doc = {"x": odd}
    assert docs.share(doc) == doc
