"""A batch commits as a whole or not at all.

A rank that raises in the middle of a batch (here: inside a layer, after that layer's KV
write) leaves every rank's pool, requests and stored pages, and rank 0's scheduler, as they
were before the batch; running the batch again then gives the reference result, bitwise.
In-process ranks (threads); the gloo rank-kill case is in ``test_rank_faults.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from cpkv.run.loop import HostLoop, LoopStep
from cpkv_core.config import model_preset
from cpkv_core.dist import Communicator, run_local
from cpkv_core.planning import BatchSpec, KvLayout, pages_for_trace
from cpkv_core.runtime import (
    CPEngine,
    RankBatchOutput,
    ReferenceModel,
    compare_batch,
    merge_rank_outputs,
)
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.debug_checks import DebugChecks
from cpkv_core.traces import load_trace
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
CP_SIZE, PAGE_SIZE = 2, 4
FAILING_RANK, FAILING_BATCH = 1, 2


def _engines(num_pages: int, layout: KvLayout) -> list[CPEngine]:
    deploy = make_deploy(CP_SIZE, PAGE_SIZE)
    return run_local(
        CP_SIZE, lambda comm: CPEngine(TINY, deploy, comm, num_pages, kv_layout=layout)
    )


def _run(engines: list[CPEngine], step: LoopStep) -> list[RankBatchOutput]:
    def body(comm: Communicator) -> RankBatchOutput:
        engine = engines[comm.rank]
        engine.comm = comm  # NOTE: a fresh group per batch: a failure breaks the old one
        with torch.no_grad():
            return engine.run_batch(step.scheduled, step.decision.plan, step.shadow)

    return run_local(CP_SIZE, body)


def _pool(engine: CPEngine) -> list[torch.Tensor]:
    return [
        t.clone().view(torch.uint8)
        for layer in engine.pool.layers
        for t in (layer.latent, layer.index_k, layer.index_k_scale)
    ]


def _fail_in_layer_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 raises in its second ``finish_layer`` call: after layer 1's KV write."""
    real: Callable[..., torch.Tensor] = engine_mod.finish_layer
    calls = [0]

    def failing(*args: object) -> torch.Tensor:
        if threading.current_thread().name == f"cpkv-local-rank{FAILING_RANK}":
            calls[0] += 1
            if calls[0] == 2:
                raise OSError("device lost in layer 1")
        return real(*args)

    monkeypatch.setattr(engine_mod, "finish_layer", failing)


def _trace_outputs(
    batches: tuple[BatchSpec, ...],
    shadow_rate: float,
    monkeypatch: pytest.MonkeyPatch | None,
    failing_batch: int = FAILING_BATCH,
) -> list[list[RankBatchOutput]]:
    deploy = make_deploy(CP_SIZE, PAGE_SIZE)
    num_pages = pages_for_trace(batches, PAGE_SIZE, CP_SIZE)
    loop = HostLoop(deploy, frozenset(REGISTERED_PHASES), num_pages, shadow_rate=shadow_rate)
    engines: list[CPEngine] | None = None
    outputs = []
    for batch in batches:
        scheduler = loop.scheduler.state()
        step = loop.step(batch)
        if engines is None:
            engines = _engines(num_pages, step.decision.plan.kv_layout)
        if monkeypatch is not None and batch.batch == failing_batch:
            assert len(step.scheduled.new_pages) > 0  # the batch allocates, and writes
            compares = step.shadow is not None and len(step.shadow.phases) > 0
            assert compares == (shadow_rate > 0 and failing_batch != FAILING_BATCH)
            pools = [_pool(e) for e in engines]
            committed = [(dict(e.requests), e.stored_pages) for e in engines]
            with monkeypatch.context() as patch:
                _fail_in_layer_1(patch)
                with pytest.raises(RuntimeError, match="device lost in layer 1"):
                    _run(engines, step)
            for engine, pool, done in zip(engines, pools, committed, strict=True):
                assert all(torch.equal(a, b) for a, b in zip(_pool(engine), pool, strict=True))
                assert (engine.requests, engine.stored_pages) == done
            loop.rollback(batch.batch)
            assert loop.scheduler.state() == scheduler
            step = loop.step(batch)  # the rerun
        outputs.append(_run(engines, step))
        loop.report(batch.batch, outputs[-1][0].shadow)
    return outputs


@pytest.mark.parametrize(
    ("shadow_rate", "failing_batch"),
    [(0.0, FAILING_BATCH), (1.0, FAILING_BATCH), (1.0, 3)],
    ids=["plain", "shadowed", "shadow-compared"],
)
def test_a_batch_failed_mid_layer_rolls_back_and_its_rerun_equals_the_reference(
    shadow_rate: float, failing_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``shadow-compared`` fails a batch whose shadow compares a phase (batch 2 has none to
    compare, so it runs plain): the candidate run raises in layer 1, and the shadow's own
    guard must put every layer's rows back."""
    batches = load_trace(DATA / "mixed.jsonl", PAGE_SIZE).batches
    clean = _trace_outputs(batches, shadow_rate, None)
    rerun = _trace_outputs(batches, shadow_rate, monkeypatch, failing_batch)
    for a_ranks, b_ranks in zip(clean, rerun, strict=True):
        for a, b in zip(a_ranks, b_ranks, strict=True):
            for name in ("topk", "last_hidden", "logits"):
                assert torch.equal(getattr(a, name), getattr(b, name)), (a.batch, a.rank, name)
    deploy = make_deploy(CP_SIZE, PAGE_SIZE)
    num_pages = pages_for_trace(batches, PAGE_SIZE, CP_SIZE)
    loop = HostLoop(deploy, frozenset(REGISTERED_PHASES), num_pages)
    reference = ReferenceModel(TINY, num_pages, PAGE_SIZE, deploy.index_k_dtype)
    for batch, pieces in zip(batches, rerun, strict=True):
        with torch.no_grad():
            want = reference.run_batch(loop.step(batch).scheduled)
        comparison = compare_batch(want, merge_rank_outputs(batch, pieces))
        assert comparison.max_abs_diff == 0.0 and comparison.topk_mismatches == 0, batch.batch


def test_a_debug_check_that_fails_after_the_run_step_undoes_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The debug checks run after the step and before the commit: when they raise, the
    batch's rows are written back and nothing is committed."""
    batches = load_trace(DATA / "mixed.jsonl", PAGE_SIZE).batches
    deploy = make_deploy(CP_SIZE, PAGE_SIZE)
    num_pages = pages_for_trace(batches, PAGE_SIZE, CP_SIZE)
    loop = HostLoop(deploy, frozenset(REGISTERED_PHASES), num_pages)
    step = loop.step(batches[0])
    layout = step.decision.plan.kv_layout
    engines = run_local(
        CP_SIZE,
        lambda comm: CPEngine(TINY, deploy, comm, num_pages, kv_layout=layout, debug_checks=True),
    )
    pools = [_pool(e) for e in engines]

    def failing(self: DebugChecks, *args: object) -> None:
        raise RuntimeError("shards do not cover the token rows in use")

    monkeypatch.setattr(DebugChecks, "after_batch", failing)
    with pytest.raises(RuntimeError, match="shards do not cover"):
        _run(engines, step)
    for engine, pool in zip(engines, pools, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(_pool(engine), pool, strict=True))
        assert (engine.requests, engine.stored_pages) == ({}, 0)
