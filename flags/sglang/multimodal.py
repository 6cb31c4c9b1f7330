"""The multimodal facts SGLang 0.5.23 reads from a model's ``config.json``: :func:`multimodal`,
and what serving a model as a VLM costs in static memory: :func:`vlm_fraction`.

``ModelConfig.is_multimodal`` (``sglang/srt/configs/model_config.py``) holds for a listed
architecture (``multimodal_model_archs``) or a composite config, one whose language model
sits in a sub-config (``get_hf_text_config`` in ``utils/hf_transformers/common.py``), unless
multimodal serving is off (``enable_multimodal``) or the model is served as a language model
only. ``memory_hook.py``'s ``adjust_mem_fraction_for_vlm`` then shrinks the static memory
share by the vision tower's size, and ``model_hook.py``'s
``handle_model_capability_adjustments`` turns chunked prefill off for the few VLMs that
cannot chunk (``is_multimodal_chunked_prefill_supported``).

A vision tower's size is read from its ``vision_config`` as SGLang reads it (its
``num_hidden_layers`` and ``hidden_size``, 24 and 1,024 when absent). A field that a config
class fills in itself is not in the ``config.json``: cpkv knows the classes of the models it
serves (:data:`CLASS_VISION_TOWERS`) and reads the rest as SGLang's fallbacks
(``docs/sglang.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MULTIMODAL_ARCHITECTURES = frozenset(
    {
        "CLIPModel",
        "Cohere2VisionForConditionalGeneration",
        "Cosmos3EdgeForConditionalGeneration",
        "DeepseekVL2ForCausalLM",
        "Ernie4_5_VLMoeForConditionalGeneration",
        "MiniMaxM3SparseForConditionalGeneration",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
        "EmbeddingGemma2Model",
        "Gemma4UnifiedForConditionalGeneration",
        "DiffusionGemmaForBlockDiffusion",
        "Glm4vForConditionalGeneration",
        "Glm4vMoeForConditionalGeneration",
        "Glm5NextForConditionalGeneration",
        "GlmOcrForConditionalGeneration",
        "GlmAsrForConditionalGeneration",
        "GlmImageForConditionalGeneration",
        "Grok1VForCausalLM",
        "Grok1AForCausalLM",
        "LlavaLlamaForCausalLM",
        "Llama4ForConditionalGeneration",
        "LlavaMistralForCausalLM",
        "LlavaQwenForCausalLM",
        "LlavaForConditionalGeneration",
        "LlavaVidForCausalLM",
        "Lfm2VlForConditionalGeneration",
        "LightOnOCRForConditionalGeneration",
        "MiMoV2ForCausalLM",
        "MiMoV2ASRForCausalLM",
        "MiniCPMO",
        "MiniCPMV",
        "Mistral3ForConditionalGeneration",
        "MultiModalityCausalLM",
        "MllamaForConditionalGeneration",
        "MossVLForConditionalGeneration",
        "NemotronH_Nano_VL_V2",
        "NemotronH_Nano_Omni_Reasoning_V3",
        "NemotronH_Omni_Reasoning_V3",
        "MuseGlimmerForConditionalGeneration",
        "MuseSparkForConditionalGeneration",
        "PixtralForConditionalGeneration",
        "Qwen2AudioForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "Qwen3ASRForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
        "KimiVLForConditionalGeneration",
        "LocateAnythingForConditionalGeneration",
        "InternVLChatModel",
        "InternS1ForConditionalGeneration",
        "InternS1ProForConditionalGeneration",
        "Phi4MMForCausalLM",
        "VoxtralForConditionalGeneration",
        "WhisperForConditionalGeneration",
        "Step3VLForConditionalGeneration",
        "POINTSV15ChatModel",
        "DotsVLMForCausalLM",
        "Dots3NoteForCausalLM",
        "DotsOCRForCausalLM",
        "Sarashina2VisionForCausalLM",
        "NVILAForConditionalGeneration",
        "NVILALiteForConditionalGeneration",
        "DeepseekOCRForCausalLM",
        "UnlimitedOCRForCausalLM",
        "JetVLMForConditionalGeneration",
        "PaddleOCRVLForConditionalGeneration",
        "MiDashengLMModel",
        "StepVLForConditionalGeneration",
        "Step3p7ForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "BailingMMNativeForConditionalGeneration",
        "BailingMM2NativeForConditionalGeneration",
        "BailingMoeV3VLForConditionalGeneration",
    }
)
"""``multimodal_model_archs``, ``MIMO_V2_MULTIMODAL_ARCHS`` among them; any of a config's
``architectures`` counts."""
OFF_BY_DEFAULT = frozenset(
    {
        "Gemma3ForConditionalGeneration",
        "Llama4ForConditionalGeneration",
        "Step3VLForConditionalGeneration",
        "InklingForConditionalGeneration",
    }
)
"""``architectures[0]`` whose multimodal serving is off unless ``--enable-multimodal`` (or
the transformers model implementation) asks for it."""
MIMO_V2 = "MiMoV2ForCausalLM"
"""Multimodal only when its config has both a ``vision_config`` and an ``audio_config``."""
NO_CHUNKED_PREFILL = frozenset(
    {
        "Grok1VForCausalLM",
        "Grok1AForCausalLM",
        "LlavaLlamaForCausalLM",
        "MllamaForConditionalGeneration",
        "MossVLForConditionalGeneration",
        "CLIPModel",
    }
)
"""VLMs SGLang serves without chunked prefill (``chunked_prefill_size`` -1)."""
TEXT_SUB_CONFIGS = ("thinker_config", "llm_config", "language_config", "text_config")
"""The sub-configs ``get_hf_text_config`` reads the language model from, first found wins
(a ``thinker_config``'s own ``text_config`` within it)."""
CLASS_VISION_TOWERS: dict[str, tuple[int, int]] = {
    "KimiK25ForConditionalGeneration": (27, 1152),
}
"""Vision towers a config class builds whatever the ``config.json`` says, as (layers,
hidden size) defaults: ``KimiK25VisionConfig`` (``configs/kimi_k25.py``)."""
VIT_LAYERS, VIT_HIDDEN = 24, 1024
"""The tower SGLang assumes when a ``vision_config`` lacks the fields (ViT-L/14)."""
TRANSFORMERS_IMPL = "transformers"


@dataclass(frozen=True, slots=True)
class VisionTower:
    layers: int
    hidden_size: int

    @property
    def fraction_factor(self) -> float:
        """What ``adjust_mem_fraction_for_vlm`` multiplies the static share by: 0.95, less
        a tenth for every ViT-L/14 the tower's weights exceed, within 0.8-1.05 of that."""
        complexity = self.layers * self.hidden_size**2 / (VIT_LAYERS * VIT_HIDDEN**2)
        adjustment = max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))
        return 0.95 * adjustment


