"""Queue tags (TagQueue, UntagQueue, ListQueueTags, CreateQueue's ``tags``), kept in one place.

Tags are the SQS API's alone: Pushgate's queue attributes are typed settings the store
checks, and a tag is free text, so the tags of a queue are one record in the store's
metadata (namespace :data:`NAMESPACE`, key ``tenant/queue``: neither name may hold a ``/``),
beside the queue's record, on the embedded store and on ``cluster://`` (etcd) alike.

The record carries the queue's ``created_at``: tags left by a queue deleted through
another door (``/v1``, ``pushgate admin``) are not the tags of a new queue of that name,
so a record whose ``created_at`` is not the queue's counts as no tags (and is replaced).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from backend_store.backend import MetadataStore
from backend_store.types import QueueInfo

from .errors import SqsError

NAMESPACE = "sqs_tags"
# AWS's limits on a queue's tags.
MAX_TAGS = 50
MAX_KEY_CHARS = 128
MAX_VALUE_CHARS = 256


def _key(info: QueueInfo) -> str:
    return f"{info.tenant}/{info.name}"


def check_tags(tags: Any) -> dict[str, str]:
    """Tags as AWS takes them: a map of 1-128-character keys to 0-256-character values."""
    if not isinstance(tags, Mapping):
        raise SqsError("InvalidParameterValue", "Tags must be a map of keys to values.")
    out: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS:
            raise SqsError(
                "InvalidParameterValue", "Tag keys must be between 1 and 128 characters in length."
            )
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS:
            raise SqsError(
                "InvalidParameterValue", "Tag values must be between 0 and 256 characters in length."
            )
        out[key] = value
    return out


class TagStore:
    """Read and change the tags of a queue."""

    def __init__(self, backend: MetadataStore) -> None:
        self._backend = backend

    async def get(self, info: QueueInfo) -> dict[str, str]:
        raw = await self._backend.meta_get(NAMESPACE, _key(info))
        if raw is None:
            return {}
        record = orjson.loads(raw)
        if record.get("created_at") != info.created_at:
            return {}  # a deleted queue's tags
        return {str(k): str(v) for k, v in record.get("tags", {}).items()}

    async def _put(self, info: QueueInfo, tags: dict[str, str]) -> None:
        record = {"created_at": info.created_at, "tags": tags}
        await self._backend.meta_put(NAMESPACE, _key(info), orjson.dumps(record))

    async def tag(self, info: QueueInfo, tags: dict[str, str]) -> None:
        """Add or replace ``tags`` (AWS refuses more than :data:`MAX_TAGS` on a queue)."""
        merged = {**await self.get(info), **tags}
        if len(merged) > MAX_TAGS:
            raise SqsError("InvalidParameterValue", f"Too many tags added for queue {info.name}.")
        await self._put(info, merged)

    async def untag(self, info: QueueInfo, keys: list[str]) -> None:
        current = await self.get(info)
        kept = {k: v for k, v in current.items() if k not in set(keys)}
        if kept != current:
            await self._put(info, kept)

    async def forget(self, info: QueueInfo) -> None:
        """Drop a deleted queue's tags."""
        await self._backend.meta_delete(NAMESPACE, _key(info))
