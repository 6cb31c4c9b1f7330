"""SGLang 0.5.23's rules of encoder disaggregation and text-only serving:
:func:`check_encoder_disaggregation`.

``handle_encoder_disaggregation`` (``sglang/srt/arg_groups/pd_disaggregation_hook.py``) runs
late in the pipeline, after KV sharding. It first runs ``model_hook.py``'s
``handle_language_model_only`` (``--language-model-only`` serves a multimodal checkpoint
without its encoders: alone, outside PD, for a few architectures), then checks the
encoder-only and language-only roles of an encoder-disaggregated deployment: one role a
worker, no PD on an encoder, and a model whose encoder SGLang can serve apart. SGLang stops at
the first; cpkv reports them all.
"""

from __future__ import annotations

from flags.checks import ProblemCode
from flags.sglang.models import GQA
from flags.sglang.rules import MODEL_HOOK, PD_HOOK, Resolving, SglangRule

C = ProblemCode
LANGUAGE_MODEL_ONLY_ARCHITECTURES = frozenset(
    {
        "DeepseekV4ForCausalLM",
        "MuseGlimmerForConditionalGeneration",
        "Cosmos3ForConditionalGeneration",
        "Cosmos3EdgeForConditionalGeneration",
    }
)
"""``ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES`` (``server_args.py``); any of a config's
``architectures`` counts."""
ENCODER_DISAGGREGATION_ARCHITECTURES = frozenset(
    {
        "Qwen2VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
        "Qwen2AudioForConditionalGeneration",
        "Qwen2_5OmniForConditionalGeneration",
        "Dots3NoteForCausalLM",
        "KimiVLForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "KimiK3ForConditionalGeneration",
        "MiMoV2ForCausalLM",
        "Glm5NextForConditionalGeneration",
        "MiniMaxM3SparseForConditionalGeneration",
        "MuseSparkForConditionalGeneration",
    }
)
"""``architectures[0]`` whose encoder SGLang serves apart (``--encoder-only``,
``--language-only``)."""
LANGUAGE_MODEL_ONLY_PD_MODEL_TYPE = "deepseek_v41"
"""The one ``model_type`` whose text-only workers may run PD."""
_EXCLUSIVE_WITH_LANGUAGE_MODEL_ONLY = (
    ("encoder_only", "--encoder-only"),
    ("language_only", "--language-only"),
    ("enable_prefix_mm_cache", "--enable-prefix-mm-cache"),
    ("enable_broadcast_mm_inputs_process", "--enable-broadcast-mm-inputs-process"),
    ("mm_enable_dp_encoder", "--mm-enable-dp-encoder"),
)

LANGUAGE_MODEL_ONLY_WITH = SglangRule(
    C.SGLANG_LANGUAGE_MODEL_ONLY,
    MODEL_HOOK,
    "--language-model-only cannot be combined with an encoder role or a multimodal-input option.",
    "drop --language-model-only, or the encoder option",
)
LANGUAGE_MODEL_ONLY_PD = SglangRule(
    C.SGLANG_LANGUAGE_MODEL_ONLY,
    MODEL_HOOK,
    "--language-model-only is incompatible with --disaggregation-mode prefill/decode",
    "drop --language-model-only on a PD worker",
)
LANGUAGE_MODEL_ONLY_MODEL = SglangRule(
    C.SGLANG_LANGUAGE_MODEL_ONLY,
    MODEL_HOOK,
    "--language-model-only does not support this model's architectures.",
    "drop --language-model-only",
)
PREFIX_MM_CACHE = SglangRule(
    C.SGLANG_ENCODER_DISAGGREGATION,
    PD_HOOK,
    "--enable-prefix-mm-cache requires --encoder-only to be enabled",
    "add --encoder-only, or drop --enable-prefix-mm-cache",
)
BOTH_ROLES = SglangRule(
    C.SGLANG_ENCODER_DISAGGREGATION,
    PD_HOOK,
    "Cannot set --encoder-only and --language-only together",
    "give a worker one role",
)
ENCODER_WITH_PD = SglangRule(
    C.SGLANG_ENCODER_DISAGGREGATION,
    PD_HOOK,
    "Cannot set --encoder-only and --disaggregation-mode prefill/decode together",
    "drop --disaggregation-mode on an encoder worker",
)
ENCODER_MODEL = SglangRule(
    C.SGLANG_ENCODER_DISAGGREGATION,
    PD_HOOK,
    "Model type is not supported for encoder disaggregation.",
    "drop --encoder-only / --language-only for this model",
)

ENCODER_RULES = (
    LANGUAGE_MODEL_ONLY_WITH,
    LANGUAGE_MODEL_ONLY_PD,
    LANGUAGE_MODEL_ONLY_MODEL,
    PREFIX_MM_CACHE,
    BOTH_ROLES,
    ENCODER_WITH_PD,
    ENCODER_MODEL,
)
"""Every rule of encoder disaggregation and text-only serving."""


def check_encoder_disaggregation(state: Resolving) -> None:
    """``handle_encoder_disaggregation``, ``handle_language_model_only`` first; the model's
    checks only for a model cpkv knows."""
    model = state.model
    architectures: list[str] | None = None
    if model is not None and model.config is not None:
        architectures = [str(a) for a in model.config["architectures"]]
    elif model is not None and model is not GQA:
        architectures = [model.architecture]
    if state["language_model_only"]:
        _language_model_only(state, architectures)
    encoder_only, language_only = state["encoder_only"], state["language_only"]
    mode = state["disaggregation_mode"]
    if state["enable_prefix_mm_cache"] and not encoder_only:
        state.add(PREFIX_MM_CACHE.problem(enable_prefix_mm_cache=True))
    if encoder_only and language_only:
        state.add(BOTH_ROLES.problem(encoder_only=True, language_only=True))
    if encoder_only and mode != "null":
        state.add(ENCODER_WITH_PD.problem(encoder_only=True, disaggregation_mode=mode))
    served_apart = architectures is None or architectures[0] in ENCODER_DISAGGREGATION_ARCHITECTURES
    if (encoder_only or language_only) and not served_apart:
        assert architectures is not None
        state.add(ENCODER_MODEL.problem(architecture=architectures[0]))


def _language_model_only(state: Resolving, architectures: list[str] | None) -> None:
    for dest, option in _EXCLUSIVE_WITH_LANGUAGE_MODEL_ONLY:
        if state[dest]:
            state.add(LANGUAGE_MODEL_ONLY_WITH.problem(language_model_only=True, option=option))
    if architectures is None or state.model is None:
        return
    config = state.model.config or {}
    mode = state["disaggregation_mode"]
    if mode != "null" and config.get("model_type") != LANGUAGE_MODEL_ONLY_PD_MODEL_TYPE:
        state.add(
            LANGUAGE_MODEL_ONLY_PD.problem(language_model_only=True, disaggregation_mode=mode)
        )
    if not any(a in LANGUAGE_MODEL_ONLY_ARCHITECTURES for a in architectures):
        state.add(LANGUAGE_MODEL_ONLY_MODEL.problem(architecture=architectures[0]))
