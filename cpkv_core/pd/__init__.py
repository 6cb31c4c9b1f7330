"""PD: owned-page transfer from CP prefill ranks to a non-CP decode server over Mooncake.

Entry points: ``PdSender`` on every prefill rank, ``serve_decode`` in the decode process.
"""

from cpkv_core.dist.typed.tensor_data import TensorData, from_data, to_data
from cpkv_core.pd.decode import DecodeServer, Started, serve_decode
from cpkv_core.pd.prefill import PdSender
from cpkv_core.pd.probe import ConcurrentWrite, LargeWrite, time_baselines
from cpkv_core.pd.protocol import Report, ReportReply, RequestReport, Shutdown
from cpkv_core.pd.target import (
    AFTER_TRACE,
    MIN_WRITE_BYTES,
    STAGING_BYTES,
    PdFaults,
    PdTarget,
    SendResult,
)
from cpkv_core.pd.transport import LOOPBACK
from cpkv_core.pd.wire import Message, WireError, call, decode, encode
from cpkv_core.pd.writer import WriteStats

__all__ = [
    "AFTER_TRACE",
    "LOOPBACK",
    "MIN_WRITE_BYTES",
    "STAGING_BYTES",
    "ConcurrentWrite",
    "DecodeServer",
    "LargeWrite",
    "Message",
    "PdFaults",
    "PdSender",
    "PdTarget",
    "Report",
    "ReportReply",
    "RequestReport",
    "SendResult",
    "Shutdown",
    "Started",
    "TensorData",
    "WireError",
    "WriteStats",
    "call",
    "decode",
    "encode",
    "from_data",
    "serve_decode",
    "time_baselines",
    "to_data",
]
