"""Start-up refusals as a server process meets them: :func:`refusal_rank` loads plugins and
publishes like ``run_scheduler_process`` after breaking one thing (:data:`SCENARIOS`), and
reports where the start stopped and with what."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from cpkv_core.dist import Communicator
from cpkv_sglang.cpu.batches import BatchShape, forward_batch, token_ids
from cpkv_sglang.cpu.ranks import PRELOAD, tail_settings
from cpkv_sglang.cpu.server import publish_rank
from cpkv_sglang.cpu.standins import install_cuda_stream_standin

__all__ = ["SCENARIOS", "RefusalReport", "refusal_rank", "run_scenario"]

SCENARIOS = {
    "none": "nothing broken: the server starts",
    "wrong-version": "the plugin is pinned to another SGLang version than the installed one",
    "unresolved-target": "a hook target that does not exist in the wheel",
    "unlanded-wrapper": "eager_runner's binding of cp_gather_after_forward is the original "
    "again after apply_hooks (a stale from-import)",
    "no-publish-hook": "the start-up hook did not land: the first gate call checks instead",
    "bad-settings": "CPKV_SHADOW_RATE=2 and phase 4 on (it runs on cpkv's engine only)",
}
"""What each scenario breaks."""


@dataclass(frozen=True, slots=True)
class RefusalReport:
    """Where a start stopped."""

    stage: str
    """``load_plugins``, ``publish``, ``first gate call`` or ``started``."""
    error: str
    """The exception's type (empty when started)."""
    message: str


def _break_before(scenario: str) -> None:
    from cpkv_sglang import plugin, targets

    if scenario == "wrong-version":
        plugin.PINNED = "0.5.22"
    if scenario == "unresolved-target":
        gone = targets.Hook(
            "sglang.srt.layers.cp.utils.cp_gather_all_hidden_states",
            "AROUND",
            "cpkv_sglang.tail:around_gather_after_forward",
            "sglang/srt/layers/cp/utils.py",
            targets.HookGroup.TAIL,
            "a target 0.5.23 does not have",
        )
        targets.HOOKS = (*targets.HOOKS, gone)


def _break_after(scenario: str) -> None:
    from sglang.srt import runtime_context
    from sglang.srt.layers.cp import utils as cp_utils
    from sglang.srt.model_executor.runner import eager_runner

    if scenario == "unlanded-wrapper":
        eager_runner.cp_gather_after_forward = cp_utils.cp_gather_after_forward.__wrapped__
    if scenario == "no-publish-hook":
        runtime_context.publish = runtime_context.publish.__wrapped__


def refusal_rank(comm: Communicator, scenario: str) -> RefusalReport:
    """Loads plugins and publishes with ``scenario`` broken (phase 1 on), then decides one
    CP batch; reports where it stopped. Its files live in a folder removed on return."""
    with tempfile.TemporaryDirectory(prefix="cpkv-sglang-rank-") as scratch:
        return _start(comm, scenario, Path(scratch))


def _start(comm: Communicator, scenario: str, scratch: Path) -> RefusalReport:
    install_cuda_stream_standin()
    logging.getLogger("cpkv_sglang").setLevel(logging.INFO)
    settings = [("CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT", "1")]
    if scenario == "bad-settings":
        settings += [
            ("CPKV_SHADOW_RATE", "2"),
            ("CPKV_ENABLE_NSA_PREFILL_CP_SHARED_KV", "1"),
            ("CPKV_ENABLE_NSA_PREFILL_CP_PAGE_ALIGNED_SPLIT", "1"),
        ]
    tail_settings(tuple(settings), scratch)
    _break_before(scenario)
    stage = "load_plugins"
    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
        _break_after(scenario)
        stage = "publish"
        publish_rank(comm, "interleave", scratch)
        stage = "first gate call"
        from sglang.srt.layers.cp import utils as cp_utils

        shape = BatchShape((5 * comm.world_size,), (0,))
        cp_utils.is_cp_active(forward_batch(shape, token_ids(shape, 96, 0)))
    except BaseException as exc:  # NOTE: SystemExit too: that is what must escape SGLang
        return RefusalReport(stage, type(exc).__name__, str(exc))
    return RefusalReport("started", "", "")


def run_scenario(scenario: str, cp_size: int = 1) -> RefusalReport:
    """Runs ``scenario`` on ``cp_size`` fresh rank processes; rank 0's report."""
    from cpkv_core.dist import spawn_group

    torch.set_num_threads(1)
    reports = spawn_group(cp_size, refusal_rank, (scenario,), timeout_s=300.0, preload=PRELOAD)
    return reports[0]
