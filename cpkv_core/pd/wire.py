"""Typed frames of the PD control channel: one JSON object a message, never a pickle.

A frame is UTF-8 JSON: ``null`` for a ``None`` reply, otherwise ``{"type": "<ClassName>",
<field>: <value>, ...}`` with every field of the ``protocol.py`` dataclass and no other key.
Values follow the field annotations: ``int`` a JSON integer (not a boolean, not a number with
a fraction or exponent), ``bool`` a boolean, ``str`` a string, ``bytes`` a base64 string,
``tuple[X, ...]`` an array, and a nested ``Piece``, ``RequestReport`` or ``TensorData`` an
object of its fields without a ``type`` key. ``decode`` checks every value against its
annotation and raises ``WireError`` naming the message and the field; a frame that fails
builds nothing. ``encode`` checks the same way, so a sender's bug (a numpy int, a list for a
tuple) fails at the sender. The codec is derived from the dataclasses' fields; an annotation
it cannot carry fails at import.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import typing
from multiprocessing.connection import Connection
from typing import Any, TypeAlias

from cpkv_core.pd.protocol import (
    Alloc,
    AllocReply,
    Await,
    Done,
    ErrorReply,
    Fail,
    Piece,
    Probe,
    ProbeEnd,
    ProbeReply,
    Report,
    ReportReply,
    RequestReport,
    Shutdown,
    TensorData,
    Verdict,
)

Message: TypeAlias = (
    Alloc
    | AllocReply
    | Done
    | Fail
    | Await
    | Verdict
    | Report
    | ReportReply
    | Probe
    | ProbeReply
    | ProbeEnd
    | Shutdown
    | ErrorReply
)
"""A message that travels on its own in a frame (tagged with its class name)."""

MESSAGES: tuple[type, ...] = typing.get_args(Message)
NESTED: tuple[type, ...] = (Piece, RequestReport, TensorData)
"""Dataclasses that travel only inside a message's field (no ``type`` key)."""

MAX_REQUEST_BYTES = 16 << 20
"""Largest frame the decode server reads; a longer one closes the connection. The largest
legitimate request is a ``Done``, which lists each page position of its request once (about
12 bytes a position, 40 a piece): 16 MiB holds a request of over a million pages. Replies
are read without a limit: a ``ReportReply`` carries every ready request's rebuilt KV (the
decode pool's bytes, 4/3 of them in base64), which no fixed bound fits."""

_SCALARS = (int, bool, str, bytes)
_JSON_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


class WireError(ValueError):
    """A frame (or a message to encode) that is not a well-formed protocol message."""


def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, resolved annotation) of every field of a protocol dataclass."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def _check_hint(hint: Any, where: str) -> None:
    """Fails at import for an annotation the wire format cannot carry."""
    if hint in _SCALARS or hint in NESTED:
        return
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        _check_hint(args[0], where)
        return
    raise TypeError(f"{where}: the PD wire format cannot carry {hint!r}")


_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {cls: _fields(cls) for cls in MESSAGES + NESTED}
for _cls, _cls_fields in _FIELDS.items():
    for _name, _hint in _cls_fields:
        _check_hint(_hint, f"{_cls.__name__}.{_name}")
_BY_NAME: dict[str, type] = {cls.__name__: cls for cls in MESSAGES}


def _wrong(path: str, hint: Any, value: object) -> WireError:
    want = _JSON_NAMES.get(hint, getattr(hint, "__name__", str(hint)))
    got = _JSON_NAMES.get(type(value), type(value).__name__)
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return WireError(f"{path}: expected {want}, got {got} ({shown})")


def _not_type(path: str, want: type, value: object) -> WireError:
    """A message field holding another Python type than its annotation (sender's bug)."""
    return WireError(f"{path}: expected {want.__name__}, got {type(value).__name__}")


