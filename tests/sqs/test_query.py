"""The query protocol on the wire: requests botocore signs by hand (their XML read here), and
Debian's aws CLI (which speaks only the query protocol to SQS) end to end."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from xml.etree import ElementTree

import httpx
import pytest
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]

from gateway.sqs.query_protocol import XML_NAMESPACE
from tests.gateway.conftest import RunningGateway
from tests.sqs.conftest import DEBIAN_AWS, aws_credentials

NS = {"sqs": XML_NAMESPACE}


class QueryClient:
    """Form-encoded SQS requests, signed with SigV4 by botocore, sent with httpx."""

    def __init__(self, gateway: RunningGateway, access_key_id: str, secret: str) -> None:
        self.url = gateway.url + "/"
        self.credentials = Credentials(access_key_id, secret)

    def call(self, action: str, **fields: Any) -> tuple[int, ElementTree.Element]:
        return self.send(action, fields, sign=True)

    def unsigned(self, action: str) -> tuple[int, ElementTree.Element]:
        return self.send(action, {}, sign=False)

    def send(self, action: str, fields: dict[str, Any], sign: bool) -> tuple[int, ElementTree.Element]:
        body = urlencode(
            {"Action": action, "Version": "2012-11-05", **{k: str(v) for k, v in fields.items()}}
        )
        request = AWSRequest(
            method="POST",
            url=self.url,
            data=body.encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
        )
        if sign:
            SigV4Auth(self.credentials, "sqs", "us-west-2").add_auth(request)
        answer = httpx.post(self.url, content=body.encode(), headers=dict(request.headers.items()))
        assert answer.headers["content-type"] == "text/xml"
        return answer.status_code, ElementTree.fromstring(answer.content)


@pytest.fixture(scope="module")
def query(gateway: RunningGateway) -> QueryClient:
    _, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*")
    return QueryClient(gateway, access_key_id, secret)


def _find(root: ElementTree.Element, path: str) -> str:
    found = root.find(path, NS)
    assert found is not None, ElementTree.tostring(root)
    return found.text or ""


def test_answers_are_aws_xml_documents(query: QueryClient, gateway: RunningGateway) -> None:
    name = f"xml-{time.monotonic_ns() % 10**9}"
    status, root = query.call(
        "CreateQueue", QueueName=name, **{"Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "45"}
    )
    assert status == 200
    assert root.tag == f"{{{XML_NAMESPACE}}}CreateQueueResponse"
    url = _find(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    assert url == f"{gateway.url}/default/{name}"
    assert _find(root, "sqs:ResponseMetadata/sqs:RequestId")
    status, root = query.call(
        "SendMessage",
        QueueUrl=url,
        MessageBody="hi",
        **{
            "MessageAttribute.1.Name": "n",
            "MessageAttribute.1.Value.DataType": "Number",
            "MessageAttribute.1.Value.StringValue": "7",
        },
    )
    assert (
        status == 200
        and _find(root, "sqs:SendMessageResult/sqs:MD5OfMessageBody") == "49f68a5c8493ec2c0bf489821c21fc3b"
    )
    status, root = query.call(
        "ReceiveMessage", QueueUrl=url, **{"AttributeName.1": "All", "MessageAttributeName.1": "All"}
    )
    [message] = root.findall("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert _find(message, "sqs:Body") == "hi"
    attributes = {_find(a, "sqs:Name"): _find(a, "sqs:Value") for a in message.findall("sqs:Attribute", NS)}
    assert attributes["ApproximateReceiveCount"] == "1"
    [typed] = message.findall("sqs:MessageAttribute", NS)
    assert (_find(typed, "sqs:Name"), _find(typed, "sqs:Value/sqs:DataType")) == ("n", "Number")
    status, root = query.call(
        "DeleteMessage", QueueUrl=url, ReceiptHandle=_find(message, "sqs:ReceiptHandle")
    )
    assert status == 200 and root.find("sqs:DeleteMessageResult", NS) is None  # no result, as on AWS


def test_errors_are_aws_error_responses(query: QueryClient, gateway: RunningGateway) -> None:
    status, root = query.call("GetQueueUrl", QueueName="no-such-queue")
    assert status == 400
    assert root.tag == f"{{{XML_NAMESPACE}}}ErrorResponse"
    assert _find(root, "sqs:Error/sqs:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert _find(root, "sqs:Error/sqs:Type") == "Sender"
    assert _find(root, "sqs:Error/sqs:Message") == "The specified queue does not exist for this wsdl version."
    assert _find(root, "sqs:RequestId")
    status, root = query.unsigned("ListQueues")
    assert (status, _find(root, "sqs:Error/sqs:Code")) == (403, "MissingAuthenticationToken")
    status, root = query.call("NoSuchAction")
    assert (status, _find(root, "sqs:Error/sqs:Code")) == (400, "InvalidAction")
    status, root = query.call(
        "SendMessageBatch", QueueUrl=f"{gateway.url}/default/x", **{"SendMessageBatchRequestEntry.1.Id": "a"}
    )
    assert status == 400


def test_move_tasks_over_query(query: QueryClient) -> None:
    name = f"qmove-{time.monotonic_ns() % 10**9}"
    _, root = query.call("CreateQueue", QueueName=f"{name}-dlq")
    dlq = _find(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    arn = f"arn:aws:sqs:us-east-1:default:{name}-dlq"
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})
    query.call(
        "CreateQueue", QueueName=name, **{"Attribute.1.Name": "RedrivePolicy", "Attribute.1.Value": policy}
    )
    _, root = query.call("ListDeadLetterSourceQueues", QueueUrl=dlq)
    sources = [e.text or "" for e in root.findall("sqs:ListDeadLetterSourceQueuesResult/sqs:QueueUrl", NS)]
    assert [s.rsplit("/", 1)[-1] for s in sources] == [name]
    status, root = query.call("StartMessageMoveTask", SourceArn=arn)
    assert status == 200
    handle = _find(root, "sqs:StartMessageMoveTaskResult/sqs:TaskHandle")
    deadline = time.monotonic() + 10
    while True:
        _, root = query.call("ListMessageMoveTasks", SourceArn=arn, MaxResults=1)
        if _find(root, "sqs:ListMessageMoveTasksResult/sqs:Results/sqs:Status") == "COMPLETED":
            break
        assert time.monotonic() < deadline
    assert _find(root, "sqs:ListMessageMoveTasksResult/sqs:Results/sqs:TaskHandle") == handle
    assert (
        _find(root, "sqs:ListMessageMoveTasksResult/sqs:Results/sqs:ApproximateNumberOfMessagesMoved") == "0"
    )


def _aws(gateway: RunningGateway, key: tuple[str, str], tmp: Path, *args: str) -> Any:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "AWS_ACCESS_KEY_ID": key[0],
        "AWS_SECRET_ACCESS_KEY": key[1],
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_CONFIG_FILE": str(tmp / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "none"),
        "AWS_PAGER": "",
    }
    done = subprocess.run(
        [str(DEBIAN_AWS), "--endpoint-url", gateway.url, "--output", "json", "sqs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_debians_aws_cli_works_unchanged(gateway: RunningGateway, tmp_path: Path) -> None:
    assert DEBIAN_AWS.exists(), "Debian's awscli package is needed (scripts/test installs it)"
    _, access_key_id, secret = aws_credentials(gateway, "admin send:* receive:*")
    key = (access_key_id, secret)
    name = f"cli-{time.monotonic_ns() % 10**9}.fifo"
    url = _aws(
        gateway, key, tmp_path, "create-queue", "--queue-name", name, "--attributes", "FifoQueue=true"
    )["QueueUrl"]
    assert url == f"{gateway.url}/default/{name}"
    sent = _aws(
        gateway,
        key,
        tmp_path,
        "send-message",
        "--queue-url",
        url,
        "--message-body",
        "from the cli",
        "--message-group-id",
        "g",
        "--message-deduplication-id",
        "d1",
    )
    assert sent["MD5OfMessageBody"] and sent["SequenceNumber"]
    got = _aws(gateway, key, tmp_path, "receive-message", "--queue-url", url, "--attribute-names", "All")
    [message] = got["Messages"]
    assert message["Body"] == "from the cli" and message["Attributes"]["MessageGroupId"] == "g"
    _aws(
        gateway,
        key,
        tmp_path,
        "delete-message",
        "--queue-url",
        url,
        "--receipt-handle",
        message["ReceiptHandle"],
    )
    assert url in _aws(gateway, key, tmp_path, "list-queues", "--queue-name-prefix", "cli-")["QueueUrls"]
    _aws(gateway, key, tmp_path, "delete-queue", "--queue-url", url)
