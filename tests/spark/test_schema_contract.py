"""The usage file format has two copies, the writer's (gateway/usage/record.py) and the
reader's (spark/schema.py): they must agree, column by column, bucket by bucket."""

from __future__ import annotations

import pyarrow as pa

from gateway.usage import record
from spark import io, schema


def test_reader_schema_is_the_writer_schema() -> None:
    written = record.SCHEMA
    assert [f.name for f in written] == list(schema.ARROW_TYPES) == schema.USAGE_SCHEMA.fieldNames()
    for f in written:
        expected = schema.ARROW_TYPES[f.name]
        if isinstance(expected, pa.ListType):
            assert isinstance(f.type, pa.ListType) and f.type.value_type == expected.value_type
        else:
            assert f.type == expected, f.name


def test_buckets_version_and_operation_names_agree() -> None:
    assert schema.LATENCY_BOUNDS_MS == record.LATENCY_BOUNDS_MS
    assert schema.BUCKETS == record.BUCKETS
    assert schema.SCHEMA_VERSION == record.SCHEMA_VERSION
    names = {schema.SEND, schema.DEDUPLICATED, schema.RECEIVE, schema.PUSH, schema.ACK, schema.NACK}
    names |= {schema.CONNECT, schema.THROTTLED, schema.DEAD_LETTERED, schema.EXPIRED}
    assert names == {op.value for op in record.Operation}  # every operation the gateway records
    assert names <= {op.value for op in record.Operation}
    assert schema.OK == record.OK
    assert io.FILE_ID_KEY == record.FILE_ID_KEY
