"""SGLang 0.5.23's start-up rules as cpkv start-up problems, and the state they resolve.

Each :class:`SglangRule` is one ``raise``/``assert`` of SGLang's argument resolution, with its
text and the file in the wheel that holds it; :class:`Resolving` carries the values a launch
command resolves to while the rules run (:mod:`flags.sglang.resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flags.checks import Problem, ProblemCode, Value
from flags.sglang.environ import env_bool, env_bool_invalid
from flags.sglang.memory import H200_MIB, MemoryDefaults
from flags.sglang.models import SglangModel
from flags.sglang.parser import ParsedArgs
from flags.sglang.table import SGLANG

ARG_GROUPS = "sglang/srt/arg_groups/"
PARALLEL_HOOK = ARG_GROUPS + "parallel_hook.py"
DEEPSEEK_OVERRIDES = ARG_GROUPS + "model_overrides/deepseek_v2.py"
OVERRIDE_BASE = ARG_GROUPS + "model_override_base.py"
MODEL_HOOK = ARG_GROUPS + "model_hook.py"
OVERRIDES = ARG_GROUPS + "overrides.py"
PD_HOOK = ARG_GROUPS + "pd_disaggregation_hook.py"
KV_SHARD_HOOK = ARG_GROUPS + "kv_shard_hook.py"
MEMORY_HOOK = ARG_GROUPS + "memory_hook.py"
KV_CACHE_HOOK = ARG_GROUPS + "kv_cache_hook.py"
ATTENTION_HOOK = ARG_GROUPS + "attention_hook.py"


@dataclass(frozen=True, slots=True)
class SglangRule:
    """One rule SGLang 0.5.23 enforces at start-up."""

    code: ProblemCode
    file: str
    """The file inside the wheel that enforces it."""
    text: str
    """What SGLang says when it refuses."""
    hint: str

    def problem(self, **values: Value) -> Problem:
        """The start-up problem: this rule's code and text, the values that broke it."""
        return Problem(
            self.code, tuple(values.items()), self.hint, self.text, f"{SGLANG} {self.file}"
        )


def _rule(code: ProblemCode, file: str, text: str, hint: str) -> SglangRule:
    return SglangRule(code, file, text, hint)


