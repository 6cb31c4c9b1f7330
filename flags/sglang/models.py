"""The model facts SGLang 0.5.23's resolution rules read: :func:`sglang_model`.

SGLang reads the model's ``config.json`` (``sglang/srt/configs/model_config.py``): its
architecture, whether it is MLA (``attention_arch``), whether it is a DeepSeek sparse-attention
model (``is_deepseek_dsa``: a DSA-capable architecture whose config has ``index_topk``) and
``index_kpool``. cpkv does the same for a local folder; a Hugging Face name it cannot fetch is
known by its last part, as ``cpkv plan`` knows it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flags.model import FlagError
from flags.sglang.checkpoint import PUBLISHED, Checkpoint, checkpoint, with_overrides
from flags.sglang.multimodal import Multimodal, multimodal, text_config

MLA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "DeepseekV32ForCausalLM",
        "Eagle3DeepseekV2ForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteForCausalLMNextN",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGeneration",
        "Glm5NextForConditionalGenerationNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
        "DotsVLMForCausalLM",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "MistralLarge3ForCausalLMEagle",
        "KimiK25ForConditionalGeneration",
        "GigaChat35ForCausalLM",
        "GigaChat35ForCausalLMNextN",
        "MiniCPM3ForCausalLM",
        "KimiVLForConditionalGeneration",
        "KimiLinearForCausalLM",
        "KimiK3LinearForCausalLM",
        "KimiK3ForConditionalGeneration",
        "BailingMoeV2_5ForCausalLM",
        "BailingMoeV3ForCausalLM",
        "BailingMoeV3VLForConditionalGeneration",
        "SarvamMLAForCausalLM",
    }
)
"""Architectures SGLang runs with MLA attention (``ModelConfig``'s ``AttentionArch.MLA``),
any of a config's ``architectures`` counting."""
MLA_WITH_TEXT_KV_LORA = frozenset({"PixtralForConditionalGeneration", "BailingMoeForCausalLMNextN"})
"""MLA only when the language model's config has ``kv_lora_rank`` (a Mistral Large 3
checkpoint, an MLA Bailing draft)."""
MLA_UNLESS_TEXT_OPTS_OUT = "DeepseekVL2ForCausalLM"
"""MLA unless the language model's config sets ``use_mla`` false."""
DSA_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
    }
)
"""``architectures[0]`` that ``is_deepseek_dsa`` accepts when the config has ``index_topk``."""
DEEPSEEK_FAMILY = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "Glm5NextForConditionalGeneration",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
    }
)
"""``architectures[0]`` that SGLang's DeepSeek model rules run for
(``model_overrides/deepseek_v2.py: _deepseek_family_overrides``, ``overrides.py:
_DEEPSEEK_FAMILY_ARCHS``): a draft architecture (``DeepseekV3ForCausalLMNextN``) served as
the main model keeps SGLang's generic defaults, DSA or not."""
MODEL_HOOK_FAMILY = DEEPSEEK_FAMILY - {"LongcatFlashForCausalLMNextN"}
"""The same family as ``model_hook.py``'s DSA checks list it (CP on a decode worker, the
DSA cache layer split): one architecture short."""
HYV4 = frozenset({"HYV4ForCausalLM", "HYV4ForCausalLMNextN"})
"""Architectures whose attention has neither prefill CP nor DCP (``deepseek_v2.py``)."""
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "hy_v4": {"index_topk": 2048, "learnable_sink": True},
}
"""Fields a config class fills in when the ``config.json`` leaves them out, by
``model_type``, where SGLang's rules read them: ``HYV4Config`` (``configs/hy_v4.py``)."""
TEXT_MIRRORING_MODEL_TYPES = frozenset({"glm5_next"})
"""Config classes that copy their ``text_config``'s DSA fields to the top level
(``configs/glm5_next.py``), where ``is_deepseek_dsa`` reads them."""


