"""SQS message attributes (String, Number, Binary and their custom types) in Pushgate's attributes.

Pushgate's message attributes are strings, the same on every door. An SQS attribute keeps its
value there as a string, so a ``/v1``, WebSocket or SSE consumer reads it: a String or Number
attribute as its text, a Binary one as base64. The SQS data type of every attribute whose type
is not plain ``String`` is kept beside them in one reserved attribute, :data:`TYPES_ATTRIBUTE`
(a JSON object of name -> data type), which SQS hides again on receive. Its name starts with
``AWS.``, which AWS forbids in attribute names, so no SQS attribute can collide with it.

The MD5 an SDK checks is computed on receive from the type and the value, exactly as on send
(:mod:`gateway.sqs.md5`), so the two agree.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .errors import SqsError

# The one attribute Pushgate stores that an SQS client never sees (see the module's docstring).
TYPES_ATTRIBUTE = "AWS.SQS.DataTypes"
# AWS's limit on message attributes per message.
MAX_MESSAGE_ATTRIBUTES = 10
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_KINDS = ("String", "Number", "Binary")


def _invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def _check_name(name: object) -> str:
    """AWS's rules for an attribute name (docs/sqs.md)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _invalid(f"Message attribute name {name!r} is invalid: 1-256 of [A-Za-z0-9_.-].")
    lowered = name.lower()
    if lowered.startswith(("aws.", "amazon.")):
        raise _invalid(f"Message attribute name {name!r} uses a reserved prefix (AWS. or Amazon.).")
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise _invalid(f"Message attribute name {name!r} cannot start or end with a period or have '..'.")
    return name


def _check_number(name: str, text: str) -> None:
    # AWS takes numbers of up to 38 digits and 10^-128..10^+126; a float check is close enough
    # to refuse what is not a number at all.
    try:
        value = float(text)
    except ValueError:
        raise _invalid(f"Can't cast the value of message (user) attribute '{name}' to a number.") from None
    if not math.isfinite(value):
        raise _invalid(f"Can't cast the value of message (user) attribute '{name}' to a number.")


def to_pushgate(attributes: Any) -> dict[str, str]:
    """SQS ``MessageAttributes`` as Pushgate's string attributes (types kept, see above)."""
    if not attributes:
        return {}
    if not isinstance(attributes, Mapping):
        raise _invalid("MessageAttributes must be a map of names to values.")
    if len(attributes) > MAX_MESSAGE_ATTRIBUTES:
        raise _invalid(
            f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum "
            f"[{MAX_MESSAGE_ATTRIBUTES}]."
        )
    out: dict[str, str] = {}
    types: dict[str, str] = {}
    for raw_name, value in attributes.items():
        name = _check_name(raw_name)
        if not isinstance(value, Mapping):
            raise _invalid(f"The message attribute '{name}' must be an object with a DataType.")
        data_type = value.get("DataType")
        if not isinstance(data_type, str) or not data_type:
            raise _invalid(f"The message attribute '{name}' must contain a non-empty message attribute type.")
        kind = data_type.split(".", 1)[0]
        if kind not in _KINDS:
            raise _invalid(
                f"The message attribute '{name}' has an invalid message attribute type, the set of "
                "supported type prefixes is Binary, Number, and String."
            )
        if value.get("StringListValues") or value.get("BinaryListValues"):
            raise _invalid(
                f"The message attribute '{name}': list values are not supported (AWS reserves them)."
            )
        if kind == "Binary":
            binary = value.get("BinaryValue")
            if not isinstance(binary, str | bytes) or not binary:
                raise _invalid(f"The message attribute '{name}' must contain a non-empty BinaryValue.")
            try:
                raw = binary if isinstance(binary, bytes) else base64.b64decode(binary, validate=True)
            except (binascii.Error, ValueError):
                raise _invalid(
                    f"The message attribute '{name}' has a BinaryValue that is not base64."
                ) from None
            out[name] = base64.b64encode(raw).decode()
        else:
            text = value.get("StringValue")
            if not isinstance(text, str) or not text:
                raise _invalid(
                    f"The message attribute '{name}' must contain non-empty message attribute value "
                    f"for message attribute type '{data_type}'."
                )
            if kind == "Number":
                _check_number(name, text)
            out[name] = text
        if data_type != "String":
            types[name] = data_type
    if types:
        out[TYPES_ATTRIBUTE] = orjson.dumps(types).decode()
    return out


def from_pushgate(attributes: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Pushgate's attributes as SQS ``MessageAttributes`` (a ``/v1`` attribute is a String)."""
    types: dict[str, str] = {}
    raw_types = attributes.get(TYPES_ATTRIBUTE)
    if raw_types is not None:
        try:
            decoded = orjson.loads(raw_types)
        except orjson.JSONDecodeError:
            decoded = {}  # sent over /v1 by hand: then every attribute is a String
        if isinstance(decoded, dict):
            types = {str(k): str(v) for k, v in decoded.items()}
    out: dict[str, dict[str, str]] = {}
    for name, value in attributes.items():
        if name == TYPES_ATTRIBUTE:
            continue
        data_type = types.get(name, "String")
        if data_type.split(".", 1)[0] == "Binary":
            out[name] = {"DataType": data_type, "BinaryValue": value}
        else:
            out[name] = {"DataType": data_type, "StringValue": value}
    return out


def select(attributes: Mapping[str, dict[str, str]], wanted: Iterable[str]) -> dict[str, dict[str, str]]:
    """The attributes ``MessageAttributeNames`` asks for: names, ``prefix.*``, ``All`` or ``.*``."""
    wanted = set(wanted)
    if "All" in wanted or ".*" in wanted:
        return dict(attributes)
    prefixes = tuple(w[:-1] for w in wanted if w.endswith(".*"))
    return {n: v for n, v in attributes.items() if n in wanted or (prefixes and n.startswith(prefixes))}