C = ProblemCode
RULES: dict[str, SglangRule] = {
    "attn_dp_below_one": _rule(
        C.SGLANG_ATTN_DP,
        PARALLEL_HOOK,
        "--attn-dp-size must be positive.",
        "set --attn-dp-size to 1 or more",
    ),
    "attn_dp_with_replicas": _rule(
        C.SGLANG_ATTN_DP,
        PARALLEL_HOOK,
        "data-parallel replicas combined with attention data parallelism are not supported.",
        "drop --dp-size or --attn-dp-size",
    ),
    "cp_attn_dp_with_replicas": _rule(
        C.SGLANG_ATTN_DP,
        OVERRIDE_BASE,
        "--dp-size with --attn-dp-size: data-parallel replicas combined with attention data "
        "parallelism are not supported.",
        "under prefill CP give --attn-dp-size alone",
    ),
    "attn_dp_indivisible": _rule(
        C.SGLANG_ATTN_DP,
        PARALLEL_HOOK,
        "tp_size must be divisible by attn_dp_size.",
        "make --tp-size a multiple of --attn-dp-size",
    ),
    "cp_strategy_unset": _rule(
        C.SGLANG_CP_STRATEGY_UNSET,
        PARALLEL_HOOK,
        "--cp-strategy must be set when --enable-prefill-cp is enabled.",
        "add --cp-strategy zigzag or --cp-strategy interleave",
    ),
    "cp_zigzag_dsv32": _rule(
        C.SGLANG_CP_STRATEGY_UNSUPPORTED,
        PARALLEL_HOOK,
        "DeepSeek V3.2 prefill CP does not support --cp-strategy zigzag; use interleave.",
        "use --cp-strategy interleave",
    ),
    "hyv4_prefill_cp": _rule(
        C.SGLANG_CP_STRATEGY_UNSUPPORTED,
        DEEPSEEK_OVERRIDES,
        "--enable-prefill-cp is not supported for HYV4.",
        "drop --enable-prefill-cp",
    ),
    "hyv4_dcp": _rule(
        C.SGLANG_DCP,
        DEEPSEEK_OVERRIDES,
        "--dcp-size > 1 is not supported for HYV4.",
        "drop --dcp-size",
    ),
    "cp_tp_above_8": _rule(
        C.SGLANG_CP_TP_ABOVE_8,
        DEEPSEEK_OVERRIDES,
        "Context parallel only supports single machine (tp_size <= 8).",
        "run prefill CP on one machine: --tp-size 8 or less",
    ),
    "cp_on_decode": _rule(
        C.SGLANG_CP_ON_DECODE,
        MODEL_HOOK,
        "CP is only supported for prefill when PD disaggregation, please remove "
        "--enable-prefill-cp.",
        "drop --enable-prefill-cp on the decode worker",
    ),
    "cp_indivisible": _rule(
        C.SGLANG_CP_SIZE_INDIVISIBLE,
        PARALLEL_HOOK,
        "tp_size must be divisible by attn_dp_size * attn_cp_size.",
        "make --tp-size a multiple of --attn-dp-size x --attn-cp-size",
    ),
    "moe_dp": _rule(
        C.SGLANG_MOE_DP,
        PARALLEL_HOOK,
        "moe_dp_size must divide tp_size, ep_size * moe_dp_size must fit tp_size, PP 1, "
        "and attn_cp_size != moe_dp_size only with moe_dp_size == 1.",
        "set --moe-dp-size 1 or to the CP size",
    ),
    "dcp_below_one": _rule(
        C.SGLANG_DCP, PARALLEL_HOOK, "--dcp-size must be >= 1.", "set --dcp-size to 1 or more"
    ),
    "dcp_with_prefill_cp": _rule(
        C.SGLANG_DCP,
        PARALLEL_HOOK,
        "--dcp-size > 1 does not support --enable-prefill-cp.",
        "drop --dcp-size or --enable-prefill-cp",
    ),
    "dcp_comm_without_dcp": _rule(
        C.SGLANG_DCP,
        PARALLEL_HOOK,
        "--dcp-comm-backend a2a/fi_a2a only affects the decode context-parallel attention "
        "reduction and therefore requires --dcp-size > 1.",
        "drop --dcp-comm-backend or set --dcp-size above 1",
    ),
    "dcp_replicate_q_without_dcp": _rule(
        C.SGLANG_DCP,
        PARALLEL_HOOK,
        "--dcp-replicate-q-proj requires --dcp-size > 1.",
        "drop --dcp-replicate-q-proj or set --dcp-size above 1",
    ),
    "dcp_replicate_q_comm": _rule(
        C.SGLANG_DCP,
        PARALLEL_HOOK,
        "--dcp-replicate-q-proj only applies to the a2a/fi_a2a DCP communication backend.",
        "drop --dcp-replicate-q-proj or use --dcp-comm-backend a2a",
    ),
    "dsa_dcp_hicache": _rule(
        C.SGLANG_DCP,
        DEEPSEEK_OVERRIDES,
        "DSA DCP does not support HiSparse or HiCache.",
        "drop --dcp-size or HiSparse/HiCache",
    ),
    "dsa_dcp_pd": _rule(
        C.SGLANG_DCP,
        DEEPSEEK_OVERRIDES,
        "DSA DCP does not support PD disaggregation.",
        "drop --dcp-size on a PD worker (cpkv pd --decode-cp-size re-shards to a decode "
        "group instead)",
    ),
    "dsa_dcp_eagle_topk": _rule(
        C.SGLANG_DCP,
        DEEPSEEK_OVERRIDES,
        "DSA DCP requires --speculative-eagle-topk 1.",
        "set --speculative-eagle-topk 1",
    ),
    "dsa_dcp_index_kpool": _rule(
        C.SGLANG_DCP,
        DEEPSEEK_OVERRIDES,
        "--dcp-size > 1 is not supported for DSA with index_kpool > 1: a pooled index key "
        "spans positions owned by different DCP ranks.",
        "drop --dcp-size",
    ),
    "trtllm_mla_blackwell": _rule(
        C.SGLANG_ATTENTION_BACKEND,
        OVERRIDES,
        "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x).",
        "on Hopper use --attention-backend fa3 or flashmla",
    ),
    "cutedsl_mla_blackwell": _rule(
        C.SGLANG_ATTENTION_BACKEND,
        OVERRIDES,
        "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100).",
        "on Hopper use --attention-backend fa3 or flashmla",
    ),
    "pd_prefill_fake": _rule(
        C.SGLANG_PD_TRANSFER_BACKEND,
        PD_HOOK,
        "Prefill server does not support 'fake' as the transfer backend.",
        "use --disaggregation-transfer-backend mooncake",
    ),
    "pd_staging_backend": _rule(
        C.SGLANG_PD_TRANSFER_BACKEND,
        PD_HOOK,
        "SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend 'mooncake' "
        "or 'nixl'.",
        "unset SGLANG_DISAGG_STAGING_BUFFER or use mooncake",
    ),
    "dsa_kv_dtype": _rule(
        C.SGLANG_DSA_KV_CACHE_DTYPE,
        OVERRIDES,
        "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype.",
        "use --kv-cache-dtype fp8_e4m3 or bfloat16",
    ),
    "dsa_backend_rocm_only": _rule(
        C.SGLANG_DSA_BACKEND,
        OVERRIDES,
        "The triton DSA backend is only supported on ROCm/HIP.",
        "pick flashmla_kv (Hopper) or trtllm (Blackwell)",
    ),
    "dsa_backend_tilelang_fp8": _rule(
        C.SGLANG_DSA_BACKEND,
        OVERRIDES,
        "CUDA TileLang FP8 KV requires both DSA backends to be tilelang.",
        "set both --dsa-prefill-backend and --dsa-decode-backend to tilelang",
    ),
    "dsa_layer_split": _rule(
        C.SGLANG_DSA_CACHE_LAYER_SPLIT,
        MODEL_HOOK,
        "--enable-dsa-cache-layer-split is only supported on PD prefill workers with "
        "--enable-prefill-cp --cp-strategy interleave, the mooncake transfer backend and PP 1.",
        "drop --enable-dsa-cache-layer-split",
    ),
    "hicache_without_radix": _rule(
        C.SGLANG_CACHE,
        KV_CACHE_HOOK,
        "The arguments enable-hierarchical-cache and disable-radix-cache are mutually "
        "exclusive and cannot be used at the same time.",
        "drop --enable-hierarchical-cache or --disable-radix-cache",
    ),
    "dsa_layer_split_not_dsa": _rule(
        C.SGLANG_DSA_CACHE_LAYER_SPLIT,
        MODEL_HOOK,
        "--enable-dsa-cache-layer-split is only supported for DSA (DeepSeek Sparse Attention) "
        "models.",
        "drop --enable-dsa-cache-layer-split",
    ),
}
"""The rules of SGLang's parallel, model and PD resolution, by name; KV sharding's are in
:mod:`flags.sglang.kv_shard`."""


