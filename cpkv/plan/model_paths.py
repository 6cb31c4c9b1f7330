"""Hugging Face model paths (SGLang's ``--model-path``) to cpkv's presets and weight dtypes."""

from __future__ import annotations

from cpkv_core.config import MODEL_PRESETS, WeightDtype

MODEL_PATHS: dict[str, tuple[str, WeightDtype]] = {
    "deepseek-v3.2": ("deepseek-v3.2", WeightDtype.FP8),
    "deepseek-v3.2-exp": ("deepseek-v3.2", WeightDtype.FP8),
    "deepseek-v3.2-speciale": ("deepseek-v3.2", WeightDtype.FP8),
    "glm-5": ("glm-5", WeightDtype.BF16),
    "glm-5-fp8": ("glm-5", WeightDtype.FP8),
}
"""The last part of a model path, lower-cased, to (preset, dtype of the published weights).

deepseek-ai/DeepSeek-V3.2* ship FP8 weights; zai-org/GLM-5 ships bf16 and
zai-org/GLM-5-FP8 fp8. A local directory named like the repository maps the same way.
"""


def preset_for_model_path(model_path: str) -> tuple[str, WeightDtype]:
    """The preset and weight dtype of ``model_path`` (``deepseek-ai/DeepSeek-V3.2``).

    Raises:
        ValueError: the path names no model cpkv has a preset for; the message lists them.
    """
    name = model_path.rstrip("/").rsplit("/", 1)[-1].lower()
    if name in MODEL_PATHS:
        return MODEL_PATHS[name]
    presets = ", ".join(p for p in MODEL_PRESETS if p != "tiny")
    known = ", ".join(sorted(MODEL_PATHS))
    raise ValueError(
        f"model path {model_path!r} maps to no preset; cpkv plans {presets} (model paths "
        f"ending in {known}); pass --model with one of them for a model of that shape"
    )