def _to_json(value: object, hint: Any, path: str) -> object:
    """``value`` as JSON-ready data; raises WireError unless it has exactly type ``hint``."""
    if hint in NESTED:
        if type(value) is not hint:
            raise _not_type(path, hint, value)
        return _fields_to_json(value, hint, path)
    if typing.get_origin(hint) is tuple:
        if type(value) is not tuple:
            raise _not_type(path, tuple, value)
        item = typing.get_args(hint)[0]
        return [_to_json(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if type(value) is not hint:  # NOTE: exact: a bool is not an int, nor a numpy int64
        raise _not_type(path, hint, value)
    if hint is bytes:
        assert isinstance(value, bytes)
        return base64.b64encode(value).decode("ascii")
    return value


def _fields_to_json(value: object, cls: type, path: str) -> dict[str, object]:
    return {
        name: _to_json(getattr(value, name), hint, f"{path}.{name}") for name, hint in _FIELDS[cls]
    }


def _from_json(value: object, hint: Any, path: str) -> object:
    """The field value ``value`` (parsed JSON) stands for; raises WireError on any mismatch."""
    if hint in NESTED:
        if not isinstance(value, dict):
            raise _wrong(path, dict, value)
        return _build(hint, value, path)
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list):
            raise _wrong(path, list, value)
        item = typing.get_args(hint)[0]
        return tuple(_from_json(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if hint is bytes:
        if type(value) is not str:
            raise WireError(f"{path}: expected a base64 string, got {_JSON_NAMES[type(value)]}")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise WireError(f"{path}: not base64: {exc}") from None
    if type(value) is not hint:
        raise _wrong(path, hint, value)
    return value


def _build(cls: type, obj: dict[str, object], path: str) -> object:
    """An instance of ``cls`` from exactly its fields in ``obj``, every value checked first."""
    names = [name for name, _ in _FIELDS[cls]]
    missing = [name for name in names if name not in obj]
    extra = sorted(set(obj) - set(names))
    if missing:
        raise WireError(f"{path}: missing field {missing[0]!r} (needs {names})")
    if extra:
        raise WireError(f"{path}: unknown field {extra[0]!r} (fields are {names})")
    values = {name: _from_json(obj[name], hint, f"{path}.{name}") for name, hint in _FIELDS[cls]}
    return cls(**values)


def _object_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise WireError(f"duplicate key in a JSON object: {[k for k, _ in pairs]}")
    return obj


def _constant(name: str) -> object:
    raise WireError(f"{name} is not a protocol value")


def encode(message: Message | None) -> bytes:
    """One frame for ``message`` (``None`` for an empty reply).

    Raises:
        WireError: ``message`` is not a protocol message, or a field holds another type
            than its annotation.
    """
    if message is None:
        return b"null"
    cls = type(message)
    if cls not in MESSAGES:
        raise WireError(f"{cls.__name__} is not a PD control message")
    obj = {"type": cls.__name__, **_fields_to_json(message, cls, cls.__name__)}
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("ascii")


def decode(data: bytes) -> Message | None:
    """The message one frame holds.

    Raises:
        WireError: not UTF-8 JSON, an unknown ``type``, a missing or unknown field, or a
            value of another type than the field's annotation (the message names it).
    """
    try:
        text = data.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=_object_pairs, parse_constant=_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WireError(f"not a JSON frame: {exc}") from None
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise WireError(f"a frame is a JSON object or null, got {_JSON_NAMES[type(obj)]}")
    name = obj.pop("type", None)
    if type(name) is not str or name not in _BY_NAME:
        raise WireError(f"unknown message type {name!r} (known: {sorted(_BY_NAME)})")
    return typing.cast(Message, _build(_BY_NAME[name], obj, name))


def call(conn: Connection, message: Message) -> Message | None:
    """One round trip on a control connection: ``message`` out, the decoded reply back."""
    conn.send_bytes(encode(message))
    return decode(conn.recv_bytes())
