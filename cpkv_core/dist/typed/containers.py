"""The typed codec's container nodes: arrays, fixed tuples, maps, dataclasses, unions."""

from __future__ import annotations

import json
from typing import Any

from cpkv_core.dist.typed.nodes import (
    JSON_NAMES,
    TAG,
    BlobReader,
    CodecError,
    FloatNode,
    Node,
    at,
    type_name,
    wrong_json,
    wrong_type,
)

__all__ = ["ArrayNode", "DataclassNode", "FixedNode", "MapNode", "UnionNode"]


class ArrayNode(Node):
    """``tuple[X, ...]``, ``list[X]`` or ``frozenset[X]``."""

    kinds = frozenset({list})

    def __init__(self, cls: type, item: Node) -> None:
        self.cls, self.item = cls, item

    def children(self) -> tuple[Node, ...]:
        return (self.item,)

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if not self.accepts(value):
            raise wrong_type(path, self.cls.__name__, value)
        mark = len(blobs) if blobs is not None else 0
        values: list[Any] = list(value)
        items = [self.item.dump(v, f"{at(path)}[{i}]", blobs) for i, v in enumerate(values)]
        # NOTE: a set has no order; sorted items give one frame per value (when no item
        # holds side bytes, whose order the items' order fixes).
        if self.cls is frozenset and (blobs is None or len(blobs) == mark):
            items.sort(key=lambda item: json.dumps(item, sort_keys=True))
        return items

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not list:
            raise wrong_json(path, "an array", obj)
        items = [self.item.load(v, f"{at(path)}[{i}]", blobs) for i, v in enumerate(obj)]
        built = self.cls(items)
        if self.cls is frozenset and len(built) != len(items):
            raise CodecError(f"{at(path)}: a set holds an item twice")
        return built


class FixedNode(Node):
    """``tuple[A, B, ...]``: exactly one item of each annotation."""

    kinds = frozenset({list})

    def __init__(self, items: tuple[Node, ...]) -> None:
        self.items = items

    def accepts(self, value: object) -> bool:
        return type(value) is tuple and len(value) == len(self.items)

    def children(self) -> tuple[Node, ...]:
        return self.items

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is not tuple or len(value) != len(self.items):
            shown = f"tuple of {len(value)}" if type(value) is tuple else type(value).__name__
            raise CodecError(f"{at(path)}: expected a tuple of {len(self.items)}, got {shown}")
        pairs = zip(self.items, value, strict=True)
        return [node.dump(v, f"{at(path)}[{i}]", blobs) for i, (node, v) in enumerate(pairs)]

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not list or len(obj) != len(self.items):
            raise wrong_json(path, f"an array of {len(self.items)}", obj)
        pairs = zip(self.items, obj, strict=True)
        return tuple(node.load(v, f"{at(path)}[{i}]", blobs) for i, (node, v) in enumerate(pairs))


class MapNode(Node):
    """``dict[K, V]`` or ``Mapping[K, V]``: ``[key, value]`` pairs, loaded as a dict."""

    kinds = frozenset({list})
    cls = dict

    def __init__(self, key: Node, value: Node) -> None:
        self.key, self.value = key, value

    def children(self) -> tuple[Node, ...]:
        return (self.key, self.value)

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is not dict:
            raise wrong_type(path, "dict", value)
        return [
            [self.key.dump(k, f"{at(path)}[{i}][0]", blobs),
             self.value.dump(v, f"{at(path)}[{i}][1]", blobs)]
            for i, (k, v) in enumerate(value.items())
        ]  # fmt: skip

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not list:
            raise wrong_json(path, "an array of [key, value] pairs", obj)
        built: dict[Any, Any] = {}
        for i, pair in enumerate(obj):
            where = f"{at(path)}[{i}]"
            if type(pair) is not list or len(pair) != 2:
                raise wrong_json(where, "a [key, value] pair", pair)
            key = self.key.load(pair[0], f"{where}[0]", blobs)
            if key in built:
                raise CodecError(f"{where}[0]: key {key!r} appears twice")
            built[key] = self.value.load(pair[1], f"{where}[1]", blobs)
        return built


class DataclassNode(Node):
    """A dataclass: an object of exactly its fields."""

    kinds = frozenset({dict})

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.fields: tuple[tuple[str, Node], ...] = ()

    def children(self) -> tuple[Node, ...]:
        return tuple(node for _, node in self.fields)

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is not self.cls:
            raise wrong_type(path, self.cls.__name__, value)
        here = path or self.cls.__name__
        return {
            name: node.dump(getattr(value, name), f"{here}.{name}", blobs)
            for name, node in self.fields
        }

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not dict:
            raise wrong_json(path, "an object", obj)
        here = path or self.cls.__name__
        names = [name for name, _ in self.fields]
        missing = [name for name in names if name not in obj]
        extra = [key for key in obj if key not in names]
        if missing:
            raise CodecError(f"{here}: missing field {missing[0]!r} (needs {names})")
        if extra:
            raise CodecError(f"{here}: unknown field {extra[0]!r} (fields are {names})")
        values = {name: node.load(obj[name], f"{here}.{name}", blobs) for name, node in self.fields}
        try:
            return self.cls(**values)
        except (ValueError, TypeError) as exc:
            raise CodecError(f"{here}: {exc}") from None


class UnionNode(Node):
    """Members told apart by JSON kind; dataclasses among them by their ``type`` tag."""

    def __init__(self, members: tuple[Node, ...], hint: Any) -> None:
        by_class = [m for m in members if isinstance(m, DataclassNode)]
        objects = [m for m in members if dict in m.kinds]
        if len(objects) > 1 and len(by_class) != len(objects):
            raise TypeError(f"{type_name(hint)}: objects of several kinds need all be dataclasses")
        seen: set[type] = set()
        for member in members:
            shared = (seen & member.kinds) - ({dict} if len(by_class) > 1 else set())
            if shared:
                raise TypeError(f"{type_name(hint)}: two members take the same JSON kind")
            seen |= member.kinds
        self.members, self.kinds, self.hint = members, frozenset(seen), hint
        self.by_name = {m.cls.__name__: m for m in by_class} if len(by_class) > 1 else {}

    def children(self) -> tuple[Node, ...]:
        return self.members

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        member = next((m for m in self.members if m.accepts(value)), None)
        if member is None and type(value) is int:
            member = next((m for m in self.members if isinstance(m, FloatNode)), None)
        if member is None:
            raise wrong_type(path, type_name(self.hint), value)
        dumped = member.dump(value, path, blobs)
        if isinstance(member, DataclassNode) and self.by_name:
            assert isinstance(dumped, dict)
            return {TAG: member.cls.__name__, **dumped}
        return dumped

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is dict and self.by_name:
            name = obj.get(TAG)
            member = self.by_name.get(name) if type(name) is str else None
            if member is None:
                raise CodecError(
                    f"{at(path)}: unknown type {name!r} (one of {sorted(self.by_name)})"
                )
            return member.load({k: v for k, v in obj.items() if k != TAG}, path, blobs)
        for candidate in self.members:
            if type(obj) in candidate.kinds:
                return candidate.load(obj, path, blobs)
        wanted = " or ".join(sorted({JSON_NAMES[k] for k in self.kinds}))
        raise wrong_json(path, wanted, obj)

