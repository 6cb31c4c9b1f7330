"""Hugging Face model paths (SGLang's ``--model-path``) to cpkv's presets and weight dtypes,
and the one sentence for a model cpkv cannot shard."""

from __future__ import annotations

from typing import Any

from cpkv_core.config import WeightDtype
from cpkv_core.hf_model import model_from_hf_config
from cpkv_core.mla_presets import PLAN_PRESETS
from flags.sglang.models import SglangModel

MODEL_PATHS: dict[str, tuple[str, WeightDtype]] = {
    "deepseek-v3.2": ("deepseek-v3.2", WeightDtype.FP8),
    "deepseek-v3.2-exp": ("deepseek-v3.2", WeightDtype.FP8),
    "deepseek-v3.2-speciale": ("deepseek-v3.2", WeightDtype.FP8),
    "glm-5": ("glm-5", WeightDtype.BF16),
    "glm-5-fp8": ("glm-5", WeightDtype.FP8),
    "deepseek-v3": ("deepseek-v3", WeightDtype.FP8),
    "deepseek-v3-0324": ("deepseek-v3", WeightDtype.FP8),
    "deepseek-v3.1": ("deepseek-v3", WeightDtype.FP8),
    "deepseek-v3.1-terminus": ("deepseek-v3", WeightDtype.FP8),
    "deepseek-r1": ("deepseek-v3", WeightDtype.FP8),
    "deepseek-r1-0528": ("deepseek-v3", WeightDtype.FP8),
    "kimi-k2-instruct": ("kimi-k2", WeightDtype.FP8),
    "kimi-k2-instruct-0905": ("kimi-k2", WeightDtype.FP8),
    "kimi-k2-base": ("kimi-k2", WeightDtype.FP8),
}
"""The last part of a model path, lower-cased, to (preset, dtype of the published weights).

deepseek-ai/DeepSeek-V3.2*, DeepSeek-V3*, DeepSeek-R1* and moonshotai/Kimi-K2-* ship FP8
weights; zai-org/GLM-5 ships bf16 and zai-org/GLM-5-FP8 fp8. A folder on this machine is
read from its ``config.json`` instead (:mod:`flags.sglang.models`).
"""


def preset_for_model_path(model_path: str) -> tuple[str, WeightDtype]:
    """The preset and weight dtype of ``model_path`` (``deepseek-ai/DeepSeek-V3.2``).

    Raises:
        ValueError: the path names no model cpkv has a preset for; the message lists them.
    """
    name = model_path.rstrip("/").rsplit("/", 1)[-1].lower()
    if name in MODEL_PATHS:
        return MODEL_PATHS[name]
    presets = ", ".join(p for p in PLAN_PRESETS if p != "tiny")
    known = ", ".join(sorted(MODEL_PATHS))
    if model_path.startswith(("/", "./", "../", "~")):
        raise ValueError(
            f"model path {model_path!r} is not a folder on this machine, so cpkv cannot read "
            "its config.json as SGLang does on the server; copy the folder's config.json to "
            f"a folder here and pass that, or pass --model with one of {presets}"
        )
    raise ValueError(
        f"model path {model_path!r} maps to no preset; cpkv plans {presets} (model paths "
        f"ending in {known}) and MLA checkpoints in a folder with a config.json; pass --model "
        "with one of them for a model of that shape"
    )


def refuse_unshardable(model_path: str, model: SglangModel | None) -> None:
    """Refuses, in one sentence, a model whose KV cpkv cannot shard: any that is not MLA.

    Raises:
        ValueError: ``model`` is known and is not an MLA model.
    """
    if model is None or model.mla:
        return
    if model.config_path is None:
        kind = "a grouped-query attention (GQA) model, by its name"
    elif model.kv_heads:
        kind = f"{model.architecture}, a GQA model with {model.kv_heads} KV heads"
    else:
        kind = f"{model.architecture}, not an MLA model"
    raise ValueError(
        f"cpkv cannot shard {model_path}: it is {kind}, which stores a K and a V per KV head, "
        "and cpkv shards the one MLA latent row per token that DeepSeek-style models "
        "(DeepSeek-V3/V3.2, GLM-5, Kimi-K2) store"
    )


def plan_model(model_path: str, model: SglangModel | None) -> dict[str, Any]:
    """What plans ``model_path``, whose model SGLang's rules read as ``model``: ``model``,
    ``model_weight_dtype`` and, for a folder with a ``config.json``, ``model_dims``.

    Raises:
        ValueError: a model cpkv cannot shard or plan (see :func:`refuse_unshardable`).
    """
    refuse_unshardable(model_path, model)
    if model is None or model.config is None:
        name, dtype = preset_for_model_path(model_path)
        return {"model": name, "model_weight_dtype": dtype}
    label = model_path.rstrip("/").rsplit("/", 1)[-1]
    dims = model_from_hf_config(model.config, label)
    assert dims.weights is not None, "model_from_hf_config always counts the weights"
    return {"model": label, "model_dims": dims, "model_weight_dtype": dims.weights.linear_dtype}
