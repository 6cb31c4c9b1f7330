"""Phase 1 in SGLang's code path: four AROUND hooks around the tail of a CP forward.

``EagerRunner._execute_extend_cp`` shards the inputs (``cp_shard_model_inputs``, the model
body runs inside it), then calls ``cp_gather_after_forward`` on the body's hidden states
and hands them to the logits processor, whose ``_get_pruned_states`` keeps each request's
last row. The same gather also runs inside the body (the DSA top-k share, Qwen's residual),
so the hooks mark the tail precisely: a slot per ``_execute_extend_cp`` call (a context
variable), armed when its ``cp_shard_model_inputs`` closes; the first gather of that batch
after it is the tail.

At the tail, a batch the gate gave phase 1 gathers ``cp x bs`` rows
(:func:`cpkv_sglang.narrow.narrow_gather`) and ``_get_pruned_states`` is told its requests
have one row each, so it keeps all of them, through SGLang's own code. Otherwise, and for the
cases only SGLang's path shows (:class:`~cpkv_sglang.records.TailFallback`), the stock
gather runs, with the reason counted. A shadowed batch (``CPKV_SHADOW_RATE``) runs the stock
gather too and compares the kept rows bit for bit: a difference kills phase 1 for the rest
of the run and the stock rows are served.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch import Tensor

from cpkv_sglang.gate import MEMO_ATTR, decide
from cpkv_sglang.narrow import last_rows_of_full, narrow_gather, places_of
from cpkv_sglang.records import TailFallback
from cpkv_sglang.runtime import Runtime
from cpkv_sglang.startup import ensure_runtime
from cpkv_sglang.state import LOG
from phases import PhaseId
from phases.decision_log import TailRecord
from phases.shadow import sampled

__all__ = [
    "around_execute_extend_cp",
    "around_gather_after_forward",
    "around_get_pruned_states",
    "around_shard_model_inputs",
]


@dataclasses.dataclass(slots=True)
class _Slot:
    """The tail of one ``_execute_extend_cp`` call."""

    forward_batch: Any
    model: Any
    armed: bool = False
    """The model body's input sharding closed: the next gather is the tail."""
    done: bool = False
    narrow: Tensor | None = None
    """The rows phase 1 handed to the logits processor."""


_SLOT: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("cpkv_tail", default=None)


def around_execute_extend_cp(
    orig: Callable[..., Any], runner: Any, *args: Any, **kwargs: Any
) -> Any:
    """Opens the slot of this CP forward; counts a forward with no tail gather (not the last
    pipeline rank)."""
    forward_batch = args[0] if args else kwargs["forward_batch"]
    model = runner.model_runner.model
    slot = _Slot(forward_batch, model)
    token = _SLOT.set(slot)
    try:
        result = orig(runner, *args, **kwargs)
    finally:
        _SLOT.reset(token)
    if not slot.done and not model.pp_group.is_last_rank:
        _count_stock(ensure_runtime(), TailFallback.PP_NOT_LAST, _batch_of(forward_batch))
    return result


class _ArmOnExit:
    """``cp_shard_model_inputs``'s context manager, arming the slot when it closes cleanly."""

    def __init__(self, inner: Any, slot: _Slot) -> None:
        self.inner, self.slot = inner, slot

    def __enter__(self) -> Any:
        return self.inner.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        handled: bool | None = self.inner.__exit__(kind, exc, tb)
        if kind is None:
            self.slot.armed = True
        return handled


