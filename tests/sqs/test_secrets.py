"""The AWS secret behind SigV4: sealed under the encryption-at-rest key when one is set, never in
a log, an audit record or any file of the data directory in the clear."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from backend_store.encryption import Keyring
from gateway.auth.aws_keys import NAMESPACE
from tests.conftest import scaled
from tests.gateway.conftest import start_gateway
from tests.sqs.conftest import sqs_client

REPO = Path(__file__).resolve().parents[2]


def _admin(data_dir: Path, key_file: Path, *args: str) -> tuple[dict[str, Any], str]:
    """``pushgate admin`` as a real process, with the gateway's key file; (JSON, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUSHGATE_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.admin_cli",
            "--data",
            str(data_dir),
            "--encryption-key-file",
            str(key_file),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout), done.stderr


def test_the_aws_secret_is_sealed_at_rest_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "keys.json"
    key_file.write_text(Keyring.generate_document("k1"))
    data_dir = tmp_path / "data"
    gateway = start_gateway(data_dir, encryption_key_file=key_file)
    try:
        created, admin_stderr = _admin(
            data_dir,
            key_file,
            "key",
            "create",
            "--tenant",
            "default",
            "--scope",
            "admin send:* receive:*",
            "--aws",
        )
        access_key_id, secret = created["aws_access_key_id"], created["aws_secret_access_key"]
        sqs = sqs_client(gateway, access_key_id, secret)
        url = sqs.create_queue(QueueName="sealed")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="hello")
        assert [m["Body"] for m in sqs.receive_message(QueueUrl=url)["Messages"]] == ["hello"]
        with pytest.raises(ClientError) as wrong:
            sqs_client(gateway, access_key_id, secret[::-1]).list_queues()
        assert wrong.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        assert secret not in str(wrong.value.response)

        stored = gateway.call(gateway.services.backend.meta_get(NAMESPACE, access_key_id))
        assert stored is not None
        record = orjson.loads(stored)
        assert "secret" not in record and record["sealed_secret"]
        assert secret not in record["sealed_secret"]
    finally:
        gateway.stop()
    # Nothing under the data directory (the store's files, the usage and audit records) holds it.
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".mdb" for p in files)
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in admin_stderr
    assert secret not in caplog.text
