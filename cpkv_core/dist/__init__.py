"""Communication: the torch.distributed communicator, the in-process group, the spawn harness.

Entry points: ``spawn_group`` (real processes) and ``run_local`` (threads), both handing each
rank a ``Communicator``.
"""

from cpkv_core.dist.comm import (
    CommStats,
    Communicator,
    TorchDistCommunicator,
    new_group_communicator,
)
from cpkv_core.dist.launch import ProgressEvent, report_progress, spawn_group
from cpkv_core.dist.local_group import LocalCommunicator, LocalGroup, run_local

__all__ = [
    "CommStats",
    "Communicator",
    "LocalCommunicator",
    "LocalGroup",
    "ProgressEvent",
    "TorchDistCommunicator",
    "new_group_communicator",
    "report_progress",
    "run_local",
    "spawn_group",
]
