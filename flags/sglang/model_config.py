"""SGLang 0.5.23's checks of a command against its checkpoint: :func:`check_model_config`.

``ModelConfig`` (``sglang/srt/configs/model_config.py``) refuses a ``--quantization`` the
checkpoint's ``quantization_config`` does not allow, a ``--context-length`` above the one it
derives from the config, and a DSA config without ``index_head_dim``; ``model_hook.py``
refuses two-batch overlap for a DSA model whose layers share their top-k; ``overrides.py``
refuses ``nvfp4_online`` below Blackwell. The facts are read by
:mod:`flags.sglang.checkpoint`.
"""

from __future__ import annotations

from flags.checks import ProblemCode
from flags.sglang.checkpoint import model_overrides
from flags.sglang.models import MODEL_HOOK_FAMILY
from flags.sglang.rules import MODEL_HOOK, OVERRIDES, Resolving, SglangRule

__all__ = ["MODEL_CONFIG_RULES", "check_model_config"]

MODEL_CONFIG = "sglang/srt/configs/model_config.py"

COMPATIBLE_QUANTIZATION: dict[str, frozenset[str]] = {
    "modelopt_fp8": frozenset({"modelopt"}),
    "modelopt_fp4": frozenset({"modelopt", "fp8"}),
    "modelopt_mixed": frozenset({"modelopt"}),
    "nvfp4_online": frozenset({"fp8", "modelopt_fp8"}),
    "minimax_m3_nvfp4": frozenset({"mxfp8"}),
    "petit_nvfp4": frozenset({"modelopt"}),
    "w8a8_int8": frozenset({"compressed-tensors", "compressed_tensors"}),
    "w8a8_fp8": frozenset({"compressed-tensors", "compressed_tensors"}),
    "auto-round-int8": frozenset({"compressed-tensors", "compressed_tensors"}),
}
"""``--quantization`` to the checkpoint methods it runs on (``compatible_quantization_methods``
in ``_verify_quantization``)."""
UNKNOWN_ON_CUDA = frozenset({"gptq", "mlx_q4", "mlx_q8"})
"""``--quantization`` choices without a method on CUDA (``layers/quantization/__init__.py``
registers them on NPU, CPU, XPU or Apple only): ``_verify_quantization`` calls them unknown.
``unquant`` is no method at all (``serving_hook.py`` resolves it to none first)."""
REQUANTIZATION_METHODS = frozenset({"quark_mxfp4"})
"""Methods that requantize any checkpoint online (``REQUANTIZATION_METHODS``)."""
SELF_NAMING_CHECKPOINTS = frozenset({"modelopt_fp8", "modelopt_fp4", "modelopt_mixed"})
"""Checkpoint methods whose quantization class takes over whatever ``--quantization`` says
(``override_quantization_method`` of ``modelopt_quant.py``); the FP8 and FP4 ones leave an
online ``nvfp4_online`` alone."""
CONVERTIBLE: dict[str, frozenset[str]] = {
    "gptq": frozenset({"moe_wna16", "marlin", "gptq_marlin"}),
    "awq": frozenset({"moe_wna16", "marlin", "awq_marlin"}),
}
"""GPTQ and AWQ checkpoints another method can convert at load time, when their bits and
group sizes allow (``gptq.py``, ``awq.py``, ``moe_wna16.py``): not refused, as cpkv does not
read those fields."""

