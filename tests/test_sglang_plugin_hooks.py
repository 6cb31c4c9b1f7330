"""The plugin's per-batch hooks driven in-process, without rank processes: the gate's memo on
a reused forward batch, the phases a runtime hands its gate, the tail's fallbacks as SGLang's
``_execute_extend_cp`` meets them, and which rank writes a shared decision log. SGLang's
objects are stand-ins holding the fields the hooks read; ``test_sglang_plugin.py`` runs the
same hooks inside SGLang's own code on CPU ranks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cpkv_core.config import CpMode
from cpkv_sglang import runtime as runtime_mod
from cpkv_sglang.decision_file import DecisionFile
from cpkv_sglang.gate import decide
from cpkv_sglang.runtime import Runtime
from cpkv_sglang.tail import (
    around_execute_extend_cp,
    around_gather_after_forward,
    around_shard_model_inputs,
)
from flags import FlagSet, ResolvedFlags
from phases import PhaseId
from phases.decision_log import DecisionRecord, TailRecord
from tests.sglang_cases import require_sglang

require_sglang()

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

pytestmark = pytest.mark.xdist_group("sglang")


def server_flags(**overrides: Any) -> ResolvedFlags:
    """Phase 1 on an interleave CP 4 server with page 64 (as the start-up check hands them)."""
    values: dict[str, Any] = {
        "enable_nsa_prefill_context_parallel": True,
        "nsa_prefill_cp_mode": CpMode.ROUND_ROBIN_SPLIT,
        "attn_cp_size": 4,
        "page_size": 64,
        "enable_nsa_prefill_cp_narrow_output": True,
    }
    flags = FlagSet(**(values | overrides))
    return ResolvedFlags(flags, dict.fromkeys(FlagSet.model_fields, "default"))


@pytest.fixture
def started() -> Iterator[Runtime]:
    """The runtime the start-up check builds for :func:`server_flags`, installed for the
    hooks; removed afterwards."""
    runtime = runtime_mod.build(server_flags())
    runtime_mod.set_current(runtime)
    yield runtime
    runtime_mod.set_current(None)


def extend_batch(**fields: Any) -> SimpleNamespace:
    """A ``ForwardBatch``'s host fields for two fresh requests of 30 and 40 tokens."""
    values: dict[str, Any] = {
        "extend_seq_lens_cpu": [30, 40],
        "extend_prefix_lens_cpu": [0, 0],
        "return_logprob": False,
    }
    return SimpleNamespace(**(values | fields))


def test_a_reused_forward_batch_that_turns_on_logprobs_is_decided_again(
    started: Runtime,
) -> None:
    """The memo on a forward batch holds only for the batch it was made for: the same
    object, now returning logprobs, loses phase 1 (it needs every position)."""
    forward_batch = extend_batch()
    decided = decide(forward_batch, True)
    assert decided is not None
    first = decided[0]
    assert (first.batch, first.phase, first.reasons) == (0, 1, ())
    forward_batch.return_logprob = True
    decided = decide(forward_batch, True)
    assert decided is not None
    again = decided[0]
    assert (again.batch, again.phase) == (1, 0), again
    assert again.reasons == ("1:RETURN_LOGPROB rid=r0", "1:RETURN_LOGPROB rid=r1")
    assert started.totals.batches == 2


def test_sglangs_kv_sharding_leaves_the_plugins_gate_deciding_phase_1_only() -> None:
    """Phase 2 is SGLang's own KV sharding here: the runtime's gate is handed phase 1 alone,
    so a batch's record says phase 1, and 0 when a logprob batch takes phase 1 off."""
    runtime = runtime_mod.build(
        server_flags(enable_nsa_prefill_cp_shared_kv=True, disaggregation_mode="prefill")
    )
    assert runtime.gate.enabled == frozenset({PhaseId.NARROW_OUTPUT})
    runtime_mod.set_current(runtime)
    try:
        records = [decide(extend_batch(return_logprob=lp), True) for lp in (False, True)]
    finally:
        runtime_mod.set_current(None)
    assert [r[0].phase for r in records if r is not None] == [1, 0]


def run_tail(hidden: Any, forward_batch: Any, aux: bool = False) -> tuple[Any, Any, dict[str, int]]:
    """One CP forward through the tail hooks as ``_execute_extend_cp`` calls them (shard the
    inputs, run the body, gather after it); returns what the tail handed on, the stock
    gather's answer, and the tail counters."""
    stock = torch.full((70, 8), 7.0)
    last_rank = SimpleNamespace(is_last_rank=True)
    model = SimpleNamespace(pp_group=last_rank, capture_aux_hidden_states=aux)
    runner = SimpleNamespace(model_runner=SimpleNamespace(model=model))

    def gather(x: Any, fb: Any) -> Any:
        return stock

    def execute(runner: Any, fb: Any) -> Any:
        inputs = around_shard_model_inputs(lambda *a: _NullContext(), None, None, fb)
        with inputs:
            pass
        return around_gather_after_forward(gather, hidden, fb)

    out = around_execute_extend_cp(execute, runner, forward_batch)
    current = runtime_mod.current()
    assert current is not None
    return out, stock, dict(current.totals.tail)


class _NullContext:
    """``cp_shard_model_inputs``'s context manager, doing nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize(
    ("hidden", "fields", "aux", "reason"),
    [
        ((torch.zeros(18, 8), torch.zeros(18, 8)), {}, False, "TUPLE_HIDDEN"),
        (torch.zeros(18, 8), {}, True, "AUX_HIDDEN"),
        (torch.zeros(18, 8), {"multi_item_delimiter_indices": [3]}, False, "ALL_POSITIONS"),
        (torch.zeros(18, 8), {"token_indices_to_pool": [0, 29]}, False, "ALL_POSITIONS"),
    ],
    ids=["tuple-hidden", "aux-hidden", "multi-item-scoring", "pooled-scoring"],
)
def test_a_phase_1_batch_whose_tail_needs_every_row_keeps_the_stock_gather(
    started: Runtime, hidden: Any, fields: dict[str, Any], aux: bool, reason: str
) -> None:
    """The gate gives these batches phase 1; only SGLang's code path shows that the tail
    needs more than each request's last row, and there the stock gather runs, counted."""
    forward_batch = extend_batch(forward_mode=ForwardMode.EXTEND, **fields)
    out, stock, tail = run_tail(hidden, forward_batch, aux)
    assert out is stock
    assert tail == {"stock": 1, f"stock:{reason}": 1}, tail


def records(path: Path) -> list[dict[str, Any]]:
    """The decision log's lines."""
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("rank", "writes"), [(0, True), (1, False)])
def test_a_shared_decision_log_is_written_by_rank_0_alone_and_a_rank_template_by_each(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rank: int, writes: bool
) -> None:
    """Every CP rank decides the same batches: without ``{rank}`` in the path only rank 0
    appends, so the log holds each batch once; with it, each rank keeps its own file."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    decision = DecisionRecord(0, 70, 2, True, True, 1, ())
    tail = TailRecord(0, "narrow", None, None)
    shared, own = tmp_path / "shared.jsonl", tmp_path / "own-{rank}.jsonl"
    for template in (shared, own):
        log = DecisionFile(str(template))
        log.write(decision)
        log.write(tail)
    expected = [{"decision": decision.to_json()}, {"tail": tail.to_json()}]
    assert shared.exists() == writes
    if writes:
        assert records(shared) == expected
    assert records(tmp_path / f"own-{rank}.jsonl") == expected
