"""The typed codec's scalar nodes and what every node shares: paths, errors, side bytes.

A node dumps and loads the values of one annotation (``codec.py`` builds them); errors name
the path of the value that does not fit, ``value`` for the root.
"""

from __future__ import annotations

import base64
import binascii
import enum
import types
import typing
from typing import Any

import numpy as np

__all__ = [
    "JSON_NAMES",
    "TAG",
    "BlobReader",
    "BytesNode",
    "CodecError",
    "EnumNode",
    "ExactNode",
    "FloatNode",
    "Node",
    "at",
    "type_name",
    "wrong_json",
    "wrong_type",
]

JSON_NAMES = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}
"""How an error names a parsed JSON value's kind."""
TAG = "type"
"""The key naming a dataclass's class where a union holds several dataclasses."""


class CodecError(ValueError):
    """Data (or a value to dump) that does not fit its annotation."""


def type_name(hint: Any) -> str:
    """``hint`` as people write it: ``list[list[RankRun] | None]``."""
    if hint is None or hint is type(None):
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is np.ndarray:
        return f"NDArray[{type_name(typing.get_args(args[1])[0])}]"
    if origin is not None:
        shown = ", ".join("..." if a is Ellipsis else type_name(a) for a in args) or "()"
        return f"{getattr(origin, '__name__', str(origin))}[{shown}]"
    return str(getattr(hint, "__name__", hint))


def at(path: str) -> str:
    """A path as errors show it (``value`` for the root)."""
    return path or "value"


def kind_of(obj: object) -> str:
    """A parsed JSON value's kind, as errors name it."""
    return JSON_NAMES.get(type(obj), type(obj).__name__)


def wrong_json(path: str, want: str, obj: object) -> CodecError:
    """Parsed JSON of another kind than its annotation needs (bad data)."""
    shown = repr(obj)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return CodecError(f"{at(path)}: expected {want}, got {kind_of(obj)} ({shown})")


def wrong_type(path: str, want: str, value: object) -> CodecError:
    """A value of another Python type than its annotation (the sender's bug)."""
    return CodecError(f"{at(path)}: expected {want}, got {type(value).__name__}")


class BlobReader:
    """The side bytes of a frame, taken in order by the ``bytes`` values that name them."""

    def __init__(self, data: memoryview, offset: int) -> None:
        self.data, self.offset = data, offset

    def take(self, nbytes: int, path: str) -> bytes:
        """The next ``nbytes``; raises CodecError when fewer are left (a truncated frame)."""
        left = len(self.data) - self.offset
        if nbytes > left:
            raise CodecError(
                f"{at(path)}: truncated: needs {nbytes} bytes at offset {self.offset}, "
                f"{left} left"
            )
        chunk = bytes(self.data[self.offset : self.offset + nbytes])
        self.offset += nbytes
        return chunk


class Node:
    """Dumps and loads the values of one annotation."""

    kinds: frozenset[type] = frozenset()
    """The JSON kinds (parsed Python types) a dumped value may take."""

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is of this annotation's Python type (picks a union's member)."""
        return type(value) is getattr(self, "cls", None)

    def children(self) -> tuple[Node, ...]:
        """The nodes of the annotations this one holds."""
        return ()

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        raise NotImplementedError

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        raise NotImplementedError


class ExactNode(Node):
    """``None``, ``bool``, ``int`` or ``str``: the same value in JSON, of exactly that type."""

    def __init__(self, cls: type) -> None:
        self.cls, self.kinds = cls, frozenset({cls})

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is not self.cls:  # NOTE: exact: a bool is no int, nor a numpy int64
            raise wrong_type(path, self.cls.__name__, value)
        return value

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not self.cls:
            raise wrong_json(path, JSON_NAMES[self.cls], obj)
        return obj


class FloatNode(Node):
    """``float``: a JSON number with a fraction or exponent (``NaN``/``Infinity`` tokens too)."""

    kinds = frozenset({float})
    cls = float

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is int:  # NOTE: typing takes an int for a float, so does the codec
            return float(value)
        if type(value) is not float:
            raise wrong_type(path, "float", value)
        return value

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not float:
            raise wrong_json(path, "a number", obj)
        return obj


class BytesNode(Node):
    """Inline base64 (``blobs`` None), or the length of the next side bytes."""

    kinds = frozenset({str, int})
    cls = bytes

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is not bytes:
            raise wrong_type(path, "bytes", value)
        if blobs is None:
            return base64.b64encode(value).decode("ascii")
        blobs.append(value)
        return len(value)

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if blobs is not None:
            if type(obj) is not int or obj < 0:
                raise wrong_json(path, "a byte count", obj)
            return blobs.take(obj, path)
        if type(obj) is not str:
            raise wrong_json(path, "a base64 string", obj)
        try:
            return base64.b64decode(obj, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CodecError(f"{at(path)}: not base64: {exc}") from None


class EnumNode(Node):
    """An enum whose values are all ``int`` or all ``str``: its value, one of the enum's."""

    def __init__(self, cls: type[enum.Enum]) -> None:
        value_types = {type(m.value) for m in cls}
        if value_types not in ({int}, {str}):
            raise TypeError(f"enum {cls.__name__}: values must be all int or all str")
        self.cls, self.kinds = cls, frozenset(value_types)
        self.value_type = value_types.pop()

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is not self.cls:
            raise wrong_type(path, self.cls.__name__, value)
        return value.value

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not self.value_type:
            raise wrong_json(path, JSON_NAMES[self.value_type], obj)
        try:
            return self.cls(obj)
        except ValueError:
            allowed = [m.value for m in self.cls]
            raise CodecError(
                f"{at(path)}: {obj!r} is not a {self.cls.__name__} (one of {allowed})"
            ) from None

