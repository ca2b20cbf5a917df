"""The AWS query protocol: ``Action=...`` form fields in, XML out (older SDKs, Debian's aws CLI).

Sans-I/O, like :mod:`gateway.sqs.protocol`. A request's flattened fields
(``Attribute.1.Name=VisibilityTimeout&Attribute.1.Value=45``,
``SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.StringValue=...``) become the same
parameters the JSON protocol carries (``{"Attributes": {"VisibilityTimeout": "45"}}``), so
both protocols run the same actions; an action's result becomes
``<ActionResponse><ActionResult>...</ActionResult><ResponseMetadata>...`` with AWS's
element names, and an error AWS's ``<ErrorResponse>``. The names are AWS's query names for
SQS (its model's ``locationName`` for each flattened list and map), in the tables below.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from xml.etree.ElementTree import Element, SubElement, tostring

from .errors import SqsError
from .protocol import ACTIONS, SqsRequest

CONTENT_TYPE = "text/xml"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
XML_NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"

# Request side: a flattened map's query name -> (parameter, key field, value field).
_MAPS = {
    "Attribute": ("Attributes", "Name", "Value"),
    "MessageAttribute": ("MessageAttributes", "Name", "Value"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value"),
    "Tag": ("Tags", "Key", "Value"),
}
# A flattened list's query name -> parameter.
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "SendMessageBatchRequestEntry": "Entries",
    "DeleteMessageBatchRequestEntry": "Entries",
    "ChangeMessageVisibilityBatchRequestEntry": "Entries",
    "StringListValue": "StringListValues",
    "BinaryListValue": "BinaryListValues",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
}
# Parameters that are integers in the JSON protocol (query carries every value as text).
_INTEGERS = frozenset(
    {
        "MaxNumberOfMessages",
        "WaitTimeSeconds",
        "VisibilityTimeout",
        "DelaySeconds",
        "MaxResults",
        "MaxNumberOfMessagesPerSecond",
    }
)
_INTEGER = re.compile(r"-?[0-9]{1,18}")
# The deepest field AWS's SQS model has is 7 parts
# (SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringListValue.1); deeper keys
# name nothing, and would only make the conversion below recurse.
MAX_KEY_PARTS = 8

# Answer side: a result map's member -> (element, key element, value element).
_RESULT_MAPS = {
    "Attributes": ("Attribute", "Name", "Value"),
    "MessageAttributes": ("MessageAttribute", "Name", "Value"),
    "Tags": ("Tag", "Key", "Value"),
}
# A result list's member -> the element of each item ("Successful" depends on the action).
_RESULT_LISTS = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "Results",
    "StringListValues": "StringListValue",
    "BinaryListValues": "BinaryListValue",
}
# Actions whose answer has no <ActionResult> (AWS's model gives them no output).
_NO_RESULT = frozenset(
    {
        "DeleteMessage",
        "DeleteQueue",
        "SetQueueAttributes",
        "PurgeQueue",
        "ChangeMessageVisibility",
        "TagQueue",
        "UntagQueue",
    }
)


def is_query_request(headers: Mapping[str, str]) -> bool:
    """Whether a ``POST /`` speaks this protocol (a form body, and no JSON protocol target)."""
    return "x-amz-target" not in headers and headers.get("content-type", "").startswith(FORM_CONTENT_TYPE)


def _tree(fields: Iterable[tuple[str, str]]) -> dict[Any, Any]:
    """``A.1.B=v`` fields as nested dicts; numeric parts are int keys (list positions)."""
    root: dict[Any, Any] = {}
    for key, value in fields:
        node = root
        parts = key.split(".", MAX_KEY_PARTS)
        if len(parts) > MAX_KEY_PARTS:
            raise SqsError("InvalidParameterValue", f"The parameter {key[:64]!r} is nested too deeply.")
        for part in parts[:-1]:
            index: Any = int(part) if part.isdigit() else part
            child = node.get(index)
            if not isinstance(child, dict):
                child = node[index] = {}
            node = child
        last = parts[-1]
        node[int(last) if last.isdigit() else last] = value
    return root


def _is_list(node: Any) -> bool:
    return isinstance(node, dict) and bool(node) and all(isinstance(k, int) for k in node)


def _convert(node: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(key, int):
            continue
        if _is_list(value):
            items = [value[i] for i in sorted(value)]
            if key in _MAPS:
                name, key_field, value_field = _MAPS[key]
                mapped: dict[str, Any] = {}
                for item in items:
                    if not isinstance(item, dict) or not isinstance(item.get(key_field), str):
                        raise SqsError("InvalidParameterValue", f"{key}.N.{key_field} is missing.")
                    entry = item.get(value_field)
                    mapped[item[key_field]] = _convert(entry) if isinstance(entry, dict) else entry
                out[name] = mapped
            else:
                out[_LISTS.get(key, key)] = [_convert(i) if isinstance(i, dict) else i for i in items]
        elif isinstance(value, dict):
            out[key] = _convert(value)
        elif key in _INTEGERS and _INTEGER.fullmatch(value):
            out[key] = int(value)
        else:
            out[key] = value
    return out


def parse_query_request(fields: Iterable[tuple[str, str]]) -> SqsRequest:
    """The action and the JSON protocol's parameters of a query request's fields."""
    fields = list(fields)
    action = next((v for k, v in fields if k == "Action"), "")
    if not action:
        raise SqsError("MissingParameter", "The request must contain the parameter Action.")
    if action not in ACTIONS:
        raise SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")
    params = _convert(_tree((k, v) for k, v in fields if k not in ("Action", "Version")))
    if action == "CreateQueue" and "Tags" in params:
        params["tags"] = params.pop("Tags")  # the JSON protocol's own spelling, for this action only
    return SqsRequest(action, params)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _fill(element: Element, result: Mapping[str, Any], action: str) -> None:
    for key, value in result.items():
        if key in _RESULT_MAPS and isinstance(value, Mapping):
            tag, key_tag, value_tag = _RESULT_MAPS[key]
            for name, item in value.items():
                entry = SubElement(element, tag)
                SubElement(entry, key_tag).text = name
                holder = SubElement(entry, value_tag)
                if isinstance(item, Mapping):
                    _fill(holder, item, action)
                else:
                    holder.text = _text(item)
        elif isinstance(value, list):
            tag = f"{action}ResultEntry" if key == "Successful" else _RESULT_LISTS.get(key, key)
            for item in value:
                entry = SubElement(element, tag)
                if isinstance(item, Mapping):
                    _fill(entry, item, action)
                else:
                    entry.text = _text(item)
        elif isinstance(value, Mapping):
            _fill(SubElement(element, key), value, action)
        elif value is not None:
            SubElement(element, key).text = _text(value)


def _document(root: Element) -> bytes:
    out: bytes = tostring(root, encoding="utf-8", xml_declaration=True)
    return out


def response(action: str, result: Mapping[str, Any], request_id: str) -> tuple[int, dict[str, str], bytes]:
    """The HTTP status, headers and XML body of a successful answer."""
    root = Element(f"{action}Response", {"xmlns": XML_NAMESPACE})
    if action not in _NO_RESULT:
        _fill(SubElement(root, f"{action}Result"), result, action)
    SubElement(SubElement(root, "ResponseMetadata"), "RequestId").text = request_id
    return 200, {"content-type": CONTENT_TYPE, "x-amzn-requestid": request_id}, _document(root)


# Characters XML 1.0 cannot carry even escaped (ElementTree writes them as they are, and the
# document no longer parses): an error message that echoes a parameter may hold them.
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """``text`` with each character XML cannot carry replaced by U+FFFD."""
    return _NOT_XML.sub("\ufffd", text)


def error_response(error: SqsError, request_id: str) -> tuple[int, dict[str, str], bytes]:
    """AWS's ``<ErrorResponse>`` for ``error``, with its query code and status."""
    root = Element("ErrorResponse", {"xmlns": XML_NAMESPACE})
    body = SubElement(root, "Error")
    SubElement(body, "Type").text = "Sender" if error.aws.sender else "Receiver"
    SubElement(body, "Code").text = error.aws.query_code
    SubElement(body, "Message").text = xml_safe(error.aws.query_message or error.message)
    SubElement(body, "Detail")
    SubElement(root, "RequestId").text = request_id
    headers = {"content-type": CONTENT_TYPE, "x-amzn-requestid": request_id}
    return error.aws.status, headers, _document(root)
