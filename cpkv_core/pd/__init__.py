"""PD: owned-page transfer from CP prefill ranks to a non-CP decode server over Mooncake.

Entry points: ``send_requests`` on every prefill rank, ``serve_decode`` in the decode process.
"""

from cpkv_core.pd.decode import DecodeServer, serve_decode
from cpkv_core.pd.prefill import PdFaults, PdTarget, SendResult, send_requests
from cpkv_core.pd.protocol import Report, ReportReply, RequestReport, Shutdown
from cpkv_core.pd.transport import LOOPBACK

__all__ = [
    "LOOPBACK",
    "DecodeServer",
    "PdFaults",
    "PdTarget",
    "Report",
    "ReportReply",
    "RequestReport",
    "SendResult",
    "Shutdown",
    "send_requests",
    "serve_decode",
]