@dataclass(frozen=True, slots=True)
class SglangModel:
    """What SGLang's rules read from a model's ``config.json``."""

    architecture: str
    """``architectures[0]`` (``DeepseekV32ForCausalLM``)."""
    dsa: bool
    """A DeepSeek sparse-attention model (``configs/model_config.py: is_deepseek_dsa``)."""
    mla: bool = True
    """MLA attention."""
    deepseek_family: bool = True
    """SGLang's DeepSeek model rules run for it (:data:`DEEPSEEK_FAMILY`)."""
    index_kpool: int = 1
    """Index keys pooled per group (``get_dsa_index_kpool``; 1 means none)."""
    index_kpool_compress: bool = False
    """Pooled index keys are compressed (``get_dsa_index_kpool_compress``)."""
    nextn_layers: int = 1
    """``num_nextn_predict_layers``: MTP draft layers shipped with the checkpoint."""
    kv_heads: int | None = None
    """``num_key_value_heads`` of a GQA model (its per-head K and V)."""
    multimodal: Multimodal | None = None
    """What SGLang reads of it as a possible VLM; None for a model known by name."""
    learnable_sink: bool = False
    """Its attention has learnable sinks, which only the ``flashmla_sparse`` DSA kernel runs,
    on bfloat16 KV (``learnable_sink`` of the top-level config, ``overrides.py``)."""
    config_path: str | None = None
    """The ``config.json`` read; None for a model known by name."""
    config: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    """The ``config.json`` as read; None for a model known by name."""
    checkpoint: Checkpoint | None = None
    """What ``--quantization`` and ``--context-length`` are checked against; None when not
    known (a model known by its family's name only)."""


DEEPSEEK_V32 = SglangModel("DeepseekV32ForCausalLM", dsa=True)
GLM5 = SglangModel("GlmMoeDsaForCausalLM", dsa=True)
DEEPSEEK_V3 = SglangModel("DeepseekV3ForCausalLM", dsa=False)

MODEL_FAMILIES: tuple[tuple[str, SglangModel], ...] = (
    ("deepseek-v3.2", DEEPSEEK_V32),
    ("glm-5", GLM5),
    ("deepseek-v3", DEEPSEEK_V3),
    ("deepseek-r1", DEEPSEEK_V3),
    ("kimi-k2", DEEPSEEK_V3),
)
"""Name prefixes of the last part of a model path, lower-cased with ``_`` read as ``-``, to
their model, first match wins: ``DeepSeek-V3.2-Exp``, ``GLM-5-FP8``, ``DeepSeek-R1-0528``,
``DeepSeek-V3.1``, ``Kimi-K2-Instruct`` (its ``config.json`` names
``DeepseekV3ForCausalLM``)."""

GQA = SglangModel("(a GQA model)", dsa=False, mla=False)
"""A grouped-query attention model: no model rule of SGLang's touches its CP or page size."""
GQA_FAMILIES = ("qwen2", "qwen3-", "llama", "meta-llama", "mistral")
"""Name prefixes of GQA model families (:data:`NOT_TEXT_GQA` excepted)."""
NOT_TEXT_GQA = ("next", "-vl", "omni", "audio")
"""Name parts of the families' hybrid and multimodal models (``Qwen3-Next``, ``Qwen2.5-VL``),
whose model rules and memory SGLang decides from their configs."""

MODELS_BY_PRESET: dict[str, SglangModel] = {
    "deepseek-v3.2": DEEPSEEK_V32,
    "glm-5": GLM5,
    "deepseek-v3": DEEPSEEK_V3,
    "kimi-k2": DEEPSEEK_V3,
}
"""cpkv's model presets that SGLang serves (``tiny`` is cpkv's test vehicle, not a model)."""


def sglang_model(
    model_path: str | None, preset: str | None = None, overrides: Mapping[str, Any] | None = None
) -> SglangModel | None:
    """The model a preset (first), a local folder's ``config.json`` or a ``--model-path``
    name describes; None when cpkv does not know it. ``overrides`` are the command's
    ``--json-model-override-args``, which SGLang applies to the config it reads.

    Raises:
        FlagError: ``model_path`` is a folder on this machine without a readable
            ``config.json``.
    """
    if preset is not None:
        return MODELS_BY_PRESET.get(preset)
    if model_path is None:
        return None
    if Path(model_path).is_dir():
        return model_from_folder(Path(model_path), overrides or {})
    name = model_path.rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    family = next((model for prefix, model in MODEL_FAMILIES if name.startswith(prefix)), None)
    if family is None and name.startswith(GQA_FAMILIES):
        family = None if any(part in name for part in NOT_TEXT_GQA) else GQA
    if family is None:
        return None
    model = _overridden(family, overrides or {})
    published = PUBLISHED.get(name)
    if published is None:
        return model
    dsa_capable = model.architecture in DSA_ARCHITECTURES and not family.dsa
    return replace(model, checkpoint=with_overrides(published, overrides or {}, dsa_capable))


