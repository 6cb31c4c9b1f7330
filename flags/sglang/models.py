"""The model facts SGLang 0.5.23's resolution rules read: :func:`sglang_model`.

SGLang reads a model's ``config.json`` (its architecture, whether it has a DSA indexer
``index_topk``, ``index_kpool``); cpkv cannot fetch it, so it knows the models it plans by
the last part of their ``--model-path`` (as ``cpkv plan`` does) or by a cpkv preset name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SglangModel:
    """What SGLang's rules read from a model's ``config.json``."""

    architecture: str
    """``architectures[0]`` (``DeepseekV32ForCausalLM``)."""
    dsa: bool
    """A DeepSeek sparse-attention model (``configs/model_config.py: is_deepseek_dsa``)."""
    mla: bool = True
    """MLA attention (every model here is)."""
    index_kpool: int = 1
    """Index keys pooled per group (``get_dsa_index_kpool``; 1 means none)."""
    index_kpool_compress: bool = False
    """Pooled index keys are compressed (``get_dsa_index_kpool_compress``)."""
    nextn_layers: int = 1
    """``num_nextn_predict_layers``: MTP draft layers shipped with the checkpoint."""


DEEPSEEK_V32 = SglangModel("DeepseekV32ForCausalLM", dsa=True)
GLM5 = SglangModel("GlmMoeDsaForCausalLM", dsa=True)
DEEPSEEK_V3 = SglangModel("DeepseekV3ForCausalLM", dsa=False)

MODEL_FAMILIES: tuple[tuple[str, SglangModel], ...] = (
    ("deepseek-v3.2", DEEPSEEK_V32),
    ("glm-5", GLM5),
    ("deepseek-v3", DEEPSEEK_V3),
    ("deepseek-r1", DEEPSEEK_V3),
)
"""Name prefixes of the last part of a model path, lower-cased with ``_`` read as ``-``, to
their model, first match wins: ``DeepSeek-V3.2-Exp``, ``GLM-5-FP8``, ``DeepSeek-R1-0528``.
A local directory named like the Hugging Face repository maps the same way."""

GQA = SglangModel("(a GQA model)", dsa=False, mla=False)
"""A grouped-query attention model: no model rule of SGLang's touches its CP or page size."""
GQA_FAMILIES = ("qwen2", "qwen3-", "llama", "meta-llama", "mistral")
"""Name prefixes of GQA model families (hybrid ``-next`` models excepted)."""

MODELS_BY_PRESET: dict[str, SglangModel] = {"deepseek-v3.2": DEEPSEEK_V32, "glm-5": GLM5}
"""cpkv's model presets that SGLang serves (``tiny`` is cpkv's test vehicle, not a model)."""


def sglang_model(model_path: str | None, preset: str | None = None) -> SglangModel | None:
    """The model a preset (first) or a ``--model-path`` names; None when cpkv does not know it."""
    if preset is not None:
        return MODELS_BY_PRESET.get(preset)
    if model_path is None:
        return None
    name = model_path.rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    for prefix, model in MODEL_FAMILIES:
        if name.startswith(prefix):
            return model
    if name.startswith(GQA_FAMILIES) and "next" not in name:
        return GQA
    return None
