"""The jobs the SGLang plugin tests share, each run once per test process (``reports``).

A job runs its batches on real CPU rank processes (``cpkv_sglang.cpu``: a gloo group stands
in for SGLang's attention-CP group; every rank forked from one server that imported SGLang
once). A stock job loads no plugin; a plugin job calls SGLang's ``load_plugins()``, which
finds cpkv through its entry point.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import random
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch


def require_sglang() -> None:
    """Skips the calling test module where SGLang's CP path is not installed; under
    ``CI=true`` that is an error instead."""
    if importlib.util.find_spec("sglang") is not None:
        return
    if os.environ.get("CI") == "true":
        raise RuntimeError("sglang is not installed: scripts/setup.sh installs its CP path")
    pytest.skip("sglang is not installed (run scripts/setup.sh)", allow_module_level=True)


require_sglang()

from cpkv_sglang.cpu.batches import BatchShape  # noqa: E402
from cpkv_sglang.cpu.ranks import TailJob, TailReport, run_ranks  # noqa: E402

NARROW = (("CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT", "1"),)
"""Phase 1 on, as a server's environment holds it."""

MUST_SHOW = BatchShape((37, 20, 64, 19, 100, 17, 33, 16), (0,) * 8)
"""cp 4, bs 8: 306 tokens."""


def random_batches(seed: int, count: int, min_len: int) -> tuple[BatchShape, ...]:
    """Ragged batches of 1-8 requests of ``min_len``-90 tokens, some with a cached prefix."""
    draw = random.Random(seed)
    shapes = []
    for _ in range(count):
        bs = draw.randint(1, 8)
        extend = tuple(draw.randint(min_len, 90) for _ in range(bs))
        prefix = tuple(draw.choice((0, 0, 64, 128)) for _ in range(bs))
        shapes.append(BatchShape(extend, prefix))
    return tuple(shapes)


FALLBACKS = (
    BatchShape((30, 40), (0, 0), return_logprob=True),
    BatchShape((30, 40), (0, 64), capture="FULL"),
    BatchShape((30, 40), (0, 0), spec="EAGLE"),
    BatchShape((30, 40), (0, 0), bcg=True),
)
"""Batches phase 1 leaves to the stock gather: logprobs, full capture, EAGLE, BCG."""

SHORT = (BatchShape((3,), (0,)), BatchShape((40, 5), (0, 0)))
"""Batches SGLang runs unsplit at cp 4: 3 tokens (< cp), and a request of 5 (< 2 x cp)."""

JOBS: dict[str, tuple[str, int, tuple[BatchShape, ...]]] = {
    "interleave-4": ("interleave", 4, (MUST_SHOW, *random_batches(1, 3, 1), *FALLBACKS, *SHORT)),
    "zigzag-4": ("zigzag", 4, (MUST_SHOW, *random_batches(2, 3, 8), *FALLBACKS, *SHORT)),
    "interleave-2": ("interleave", 2, random_batches(3, 4, 1)),
    "zigzag-3": ("zigzag", 3, random_batches(4, 4, 5)),
}
"""Strategy, cp size and batches of each job (run stock and with the plugin)."""

INNER_GATHER = frozenset({"interleave-2", "zigzag-3"})
"""Jobs whose model body gathers through ``cp_gather_after_forward`` too, before the tail."""


DECISION_LOGS = Path(tempfile.mkdtemp(prefix="cpkv-decision-logs-"))
"""Where each plugin job's ranks keep their decision logs (``CPKV_DECISION_LOG``); removed
when the test process exits."""
atexit.register(shutil.rmtree, DECISION_LOGS, ignore_errors=True)


def decision_log(name: str, rank: int) -> Path:
    """The decision log rank ``rank`` of plugin job ``name`` wrote."""
    return DECISION_LOGS / f"{name}-{rank}.jsonl"


@cache
def reports(
    name: str,
    plugin: bool,
    settings: tuple[tuple[str, str], ...] = NARROW,
    corrupt_batch: int = -1,
) -> list[TailReport]:
    """Every rank's report of job ``name``, stock or with the plugin and ``settings``."""
    strategy, cp_size, batches = JOBS[name]
    if plugin and settings == NARROW and corrupt_batch < 0:
        log = ("CPKV_DECISION_LOG", str(DECISION_LOGS / f"{name}-{{rank}}.jsonl"))
        settings = (*settings, log)
    job = TailJob(
        strategy,
        batches,
        plugin=plugin,
        settings=settings if plugin else (),
        inner_gather=name in INNER_GATHER,
        corrupt_batch=corrupt_batch,
    )
    return run_ranks(cp_size, job)


def decisions(report: TailReport) -> list[dict[str, Any]]:
    """The plugin's decision record of each batch."""
    return [json.loads(result.decision) for result in report.results]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
