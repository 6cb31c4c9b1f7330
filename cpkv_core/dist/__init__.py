"""Communication: the torch.distributed communicator, the in-process group, the launchers.

Entry points: ``spawn_group`` (real processes on this machine), ``TorchrunGroup`` (this process
is one rank that torchrun started) and ``run_local`` (threads), each handing a rank a
``Communicator``.
"""

from cpkv_core.dist.comm import (
    CommStats,
    Communicator,
    TorchDistCommunicator,
    new_group_communicator,
)
from cpkv_core.dist.launch import ProgressEvent, report_progress, spawn_group
from cpkv_core.dist.local_group import LocalCommunicator, LocalGroup, run_local
from cpkv_core.dist.torchrun import TorchrunEnv, TorchrunGroup, torchrun_env

__all__ = [
    "CommStats",
    "Communicator",
    "LocalCommunicator",
    "LocalGroup",
    "ProgressEvent",
    "TorchDistCommunicator",
    "TorchrunEnv",
    "TorchrunGroup",
    "new_group_communicator",
    "report_progress",
    "run_local",
    "spawn_group",
    "torchrun_env",
]
