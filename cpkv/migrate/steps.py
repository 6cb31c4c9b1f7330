"""The rungs of a migration, level 0 up: :data:`LADDER` (steps SGLang 0.5.23 runs) and
:data:`ENGINE_ONLY` (phases only cpkv's engine runs), each with what it adds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpkv.migrate.launch import Edit, EditKind, LaunchCommand
from cpkv.migrate.plugin import plugin_edits

AddsOf = Callable[[LaunchCommand, float, str | None], tuple[Edit, ...]]
"""What a step adds to the previous step's command, given the shadow rate and config file."""


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step SGLang 0.5.23 runs."""

    levels: tuple[int, ...]
    """The cpkv levels the step reaches (``(2, 3)``: SGLang's KV sharding is both)."""
    name: str
    runs_on: str
    plugin: bool
    """The step needs the cpkv plugin loaded."""
    adds: AddsOf
    what: str
    """What the step changes in the server, in one sentence."""


LADDER = (
    StepSpec(
        (0,),
        "replicated KV",
        "SGLang 0.5.23",
        False,
        lambda command, rate, config: (),
        "the baseline: every CP rank stores the whole KV cache",
    ),
    StepSpec(
        (1,),
        "narrow output, under cpkv's gate",
        "SGLang 0.5.23 with the cpkv plugin",
        True,
        plugin_edits,
        "the plugin's gate decides every batch, and phase 1 gathers only each request's "
        "last-token hidden state at the tail (a shadow compares it with the full gather)",
    ),
    StepSpec(
        (2, 3),
        "SGLang's KV sharding",
        "SGLang 0.5.23 with the cpkv plugin",
        True,
        lambda command, rate, config: (Edit(EditKind.SWITCH, "enable_kv_cache_sharding"),),
        "each CP rank stores only the pages it owns (page % cp); a sharded prefill reads the "
        "current chunk from its staged copy (sglang/srt/mem_cache/page_interleave_pool.py), "
        "which is phase 3",
    ),
)
"""The steps SGLang 0.5.23 runs, in order; each builds on the one before."""


@dataclass(frozen=True, slots=True)
class EngineOnly:
    """A phase SGLang 0.5.23 cannot run: listed, never given as a command."""

    level: int
    name: str
    why: str
    where: str
    """Where cpkv runs it."""

    def to_json(self) -> dict[str, Any]:
        """The fields."""
        return {"level": self.level, "name": self.name, "why": self.why, "runs_in": self.where}


TOKEN_INTERLEAVE = (
    "SGLang 0.5.23 deals a chunk's tokens, not its pages, to the CP ranks, and hard-wires that "
    "in about ten functions: cp_interleave_input_ids (sglang/srt/layers/cp/utils.py), "
    "shard_per_request through the CUDA kernel dsa_cp_interleave_q_seqs "
    "(sglang/srt/layers/cp/interleave.py, sglang/kernels/ops/attention/dsa/cp_split.py), the "
    "indexer overlap, the MoE transport (sglang/srt/models/deepseek_common/moe_transport.py) "
    "and the breakable-CUDA-graph inputs (sglang/srt/layers/cp/bcg/interleave_bcg.py); a "
    "plugin hook cannot change the split, only a patch to SGLang can"
)
ENGINE_ONLY = (
    EngineOnly(
        4,
        "page-aligned split",
        TOKEN_INTERLEAVE,
        "cpkv's engine: cpkv verify, cpkv explain and cpkv pd with --phases 4 or all",
    ),
    EngineOnly(
        5,
        "compute-owner direct write",
        "it needs phase 4's one compute owner per page, which SGLang 0.5.23 cannot give "
        "(the reason above)",
        "cpkv's engine: cpkv verify, cpkv explain and cpkv pd with --phases all",
    ),
)
"""cpkv's phases 4 and 5, which no SGLang 0.5.23 command runs."""
