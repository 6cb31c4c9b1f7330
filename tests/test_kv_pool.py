"""The pool's row copy: every byte pattern lands unchanged whatever words it moves in, and a
write that takes every row of its source in order plans no gather of them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cpkv.bench.measure import ALL_PHASES
from cpkv.run.loop import HostLoop
from cpkv_core.config import CpMode
from cpkv_core.planning import (
    BatchSpec,
    ExecutionPlan,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    RequestSpec,
    ScheduledBatch,
    build_host_plan,
    pages_for_trace,
)
from cpkv_core.runtime import expand, upload
from cpkv_core.runtime.kv_pool import LatentStorage, copy_rows_
from tests.conftest import make_deploy


@pytest.mark.parametrize(
    ("dtype", "width"),
    [
        (torch.bfloat16, 576),
        (torch.uint8, 656),
        (torch.float8_e4m3fn, 128),
        (torch.float32, 48),
        (torch.float32, 1),
        (torch.uint8, 3),
    ],
)
def test_row_copy_is_bitwise_for_every_byte_pattern(dtype: torch.dtype, width: int) -> None:
    """Random bytes (NaN and signalling-NaN patterns among them) land unchanged."""
    gen = torch.Generator().manual_seed(width)
    shape = (40, width) if width > 1 else (40,)
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    raw = torch.randint(0, 256, (2, nbytes), generator=gen, dtype=torch.uint8)
    dest = raw[0].view(dtype).view(shape).clone()
    rows = raw[1].view(dtype).view(shape)[:10]
    index = torch.tensor([3, 7, 0, 39, 20, 21, 22, 5, 6, 38])
    expected = dest.view(torch.uint8).clone().view(40, -1)
    expected[index] = rows.view(torch.uint8).reshape(10, -1)
    copy_rows_(dest, index, rows)
    assert torch.equal(dest.view(torch.uint8).view(40, -1), expected)


@pytest.mark.parametrize(
    "pattern",
    [0x7FF0_0000_0000_0001, 0xFFF8_0000_0000_0000 - (1 << 64), 0x7FF7_FFFF_FFFF_FFFF, -1],
    ids=["snan", "negative-qnan", "snan-max-payload", "all-ones"],
)
def test_row_copy_keeps_nan_words_as_they_are(pattern: int) -> None:
    """Rows of 16-byte words copy as pairs of doubles: signalling and quiet NaN doubles,
    every payload bit set or not, land unchanged (no arithmetic quiets them)."""
    dest = torch.zeros(8, 576, dtype=torch.bfloat16)
    rows = torch.full((3, 144), pattern, dtype=torch.int64).view(torch.bfloat16)
    copy_rows_(dest, torch.tensor([6, 1, 4]), rows)
    assert torch.equal(dest.view(torch.int64)[[6, 1, 4]], rows.view(torch.int64))
    assert not dest.view(torch.int64)[[0, 2, 3, 5, 7]].any()


def test_latent_storage_counts_its_row_bytes() -> None:
    assert LatentStorage(torch.uint8, 656).row_bytes == 656
    assert LatentStorage(torch.bfloat16, 576).row_bytes == 1152


def _scheduled() -> tuple[ScheduledBatch, ExecutionPlan]:
    deploy = make_deploy(cp_size=2, page_size=4)
    first = BatchSpec(0, (RequestSpec("a", 0, 32),))
    second = BatchSpec(1, (RequestSpec("a", 32, 32),))
    loop = HostLoop(deploy, ALL_PHASES, pages_for_trace([first, second], 4, 2))
    loop.step(first)
    step = loop.step(second)
    return step.scheduled, step.decision.plan


@pytest.mark.parametrize(
    ("write", "in_order"),
    [
        (KvWriteStrategy.COMPUTE_OWNER_DIRECT, True),
        (KvWriteStrategy.REPLICATED, True),
        (KvWriteStrategy.OWNER_FILTERED, False),
    ],
)
def test_a_write_of_every_source_row_in_order_plans_no_gather(
    write: KvWriteStrategy, in_order: bool
) -> None:
    scheduled, direct = _scheduled()
    assert direct.kv_write is KvWriteStrategy.COMPUTE_OWNER_DIRECT
    plan = direct
    if write is not KvWriteStrategy.COMPUTE_OWNER_DIRECT:
        read = (
            KvReadStrategy.LOCAL_POOL
            if write is KvWriteStrategy.REPLICATED
            else KvReadStrategy.MATERIALIZED_SLOT
        )
        base = ExecutionPlan.baseline(CpMode.IN_SEQ_SPLIT)
        plan = dataclasses.replace(
            base, kv_write=write, kv_read=read, output=OutputStrategy.NARROW_LAST_TOKEN
        )
    host = build_host_plan(scheduled, plan, 0)
    tensors = expand(host, upload(host, torch.device("cpu")), 256)
    assert (tensors.write_source is None) == in_order
    rows = tensors.write_source_rows()
    assert len(rows) == host.num_written
    if in_order:
        assert torch.equal(rows, torch.arange(host.num_written))
