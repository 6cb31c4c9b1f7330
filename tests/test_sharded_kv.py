"""Phase 2/3 mechanics: shards partition the replicated pool, views equal replicated reads,
the run step needs no value and no other device, debug checks fire, and real gloo ranks
agree."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from cpkv.run.dry_run import MetaGuard
from cpkv.run.jobs import Backend, RankJob
from cpkv.run.loop import HostLoop, LoopStep
from cpkv.run.runner import run_jobs_on_gloo, run_reference
from cpkv.run.verify import verify_levels
from cpkv_core.config import CpMode, DeploymentConfig, model_preset
from cpkv_core.dist import Communicator, LocalGroup, run_local
from cpkv_core.planning import (
    BatchSpec,
    ExecutionPlan,
    KvLayout,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    OwnerPolicy,
    RequestSpec,
    ScheduledBatch,
    Scheduler,
    SplitStrategy,
    build_host_plan,
    owner_of_page,
    pages_for_trace,
    physical_loc,
)
from cpkv_core.runtime import CPEngine, KVRows, PagedKVPool, compare_batch, expand, materialize
from cpkv_core.runtime import collect as collect_mod
from cpkv_core.runtime import engine as engine_mod
from cpkv_core.runtime.device_plan import BatchTensors, upload
from cpkv_core.traces import load_trace
from phases import level_enabled, levels_of
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, interleave_trace, make_deploy, mixed_trace

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)


def loop_steps(
    deploy: DeploymentConfig, level: int, batches: tuple[BatchSpec, ...]
) -> list[LoopStep]:
    """The runtime loop's steps for ``batches`` at ``level``, made on the host."""
    pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    loop = HostLoop(deploy, level_enabled(level, ALL), pages)
    return [loop.step(batch) for batch in batches]


def run_engines(
    deploy: DeploymentConfig, level: int, debug_checks: bool = False
) -> tuple[list[CPEngine], list[LoopStep]]:
    """Runs the mixed trace at ``level`` on the in-process group; every rank's engine."""
    batches = mixed_trace(deploy.page_size).batches
    steps = loop_steps(deploy, level, batches)
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    layout = steps[0].decision.plan.kv_layout

    def body(comm: Communicator) -> CPEngine:
        engine = CPEngine(TINY, deploy, comm, num_pages, layout, debug_checks=debug_checks)
        for step in steps:
            engine.run_batch(step.scheduled, step.decision.plan)
        return engine

    return run_local(deploy.cp_size, body), steps


def pages_in_use(steps: list[LoopStep]) -> set[int]:
    return {int(p) for s in steps for r in s.scheduled.requests for p in r.page_table}


def page_bytes(pool: PagedKVPool, layer: int, row: int) -> bytes:
    rows = pool.layers[layer].select(torch.arange(row, row + pool.page_size))
    parts = (rows.latent, rows.index_k.view(torch.uint8), rows.index_k_scale)
    return b"".join(t.contiguous().numpy().tobytes() for t in parts)


@pytest.mark.parametrize("cp_mode", list(CpMode))
@pytest.mark.parametrize(("cp_size", "page_size"), [(2, 4), (3, 1), (4, 16)])
def test_union_of_shards_equals_the_replicated_pool_byte_for_byte(
    cp_size: int, page_size: int, cp_mode: CpMode
) -> None:
    deploy = make_deploy(cp_size, page_size, cp_mode)
    replicated, steps0 = run_engines(deploy, level=0)
    sharded, steps2 = run_engines(deploy, level=2)
    in_use = pages_in_use(steps0)
    assert in_use == pages_in_use(steps2)
    for page in sorted(in_use):
        owner = owner_of_page(page, cp_size)
        for layer in range(TINY.num_layers):
            want = page_bytes(replicated[0].pool, layer, page * page_size)
            got = page_bytes(
                sharded[owner].pool, layer, physical_loc(page * page_size, page_size, cp_size)
            )
            assert got == want, (page, owner, layer)
    assert sum(engine.stored_pages for engine in sharded) == len(in_use)
    assert replicated[0].stored_pages == len(in_use)
    assert sharded[0].pool.num_pages * cp_size < replicated[0].pool.num_pages + cp_size


def entry_slices(batch: ScheduledBatch) -> list[slice]:
    starts = np.cumsum([0, *(len(r.page_table) for r in batch.requests)])
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(starts)]


