"""The trace format: JSON Lines, one prefill batch a line; entry point ``load_trace``."""

from cpkv_core.traces.schema import BatchLine, RequestLine, TraceError
from cpkv_core.traces.trace import (
    Trace,
    load_trace,
    parse_trace_lines,
    parse_trace_text,
    validate_trace,
)

__all__ = [
    "BatchLine",
    "RequestLine",
    "Trace",
    "TraceError",
    "load_trace",
    "parse_trace_lines",
    "parse_trace_text",
    "validate_trace",
]
