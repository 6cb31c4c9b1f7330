"""Models from a folder's ``config.json``: the facts SGLang's rules read, the weight counts a
plan needs, and the one sentence for a model cpkv cannot shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpkv.plan.model_paths import plan_model, refuse_unshardable
from cpkv_core.hf_model import HfConfigError, model_from_hf_config, weight_dtype
from cpkv_core.mla_presets import MLA_PRESETS
from cpkv_core.models import MODEL_PRESETS, WeightDtype
from flags import FlagError
from flags.sglang.models import sglang_model

MODELS = Path(__file__).parent / "data" / "models"


def _config(name: str) -> dict[str, object]:
    config: dict[str, object] = json.loads((MODELS / name / "config.json").read_text())
    return config


@pytest.mark.parametrize(
    ("folder", "preset"),
    [("deepseek-ai/DeepSeek-V3.2", "deepseek-v3.2"), ("zai-org/GLM-5-FP8", "glm-5")],
)
def test_published_configs_count_the_presets_weights_exactly(folder: str, preset: str) -> None:
    model = model_from_hf_config(_config(folder), preset)
    expected = MODEL_PRESETS[preset]
    assert model.weights is not None and expected.weights is not None
    published = {"published_total_params", "published_active_params"}
    assert model.weights.model_dump(exclude=published) == (
        expected.weights.model_dump(exclude=published)
    )
    assert model.model_dump(exclude={"weights", "name"}) == expected.model_dump(
        exclude={"weights", "name"}
    )


def test_deepseek_v3_is_mla_without_an_indexer() -> None:
    model = model_from_hf_config(_config("deepseek-ai/DeepSeek-V3"), "v3")
    assert not model.has_indexer and model.kv_dim == 576
    assert model.weights is not None
    assert 670e9 < model.weights.total_params < 672e9
    assert MLA_PRESETS["deepseek-v3"].weights == model.weights


def test_weight_dtype_follows_the_quantization() -> None:
    assert weight_dtype({}) is WeightDtype.BF16
    assert weight_dtype({"quantization_config": {"quant_method": "fp8"}}) is WeightDtype.FP8
    with pytest.raises(HfConfigError, match="'awq'"):
        weight_dtype({"quantization_config": {"quant_method": "awq"}})


def test_a_config_without_mla_fields_is_refused() -> None:
    with pytest.raises(HfConfigError, match="kv_lora_rank"):
        model_from_hf_config(_config("Qwen/Qwen3-8B"), "qwen")


def test_a_folder_is_read_as_sglang_reads_it() -> None:
    v32 = sglang_model(str(MODELS / "local" / "v32-finetune"))
    v3 = sglang_model(str(MODELS / "local" / "dsv3-finetune"))
    qwen = sglang_model(str(MODELS / "local" / "qwen3-finetune"))
    assert v32 is not None and (v32.architecture, v32.dsa, v32.mla) == (
        "DeepseekV32ForCausalLM",
        True,
        True,
    )
    assert v3 is not None and (v3.dsa, v3.mla) == (False, True)
    assert qwen is not None and (qwen.mla, qwen.kv_heads) == (False, 8)


def test_dsa_needs_index_topk_whatever_the_architecture(tmp_path: Path) -> None:
    config = _config("deepseek-ai/DeepSeek-V3") | {"index_topk": 2048}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = sglang_model(str(tmp_path))
    assert model is not None and model.dsa


def test_a_folder_without_config_json_is_a_clear_error() -> None:
    with pytest.raises(FlagError, match=r"has no config\.json"):
        sglang_model(str(MODELS / "local" / "no-config"))


def test_a_gqa_model_gets_one_sentence() -> None:
    folder = str(MODELS / "local" / "qwen3-finetune")
    with pytest.raises(ValueError, match=r"cannot shard .*Qwen3ForCausalLM, a GQA model with 8"):
        refuse_unshardable(folder, sglang_model(folder))
    with pytest.raises(ValueError, match="GQA"):
        plan_model("Qwen/Qwen3-8B", sglang_model("Qwen/Qwen3-8B"))


def test_a_folder_plans_from_its_config() -> None:
    folder = str(MODELS / "local" / "dsv3-finetune")
    found = plan_model(folder, sglang_model(folder))
    assert found["model"] == "dsv3-finetune" and found["model_weight_dtype"] is WeightDtype.FP8
    assert found["model_dims"].kv_dim == 576 and not found["model_dims"].has_indexer