@pytest.mark.parametrize(
    "strategy", [KvReadStrategy.MATERIALIZED_SLOT, KvReadStrategy.MATERIALIZED_UNIQUE]
)
def test_materialized_view_equals_the_replicated_view(strategy: KvReadStrategy) -> None:
    deploy = make_deploy(3, 4)
    replicated, _ = run_engines(deploy, level=0)
    sharded, steps = run_engines(deploy, level=2)
    batch = steps[2].scheduled  # continuations and a prefix hit: history on every request
    plan = dataclasses.replace(steps[2].decision.plan, kv_read=strategy)

    def body(comm: Communicator) -> list[KVRows]:
        host = build_host_plan(batch, plan, comm.rank)
        tensors = expand(host, upload(host, torch.device("cpu")), TINY.vocab_size)
        pool = sharded[comm.rank].pool
        view = materialize(comm, pool.layers[1], tensors.send_pages, pool.page_size)
        assert host.view is not None
        rows = [
            host.view.key_rows(entries, req.seq_len)
            for entries, req in zip(entry_slices(batch), batch.requests, strict=True)
        ]
        return [view.select(torch.from_numpy(r)) for r in rows]

    views = run_local(3, body)
    for req_index, req in enumerate(batch.requests):
        table = torch.tensor(req.page_table)
        positions = torch.arange(req.seq_len)
        locs = table[positions // 4] * 4 + positions % 4
        want = replicated[0].pool.read(1, locs)
        for rank_views in views:
            got = rank_views[req_index]
            assert torch.equal(got.latent, want.latent)
            assert torch.equal(got.index_k.view(torch.uint8), want.index_k.view(torch.uint8))
            assert torch.equal(got.index_k_scale, want.index_k_scale)


def test_unique_remap_moves_fewer_bytes_with_shared_prefixes() -> None:
    steps = loop_steps(make_deploy(2, 4), 2, mixed_trace(4).batches)
    batch, plan = steps[2].scheduled, steps[2].decision.plan
    views = {}
    for strategy in (KvReadStrategy.MATERIALIZED_SLOT, KvReadStrategy.MATERIALIZED_UNIQUE):
        view = build_host_plan(batch, dataclasses.replace(plan, kv_read=strategy), 0).view
        assert view is not None
        views[strategy] = view.view_tokens
    assert views[KvReadStrategy.MATERIALIZED_UNIQUE] < views[KvReadStrategy.MATERIALIZED_SLOT]


def _valid_plans() -> list[ExecutionPlan]:
    """Every strategy combination the engine executes (reads agree with the layout)."""
    reads = {
        KvWriteStrategy.REPLICATED: [KvReadStrategy.LOCAL_POOL],
        KvWriteStrategy.OWNER_FILTERED: [
            KvReadStrategy.MATERIALIZED_SLOT,
            KvReadStrategy.MATERIALIZED_UNIQUE,
            KvReadStrategy.CURRENT_REUSE,
        ],
    }
    reads[KvWriteStrategy.COMPUTE_OWNER_DIRECT] = reads[KvWriteStrategy.OWNER_FILTERED]
    plans = []
    for split, write, output in itertools.product(SplitStrategy, KvWriteStrategy, OutputStrategy):
        if write is KvWriteStrategy.COMPUTE_OWNER_DIRECT and split is not (
            SplitStrategy.PAGE_ALIGNED_ZIGZAG
        ):
            continue
        # NOTE: the none split (CP off) gathers nothing at the tail, and only it may skip it.
        if (split is SplitStrategy.NONE) != (output is OutputStrategy.LOCAL_LAST_TOKEN):
            continue
        plans += [ExecutionPlan(split, write, read, output) for read in reads[write]]
    return plans


@pytest.mark.parametrize(
    "plan", _valid_plans(), ids=lambda p: f"{p.split}/{p.kv_write}/{p.kv_read}/{p.output}"
)
def test_run_batch_runs_every_strategy_on_meta_with_no_host_value(plan: ExecutionPlan) -> None:
    """The engine's own host plan, one copy to ``meta``, then the whole step on shapes: no
    op reads a value (meta has none) and no op gets a host tensor (the guard)."""
    cp_size, page_size = 2, 4
    deploy = make_deploy(cp_size, page_size)
    batches = [
        BatchSpec(0, (RequestSpec("a", 0, 40), RequestSpec("b", 0, 17))),
        BatchSpec(1, (RequestSpec("a", 40, 33), RequestSpec("c", 16, 20, prefix_from="b"))),
    ]
    if plan.kv_read is KvReadStrategy.CURRENT_REUSE:
        batches = batches[:1]
    scheduler = Scheduler(pages_for_trace(batches, page_size, cp_size), page_size, cp_size)
    scheduled = [scheduler.schedule(b, OwnerPolicy.COMPUTE_OWNER) for b in batches]
    meta = torch.device("meta")

    def body(comm: Communicator) -> list[tuple[int, ...]]:
        engine = CPEngine(TINY, deploy, comm, 64, plan.kv_layout, device=meta)
        shapes = []
        for batch in scheduled:
            host = engine.host_plan(batch, plan)
            packed = upload(host, meta)
            with torch.no_grad(), MetaGuard():
                tensors = expand(host, packed, TINY.vocab_size)
                step = engine.run_step(host, tensors)
            assert step.logits.device == meta
            shapes.append(tuple(step.topk.shape))
        return shapes

    per_rank = run_local(cp_size, body)
    local_rows = [shapes[0][1] for shapes in per_rank]
    if plan.computes_every_token:
        assert local_rows == [scheduled[0].num_tokens] * cp_size
    else:
        assert sum(local_rows) == scheduled[0].num_tokens


def test_meta_guard_names_an_op_handed_a_host_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard fails a step that indexes with a CPU tensor (a sync on CUDA)."""
    original = collect_mod.collect_narrow_last_token

    def host_index(comm, hidden, host, tensors):  # type: ignore[no-untyped-def]
        cpu = dataclasses.replace(tensors, gathered_last_rows=torch.arange(host.bs))
        return original(comm, hidden, host, cpu)

    monkeypatch.setitem(collect_mod.COLLECTORS, OutputStrategy.NARROW_LAST_TOKEN, host_index)
    plan = dataclasses.replace(
        ExecutionPlan.baseline(CpMode.IN_SEQ_SPLIT), output=OutputStrategy.NARROW_LAST_TOKEN
    )
    with pytest.raises(RuntimeError, match=r"OffDeviceError: .* got a cpu tensor \(2,\)"):
        test_run_batch_runs_every_strategy_on_meta_with_no_host_value(plan)


def test_debug_checks_pass_on_a_correct_run() -> None:
    engines, _ = run_engines(make_deploy(3, 4, CpMode.ROUND_ROBIN_SPLIT), 3, debug_checks=True)
    assert engines[0].debug is not None and len(engines[0].debug.written_pages) > 0


def test_debug_checks_pass_with_compute_owner_writes() -> None:
    deploy = make_deploy(2, 4)
    batches = load_trace(DATA / "long.jsonl", 4).batches
    report = verify_levels(TINY, deploy, batches, (5,), ALL, Backend.LOCAL, debug_checks=True)
    assert report.ok
    assert 5 in {row.batch_plan.phase for row in report.levels[0].rows}


def test_debug_checks_catch_a_write_to_a_foreign_page(monkeypatch: pytest.MonkeyPatch) -> None:
    def next_page(*args, **kwargs) -> BatchTensors:  # type: ignore[no-untyped-def]
        tensors = expand(*args, **kwargs)
        return dataclasses.replace(tensors, written_locs=tensors.written_locs + 4)

    monkeypatch.setattr(engine_mod, "expand", next_page)
    with pytest.raises(RuntimeError, match="does not own"):
        run_engines(make_deploy(2, 4), level=2, debug_checks=True)


def test_engine_refuses_a_plan_for_another_layout() -> None:
    deploy = make_deploy(1, 4)
    engine = CPEngine(TINY, deploy, LocalGroup(1).communicators()[0], 16, KvLayout.SHARDED)
    batch = Scheduler(16, 4).schedule(mixed_trace(4).batches[0])
    with pytest.raises(RuntimeError, match="KV at rest"):
        engine.host_plan(batch, ExecutionPlan.baseline(CpMode.IN_SEQ_SPLIT))


@pytest.mark.gloo
@pytest.mark.usefixtures("forked")
def test_every_level_matches_reference_on_real_gloo_ranks() -> None:
    """One 4-rank spawn, smaller CP sizes on subgroups: both splits, three page sizes, long
    requests that take phases 4 and 5 (the page interleave under round-robin), and CP
    minimums that leave some batches unsplit."""
    configs = [
        ("mixed", 4, 16, CpMode.IN_SEQ_SPLIT, 0),
        ("mixed", 4, 4, CpMode.ROUND_ROBIN_SPLIT, 0),
        ("mixed", 3, 1, CpMode.ROUND_ROBIN_SPLIT, 0),
        ("long", 4, 16, CpMode.IN_SEQ_SPLIT, 0),
        ("long", 2, 4, CpMode.IN_SEQ_SPLIT, 0),
        ("long", 4, 16, CpMode.IN_SEQ_SPLIT, 280),
        ("mixed", 3, 4, CpMode.ROUND_ROBIN_SPLIT, 30),
        ("interleave", 3, 4, CpMode.ROUND_ROBIN_SPLIT, 0),
    ]
    jobs, names = [], []
    for trace, cp_size, page_size, cp_mode, cp_min_tokens in configs:
        names.append(trace)
        deploy = make_deploy(cp_size, page_size, cp_mode).model_copy(
            update={"cp_min_tokens": cp_min_tokens}
        )
        levels = levels_of(ALL)
        if trace == "interleave":
            # NOTE: levels 0-3 of round-robin run in the mixed cases above.
            batches, levels = interleave_trace(cp_size, page_size, 3), (4, 5)
        else:
            batches = load_trace(DATA / f"{trace}.jsonl", page_size).batches
        num_pages = pages_for_trace(batches, page_size, cp_size)
        jobs.append(RankJob(TINY, deploy, batches, levels, num_pages))
    for name, job, runs in zip(names, jobs, run_jobs_on_gloo(jobs), strict=True):
        reference = run_reference(TINY, job, [s.scheduled for s in runs[0].steps])
        assert len(runs) == len(job.levels)
        for run in runs:
            for ref, got in zip(reference, run.outputs, strict=True):
                cmp = compare_batch(ref, got)
                assert cmp.topk_equal and cmp.max_abs_diff == 0.0, (job.deploy, cmp)
        if name in ("long", "interleave"):
            assert 5 in {s.decision.phase for s in runs[-1].steps}, job.deploy
        if job.deploy.cp_min_tokens:
            unsplit = {s.decision.cp_off is not None for s in runs[-1].steps}
            assert unsplit == {True, False}, job.deploy
