"""PD: owned-page transfer from CP prefill ranks to a decode group over Mooncake, re-sharded
from the prefill's CP size N to the decode side's M (1: a non-CP decode server).

Entry points: ``PdSender`` on every prefill rank, ``serve_decode_rank`` in each decode rank.
"""

from cpkv_core.dist.typed.tensor_data import TensorData, from_data, to_data
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.decode_group import DecodeSpec, DecodeStarted
from cpkv_core.pd.decode_rank import serve_decode_rank
from cpkv_core.pd.layout import ANY_PREFILL, PD_PROTOCOL, describe, layout_mismatch
from cpkv_core.pd.prefill import PdSender
from cpkv_core.pd.probe import ConcurrentWrite, LargeWrite, time_baselines
from cpkv_core.pd.protocol import PdLayout, Report, ReportReply, RequestReport, Shutdown
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
from cpkv_core.pd.writes import WriteStats

__all__ = [
    "AFTER_TRACE",
    "ANY_PREFILL",
    "LOOPBACK",
    "MIN_WRITE_BYTES",
    "PD_PROTOCOL",
    "STAGING_BYTES",
    "ConcurrentWrite",
    "DecodeServer",
    "DecodeSpec",
    "DecodeStarted",
    "LargeWrite",
    "Message",
    "PdFaults",
    "PdLayout",
    "PdSender",
    "PdTarget",
    "Report",
    "ReportReply",
    "RequestReport",
    "SendResult",
    "Shutdown",
    "TensorData",
    "WireError",
    "WriteStats",
    "call",
    "decode",
    "describe",
    "encode",
    "from_data",
    "layout_mismatch",
    "serve_decode_rank",
    "time_baselines",
    "to_data",
]
