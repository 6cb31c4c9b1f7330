"""What SGLang 0.5.23's ``ModelConfig`` checks a launch command against, read from the
checkpoint's config: :func:`checkpoint`, :data:`PUBLISHED`.

``sglang/srt/configs/model_config.py`` refuses a ``--quantization`` that the checkpoint's own
``quantization_config`` does not allow (``_verify_quantization``) and a ``--context-length``
above the one it derives from the config (``_derive_context_length``, with
``get_context_length`` of ``sglang/srt/utils/hf_transformers/common.py``). It reads a DSA
model's ``index_head_dim``, and ``model_hook.py`` its index-topk sharing, which two-batch
overlap cannot run. The rules are :mod:`flags.sglang.model_config`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "PUBLISHED",
    "Checkpoint",
    "checkpoint",
    "derived_context_length",
    "model_overrides",
    "with_overrides",
]

CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
"""The config keys ``get_context_length`` reads, the first present winning."""
SIDE_QUANT_FILES = ("hf_quant_config.json", "quant_model_description.json")
"""Quantization descriptions SGLang reads from files beside ``config.json`` (ModelOpt,
ModelSlim): a folder with one is not checked."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint's facts that SGLang checks a command against."""

    quantization: str | None
    """``quantization_config.quant_method`` lower-cased (or ``compression_config``'s); None
    for an unquantized checkpoint."""
    quantization_known: bool = True
    """False where SGLang reads the method elsewhere (a ModelOpt or ModelSlim description,
    a config without ``quant_method``): ``--quantization`` is not checked then."""
    context_length: int | None = None
    """What ``get_context_length`` derives from the language model's config; None when the
    config names none of :data:`CONTEXT_LENGTH_KEYS` (a config class's default applies)."""
    dsa_without_index_head_dim: bool = False
    """A DSA config without ``index_head_dim``, which ``ModelConfig`` reads and fails on."""
    index_topk_shared: bool = False
    """Some layers reuse an earlier layer's top-k (``index_topk_freq`` above 1, an ``S`` in
    ``index_topk_pattern``, or a ``shared`` indexer: HYV4's default from layer 2 on)."""


PUBLISHED: dict[str, Checkpoint] = {
    "deepseek-v3.2": Checkpoint("fp8", context_length=163840),
    "deepseek-v3": Checkpoint("fp8", context_length=163840),
    "deepseek-r1": Checkpoint("fp8", context_length=163840),
    "kimi-k2-instruct": Checkpoint("fp8", context_length=131072),
    "glm-5": Checkpoint(None, context_length=202752),
    "glm-5-fp8": Checkpoint("fp8", context_length=202752),
    "qwen3-8b": Checkpoint(None, context_length=40960),
}
"""The published checkpoints cpkv knows by the last part of their name, lower-cased, as
their ``config.json`` has them (the copies in ``tests/data/models/ORG/NAME``: YaRN's factor
does not count where ``original_max_position_embeddings`` is set). Other names of a family
(``DeepSeek-V3.1``, ``Kimi-K2-Thinking``) differ in these facts and are not checked."""


def model_overrides(text: str | None) -> dict[str, Any] | None:
    """``--json-model-override-args`` as ``ModelConfig`` loads it: a JSON object (``{}`` when
    unset); None for text that is not one, which SGLang fails on."""
    if not text:
        return {}
    try:
        overrides = json.loads(text)
    except ValueError:
        return None
    return overrides if isinstance(overrides, dict) else None


def derived_context_length(text: Mapping[str, Any]) -> int | None:
    """``get_context_length`` of a language model's config: the first of
    :data:`CONTEXT_LENGTH_KEYS`, times the RoPE scaling factor unless the scaling names
    ``original_max_position_embeddings`` or is Llama 3's; None when no key is set."""
    rope = text.get("rope_scaling")
    factor: float = 1
    if isinstance(rope, Mapping) and rope:
        factor = rope.get("factor", 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = text.get(key)
        if value is not None:
            return int(factor * value)
    return None


def _quantization(config: Mapping[str, Any], folder: Path | None) -> tuple[str | None, bool]:
    """``(method, known)`` as ``_parse_quant_hf_config`` finds it (module docstring)."""
    if folder is not None and any((folder / name).is_file() for name in SIDE_QUANT_FILES):
        return None, False
    quant = config.get("quantization_config")
    if quant is None:
        quant = config.get("compression_config")
    if quant is None:
        return None, True
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if not isinstance(method, str) or method.lower() == "modelopt":
        return None, False
    return method.lower(), True


def _index_topk_shared(fields: Mapping[str, Any]) -> bool:
    """``_validate_dsa_tbo_index_sharing``'s test (``model_hook.py``), with HYV4's default
    indexers (``configs/hy_v4.py``: full at layers 0, 1, 5, 9, ..., shared between)."""
    pattern = fields.get("index_topk_pattern")
    indexers = fields.get("indexer_types")
    if indexers is None and fields.get("model_type") == "hy_v4":
        indexers = ["shared"] if int(fields.get("num_hidden_layers", 0)) > 2 else []
    return (
        int(fields.get("index_topk_freq", 1) or 1) > 1
        or (isinstance(pattern, str) and "S" in pattern)
        or (isinstance(indexers, list) and "shared" in indexers)
    )


def checkpoint(
    config: Mapping[str, Any],
    text: Mapping[str, Any],
    dsa_fields: Mapping[str, Any] | None,
    folder: Path | None,
) -> Checkpoint:
    """The facts of a ``config.json`` (``text``: its language model's config;
    ``dsa_fields``: where a DSA model's index fields are read, None for a model without DSA)
    in ``folder``."""
    method, known = _quantization(config, folder)
    return Checkpoint(
        method,
        quantization_known=known,
        context_length=derived_context_length(text),
        dsa_without_index_head_dim=dsa_fields is not None and "index_head_dim" not in dsa_fields,
        index_topk_shared=dsa_fields is not None and _index_topk_shared(dsa_fields),
    )


def with_overrides(
    known: Checkpoint, overrides: Mapping[str, Any], dsa_capable: bool = False
) -> Checkpoint:
    """A published checkpoint's facts after ``--json-model-override-args``: a context key or
    a quantization config it sets is taken over, and an ``index_topk`` without
    ``index_head_dim`` makes a ``dsa_capable`` architecture's config a DSA one that lacks
    it (the published configs of DSA models have it). Nothing else of the config is known."""
    changed = known
    if any(key in overrides for key in (*CONTEXT_LENGTH_KEYS, "rope_scaling")):
        changed = replace(changed, context_length=derived_context_length(overrides))
    if "quantization_config" in overrides or "compression_config" in overrides:
        method, quant_known = _quantization(overrides, None)
        changed = replace(changed, quantization=method, quantization_known=quant_known)
    if dsa_capable and "index_topk" in overrides and "index_head_dim" not in overrides:
        changed = replace(changed, dsa_without_index_head_dim=True)
    return changed
