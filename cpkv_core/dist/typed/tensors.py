"""The typed codec's data nodes: pydantic models, tensors and numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import pydantic
import torch

from cpkv_core.dist.typed.nodes import BlobReader, CodecError, Node, at, wrong_json, wrong_type
from cpkv_core.dist.typed.tensor_data import TensorData, from_data, to_data

__all__ = ["ModelNode", "NDArrayNode", "TensorNode"]


class ModelNode(Node):
    """A pydantic model: its JSON dump, validated by the model itself on load."""

    kinds = frozenset({dict})

    def __init__(self, cls: type[pydantic.BaseModel]) -> None:
        if cls.model_config.get("extra") != "forbid":
            raise TypeError(f"pydantic model {cls.__name__} must forbid extra fields")
        self.cls = cls

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if type(value) is not self.cls:
            raise wrong_type(path, self.cls.__name__, value)
        return value.model_dump(mode="json")

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        if type(obj) is not dict:
            raise wrong_json(path, "an object", obj)
        try:
            return self.cls.model_validate(obj)
        except pydantic.ValidationError as exc:
            raise CodecError(f"{path or self.cls.__name__}: {exc}") from None


class TensorNode(Node):
    """A tensor (on any device; loaded on the CPU) as ``TensorData``'s fields."""

    kinds = frozenset({dict})

    def __init__(self, data: Node) -> None:
        self.data = data
        """``TensorData``'s node."""

    def accepts(self, value: object) -> bool:
        return isinstance(value, torch.Tensor)

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if not isinstance(value, torch.Tensor):
            raise wrong_type(path, "Tensor", value)
        try:
            data = to_data(value)
        except ValueError as exc:
            raise CodecError(f"{at(path)}: {exc}") from None
        return self.data.dump(data, at(path), blobs)

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        data = self.data.load(obj, at(path), blobs)
        try:
            return from_data(data)
        except ValueError as exc:
            raise CodecError(f"{at(path)}: {exc}") from None


class NDArrayNode(Node):
    """A numpy array of the annotation's dtype, as ``TensorData``'s fields."""

    kinds = frozenset({dict})

    def __init__(self, dtype: np.dtype[Any], data: Node) -> None:
        self.dtype, self.name, self.data = dtype, dtype.name, data

    def accepts(self, value: object) -> bool:
        return isinstance(value, np.ndarray)

    def dump(self, value: Any, path: str, blobs: list[bytes] | None) -> object:
        if not isinstance(value, np.ndarray) or value.dtype != self.dtype:
            shown = getattr(value, "dtype", type(value).__name__)
            raise CodecError(f"{at(path)}: expected an {self.name} array, got {shown}")
        data = TensorData(self.name, tuple(value.shape), np.ascontiguousarray(value).tobytes())
        return self.data.dump(data, at(path), blobs)

    def load(self, obj: object, path: str, blobs: BlobReader | None) -> Any:
        data = self.data.load(obj, at(path), blobs)
        if data.dtype != self.name:
            raise CodecError(f"{at(path)}.dtype: expected {self.name!r}, got {data.dtype!r}")
        try:
            return from_data(data).numpy()
        except ValueError as exc:
            raise CodecError(f"{at(path)}: {exc}") from None

