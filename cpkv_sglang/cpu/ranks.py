"""The CPU harness's rank body and its launcher: :func:`run_ranks` runs a :class:`TailJob` on
``cp_size`` rank processes and returns each rank's :class:`TailReport`.

A rank sets cpkv's settings in its environment, and with ``plugin`` calls SGLang's own
``load_plugins()`` (which finds cpkv through its entry point, as every server process
does) before it publishes its ``ServerArgs``; without it, SGLang runs as shipped. Then it
runs the job's batches one after another.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from cpkv_core.dist import Communicator, spawn_group
from cpkv_sglang.cpu.batches import BatchShape
from cpkv_sglang.cpu.forward import BatchResult, run_batch
from cpkv_sglang.cpu.model import TinyCausalLM
from cpkv_sglang.cpu.preload import PRELOAD
from cpkv_sglang.cpu.server import publish_rank
from cpkv_sglang.cpu.standins import install_cuda_stream_standin

__all__ = ["PRELOAD", "TailJob", "TailReport", "run_ranks", "tail_rank", "tail_settings"]


@dataclass(frozen=True, slots=True)
class TailJob:
    """Batches to run on every rank, and how."""

    strategy: str
    """SGLang's ``--cp-strategy``: ``zigzag`` or ``interleave``."""
    batches: tuple[BatchShape, ...]
    plugin: bool = False
    """Load plugins (cpkv's) before publishing; else SGLang as shipped."""
    settings: tuple[tuple[str, str], ...] = ()
    """cpkv's ``CPKV_*`` settings, as a server's environment holds them."""
    hidden: int = 64
    vocab: int = 96
    aux: bool = False
    """The model captures aux hidden states (EAGLE-3 style)."""
    last_pipeline_rank: bool = True
    inner_gather: bool = False
    """The model body gathers through ``cp_gather_after_forward`` too (as DSA's top-k share)."""
    corrupt_batch: int = -1
    """The batch whose first gather is corrupted (-1: none)."""


@dataclass(frozen=True, slots=True)
class TailReport:
    """One rank's view of a job."""

    rank: int
    results: tuple[BatchResult, ...]
    log: tuple[str, ...]
    """Log lines of cpkv's plugin and SGLang's plugin framework, in order."""
    totals: str
    """The plugin's totals line (empty without the plugin)."""


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


def tail_rank(comm: Communicator, job: TailJob) -> TailReport:
    """The rank body (see the module docstring). Its config file and model folder live in a
    folder of its own, removed when the body returns (a rank process skips ``atexit``)."""
    with tempfile.TemporaryDirectory(prefix="cpkv-sglang-rank-") as scratch:
        return _run_job(comm, job, Path(scratch))


def _run_job(comm: Communicator, job: TailJob, scratch: Path) -> TailReport:
    install_cuda_stream_standin()
    lines = _Lines()
    for name in ("cpkv_sglang", "sglang.srt.plugins"):
        logging.getLogger(name).addHandler(lines)
        logging.getLogger(name).setLevel(logging.INFO)
    tail_settings(job.settings, scratch)
    if job.plugin:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    server_args, group = publish_rank(comm, job.strategy, scratch)
    model = TinyCausalLM(
        server_args._model_config.hf_config,
        job.hidden,
        job.vocab,
        aux=job.aux,
        last_pipeline_rank=job.last_pipeline_rank,
        inner_gather=job.inner_gather,
    )
    results = tuple(
        run_batch(model, group, shape, seed, seed == job.corrupt_batch)
        for seed, shape in enumerate(job.batches)
    )
    return TailReport(comm.rank, results, tuple(lines.lines), _totals())


def tail_settings(settings: tuple[tuple[str, str], ...], scratch: Path) -> None:
    """cpkv's settings only from ``settings``: an empty config file in ``scratch``, no other
    ``CPKV_*``."""
    for name in [n for n in os.environ if n.startswith("CPKV_")]:
        del os.environ[name]
    config = scratch / "cpkv.toml"
    config.write_text("")
    os.environ["CPKV_CONFIG"] = str(config)
    os.environ["SGLANG_PLUGINS"] = "cpkv"
    os.environ.update(dict(settings))


def _totals() -> str:
    from cpkv_sglang.runtime import current

    runtime = current()
    return "" if runtime is None else runtime.totals.line()


def run_ranks(cp_size: int, job: TailJob, timeout_s: float = 300.0) -> list[TailReport]:
    """Runs ``job`` on ``cp_size`` CPU ranks (a gloo group; each rank forked from a server
    that imported SGLang once) and returns every rank's report."""
    torch.set_num_threads(1)
    return spawn_group(cp_size, tail_rank, (job,), timeout_s=timeout_s, preload=PRELOAD)