def around_shard_model_inputs(orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Arms the open slot when the model body's input sharding of its batch closes."""
    inner = orig(*args, **kwargs)
    slot = _SLOT.get()
    forward_batch = args[2] if len(args) > 2 else kwargs.get("forward_batch")
    if slot is None or forward_batch is not slot.forward_batch:
        return inner
    return _ArmOnExit(inner, slot)


def around_gather_after_forward(orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The tail: phase 1's narrow gather, or the stock one with its reason."""
    x, forward_batch = args[0], args[1] if len(args) > 1 else kwargs["forward_batch"]
    slot = _SLOT.get()
    if slot is None or not slot.armed or slot.done or forward_batch is not slot.forward_batch:
        return orig(*args, **kwargs)
    slot.done = True
    runtime = ensure_runtime()
    reason = _fallback(x, slot)
    if reason is not None:
        _count_stock(runtime, reason, _batch_of(forward_batch))
        return orig(*args, **kwargs)
    from sglang.srt.layers.cp.base import get_cp_strategy
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    cp_size = parallel.attn_cp_size
    places = places_of(forward_batch, get_cp_strategy().name, cp_size, parallel.attn_cp_rank)
    rows = narrow_gather(x, places, cp_size)
    decided = decide(forward_batch, True)
    assert decided is not None, "a batch without a decision took phase 1"
    batch = decided[0].batch
    shadow = None
    if sampled(batch, runtime.shadow_rate, runtime.shadow_seed):
        full = orig(*args, **kwargs)
        if not _shadow_agrees(runtime, rows, full, forward_batch, batch):
            return full
        shadow = "agreed"
    runtime.totals.tail["narrow"] += 1
    runtime.keep(TailRecord(batch, "narrow", None, shadow))
    slot.narrow = rows
    return rows


def _shadow_agrees(
    runtime: Runtime, rows: Tensor, full: Tensor, forward_batch: Any, batch: int
) -> bool:
    """Compares phase 1's rows with the stock gather's kept rows; kills phase 1 on a
    difference."""
    expected = last_rows_of_full(full, list(forward_batch.extend_seq_lens_cpu))
    runtime.totals.shadow["checked"] += 1
    if _bitwise_equal(rows, expected):
        return True
    runtime.totals.shadow["mismatched"] += 1
    runtime.gate.kill(PhaseId.NARROW_OUTPUT, (("shadow", "mismatch"), ("batch", batch)))
    LOG.error(
        "cpkv: shadow check of batch %d found phase 1's rows differ from SGLang's gather: "
        "phase 1 is killed for the rest of the run; the stock rows are served",
        batch,
    )
    _count_stock(runtime, "SHADOW_MISMATCH", batch, "mismatched")
    return False


def _bitwise_equal(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _count_stock(
    runtime: Runtime, reason: str, batch: int | None, shadow: str | None = None
) -> None:
    runtime.totals.tail["stock"] += 1
    runtime.totals.tail[f"stock:{reason}"] += 1
    if batch is not None:
        runtime.keep(TailRecord(batch, "stock", reason, shadow))


def _batch_of(forward_batch: Any) -> int | None:
    """The index the gate gave this batch, or None when it could not read it."""
    memo = getattr(forward_batch, MEMO_ATTR, None)
    return None if memo is None else int(memo[1].batch)


def _fallback(x: Any, slot: _Slot) -> str | None:
    """Why this tail keeps the stock gather, or None when phase 1 runs."""
    decided = decide(slot.forward_batch, True)
    if decided is None:
        return "UNREADABLE"
    phase_1 = decided[1].decisions[PhaseId.NARROW_OUTPUT - 1]
    if not decided[0].split:
        return "CP_OFF"
    if not phase_1.active:
        return str(phase_1.reasons[0].code)
    if isinstance(x, tuple):
        return TailFallback.TUPLE_HIDDEN
    if getattr(slot.model, "capture_aux_hidden_states", False):
        return TailFallback.AUX_HIDDEN
    return _path_fallback(slot.forward_batch)


def _path_fallback(forward_batch: Any) -> str | None:
    from sglang.srt.layers.layernorm_sp import runs_sp
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        is_in_breakable_cuda_graph,
    )

    if is_in_breakable_cuda_graph():
        return TailFallback.BREAKABLE_CUDA_GRAPH
    mode = forward_batch.forward_mode
    scoring = any(
        getattr(forward_batch, name, None) is not None
        for name in ("multi_item_delimiter_indices", "token_indices_to_pool")
    )
    if mode.is_dllm_extend() or scoring or runs_sp(mode):
        return TailFallback.ALL_POSITIONS
    return None


def around_get_pruned_states(
    orig: Callable[..., Any], processor: Any, hidden_states: Any, *args: Any, **kwargs: Any
) -> Any:
    """Given phase 1's ``[bs, hidden]`` rows, SGLang's pruning runs as for ``bs`` requests of
    one row each, and so keeps every row."""
    slot = _SLOT.get()
    if slot is None or slot.narrow is None or hidden_states is not slot.narrow:
        return orig(processor, hidden_states, *args, **kwargs)
    *rest, metadata = args
    lens = metadata.extend_seq_lens
    bs = hidden_states.shape[0]
    ones = torch.ones(bs, dtype=torch.int64, device=hidden_states.device)
    one_each = dataclasses.replace(
        metadata,
        extend_seq_lens=ones if lens is None else torch.ones_like(lens),
        extend_seq_lens_cpu=[1] * bs,
    )
    return orig(processor, hidden_states, *rest, one_each, **kwargs)
