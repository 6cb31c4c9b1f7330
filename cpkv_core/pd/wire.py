"""Typed frames of the PD control channel: one JSON object a message, never a pickle.

A frame is UTF-8 JSON: ``null`` for a ``None`` reply, otherwise ``{"type": "<ClassName>",
<field>: <value>, ...}`` with every field of the ``protocol.py`` dataclass and no other key.
Values follow the field annotations (the typed codec, ``dist/typed``, which the launcher's
frames use too): ``int`` a JSON integer (not a boolean, not a number with a fraction or
exponent), ``bool`` a boolean, ``str`` a string, ``bytes`` a base64 string, ``tuple[X, ...]``
an array, and a nested ``PdLayout``, ``Piece``, ``RequestReport`` or ``TensorData`` an
object of its fields without a ``type`` key. ``decode`` checks every value against its
annotation and raises ``WireError`` naming the message and the field; a frame that fails
builds nothing. ``encode`` checks the same way, so a sender's bug (a numpy int, a list for a
tuple) fails at the sender.
An annotation the codec cannot carry fails at import.
"""

from __future__ import annotations

import json
import typing
from multiprocessing.connection import Connection
from typing import TypeAlias

from cpkv_core.dist.typed import TAG, CodecError, codec_for
from cpkv_core.dist.typed.tensor_data import TensorData
from cpkv_core.pd.protocol import (
    Alloc,
    AllocReply,
    Await,
    Done,
    ErrorReply,
    Fail,
    Hello,
    HelloReply,
    PdLayout,
    Piece,
    Probe,
    ProbeEnd,
    ProbeReply,
    Report,
    ReportReply,
    RequestReport,
    Shutdown,
    Verdict,
)

Message: TypeAlias = (
    Hello
    | HelloReply
    | Alloc
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
NESTED: tuple[type, ...] = (PdLayout, Piece, RequestReport, TensorData)
"""Dataclasses that travel only inside a message's field (no ``type`` key)."""

MAX_REQUEST_BYTES = 16 << 20
"""Largest frame the decode server reads; a longer one closes the connection. The largest
legitimate request is a ``Done``, which lists each page position of its request once (about
12 bytes a position, 40 a piece): 16 MiB holds a request of over a million pages. Replies
are read without a limit: a ``ReportReply`` carries every ready request's rebuilt KV (the
decode pool's bytes, 4/3 of them in base64), which no fixed bound fits."""

_CODEC = codec_for(Message | None)  # NOTE: fails at import for a field it cannot carry
_BY_NAME: dict[str, type] = {cls.__name__: cls for cls in MESSAGES}


class WireError(ValueError):
    """A frame (or a message to encode) that is not a well-formed protocol message."""


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
    if message is not None and type(message) not in MESSAGES:
        raise WireError(f"{type(message).__name__} is not a PD control message")
    try:
        obj = _CODEC.dump(message)
    except CodecError as exc:
        raise WireError(str(exc)) from None
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
    if isinstance(obj, dict) and obj.get(TAG) not in _BY_NAME:
        name = obj.get(TAG)
        raise WireError(f"unknown message type {name!r} (known: {sorted(_BY_NAME)})")
    try:
        return typing.cast(Message | None, _CODEC.load(obj))
    except CodecError as exc:
        raise WireError(str(exc)) from None


def call(conn: Connection, message: Message) -> Message | None:
    """One round trip on a control connection: ``message`` out, the decoded reply back."""
    conn.send_bytes(encode(message))
    return decode(conn.recv_bytes())
