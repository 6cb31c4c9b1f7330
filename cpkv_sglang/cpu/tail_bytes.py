"""The bytes SGLang 0.5.23's tail all-gather moves, as shipped and with cpkv's phase 1, at
DeepSeek-V3.2's hidden size (7,168 x bf16), for bs 1-64, on SGLang's own path
(``cpkv_sglang.cpu``): :func:`measure`, which ``python -m cpkv_sglang.cpu.bench`` prints."""

from __future__ import annotations

from typing import Any

import torch

from cpkv_sglang.cpu.batches import BatchShape
from cpkv_sglang.cpu.ranks import TailJob, TailReport, run_ranks

__all__ = ["BATCH_SIZES", "HIDDEN", "STRATEGY", "TOKENS_PER_REQUEST", "measure"]

HIDDEN = 7168
"""DeepSeek-V3.2's hidden size; the states are bf16."""
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
TOKENS_PER_REQUEST = 32
"""Current tokens of every request (the stock gather moves them all, phase 1 one each)."""
STRATEGY = "interleave"
"""The CP strategy SGLang 0.5.23 runs DeepSeek-V3.2 with."""


def _same_bits(stock: list[TailReport], plugin: list[TailReport]) -> bool:
    """Every rank's logits of every batch, stock and plugin, equal byte for byte."""
    for s, p in zip(stock, plugin, strict=True):
        for sr, pr in zip(s.results, p.results, strict=True):
            a, b = sr.logits.contiguous(), pr.logits.contiguous()
            if a.shape != b.shape or not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
                return False
    return True


def measure(cp_size: int) -> dict[str, Any]:
    """Runs the batches stock and with the plugin on ``cp_size`` CPU ranks; the document."""
    batches = tuple(BatchShape((TOKENS_PER_REQUEST,) * bs, (0,) * bs) for bs in BATCH_SIZES)
    job = TailJob(STRATEGY, batches, hidden=HIDDEN, vocab=64)
    stock = run_ranks(cp_size, job)
    narrow = (("CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT", "1"),)
    plugin = run_ranks(cp_size, TailJob(STRATEGY, batches, True, narrow, HIDDEN, 64))
    rows = [
        {
            "bs": len(shape.extend_lens),
            "tokens": shape.num_tokens,
            "stock_rows": sum(s.gathered_rows),
            "plugin_rows": sum(p.gathered_rows),
            "stock_bytes": s.gathered_bytes,
            "plugin_bytes": p.gathered_bytes,
        }
        for shape, s, p in zip(batches, stock[0].results, plugin[0].results, strict=True)
    ]
    return {
        "cp_size": cp_size,
        "strategy": STRATEGY,
        "hidden": HIDDEN,
        "dtype": "bfloat16",
        "tokens_per_request": TOKENS_PER_REQUEST,
        "rows": rows,
        "logits_bitwise_equal": _same_bits(stock, plugin),
    }
