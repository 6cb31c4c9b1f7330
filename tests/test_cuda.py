"""The run step on CUDA: equal to the reference, no host sync, replayable in a CUDA graph.

These tests skip on a machine without CUDA (this project's CI); run them where one is lent.
"""

from __future__ import annotations

import pytest
import torch

from cpkv.run.jobs import Backend
from cpkv.run.loop import HostLoop
from cpkv.run.verify import verify_levels
from cpkv_core.config import MaterializeMode, model_preset
from cpkv_core.dist import Communicator, LocalGroup, run_local
from cpkv_core.planning import (
    BatchSpec,
    ExecutionPlan,
    KvLayout,
    OwnerPolicy,
    RequestSpec,
    Scheduler,
    pages_for_trace,
)
from cpkv_core.runtime import CPEngine, expand, init_weights, upload
from cpkv_core.traces import load_trace
from phases import level_enabled, levels_of
from phases.registry import REGISTERED_PHASES
from tests.conftest import DATA, make_deploy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)
CUDA = torch.device("cuda")


@pytest.mark.parametrize(("trace", "cp_size", "page_size"), [("mixed", 2, 4), ("long", 4, 16)])
def test_every_level_equals_the_reference_on_cuda(trace: str, cp_size: int, page_size: int) -> None:
    deploy = make_deploy(cp_size, page_size)
    batches = load_trace(DATA / f"{trace}.jsonl", page_size).batches
    report = verify_levels(TINY, deploy, batches, levels_of(ALL), ALL, Backend.LOCAL, device="cuda")
    assert report.ok, [(lv.level, lv.max_abs_diff) for lv in report.levels]


@pytest.mark.parametrize(
    ("materialize", "prefetch"),
    [
        (MaterializeMode.PEER_READ, False),
        (MaterializeMode.GATHER, True),
        (MaterializeMode.PEER_READ, True),
    ],
)
def test_peer_read_and_prefetch_equal_the_reference_on_cuda(
    materialize: MaterializeMode, prefetch: bool
) -> None:
    """In-process ranks share pools by reference; prefetch fetches on a side stream."""
    deploy = make_deploy(4, 16).model_copy(
        update={"materialize": materialize, "materialize_prefetch": prefetch}
    )
    batches = load_trace(DATA / "long.jsonl", 16).batches
    report = verify_levels(TINY, deploy, batches, levels_of(ALL), ALL, Backend.LOCAL, device="cuda")
    assert report.ok, [(lv.level, lv.max_abs_diff) for lv in report.levels]


def _two_batches() -> list[BatchSpec]:
    return [
        BatchSpec(0, (RequestSpec("a", 0, 40), RequestSpec("b", 0, 24))),
        BatchSpec(1, (RequestSpec("c", 0, 40), RequestSpec("d", 0, 24))),
    ]


@pytest.mark.parametrize(
    ("level", "materialize", "prefetch"),
    [
        *((level, MaterializeMode.GATHER, False) for level in range(6)),
        (2, MaterializeMode.PEER_READ, False),
        (2, MaterializeMode.GATHER, True),
        (5, MaterializeMode.PEER_READ, True),
    ],
)
def test_run_step_makes_no_host_sync(
    level: int, materialize: MaterializeMode, prefetch: bool
) -> None:
    """Under ``set_sync_debug_mode("error")`` any op that waits for the device raises; the
    batch's undo copy of the rows it writes, and writing it back, are checked too. Peer-read's
    batch-start drain is a sync by design and lives outside the run step, so it is not run:
    in-process ranks share the device's stream, which orders the history reads anyway."""
    deploy = make_deploy(2, 4).model_copy(
        update={"materialize": materialize, "materialize_prefetch": prefetch}
    )
    batches = _two_batches()
    loop = HostLoop(deploy, level_enabled(level, ALL), pages_for_trace(batches, 4, 2))
    steps = [loop.step(b) for b in batches]

    def body(comm: Communicator) -> int:
        # NOTE: the sync debug mode is per process and the local ranks are threads, so it is
        # switched on once every rank has built its engine (weights are copied in with syncs)
        # and off once every rank is done.
        engine = CPEngine(TINY, deploy, comm, 64, steps[0].decision.plan.kv_layout, device=CUDA)
        torch.cuda.synchronize()
        comm.barrier()
        if comm.rank == 0:
            torch.cuda.set_sync_debug_mode("error")
        comm.barrier()
        try:
            for step in steps:
                host = engine.host_plan(step.scheduled, step.decision.plan)
                packed = upload(host, CUDA)
                tensors = expand(host, packed, TINY.vocab_size)
                saved = engine.pool.save_rows(tensors.write_dest)  # a batch's undo copy
                engine.run_step(host, tensors)
                engine.pool.restore_rows(saved)  # the failure path writes it back
        finally:
            comm.barrier()
            if comm.rank == 0:
                torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        return len(steps)

    assert run_local(2, body) == [2, 2]


def test_the_sync_debug_mode_catches_a_host_read() -> None:
    """The guard above can fail: a host read of a device value raises under it."""
    value = torch.ones(4, device=CUDA)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchronizing"):
            value.sum().item()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_run_step_replays_in_a_cuda_graph_for_a_second_batch() -> None:
    """Captured on batch 0, replayed with batch 1's tables copied in: equal to eager."""
    deploy = make_deploy(1, 4)
    plan = ExecutionPlan.baseline(deploy.cp_mode)
    scheduler = Scheduler(64, 4, 1)
    first, second = (scheduler.schedule(b, OwnerPolicy.DEALT) for b in _two_batches())
    weights = init_weights(TINY, CUDA)
    comm = LocalGroup(1).communicators()[0]
    graphed = CPEngine(TINY, deploy, comm, 64, KvLayout.REPLICATED, weights, device=CUDA)
    eager = CPEngine(TINY, deploy, comm, 64, KvLayout.REPLICATED, weights, device=CUDA)
    host_first = graphed.host_plan(first, plan)
    host_second = graphed.host_plan(second, plan)
    assert host_first.fields == host_second.fields  # same shapes: one graph serves both
    static = upload(host_first, CUDA)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            graphed.run_step(host_first, expand(host_first, static, TINY.vocab_size))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = graphed.run_step(host_first, expand(host_first, static, TINY.vocab_size))
        static.copy_(upload(host_second, CUDA))
        graph.replay()
        eager.run_batch(first, plan)
        want = eager.run_batch(second, plan)
    torch.cuda.synchronize()
    assert torch.equal(out.logits, want.logits)
    assert torch.equal(out.topk, want.topk)
