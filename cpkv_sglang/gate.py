"""The gate inside SGLang: AROUND hooks on the strategies' ``can_apply`` and on the DSA
backend's copy of it, ``can_dsa_prefill_cp_interleave``.

SGLang's rule is kept: a batch it would not split stays unsplit. cpkv's gate then decides
the batch once (:func:`decide`, memoized on the forward batch), from its host metadata
only, so every CP rank decides the same: a ``CP_OFF`` reason from cpkv's minimum
(``--nsa-prefill-cp-min-tokens``) runs it unsplit, and phase 1 is active or not with
every reason. Both hooks answer from the same decision, so ``is_cp_active`` and the DSA
backend (``init_forward_metadata``, ``pad_dsa_cache_seqlens``) agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cpkv_sglang.batch_view import scheduled_view
from cpkv_sglang.records import DecisionRecord, record_of
from cpkv_sglang.runtime import Runtime
from cpkv_sglang.startup import ensure_runtime
from cpkv_sglang.state import LOG
from flags import FlagError, batch_from_forward_batch
from phases import BatchPlan

__all__ = ["MEMO_ATTR", "around_can_apply", "around_can_dsa_interleave", "decide"]

MEMO_ATTR = "_cpkv_decision"
"""The forward batch's attribute holding its decision (``(key, record, plan)``)."""


def around_can_apply(
    orig: Callable[..., bool], strategy: Any, num_tokens: int, forward_batch: Any
) -> bool:
    """``ContextParallelStrategy.can_apply`` with cpkv's CP-off minimum on top."""
    sglang_split = bool(orig(strategy, num_tokens, forward_batch))
    return _split(forward_batch, sglang_split)


def around_can_dsa_interleave(orig: Callable[..., bool], forward_batch: Any) -> bool:
    """``can_dsa_prefill_cp_interleave`` answering as the interleave strategy's hook does."""
    sglang_split = bool(orig(forward_batch))
    return _split(forward_batch, sglang_split)


def _split(forward_batch: Any, sglang_split: bool) -> bool:
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None or not mode.is_context_parallel_extend():
        return sglang_split  # NOTE: decode and idle batches: nothing to decide
    decided = decide(forward_batch, sglang_split)
    if decided is None:
        return sglang_split
    return sglang_split and decided[0].split


def decide(forward_batch: Any, sglang_split: bool) -> tuple[DecisionRecord, BatchPlan] | None:
    """The decision of ``forward_batch`` (made on the first call, then memoized on it), or
    None when cpkv cannot read the batch (then SGLang's decision stands, counted as
    unreadable)."""
    runtime = ensure_runtime()
    key = _key(forward_batch)
    memo = getattr(forward_batch, MEMO_ATTR, None)
    if memo is not None and memo[0] == key:
        return memo[1], memo[2]
    try:
        spec = batch_from_forward_batch(forward_batch, runtime.next_batch)
    except FlagError as exc:
        runtime.totals.unreadable += 1
        LOG.warning("cpkv: forward batch not read, SGLang's decision stands: %s", exc)
        return None
    plan = _plan(runtime, spec)
    record = record_of(
        runtime.take_batch_index(), spec.num_tokens, len(spec.requests), sglang_split, plan
    )
    runtime.totals.count(record)
    runtime.keep(record)
    LOG.debug("cpkv decision: %s", record.to_json())
    setattr(forward_batch, MEMO_ATTR, (key, record, plan))
    return record, plan


def _plan(runtime: Runtime, spec: Any) -> BatchPlan:
    deploy = runtime.deploy
    return runtime.gate.decide(scheduled_view(spec, deploy.page_size, deploy.cp_size))


def _key(forward_batch: Any) -> tuple[object, ...]:
    """What the decision depends on; a forward batch reused for another batch misses."""
    return (
        tuple(getattr(forward_batch, "extend_seq_lens_cpu", None) or ()),
        tuple(getattr(forward_batch, "extend_prefix_lens_cpu", None) or ()),
        bool(getattr(forward_batch, "return_logprob", False)),
    )
