"""Communication: the torch.distributed communicator, the in-process group, the launchers.

Entry points: ``spawn_group`` (real processes on this machine), ``TorchrunGroup`` (this process
is one rank that torchrun started) and ``run_local`` (threads), each handing a rank a
``Communicator``. What ranks send their launcher travels as typed frames (``frames``), never
as a pickle.
"""

from cpkv_core.dist.comm import (
    CommStats,
    Communicator,
    TorchDistCommunicator,
    new_group_communicator,
)
from cpkv_core.dist.launch import ProgressEvent, report_progress, spawn_group
from cpkv_core.dist.local_group import LocalCommunicator, LocalGroup, run_local
from cpkv_core.dist.rank_errors import ErrorRecord, RankError, RankFailed, rank_error
from cpkv_core.dist.start_method import forked_ranks
from cpkv_core.dist.torchrun import TorchrunEnv, TorchrunGroup, torchrun_env
from cpkv_core.dist.typed import FrameError, decode_frame, encode_frame
from cpkv_core.dist.value_collectives import broadcast_value, gather_value

__all__ = [
    "CommStats",
    "Communicator",
    "ErrorRecord",
    "FrameError",
    "LocalCommunicator",
    "LocalGroup",
    "ProgressEvent",
    "RankError",
    "RankFailed",
    "TorchDistCommunicator",
    "TorchrunEnv",
    "TorchrunGroup",
    "broadcast_value",
    "decode_frame",
    "encode_frame",
    "forked_ranks",
    "gather_value",
    "new_group_communicator",
    "rank_error",
    "report_progress",
    "run_local",
    "spawn_group",
    "torchrun_env",
]
