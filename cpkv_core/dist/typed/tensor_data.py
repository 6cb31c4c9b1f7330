"""Tensors as plain data: dtype name, shape and raw bytes, never a pickle.

The PD control channel (``pd/wire.py``) and the typed frames ranks send their launcher
(``frames.py``) both carry tensors this way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["DTYPES", "TensorData", "from_data", "to_data"]

DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    )
}
"""The dtypes a ``TensorData`` may name."""


@dataclass(frozen=True, slots=True)
class TensorData:
    """A tensor as plain data: its dtype's name, its shape and its bytes (C order, the
    hosts' native byte order, little-endian on every supported platform)."""

    dtype: str
    """``torch`` dtype name without the ``torch.`` prefix, e.g. ``"bfloat16"``."""
    shape: tuple[int, ...]
    data: bytes
    """``prod(shape) * itemsize`` bytes."""


def to_data(tensor: torch.Tensor) -> TensorData:
    """``tensor`` (on any device) as dtype name, shape and its bytes in C order."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {tensor.dtype} cannot travel as TensorData; use one of {DTYPES}")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return TensorData(name, tuple(tensor.shape), data)


def from_data(data: TensorData) -> torch.Tensor:
    """The CPU tensor ``data`` describes (a copy of its bytes).

    Raises:
        ValueError: an unknown dtype, a negative dimension, or a byte count other than
            ``prod(shape) * itemsize``.
    """
    dtype = DTYPES.get(data.dtype)
    if dtype is None:
        raise ValueError(f"unknown tensor dtype {data.dtype!r}; expected one of {sorted(DTYPES)}")
    if any(dim < 0 for dim in data.shape):
        raise ValueError(f"negative dimension in tensor shape {data.shape}")
    nbytes = math.prod(data.shape) * dtype.itemsize
    if len(data.data) != nbytes:
        raise ValueError(
            f"a {data.dtype} tensor of shape {data.shape} needs {nbytes} bytes, "
            f"got {len(data.data)}"
        )
    if nbytes == 0:
        return torch.empty(data.shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(data.data), dtype=torch.uint8)
    return raw.view(dtype).reshape(data.shape)