def _overridden(family: SglangModel, overrides: Mapping[str, Any]) -> SglangModel:
    """A model known by name with the ``architectures`` and ``index_topk`` of
    ``--json-model-override-args`` over its published config: whether it is MLA, DSA and of
    the DeepSeek family follows the new architecture (its config's other fields unknown)."""
    architectures = overrides.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        architectures = [family.architecture]
    names = [str(a) for a in architectures]
    has_index_topk = family.dsa or overrides.get("index_topk") is not None
    if names[0] == family.architecture and has_index_topk == family.dsa:
        return family
    return replace(
        family,
        architecture=names[0],
        dsa=names[0] in DSA_ARCHITECTURES and has_index_topk,
        mla=family.mla or _mla(names, {}),
        deepseek_family=names[0] in DEEPSEEK_FAMILY,
    )


def model_from_folder(folder: Path, overrides: Mapping[str, Any] | None = None) -> SglangModel:
    """The model of a checkpoint folder, from its ``config.json`` as SGLang reads it, with
    ``overrides`` (``--json-model-override-args``) applied over its top level.

    Raises:
        FlagError: no ``config.json``, or one that is not a JSON object with
            ``architectures``.
    """
    path = folder / "config.json"
    if not path.is_file():
        raise FlagError(
            f"--model-path {folder}: the folder has no config.json; SGLang reads the model's "
            "architecture and dimensions from it (point --model-path at the checkpoint "
            "folder, or name the model with --model PRESET)"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FlagError(f"{path}: cannot read it as JSON: {exc}") from exc
    if isinstance(config, dict):
        config = {**config, **(overrides or {})}
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(architectures, list) or not architectures:
        raise FlagError(f"{path}: needs a non-empty 'architectures' list, as SGLang reads it")
    return model_from_config(config, str(path), folder)


def model_from_config(
    config: Mapping[str, Any], path: str, folder: Path | None = None
) -> SglangModel:
    """The facts SGLang's rules read from a ``config.json`` mapping (in ``folder``, where
    SGLang also looks for a quantization description of its own)."""
    architectures = [str(a) for a in config["architectures"]]
    architecture = architectures[0]
    text = text_config(config)
    defaults = CLASS_DEFAULTS.get(str(config.get("model_type")), {})
    if text is config:
        text = {**defaults, **config}
    config_fields = {**defaults, **config}
    mla = _mla(architectures, text)
    dsa_fields = _dsa_fields(config_fields, text)
    dsa = architecture in DSA_ARCHITECTURES and dsa_fields.get("index_topk") is not None
    kv_heads = text.get("num_key_value_heads")
    return SglangModel(
        architecture,
        dsa=dsa,
        mla=mla,
        deepseek_family=architecture in DEEPSEEK_FAMILY,
        index_kpool=int(dsa_fields.get("index_kpool", 1)),
        index_kpool_compress=bool(dsa_fields.get("index_kpool_compress", False)),
        nextn_layers=int(text.get("num_nextn_predict_layers", 0) or 0),
        kv_heads=None if mla or not isinstance(kv_heads, int) else kv_heads,
        multimodal=multimodal(config),
        learnable_sink=bool(config_fields.get("learnable_sink", False)),
        config_path=path,
        config=config,
        checkpoint=checkpoint(config, text, dsa_fields if dsa else None, folder),
    )


def _mla(architectures: list[str], text: Mapping[str, Any]) -> bool:
    """``ModelConfig``'s attention architecture is MLA."""
    if any(a in MLA_ARCHITECTURES for a in architectures):
        return True
    if text.get("kv_lora_rank") is not None and any(
        a in MLA_WITH_TEXT_KV_LORA for a in architectures
    ):
        return True
    return MLA_UNLESS_TEXT_OPTS_OUT in architectures and bool(text.get("use_mla", True))


def _dsa_fields(config: Mapping[str, Any], text: Mapping[str, Any]) -> Mapping[str, Any]:
    """Where ``is_deepseek_dsa`` and ``get_dsa_index_kpool`` read: the top-level config,
    which a mirroring config class fills from its ``text_config``."""
    if config.get("model_type") in TEXT_MIRRORING_MODEL_TYPES:
        return {**config, **text}
    return config
