"""The ``--device`` option: where weights, pools, the reference and the run step live."""

from __future__ import annotations

from enum import StrEnum

import torch

from cpkv.common.console import BadInput


class Device(StrEnum):
    """A run device."""

    CPU = "cpu"
    CUDA = "cuda"
    META = "meta"
    """A dry run on shapes alone: does the step run without reading a value on the host?"""


def check_device(device: Device) -> None:
    """Refuses ``cuda`` on a machine without one (exit 2, nothing runs)."""
    if device is Device.CUDA and not torch.cuda.is_available():
        raise BadInput(
            "--device cuda needs a CUDA device and this machine has none (torch "
            f"{torch.__version__}); use --device cpu, or --device meta for a dry run"
        )