class Resolving:
    """The values of a launch command while SGLang's resolution rules run over them.

    Starts as the parsed arguments (defaults filled in); a rule that resolves a value
    :meth:`declare` s it with its file, a rule that refuses adds a problem.
    """

    def __init__(
        self,
        parsed: ParsedArgs,
        env: dict[str, str],
        model: SglangModel | None,
        gpu_mib: float = H200_MIB,
    ):
        self.values: dict[str, Any] = dict(parsed.values)
        self.gpu_mib = gpu_mib
        """The GPU's memory in MiB, as SGLang's memory rules read it."""
        self.memory: MemoryDefaults | None = None
        """What the GPU-memory rule resolved."""
        self.parsed = parsed
        self.given = dict(parsed.given)
        self.env = env
        self.model = model
        self.declared: dict[str, str] = {}
        """Field to the file of the rule that last resolved it."""
        self.problems: list[Problem] = []
        self.notes: list[str] = []
        self.read: set[str] = set()
        """The fields the rules read."""

    def __getitem__(self, dest: str) -> Any:
        self.read.add(dest)
        return self.values[dest]

    def declare(self, file: str, **values: Any) -> None:
        """Resolves fields to ``values`` as the rule in ``file`` does."""
        for dest, value in values.items():
            self.values[dest] = value
            self.declared[dest] = file

    def refuse(self, rule: str, **values: Value) -> None:
        """Adds rule ``rule``'s problem, once."""
        problem = RULES[rule].problem(**values)
        if problem not in self.problems:
            self.problems.append(problem)

    def refused(self, code: ProblemCode) -> bool:
        """True when a rule with ``code`` has refused the command already."""
        return any(p.code is code for p in self.problems)

    def add(self, problem: Problem) -> None:
        """Adds a problem built elsewhere, once."""
        if problem not in self.problems:
            self.problems.append(problem)

    def env_on(self, name: str) -> bool:
        """Boolean variable ``name`` as SGLang reads the command's assignments
        (:func:`flags.sglang.environ.env_bool`); a value SGLang ignores gets a note."""
        note = (
            f"{name}={self.env.get(name)!r} is not a boolean SGLang reads (true/1/yes/y, "
            f"false/0/no/n): it warns and uses the default, {env_bool({}, name)}"
        )
        if env_bool_invalid(self.env, name) and note not in self.notes:
            self.notes.append(note)
        return env_bool(self.env, name)
