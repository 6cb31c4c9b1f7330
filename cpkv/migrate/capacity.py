"""Tokens a step's server caches, from the capacity planner: :func:`step_capacity`.

The command is read for the plan as ``cpkv plan --from-sglang`` reads it
(``cpkv.plan.sglang.read_sglang_plan``), at the GPU size given; level 0 and 1 store
replicated KV, SGLang's KV sharding (levels 2-3) stores a page on its owner only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cpkv.plan.capacity import plan_capacity
from cpkv.plan.inputs import PlanInputs
from cpkv.plan.sglang import read_sglang_plan
from flags.sglang.memory import H200_MIB

DEFAULT_GPU_MEM_GIB = H200_MIB / 1024
"""An H200's memory as SGLang reads it (143,771 MiB, 140.40 GiB): the reader resolves SGLang's
rules as on one H200 node, and ``cpkv plan`` plans that GPU by default."""


@dataclass(frozen=True, slots=True)
class StepCapacity:
    """One step's KV capacity, as ``cpkv plan`` counts it."""

    level: int
    """0: replicated KV (levels 0 and 1); 2: sharded (levels 2-5)."""
    tokens_per_rank: int
    """Tokens whose KV one rank's pool stores."""
    tokens_per_deployment: int
    """Logical tokens the server's CP group caches together."""
    cp_size: int
    kv_cache_dtype: str
    page_size: int
    mem_fraction_static: float
    bytes_per_token_all_layers: int

    def to_json(self) -> dict[str, Any]:
        """The fields, in order."""
        return asdict(self)


def step_capacity(
    command: str, preset: str | None, gpu_mem_gib: float, sharded: bool
) -> StepCapacity:
    """The capacity of the server ``command`` starts.

    Raises:
        ValueError: the planner cannot plan it (no preset for the model, weights that do
            not fit, a pool under one page).
    """
    values = read_sglang_plan(command, preset).values
    if preset is not None:
        values = values | {"model": (preset, "cli")}
    inputs = PlanInputs(gpu_mem_gib=gpu_mem_gib, **{k: v for k, (v, _) in values.items()})
    plan = plan_capacity(inputs)
    level = plan.sharded if sharded else plan.replicated
    return StepCapacity(
        level.level,
        level.tokens_per_rank,
        level.tokens_per_deployment,
        plan.layout.cp_size,
        str(inputs.kv_cache_dtype),
        inputs.page_size,
        plan.budget.mem_fraction_static,
        plan.bytes_per_token_all_layers,
    )
