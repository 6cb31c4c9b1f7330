"""Shared factories for the cpkv tests."""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cpkv.commands.shared import RANK_MODULES
from cpkv_core.config import CpMode, DeploymentConfig, IndexKDtype, SplitGate, model_preset
from cpkv_core.dist import forked_ranks
from cpkv_core.pd.transport import LOG_DIR_ENV
from cpkv_core.planning import BatchSpec, RequestSpec
from cpkv_core.traces.trace import Trace, load_trace

DATA = Path(__file__).parent / "data"
MIXED_TRACE = DATA / "mixed.jsonl"
"""Chunked prefill resuming mid-page, prefix hits, requests shorter than 2*cp_size,
single-token extends, and a one-token batch that leaves most ranks empty."""


@pytest.fixture(scope="session", autouse=True)
def transfer_logs_in_pytests_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every transfer engine's native log goes to this session's pytest temp folder (kept
    for the last three runs), not one ``cpkv-transfer-<pid>.log`` per process into the
    system temp folder. Set before any test starts a rank server, whose ranks inherit it."""
    if LOG_DIR_ENV in os.environ:
        yield
        return
    os.environ[LOG_DIR_ENV] = str(tmp_path_factory.mktemp("transfer-logs"))
    yield
    del os.environ[LOG_DIR_ENV]


def make_deploy(
    cp_size: int = 2,
    page_size: int = 4,
    cp_mode: CpMode = CpMode.IN_SEQ_SPLIT,
    index_k_dtype: IndexKDtype = IndexKDtype.FP8_E4M3,
    split_gate: SplitGate = SplitGate.SGLANG,
) -> DeploymentConfig:
    """A deployment with test-sized defaults. Tests about the split itself (short requests,
    empty ranks, the bytes of a split) pass ``SplitGate.SPLIT_ANYWAY``: under SGLang's gate,
    the default, such batches run unsplit."""
    return DeploymentConfig(
        cp_size=cp_size,
        cp_mode=cp_mode,
        page_size=page_size,
        index_k_dtype=index_k_dtype,
        split_gate=split_gate,
    )


def mixed_trace(page_size: int) -> Trace:
    """The mixed test trace, validated for ``page_size``."""
    return load_trace(MIXED_TRACE, page_size)


@pytest.fixture
def mixed_trace_path() -> Path:
    return MIXED_TRACE


@pytest.fixture
def forked() -> Iterator[None]:
    """The test's ranks and decode processes fork from the rank server the CLI's commands
    use (``RANK_MODULES``): one import of torch a worker, where a spawn imports it a rank
    (seconds each, on 2 cores next to the other worker)."""
    with forked_ranks(RANK_MODULES):
        yield


def tiny_row_bytes(dtype: IndexKDtype) -> int:
    """One token row of every layer, from the model's widths: fp32 latent, index K (1 byte
    in fp8, 4 in fp32), fp32 scale."""
    tiny = model_preset("tiny")
    index_itemsize = 1 if dtype is IndexKDtype.FP8_E4M3 else 4
    per_layer = (
        4 * (tiny.kv_lora_rank + tiny.qk_rope_head_dim) + tiny.index_head_dim * index_itemsize
    )
    return (per_layer + 4) * tiny.num_layers


class CreatesFile:
    """Unpickling this calls ``open(path, "w")``: the file appearing means a payload ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def code_running_payloads(path: Path) -> dict[str, bytes]:
    """Bytes that create ``path`` when the old loader read them: a pickle, and a
    ``torch.save`` archive (``torch.load(weights_only=False)`` runs it)."""
    archive = io.BytesIO()
    torch.save(CreatesFile(path), archive)
    return {"pickle": pickle.dumps(CreatesFile(path)), "torch.save": archive.getvalue()}


def load_unsafely(how: str, payload: bytes) -> None:
    """What the launcher did before typed frames; proves a payload really runs code."""
    loaded = (
        pickle.loads(payload)
        if how == "pickle"
        else torch.load(io.BytesIO(payload), weights_only=False)
    )
    loaded.close()


def interleave_trace(cp_size: int, page_size: int, pages_per_rank: int) -> tuple[BatchSpec, ...]:
    """Four batches sized in units of ``cp_size`` pages, for the page-interleaved split:
    ``a`` ends mid-page and resumes there twice, ``c`` hits ``b``'s first pages, and batch 2
    has three tokens (idle ranks: the split falls back)."""
    unit = cp_size * page_size
    a0, a1 = pages_per_rank * unit + page_size // 2 + 1, pages_per_rank * unit + 1
    return (
        BatchSpec(0, (RequestSpec("a", 0, a0), RequestSpec("b", 0, unit + 1))),
        BatchSpec(1, (RequestSpec("a", a0, a1), RequestSpec("c", unit, unit + 3, "b"))),
        BatchSpec(2, (RequestSpec("a", a0 + a1, 2), RequestSpec("d", 0, 1))),
        BatchSpec(
            3,
            (RequestSpec("d", 1, pages_per_rank * unit), RequestSpec("a", a0 + a1 + 2, unit + 2)),
        ),
    )
