"""Tensors as plain data for the control channel: dtype name, shape and raw bytes, no pickle."""

from __future__ import annotations

import math

import torch

from cpkv_core.pd.protocol import TensorData

DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.uint8,
        torch.int8,
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
