"""Phase 2/3 mechanics: shards partition the replicated pool, views equal replicated reads,
the run steps have no data-dependent shapes, debug checks fire, and real gloo ranks agree."""

from __future__ import annotations

import pytest
import torch

from cpkv.runner import Backend, RankJob, run_jobs_on_gloo, run_reference
from cpkv.verify import verify_levels
from cpkv_core.config import CpMode, DeploymentConfig, model_preset
from cpkv_core.dist.comm import Communicator
from cpkv_core.dist.local_group import LocalGroup, run_local
from cpkv_core.planning.allocation import pages_for_trace
from cpkv_core.planning.execution import ExecutionPlan, KvLayout, KvReadStrategy
from cpkv_core.planning.ownership import owner_of_page, physical_loc
from cpkv_core.runtime.engine import CPEngine
from cpkv_core.runtime.kv_access import key_source, materialize, write_current
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool
from cpkv_core.runtime.layout import KeySource, ReadPlan, WritePlan, build_read_plan
from cpkv_core.runtime.outputs import compare_batch
from cpkv_core.traces.trace import load_trace
from phases.gate import level_plans, levels_of
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy, mixed_trace

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)


def run_engines(deploy: DeploymentConfig, level: int, debug_checks: bool = False) -> list[CPEngine]:
    """Runs the mixed trace at ``level`` on the in-process group; returns every rank's engine."""
    batches = mixed_trace(deploy.page_size).batches
    plans = [p.plan for p in level_plans(level, ALL, deploy, batches)]
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)

    def body(comm: Communicator) -> CPEngine:
        engine = CPEngine(
            TINY, deploy, comm, num_pages, plans[0].kv_layout, debug_checks=debug_checks
        )
        for batch, plan in zip(batches, plans, strict=True):
            engine.run_batch(batch, plan)
        return engine

    return run_local(deploy.cp_size, body)


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
    replicated = run_engines(deploy, level=0)
    sharded = run_engines(deploy, level=2)
    in_use = replicated[0].allocator.pages_in_use
    assert in_use == sharded[0].allocator.pages_in_use
    for page in sorted(in_use):
        owner = owner_of_page(page, cp_size)
        for layer in range(TINY.num_layers):
            want = page_bytes(replicated[0].pool, layer, page * page_size)
            got = page_bytes(
                sharded[owner].pool, layer, physical_loc(page * page_size, page_size, cp_size)
            )
            assert got == want, (page, owner, layer)
    stored = [engine.stored_pages() for engine in sharded]
    assert sum(stored) == len(in_use)
    assert sharded[0].pool.num_pages * cp_size < replicated[0].pool.num_pages + cp_size


@pytest.mark.parametrize(
    "strategy", [KvReadStrategy.MATERIALIZED_SLOT, KvReadStrategy.MATERIALIZED_UNIQUE]
)
def test_materialized_view_equals_the_replicated_view(strategy: KvReadStrategy) -> None:
    deploy = make_deploy(3, 4)
    replicated = run_engines(deploy, level=0)
    sharded = run_engines(deploy, level=2)
    batch = mixed_trace(4).batches[2]  # continuations and a prefix hit: history on every request
    allocator = sharded[0].allocator

    def body(comm: Communicator) -> list[KVRows]:
        plan, key_rows = build_read_plan(strategy, batch, allocator, comm.rank, 3)
        assert plan.send_rows is not None
        view = materialize(comm, sharded[comm.rank].pool.layers[1], plan.send_rows)
        return [view.select(torch.tensor(rows)) for rows in key_rows]

    views = run_local(3, body)
    for req_index, req in enumerate(batch.requests):
        want = replicated[0].pool.read(1, torch.tensor(allocator.req_to_token(req.rid)))
        for rank_views in views:
            got = rank_views[req_index]
            assert torch.equal(got.latent, want.latent)
            assert torch.equal(got.index_k.view(torch.uint8), want.index_k.view(torch.uint8))
            assert torch.equal(got.index_k_scale, want.index_k_scale)


def test_unique_remap_moves_fewer_bytes_with_shared_prefixes() -> None:
    deploy = make_deploy(2, 4)
    batch = mixed_trace(4).batches[2]
    engine = run_engines(deploy, level=2)[0]
    slot, _ = build_read_plan(KvReadStrategy.MATERIALIZED_SLOT, batch, engine.allocator, 0, 2)
    unique, _ = build_read_plan(KvReadStrategy.MATERIALIZED_UNIQUE, batch, engine.allocator, 0, 2)
    assert slot.view is not None and unique.view is not None
    assert unique.view.view_tokens < slot.view.view_tokens


