"""Typed values as plain JSON data and back, driven by their annotations: never a pickle.

``codec_for(hint)`` converts a value of the annotation ``hint`` to JSON-ready data (``dump``)
and back (``load``), checking every value against its annotation both ways. ``load`` builds
only the types ``hint`` names, so the data cannot choose what gets built, and it raises
``CodecError`` naming the path of the first value that does not fit
(``value[0][1].outputs[2].topk.shape[1]``); ``dump`` fails the same way on a sender's bug (a
list for a tuple, a numpy int for an int). An annotation the codec cannot carry (``Any``,
``object``, a class it does not know) fails with ``TypeError`` when the codec is built.

| annotation | JSON |
| --- | --- |
| ``None`` / ``bool`` / ``int`` / ``str`` | null / boolean / integer / string, exactly (a bool is no int) |
| ``float`` | a number; NaN and infinities as Python's json writes them; an int is taken on dump |
| ``bytes`` | base64 inline, or (``blobs``) its length, the bytes going to a side list |
| an ``IntEnum`` / ``StrEnum`` | its value, which must be one of the enum's |
| ``tuple[X, ...]``, ``list[X]``, ``frozenset[X]`` | an array (a frozenset's without duplicates) |
| ``tuple[A, B]`` | an array of exactly those items |
| ``dict[K, V]``, ``Mapping[K, V]`` | an array of ``[key, value]`` pairs, keys unique |
| ``A | B | None`` | the member whose JSON kind the value has (members' kinds must differ) |
| a dataclass | an object of exactly its fields; beside other dataclasses in a union, with
  ``"type": "<ClassName>"`` too |
| a pydantic model (``extra="forbid"``) | its JSON dump, validated by the model on load |
| ``torch.Tensor``, ``npt.NDArray[np.int64]`` | ``{"dtype", "shape", "data"}`` (``TensorData``) |
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import threading
import types
import typing
from typing import Any

import numpy as np
import pydantic
import torch

from cpkv_core.dist.typed.containers import ArrayNode, DataclassNode, FixedNode, MapNode, UnionNode
from cpkv_core.dist.typed.nodes import (
    BlobReader,
    BytesNode,
    EnumNode,
    ExactNode,
    FloatNode,
    Node,
    type_name,
)
from cpkv_core.dist.typed.tensor_data import TensorData
from cpkv_core.dist.typed.tensors import ModelNode, NDArrayNode, TensorNode

__all__ = ["Codec", "codec_for"]


_EXACT = (type(None), bool, int, str)
_ARRAYS = {tuple: tuple, list: list, frozenset: frozenset}
_MAPS = (dict, collections.abc.Mapping)
_NODES: dict[Any, Node] = {}
"""Every annotation's node, built once (a dataclass's before its fields: recursion)."""
_BUILDING = threading.RLock()
"""Held while nodes are built: a dataclass's node is cached before its fields are, and
ranks run as threads (``LocalGroup``) may build their first codec at once."""


def _class_node(hint: type) -> Node:
    if issubclass(hint, enum.Enum):
        return EnumNode(hint)
    if hint is torch.Tensor:
        return TensorNode(_node(TensorData))
    if issubclass(hint, pydantic.BaseModel):
        return ModelNode(hint)
    if dataclasses.is_dataclass(hint):
        fields = dataclasses.fields(hint)
        if any(not f.init for f in fields):
            raise TypeError(f"dataclass {hint.__name__} has a field __init__ does not take")
        # NOTE: cached before its fields are built, so a class that holds itself terminates.
        node = _NODES[hint] = DataclassNode(hint)
        try:
            hints = typing.get_type_hints(hint)
            node.fields = tuple(
                (f.name, _node(hints[f.name], f"{hint.__name__}.{f.name}")) for f in fields
            )
        except BaseException:
            del _NODES[hint]
            raise
        return node
    raise TypeError(f"cannot carry {hint.__name__}")


def _generic_node(hint: Any, origin: Any, args: tuple[Any, ...], where: str) -> Node:
    if origin in (typing.Union, types.UnionType):
        return UnionNode(tuple(_node(a, where) for a in args), hint)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return FixedNode(tuple(_node(a, where) for a in args))
    if origin in _ARRAYS and len(args) in (1, 2):
        return ArrayNode(_ARRAYS[origin], _node(args[0], where))
    if origin in _MAPS and len(args) == 2:
        return MapNode(_node(args[0], where), _node(args[1], where))
    if origin is np.ndarray:
        (scalar,) = typing.get_args(args[1])
        if isinstance(scalar, type) and issubclass(scalar, np.generic):
            return NDArrayNode(np.dtype(scalar), _node(TensorData))
    raise TypeError(f"cannot carry {type_name(hint)}")


def _node(hint: Any, where: str = "") -> Node:
    """The node of ``hint``; raises TypeError naming ``where`` for one the codec cannot carry."""
    hint = type(None) if hint is None else getattr(hint, "__supertype__", hint)  # NewType
    if hint in _NODES:
        return _NODES[hint]
    try:
        if hint in _EXACT:
            node: Node = ExactNode(hint)
        elif hint is float:
            node = FloatNode()
        elif hint is bytes:
            node = BytesNode()
        elif typing.get_origin(hint) is not None:
            node = _generic_node(hint, typing.get_origin(hint), typing.get_args(hint), where)
        elif isinstance(hint, type):
            node = _class_node(hint)
        else:
            raise TypeError(f"cannot carry {hint!r}")
    except TypeError as exc:
        if where and " (at " not in str(exc):
            raise TypeError(f"{exc} (at {where})") from None
        raise
    _NODES[hint] = node
    return node


class Codec:
    """Dumps and loads the values of one annotation (see the module docstring)."""

    def __init__(self, hint: Any) -> None:
        """Raises TypeError when ``hint`` holds an annotation the codec cannot carry."""
        self.hint, self.name = hint, type_name(hint)
        with _BUILDING:
            self._root = _node(hint, self.name)

    def dump(self, value: object, blobs: list[bytes] | None = None) -> object:
        """``value`` as JSON-ready data; ``bytes`` go to ``blobs`` when given (else base64).

        Raises:
            CodecError: ``value`` (or a part of it) is not of its annotation's type.
        """
        return self._root.dump(value, "", blobs)

    def load(self, obj: object, blobs: BlobReader | None = None) -> Any:
        """The value parsed JSON ``obj`` stands for, its ``bytes`` read from ``blobs``.

        Raises:
            CodecError: ``obj`` does not fit the annotation (the message names the path).
        """
        return self._root.load(obj, "", blobs)

    def classes(self) -> frozenset[type]:
        """Every dataclass, pydantic model and enum a value of the annotation may hold."""
        seen: set[int] = set()
        found: set[type] = set()
        todo: list[Node] = [self._root]
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, (DataclassNode, ModelNode, EnumNode)):
                found.add(node.cls)
            todo.extend(node.children())
        return frozenset(found)


_CODECS: dict[Any, Codec] = {}


def codec_for(hint: Any) -> Codec:
    """The (cached) codec of ``hint``; raises TypeError for one it cannot carry."""
    codec = _CODECS.get(hint)
    if codec is None:
        with _BUILDING:
            codec = _CODECS.get(hint) or Codec(hint)
            _CODECS[hint] = codec
    return codec