C = ProblemCode
QUANTIZATION = SglangRule(
    C.SGLANG_QUANTIZATION,
    MODEL_CONFIG,
    "Quantization method specified in the model config does not match the quantization "
    "method specified in the `quantization` argument.",
    "drop --quantization, or give the checkpoint's own method",
)
CONTEXT_LENGTH = SglangRule(
    C.SGLANG_MODEL_CONFIG,
    MODEL_CONFIG,
    "User-specified context_length is greater than the derived context_length. To allow "
    "overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
    "lower --context-length to the model's, or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
)
DSA_INDEX_HEAD_DIM = SglangRule(
    C.SGLANG_MODEL_CONFIG,
    MODEL_CONFIG,
    "object has no attribute 'index_head_dim'",
    "a DSA config needs index_head_dim beside index_topk (check --json-model-override-args)",
)
TBO_INDEX_SHARING = SglangRule(
    C.SGLANG_MODEL_CONFIG,
    MODEL_HOOK,
    "--enable-two-batch-overlap is not supported with DSA index-topk sharing: the TBO op "
    "path does not propagate topk indices across layers.",
    "drop --enable-two-batch-overlap",
)
UNKNOWN_QUANTIZATION = SglangRule(
    C.SGLANG_QUANTIZATION,
    MODEL_CONFIG,
    "Unknown quantization method. Must be one of the methods registered on this platform.",
    "pick a method SGLang registers on CUDA (gptq checkpoints run as gptq_marlin)",
)
NVFP4_ONLINE_BLACKWELL = SglangRule(
    C.SGLANG_QUANTIZATION,
    OVERRIDES,
    "--quantization nvfp4_online is supported only on NVIDIA Blackwell SM100/SM103 GPUs.",
    "on Hopper use the checkpoint's own quantization",
)
OVERRIDES_NOT_AN_OBJECT = SglangRule(
    C.SGLANG_MODEL_CONFIG,
    MODEL_CONFIG,
    "--json-model-override-args is not a JSON object: loading it to update the model config fails.",
    "give a JSON object, e.g. '{\"max_position_embeddings\": 163840}'",
)
MODEL_CONFIG_RULES = (
    OVERRIDES_NOT_AN_OBJECT,
    QUANTIZATION,
    UNKNOWN_QUANTIZATION,
    CONTEXT_LENGTH,
    DSA_INDEX_HEAD_DIM,
    TBO_INDEX_SHARING,
    NVFP4_ONLINE_BLACKWELL,
)


def quantization_refused(asked: str | None, method: str | None) -> bool:
    """``_verify_quantization`` raises for ``--quantization asked`` on a checkpoint
    quantized by ``method`` (None: unquantized, any method runs online)."""
    if asked is None or method is None:
        return False
    asked = asked.lower()
    if asked == method or asked in REQUANTIZATION_METHODS:
        return False
    if method in SELF_NAMING_CHECKPOINTS and (
        asked != "nvfp4_online" or method == "modelopt_mixed"
    ):
        return False
    if asked == "humming" and method != "mxfp4":
        return False
    if asked in CONVERTIBLE.get(method, frozenset()):
        return False
    return method not in COMPATIBLE_QUANTIZATION.get(asked, frozenset())


def check_model_config(state: Resolving) -> None:
    """``ModelConfig``'s checks of the command against the checkpoint (module docstring)."""
    text = state["json_model_override_args"]
    if model_overrides(text) is None:
        state.add(OVERRIDES_NOT_AN_OBJECT.problem(json_model_override_args=text))
    asked = state["quantization"]
    if asked == "unquant":
        asked = None
    if asked in UNKNOWN_ON_CUDA:
        state.add(UNKNOWN_QUANTIZATION.problem(quantization=asked))
    if asked is not None and asked.lower() == "nvfp4_online":
        # NOTE: overrides.py's _moe_runner_backend_quant_constraints, whatever the model.
        state.add(NVFP4_ONLINE_BLACKWELL.problem(quantization=asked))
    model = state.model
    facts = model.checkpoint if model is not None else None
    if model is None or facts is None:
        return
    if facts.quantization_known and quantization_refused(asked, facts.quantization):
        state.add(QUANTIZATION.problem(quantization=asked, checkpoint=facts.quantization))
    context = state["context_length"]
    allowed = state.env_on("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") or state.env_on(
        "SGLANG_IS_IN_CI"
    )
    derived = facts.context_length
    if context is not None and derived is not None and context > derived and not allowed:
        state.add(CONTEXT_LENGTH.problem(context_length=context, derived=derived))
    if facts.dsa_without_index_head_dim:
        state.add(DSA_INDEX_HEAD_DIM.problem(architecture=model.architecture))
    in_hook = model.architecture in MODEL_HOOK_FAMILY and model.dsa
    if in_hook and facts.index_topk_shared and state["enable_two_batch_overlap"]:
        state.add(TBO_INDEX_SHARING.problem(enable_two_batch_overlap=True))