@dataclass(frozen=True, slots=True)
class Multimodal:
    """What SGLang reads of a model that may be served as a VLM."""

    listed: bool
    """One of its architectures is in ``multimodal_model_archs``."""
    composite: bool
    """Its language model sits in a sub-config (:data:`TEXT_SUB_CONFIGS`)."""
    has_media_config: bool
    """It has a ``vision_config`` or an ``audio_config`` (what the transformers
    implementation counts)."""
    off_by_default: bool
    """Multimodal serving is off unless asked for, or the transformers implementation
    serves it (:data:`OFF_BY_DEFAULT`)."""
    media_less_mimo: bool
    """A MiMo V2 checkpoint without both a ``vision_config`` and an ``audio_config``: off
    unless asked for."""
    deepseek_v41_vision: bool
    """A ``deepseek_v41`` config with vision layers (``vision_n_layers``)."""
    language_model_only: bool
    """The config declares text-only serving (``language_model_only``)."""
    tower: VisionTower | None
    """Its vision tower; None without a ``vision_config``."""
    chunked_prefill: bool
    """SGLang chunks its prefill (:data:`NO_CHUNKED_PREFILL`)."""

    def is_multimodal(self, values: Mapping[str, Any]) -> bool:
        """``ModelConfig.is_multimodal`` for a command's ``--enable-multimodal``,
        ``--model-impl`` and ``--language-model-only``."""
        transformers = values["model_impl"] == TRANSFORMERS_IMPL
        enabled = values["enable_multimodal"]
        if enabled is None:
            enabled = not (self.off_by_default and not transformers) and not self.media_less_mimo
        detected = self.listed or self.composite or self.deepseek_v41_vision
        detected |= transformers and self.has_media_config
        text_only = self.language_model_only or values["language_model_only"]
        return bool(enabled and detected and not text_only)

    def served_as_vlm(self, values: Mapping[str, Any]) -> bool:
        """``is_vlm`` as ``memory_hook.py`` reads it: multimodal, not served as a language
        model only (``--language-only``), and not a decode worker."""
        return (
            self.is_multimodal(values)
            and not values["language_only"]
            and values["disaggregation_mode"] != "decode"
        )


def multimodal(config: Mapping[str, Any]) -> Multimodal:
    """The multimodal facts of a ``config.json`` mapping with ``architectures``."""
    architectures: Sequence[str] = [str(a) for a in config["architectures"]]
    first = architectures[0]
    media = "vision_config" in config or "audio_config" in config
    both_media = "vision_config" in config and "audio_config" in config
    vision_layers = config.get("vision_n_layers")
    return Multimodal(
        listed=any(a in MULTIMODAL_ARCHITECTURES for a in architectures),
        composite=text_config(config) is not config,
        has_media_config=media,
        off_by_default=first in OFF_BY_DEFAULT,
        media_less_mimo=first == MIMO_V2 and not both_media,
        deepseek_v41_vision=config.get("model_type") == "deepseek_v41"
        and isinstance(vision_layers, int)
        and vision_layers > 0,
        language_model_only=bool(config.get("language_model_only", False)),
        tower=_tower(config, first),
        chunked_prefill=not any(a in NO_CHUNKED_PREFILL for a in architectures),
    )


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config, as ``get_hf_text_config`` picks it: the config itself
    for a Llava ``...ForCausalLM`` or a model without a text sub-config."""
    architectures = config.get("architectures") or [""]
    first = str(architectures[0])
    if first.startswith("Llava") and first.endswith("ForCausalLM"):
        return config
    for key in TEXT_SUB_CONFIGS:
        sub = config.get(key)
        if isinstance(sub, Mapping):
            inner = sub.get("text_config") if key == "thinker_config" else None
            return inner if isinstance(inner, Mapping) else sub
    return config


def _tower(config: Mapping[str, Any], architecture: str) -> VisionTower | None:
    vision = config.get("vision_config")
    defaults = CLASS_VISION_TOWERS.get(architecture)
    if vision is None and defaults is None:
        return None
    layers, hidden = defaults or (VIT_LAYERS, VIT_HIDDEN)
    fields = vision if isinstance(vision, Mapping) else {}
    return VisionTower(
        int(fields.get("num_hidden_layers", layers)), int(fields.get("hidden_size", hidden))
    )


def vlm_fraction(
    fraction: float, tower: VisionTower | None, post_capture: bool, gpu_mib: float
) -> float:
    """``adjust_mem_fraction_for_vlm``: the static share a VLM keeps (not rounded again)."""
    if post_capture:
        return fraction - 8 * 1024 / gpu_mib
    if tower is None:
        return fraction
    return fraction * tower.fraction_factor
