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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flags.model import FlagError

MLA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "DeepseekV32ForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "HYV4ForCausalLM",
        "Dots3NoteForCausalLM",
        "MistralLarge3ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "GigaChat35ForCausalLM",
        "MiniCPM3ForCausalLM",
        "KimiVLForConditionalGeneration",
        "SarvamMLAForCausalLM",
    }
)
"""Architectures SGLang runs with MLA attention (``ModelConfig``'s ``AttentionArch.MLA``)."""
DSA_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "MistralLarge3ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "Dots3NoteForCausalLM",
        "HYV4ForCausalLM",
    }
)
"""Architectures ``is_deepseek_dsa`` accepts when the config has ``index_topk``."""


@dataclass(frozen=True, slots=True)
class SglangModel:
    """What SGLang's rules read from a model's ``config.json``."""

    architecture: str
    """``architectures[0]`` (``DeepseekV32ForCausalLM``)."""
    dsa: bool
    """A DeepSeek sparse-attention model (``configs/model_config.py: is_deepseek_dsa``)."""
    mla: bool = True
    """MLA attention."""
    index_kpool: int = 1
    """Index keys pooled per group (``get_dsa_index_kpool``; 1 means none)."""
    index_kpool_compress: bool = False
    """Pooled index keys are compressed (``get_dsa_index_kpool_compress``)."""
    nextn_layers: int = 1
    """``num_nextn_predict_layers``: MTP draft layers shipped with the checkpoint."""
    kv_heads: int | None = None
    """``num_key_value_heads`` of a GQA model (its per-head K and V)."""
    config_path: str | None = None
    """The ``config.json`` read; None for a model known by name."""
    config: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    """The ``config.json`` as read; None for a model known by name."""


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
"""Name prefixes of GQA model families (hybrid ``-next`` models excepted)."""

MODELS_BY_PRESET: dict[str, SglangModel] = {
    "deepseek-v3.2": DEEPSEEK_V32,
    "glm-5": GLM5,
    "deepseek-v3": DEEPSEEK_V3,
    "kimi-k2": DEEPSEEK_V3,
}
"""cpkv's model presets that SGLang serves (``tiny`` is cpkv's test vehicle, not a model)."""


def sglang_model(model_path: str | None, preset: str | None = None) -> SglangModel | None:
    """The model a preset (first), a local folder's ``config.json`` or a ``--model-path``
    name describes; None when cpkv does not know it.

    Raises:
        FlagError: ``model_path`` is a folder on this machine without a readable
            ``config.json``.
    """
    if preset is not None:
        return MODELS_BY_PRESET.get(preset)
    if model_path is None:
        return None
    if Path(model_path).is_dir():
        return model_from_folder(Path(model_path))
    name = model_path.rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    for prefix, model in MODEL_FAMILIES:
        if name.startswith(prefix):
            return model
    if name.startswith(GQA_FAMILIES) and "next" not in name:
        return GQA
    return None


def model_from_folder(folder: Path) -> SglangModel:
    """The model of a checkpoint folder, from its ``config.json`` as SGLang reads it.

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
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(architectures, list) or not architectures:
        raise FlagError(f"{path}: needs a non-empty 'architectures' list, as SGLang reads it")
    return model_from_config(config, str(path))


def model_from_config(config: Mapping[str, Any], path: str) -> SglangModel:
    """The facts SGLang's rules read from a ``config.json`` mapping."""
    architecture = str(config["architectures"][0])
    text = config.get("text_config") if "kv_lora_rank" not in config else None
    fields = text if isinstance(text, Mapping) else config
    mla = architecture in MLA_ARCHITECTURES
    dsa = architecture in DSA_ARCHITECTURES and fields.get("index_topk") is not None
    kv_heads = fields.get("num_key_value_heads")
    return SglangModel(
        architecture,
        dsa=dsa,
        mla=mla,
        index_kpool=int(fields.get("index_kpool", 1)),
        index_kpool_compress=bool(fields.get("index_kpool_compress", False)),
        nextn_layers=int(fields.get("num_nextn_predict_layers", 0) or 0),
        kv_heads=None if mla or not isinstance(kv_heads, int) else kv_heads,
        config_path=path,
        config=config,
    )
