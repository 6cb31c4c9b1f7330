"""Every stand-in the CPU harness runs with, and why: the one list (:data:`STANDINS`).

A stand-in replaces code the tested path never runs, and raises if it is run. The CPU
harness replaces nothing else of SGLang's but its process groups (:mod:`.group`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import torch

__all__ = ["STANDINS", "NoCudaStream", "StandIn", "install_cuda_stream_standin"]


@dataclass(frozen=True, slots=True)
class StandIn:
    """One replaced piece and the reason."""

    name: str
    where: str
    reason: str


STANDINS: tuple[StandIn, ...] = (
    StandIn(
        "torchvision (distribution 0.28.0+cpkv.standin)",
        "scripts/sglang_standins, installed by scripts/setup.sh where no torchvision is",
        "PyPI's torchvision wheels for torch 2.13 are CUDA builds whose operators do not "
        "register on torch's CPU build. SGLang imports it at the top of "
        "srt/multimodal/internvl_utils.py (via srt/configs/__init__.py), transformers imports "
        "torchvision.io and transforms once it finds the package and reads its version from "
        "the metadata. Only enum values and names; every function raises.",
    ),
    StandIn(
        "torch.cuda.current_stream",
        "install_cuda_stream_standin(), in each rank process",
        "EagerRunner._execute_extend_cp (srt/model_executor/runner/eager_runner.py) asks for "
        "the current CUDA stream only to hand it to cp_gather_after_forward, whose gathers do "
        "not use it; torch's CPU build raises on the call. The stand-in returns a NoCudaStream, "
        "which raises on any use.",
    ),
    StandIn(
        "the model",
        "cpkv_sglang/cpu/model.py",
        "SGLang's DeepSeek models need CUDA kernels (FlashMLA, DeepGEMM, sgl-kernel). A small "
        "per-token model stands in for the body; the embedding, the sharding, the gather, the "
        "logits processor and the LM-head matmul are SGLang's path.",
    ),
)
"""What the CPU harness stands in for, where, and why."""


class NoCudaStream:
    """What ``torch.cuda.current_stream()`` returns on a CPU rank: using it raises."""

    def __getattr__(self, name: str) -> NoReturn:
        raise RuntimeError(
            f"NoCudaStream.{name}: the CPU harness has no CUDA stream; the tested path only "
            "passes the stream along (cpkv_sglang/cpu/standins.py)"
        )

    def __bool__(self) -> NoReturn:
        raise RuntimeError("NoCudaStream used as a value (cpkv_sglang/cpu/standins.py)")


def _current_stream(device: object = None) -> NoCudaStream:
    return NoCudaStream()


def install_cuda_stream_standin() -> None:
    """Makes ``torch.cuda.current_stream()`` return a :class:`NoCudaStream` on a CPU build.

    Raises:
        RuntimeError: CUDA is available: the real stream must be used.
    """
    if torch.cuda.is_available():
        raise RuntimeError("install_cuda_stream_standin is for CPU builds; CUDA is available")
    torch.cuda.current_stream = _current_stream  # type: ignore[assignment]
