"""Phase 1: narrow output equals the full gather's last-token rows, and moves exactly
``cp_size x bs x hidden`` at the tail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpkv.run.jobs import Backend
from cpkv.run.verify import verify_levels
from cpkv_core.config import CpMode, SplitGate, model_preset
from cpkv_core.dist import Communicator, run_local
from cpkv_core.planning import (
    BatchSpec,
    KvReadStrategy,
    KvWriteStrategy,
    OwnerPolicy,
    RequestSpec,
    Scheduler,
    SplitStrategy,
    build_host_plan,
    pages_for_trace,
)
from cpkv_core.planning.execution import ExecutionPlan, OutputStrategy
from cpkv_core.planning.sglang_cp import gather_rows_per_rank
from cpkv_core.planning.split import build_split
from cpkv_core.runtime import expand, upload
from cpkv_core.runtime.collect import collect_narrow_last_token
from cpkv_core.traces.trace import load_trace
from phases.ids import PhaseId
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
NARROW = frozenset({PhaseId.NARROW_OUTPUT})


@pytest.mark.parametrize("cp_mode", list(CpMode))
@pytest.mark.parametrize("cp_size", [1, 2, 3, 4])
def test_narrow_output_matches_reference_and_counts_tail_bytes(
    cp_size: int, cp_mode: CpMode
) -> None:
    deploy = make_deploy(cp_size, 4, cp_mode, split_gate=SplitGate.SPLIT_ANYWAY)
    batches = load_trace(DATA / "narrow.jsonl", 4).batches
    report = verify_levels(TINY, deploy, batches, (0, 1), NARROW, Backend.LOCAL)
    assert report.ok
    assert report.levels[1].max_abs_diff == 0.0
    for row, batch in zip(report.levels[1].rows, batches, strict=True):
        hidden_bytes = TINY.hidden_size * 4
        if row.batch_plan.phase == 1:
            assert row.batch_plan.plan.output is OutputStrategy.NARROW_LAST_TOKEN
            expected = cp_size * len(batch.requests) * hidden_bytes
        else:
            max_local = build_split(batch.extend_lens, cp_size, cp_mode).max_local
            split = ExecutionPlan.baseline(cp_mode).split
            expected = cp_size * gather_rows_per_rank(max_local, split, cp_size) * hidden_bytes
        assert row.gathered_bytes_by_tag["tail_hidden"] == expected
    # Batch 1 speculates, batch 2 asks for logprobs and hidden states: both keep the full gather.
    assert [row.batch_plan.phase for row in report.levels[1].rows] == [1, 0, 0, 1]


@pytest.mark.parametrize(
    ("split", "lengths", "cp_size", "local_last"),
    [
        (SplitStrategy.ZIGZAG, (40, 17, 5, 29), 3, [3, 1, 0]),
        (SplitStrategy.ROUND_ROBIN, (40, 17, 5, 29), 3, [2, 1, 1]),
        (SplitStrategy.ZIGZAG, (40, 24), 2, [2, 0]),
    ],
)
def test_narrow_collector_hands_every_rank_each_last_state_bit_for_bit(
    split: SplitStrategy, lengths: tuple[int, ...], cp_size: int, local_last: list[int]
) -> None:
    """Random bf16 bit patterns, NaNs among them: each request's last-token state reaches
    every rank unchanged, whether a rank holds all the last tokens, none or some (``local_last``
    per rank: its contribution is then one select, zeros, or zeros with the rows copied in)."""
    page_size = 4
    batch = BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, n) for i, n in enumerate(lengths)))
    scheduler = Scheduler(pages_for_trace([batch], page_size, cp_size), page_size, cp_size)
    scheduled = scheduler.schedule(batch, OwnerPolicy.COMPUTE_OWNER)
    narrow = OutputStrategy.NARROW_LAST_TOKEN
    plan = ExecutionPlan(split, KvWriteStrategy.REPLICATED, KvReadStrategy.LOCAL_POOL, narrow)
    hosts = [build_host_plan(scheduled, plan, rank) for rank in range(cp_size)]
    assert [host.num_local_last for host in hosts] == local_last
    seeded = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**15), 2**15, (sum(lengths), 64), dtype=torch.int16, generator=seeded)
    assert bits.view(torch.bfloat16).isnan().any()
    last_bits = bits[torch.from_numpy(np.cumsum(lengths) - 1)]

    def body(comm: Communicator) -> torch.Tensor:
        host = hosts[comm.rank]
        tensors = expand(host, upload(host, torch.device("cpu")), TINY.vocab_size)
        hidden = bits.index_select(0, tensors.local_token_indices).view(torch.bfloat16)
        return collect_narrow_last_token(comm, hidden, host, tensors)

    for collected in run_local(cp_size, body):
        assert torch.equal(collected.view(torch.int16), last_bits)
