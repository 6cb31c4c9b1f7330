"""Typed frames: one value of a known annotation as JSON plus raw bytes, never a pickle.

What a rank sends its launcher (the call's arguments, progress, its result, its error) and
what ranks exchange as host metadata travel as frames. A frame is::

    b"CPKVTF1\\n" | header length (8 bytes, little-endian) | header | side bytes

The header is UTF-8 JSON ``{"type": "<annotation>", "value": <the value>}`` written by
``codec.Codec``: the annotation's name must be the one the reader expects, and ``value`` is
checked field by field against it. Every ``bytes`` value (a tensor's data among them) is
written in the header as its length and its bytes follow the header, in order; the side
bytes must be used up exactly. ``decode_frame`` raises ``FrameError`` for anything else: a
pickle or a ``torch.save`` archive is refused by its first bytes, before any of it is read.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from cpkv_core.dist.typed.codec import codec_for
from cpkv_core.dist.typed.nodes import BlobReader, CodecError

__all__ = ["MAGIC", "FrameError", "decode_frame", "encode_frame"]

MAGIC = b"CPKVTF1\n"
"""The first bytes of every frame (format version 1)."""
_LENGTH = struct.Struct("<Q")
_HEAD = len(MAGIC) + _LENGTH.size


class FrameError(CodecError):
    """Bytes that are not a well-formed frame of the expected annotation; nothing of them was
    built or run."""


def _looks_like(data: bytes) -> str:
    """What bytes that are not a frame seem to be, for the error."""
    if data[:1] == b"\x80":
        return "a pickle"
    if data[:4] == b"PK\x03\x04":
        return "a zip archive (torch.save writes one)"
    return f"bytes starting {data[:8]!r}"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise FrameError(f"a JSON object holds a key twice: {[k for k, _ in pairs]}")
    return obj


def encode_frame(value: object, hint: Any) -> bytes:
    """``value``, of the annotation ``hint``, as one frame.

    Raises:
        TypeError: the codec cannot carry ``hint``.
        CodecError: ``value`` (or a part of it) is not of its annotation's type.
    """
    codec = codec_for(hint)
    blobs: list[bytes] = []
    body = codec.dump(value, blobs)
    header = json.dumps({"type": codec.name, "value": body}, separators=(",", ":"))
    raw = header.encode("ascii")
    return b"".join((MAGIC, _LENGTH.pack(len(raw)), raw, *blobs))


def _header(data: bytes, what: str) -> tuple[dict[str, Any], int]:
    """The parsed header and the offset of the side bytes."""
    if len(data) < _HEAD or not data.startswith(MAGIC):
        raise FrameError(
            f"{what}: not a typed frame ({_looks_like(data)}, {len(data)} bytes): refused "
            "unread; ranks send typed frames only"
        )
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    if length > len(data) - _HEAD:
        raise FrameError(
            f"{what}: truncated: a {length}-byte header, {len(data) - _HEAD} bytes follow"
        )
    try:
        header = json.loads(data[_HEAD : _HEAD + length], object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FrameError(f"{what}: the header is not JSON: {exc}") from None
    if type(header) is not dict or sorted(header) != ["type", "value"]:
        raise FrameError(f'{what}: the header must be {{"type", "value"}}, got {header!r:.80}')
    return header, _HEAD + length


def decode_frame(data: bytes, hint: Any, what: str = "frame") -> Any:
    """The value of annotation ``hint`` that ``data`` holds.

    Args:
        data: One frame (``encode_frame``).
        hint: The annotation the reader expects; the frame must name the same.
        what: Names the frame in errors, e.g. ``"rank 1's result"``.

    Raises:
        FrameError: not a frame, a frame of another annotation, a value that does not fit
            it (the message names the path), or side bytes missing or left over.
    """
    codec = codec_for(hint)
    header, offset = _header(data, what)
    if header["type"] != codec.name:
        raise FrameError(f"{what}: holds {header['type']!r}, expected {codec.name!r}")
    blobs = BlobReader(memoryview(data), offset)
    try:
        value = codec.load(header["value"], blobs)
    except FrameError:
        raise
    except CodecError as exc:
        raise FrameError(f"{what}: {exc}") from None
    if blobs.offset != len(data):
        raise FrameError(f"{what}: {len(data) - blobs.offset} bytes after the last value")
    return value

