"""The built-in trace of ``cpkv demo`` and ``cpkv bench``: chunked prefill, prefix hits,
short and single-token requests, about 2.3k tokens."""

from __future__ import annotations

from importlib.resources import files

from cpkv_core.traces import Trace, parse_trace_text

DEMO_TRACE = "data/demo_trace.jsonl"


def demo_trace(page_size: int) -> Trace:
    """The built-in trace, validated for ``page_size`` (prefix hits are 64-token aligned)."""
    text = files("cpkv").joinpath(DEMO_TRACE).read_text()
    return parse_trace_text(text, page_size, source=f"cpkv/{DEMO_TRACE}")
