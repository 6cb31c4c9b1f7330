"""One batch through SGLang's CP path on a CPU rank: :func:`run_batch`.

It is what ``EagerRunner._execute_extend`` does around the CP tail (``eager_runner.py``):
``is_cp_active``; if active ``prepare_cp_forward`` then SGLang's own
``EagerRunner._execute_extend_cp``, else the model's unsplit ``forward``. The attention
backend's part is its gate copy: ``can_dsa_prefill_cp_interleave`` (at its own module and at
the DSA backend's binding) and ``pad_dsa_cache_seqlens``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from cpkv_sglang.cpu.batches import BatchShape, forward_batch, token_ids
from cpkv_sglang.cpu.group import CommGroup
from cpkv_sglang.cpu.model import TinyCausalLM

__all__ = ["BatchResult", "run_batch"]


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one rank saw of one batch."""

    split: bool
    """``is_cp_active``: the batch ran split over the CP ranks."""
    can_apply: bool
    """The strategy's ``can_apply(len(input_ids), forward_batch)``."""
    can_dsa: bool
    """``dsa.utils.can_dsa_prefill_cp_interleave`` (the DSA backend's copy)."""
    can_dsa_at_backend: bool
    """The same, through ``dsa_backend``'s ``from ... import`` binding."""
    dsa_seqlens: int
    """Length ``pad_dsa_cache_seqlens`` pads this rank's per-token seqlens to."""
    gathered_rows: tuple[int, ...]
    """Rows of each all-gather of the forward (the tail's; two when shadowed)."""
    gathered_bytes: int
    logits: Tensor
    """``[bs, vocab]`` ``next_token_logits``; ``[0, 0]`` on a non-last pipeline rank."""
    pruned: Tensor
    """``[bs, hidden]`` the rows ``_get_pruned_states`` kept."""
    decision: str
    """The plugin's decision record as JSON (empty without the plugin)."""


def run_batch(
    model: TinyCausalLM, group: CommGroup, shape: BatchShape, seed: int, corrupt: bool
) -> BatchResult:
    """Runs ``shape`` on this rank (``corrupt``: the forward's first gather is corrupted)."""
    from sglang.srt.layers.attention import dsa_backend
    from sglang.srt.layers.attention.dsa import utils as dsa_utils
    from sglang.srt.layers.cp import utils as cp_utils
    from sglang.srt.layers.cp.base import get_cp_strategy
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        enable_breakable_cuda_graph,
    )

    ids = token_ids(shape, model.embed.num_embeddings, seed)
    fb = forward_batch(shape, ids)
    can_apply = bool(get_cp_strategy().can_apply(len(ids), fb))
    can_dsa = bool(dsa_utils.can_dsa_prefill_cp_interleave(fb))
    at_backend = bool(dsa_backend.can_dsa_prefill_cp_interleave(fb))
    split = bool(cp_utils.is_cp_active(fb))
    if split:
        cp_utils.prepare_cp_forward(fb)
    local = _local_tokens(fb, split)
    dsa_len = int(dsa_utils.pad_dsa_cache_seqlens(fb, torch.zeros(local)).shape[0])
    group.take()
    group.corrupt_next = corrupt
    pruned = _spy_pruned(model)
    scope = enable_breakable_cuda_graph() if shape.bcg else contextlib.nullcontext()
    with scope:
        out = _forward(model, fb, split)
    gathers = group.take()
    logits = getattr(out, "next_token_logits", None)
    return BatchResult(
        split,
        can_apply,
        can_dsa,
        at_backend,
        dsa_len,
        tuple(g.rows for g in gathers),
        sum(g.nbytes for g in gathers),
        torch.zeros(0, 0) if logits is None else logits,
        pruned[0] if pruned else torch.zeros(0, 0),
        json.dumps(_decision(fb)),
    )


def _forward(model: TinyCausalLM, fb: Any, split: bool) -> Any:
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    if not split:
        return model.forward(fb.input_ids, fb.positions, fb)
    runner = object.__new__(EagerRunner)
    runner.model_runner = _ModelRunner(model)
    return EagerRunner._execute_extend_cp(runner, fb, {})


@dataclass(frozen=True, slots=True)
class _ModelRunner:
    """The one attribute of a ``ModelRunner`` ``_execute_extend_cp`` reads."""

    model: TinyCausalLM


def _local_tokens(fb: Any, split: bool) -> int:
    """This rank's per-token rows the DSA backend pads: its logical shard when split."""
    if not split:
        return int(sum(fb.extend_seq_lens_cpu))
    from sglang.srt.runtime_context import get_parallel

    meta = fb.attn_cp_metadata
    counts = meta.per_rank_logical_token or meta.per_rank_actual_token
    return int(counts[get_parallel().attn_cp_rank])


def _spy_pruned(model: TinyCausalLM) -> list[Tensor]:
    """Records what the (hooked) ``_get_pruned_states`` returns, through an instance
    attribute that calls the class's."""
    processor = model.logits_processor
    bound = type(processor)._get_pruned_states.__get__(processor)
    kept: list[Tensor] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        result = bound(*args, **kwargs)
        kept.append(result[0].clone())
        return result

    processor._get_pruned_states = spy
    return kept


def _decision(fb: Any) -> dict[str, Any]:
    from cpkv_sglang.gate import MEMO_ATTR

    memo = getattr(fb, MEMO_ATTR, None)
    return {} if memo is None else memo[1].to_json()