def test_hot_path_runs_on_the_meta_device() -> None:
    """No .item(), .tolist(), nonzero, boolean masks or unique: meta tensors have no values."""
    meta = torch.device("meta")
    pool = PagedKVPool(
        TINY, num_pages=8, page_size=4, dtype=make_deploy().index_k_dtype, device=meta
    )
    current = KVRows(
        torch.empty(10, TINY.kv_dim, device=meta),
        torch.empty(10, TINY.index_head_dim, device=meta, dtype=torch.float8_e4m3fn),
        torch.empty(10, device=meta),
    )
    index = torch.arange(5, device=meta)
    write_current(pool, 0, WritePlan(index, index + 3, index), current)  # owner-filtered write
    comm = LocalGroup(1).communicators()[0]
    send_rows = torch.arange(12, device=meta)
    view = materialize(comm, pool.layers[0], send_rows)
    assert view.latent.shape == (12, TINY.kv_dim) and view.latent.device == meta
    keys = key_source(comm, pool, 0, ReadPlan(KeySource.VIEW, None, send_rows), current)
    assert keys.select(index).latent.shape == (5, TINY.kv_dim)  # slot or unique remap's read
    reused = key_source(comm, pool, 0, ReadPlan(KeySource.CURRENT), current)
    assert reused.select(index).index_k.shape == (5, TINY.index_head_dim)  # reuse remap


def test_debug_checks_pass_on_a_correct_run() -> None:
    engines = run_engines(make_deploy(3, 4, CpMode.ROUND_ROBIN_SPLIT), level=3, debug_checks=True)
    assert len(engines[0].written_pages) > 0


def test_debug_checks_pass_with_compute_owner_writes() -> None:
    deploy = make_deploy(2, 4)
    batches = load_trace(DATA / "long.jsonl", 4).batches
    levels = {5: level_plans(5, ALL, deploy, batches)}
    assert 5 in {p.phase for p in levels[5]}
    report = verify_levels(TINY, deploy, batches, levels, Backend.LOCAL, debug_checks=True)
    assert report.ok


def test_debug_checks_catch_a_write_to_a_foreign_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from cpkv_core.runtime import layout as layout_mod

    original = layout_mod.build_write_plan

    def write_everything(strategy, current_locs, local, rank, cp_size, page_size):  # type: ignore[no-untyped-def]
        plan = original(strategy, current_locs, local, rank, cp_size, page_size)
        every = torch.arange(len(current_locs))
        return WritePlan(
            every, plan.dest_rows.new_zeros(len(current_locs)), torch.tensor(current_locs)
        )

    monkeypatch.setattr(layout_mod, "build_write_plan", write_everything)
    with pytest.raises(RuntimeError, match="does not own"):
        run_engines(make_deploy(2, 4), level=2, debug_checks=True)


def test_engine_refuses_a_plan_for_another_layout() -> None:
    deploy = make_deploy(1, 4)
    engine = CPEngine(TINY, deploy, LocalGroup(1).communicators()[0], 16, KvLayout.SHARDED)
    with pytest.raises(RuntimeError, match="KV at rest"):
        engine.prepare(mixed_trace(4).batches[0], ExecutionPlan.baseline(CpMode.IN_SEQ_SPLIT))


@pytest.mark.gloo
def test_every_level_matches_reference_on_real_gloo_ranks() -> None:
    """One 4-rank spawn, smaller CP sizes on subgroups: both splits, three page sizes, and
    long requests that take phases 4 and 5."""
    configs = [
        ("mixed", 4, 16, CpMode.IN_SEQ_SPLIT),
        ("mixed", 4, 4, CpMode.ROUND_ROBIN_SPLIT),
        ("mixed", 3, 1, CpMode.ROUND_ROBIN_SPLIT),
        ("long", 4, 16, CpMode.IN_SEQ_SPLIT),
        ("long", 2, 4, CpMode.IN_SEQ_SPLIT),
    ]
    jobs = []
    for trace, cp_size, page_size, cp_mode in configs:
        deploy = make_deploy(cp_size, page_size, cp_mode)
        batches = load_trace(DATA / f"{trace}.jsonl", page_size).batches
        plans = tuple(
            tuple(p.plan for p in level_plans(lv, ALL, deploy, batches)) for lv in levels_of(ALL)
        )
        num_pages = pages_for_trace(batches, page_size, cp_size)
        jobs.append(RankJob(TINY, deploy, batches, plans, num_pages))
    for job, runs in zip(jobs, run_jobs_on_gloo(jobs), strict=True):
        reference = run_reference(job)
        assert len(runs) == len(levels_of(ALL))
        for run in runs:
            for ref, got in zip(reference, run.outputs, strict=True):
                cmp = compare_batch(ref, got)
                assert cmp.topk_equal and cmp.max_abs_diff == 0.0, (job.deploy, cmp)
