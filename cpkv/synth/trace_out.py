"""Synthesized batches as trace JSON Lines, and a summary of what the scheduler did."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpkv_core.planning import BatchSpec, RequestSpec


def _request_json(req: RequestSpec) -> dict[str, Any]:
    line: dict[str, Any] = {
        "rid": req.rid,
        "prefix_len": req.prefix_len,
        "extend_len": req.extend_len,
    }
    if req.prefix_from is not None:
        line["prefix_from"] = req.prefix_from
    return line


def trace_text(batches: Sequence[BatchSpec]) -> str:
    """The trace file's text (``docs/trace-format.md``): one batch a line, keys in a fixed
    order, so the same batches always give the same bytes."""
    lines = (
        json.dumps(
            {"batch": b.batch, "spec": b.spec, "requests": [_request_json(r) for r in b.requests]}
        )
        for b in batches
    )
    return "".join(line + "\n" for line in lines)


@dataclass(frozen=True, slots=True)
class SynthSummary:
    """What the scheduler made of a workload. Invariant: ``prompt_tokens ==
    cached_tokens + computed_tokens``."""

    batches: int
    requests: int
    """Distinct requests (turns)."""
    prompt_tokens: int
    """Tokens of every prompt."""
    cached_tokens: int
    """Prompt tokens served by radix-cache hits (page-aligned shared prefixes)."""
    computed_tokens: int
    """Tokens the batches compute."""
    continued_chunks: int
    """Batch entries that continue a chunked request."""
    mid_page_resumes: int
    """Continued chunks that start inside a page."""
    largest_batch_tokens: int

    def to_json(self) -> dict[str, Any]:
        """The summary as ``cpkv trace synth --json`` prints it."""
        return {
            "batches": self.batches,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "computed_tokens": self.computed_tokens,
            "cache_hit_share": self.cached_tokens / self.prompt_tokens,
            "continued_chunks": self.continued_chunks,
            "mid_page_resumes": self.mid_page_resumes,
            "largest_batch_tokens": self.largest_batch_tokens,
        }


def summarize(batches: Sequence[BatchSpec], page_size: int) -> SynthSummary:
    """Counts requests, cache hits, chunking and mid-page resumes over ``batches``."""
    seen: set[str] = set()
    cached = continued = mid_page = 0
    for batch in batches:
        for req in batch.requests:
            if req.rid in seen:
                continued += 1
                mid_page += req.prefix_len % page_size != 0
            else:
                cached += req.prefix_len
                seen.add(req.rid)
    computed = sum(b.num_tokens for b in batches)
    return SynthSummary(
        batches=len(batches),
        requests=len(seen),
        prompt_tokens=cached + computed,
        cached_tokens=cached,
        computed_tokens=computed,
        continued_chunks=continued,
        mid_page_resumes=mid_page,
        largest_batch_tokens=max((b.num_tokens for b in batches), default=0),
    )
