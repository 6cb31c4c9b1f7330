"""The model facts the reader takes from a ``config.json`` as SGLang 0.5.23 reads them: which
rules run (the DeepSeek family), MLA and DSA, the class defaults, and what serving a model as
a VLM costs. The corpus rows check these end to end against SGLang; these pin each fact."""

from __future__ import annotations

from typing import Any

import pytest

from flags.sglang.models import model_from_config
from flags.sglang.multimodal import VisionTower, multimodal, text_config, vlm_fraction
from flags.sglang.parser import sglang_defaults

MLA_TEXT = {"kv_lora_rank": 512, "num_attention_heads": 64}


def _model(architecture: str, **fields: Any) -> Any:
    return model_from_config({"architectures": [architecture], **fields}, "config.json")


def test_a_draft_architecture_served_alone_is_dsa_but_outside_the_family() -> None:
    draft = _model("DeepseekV3ForCausalLMNextN", index_topk=2048, kv_lora_rank=512)
    assert (draft.dsa, draft.mla, draft.deepseek_family) == (True, True, False)
    main = _model("DeepseekV32ForCausalLM", index_topk=2048, kv_lora_rank=512)
    assert (main.dsa, main.mla, main.deepseek_family) == (True, True, True)
    assert not _model("DeepseekV2ForCausalLM", kv_lora_rank=512).deepseek_family


def test_a_class_default_counts_where_the_config_json_is_silent() -> None:
    hyv4 = _model("HYV4ForCausalLM", model_type="hy_v4")
    assert (hyv4.dsa, hyv4.learnable_sink) == (True, True)
    told = _model("HYV4ForCausalLM", model_type="hy_v4", index_topk=None, learnable_sink=False)
    assert (told.dsa, told.learnable_sink) == (False, False)


def test_mla_follows_the_language_model_s_config() -> None:
    assert _model("PixtralForConditionalGeneration", text_config=MLA_TEXT).mla
    assert not _model("PixtralForConditionalGeneration", text_config={"num_attention_heads": 8}).mla
    assert _model("DeepseekVL2ForCausalLM", language_config=MLA_TEXT).mla
    opted_out = {**MLA_TEXT, "use_mla": False}
    assert not _model("DeepseekVL2ForCausalLM", language_config=opted_out).mla


def test_a_mirroring_config_class_reads_dsa_fields_from_its_text_config() -> None:
    text = {**MLA_TEXT, "index_topk": 2048, "index_kpool": 4}
    glm = _model("Glm5NextForConditionalGeneration", model_type="glm5_next", text_config=text)
    assert (glm.dsa, glm.index_kpool) == (True, 4)
    other = _model("Glm5NextForConditionalGeneration", model_type="other", text_config=text)
    assert (other.dsa, other.index_kpool) == (False, 1)


def test_text_config_takes_sglang_s_priority() -> None:
    inner = {"num_attention_heads": 1}
    both = {"architectures": ["X"], "text_config": {"a": 1}, "llm_config": {"b": 2}}
    assert text_config(both) == {"b": 2}
    assert text_config({"architectures": ["X"], "thinker_config": {"text_config": inner}}) == inner
    llava = {"architectures": ["LlavaLlamaForCausalLM"], "text_config": inner}
    assert text_config(llava) is llava


def test_the_vision_tower_factor_is_sglang_s() -> None:
    assert VisionTower(24, 1024).fraction_factor == pytest.approx(0.95)
    assert VisionTower(27, 1152).fraction_factor == pytest.approx(0.95 * (1 - 0.1 * 0.423828125))
    assert VisionTower(96, 4096).fraction_factor == pytest.approx(0.95 * 0.8)
    assert VisionTower(1, 64).fraction_factor == pytest.approx(0.95 * 1.05)
    assert vlm_fraction(0.9, None, False, 143771) == 0.9
    assert vlm_fraction(0.9, None, True, 143771) == pytest.approx(0.9 - 8192 / 143771)


def _values(**given: Any) -> dict[str, Any]:
    return sglang_defaults() | given


def test_a_vlm_is_served_as_one_unless_the_command_says_text() -> None:
    kimi = multimodal({"architectures": ["KimiK25ForConditionalGeneration"]})
    assert kimi.tower == VisionTower(27, 1152)
    assert kimi.served_as_vlm(_values())
    assert not kimi.served_as_vlm(_values(language_only=True))
    assert not kimi.served_as_vlm(_values(disaggregation_mode="decode"))
    assert kimi.is_multimodal(_values(disaggregation_mode="decode"))
    assert not kimi.is_multimodal(_values(language_model_only=True))
    assert not kimi.is_multimodal(_values(enable_multimodal=False))


def test_off_by_default_vlms_need_asking_and_a_text_mimo_stays_text() -> None:
    gemma = multimodal({"architectures": ["Gemma3ForConditionalGeneration"]})
    assert not gemma.is_multimodal(_values())
    assert gemma.is_multimodal(_values(enable_multimodal=True))
    assert gemma.is_multimodal(_values(model_impl="transformers"))
    mimo = multimodal({"architectures": ["MiMoV2ForCausalLM"], "vision_config": {}})
    assert not mimo.is_multimodal(_values(model_impl="transformers"))
    assert not multimodal({"architectures": ["Qwen3ForCausalLM"]}).is_multimodal(_values())


def test_a_vlm_that_cannot_chunk_is_marked() -> None:
    assert not multimodal({"architectures": ["LlavaLlamaForCausalLM"]}).chunked_prefill
    assert multimodal({"architectures": ["KimiK25ForConditionalGeneration"]}).chunked_prefill
