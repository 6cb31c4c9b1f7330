"""What SGLang 0.5.23's ``ModelConfig`` checks a command against (``flags/sglang/checkpoint.py``,
``flags/sglang/model_config.py``), from hand-built configs: the quantization table, the derived
context length, DSA top-k sharing and ``--json-model-override-args``."""

from __future__ import annotations

from pathlib import Path

import pytest

from flags import read_sglang
from flags.sglang.checkpoint import (
    PUBLISHED,
    checkpoint,
    derived_context_length,
    model_overrides,
    with_overrides,
)
from flags.sglang.model_config import quantization_refused
from flags.sglang.models import model_from_config, sglang_model

MODELS = Path(__file__).parent / "data" / "models"


@pytest.mark.parametrize(
    ("asked", "method", "refused"),
    [
        (None, "fp8", False),
        ("fp8", None, False),  # an unquantized checkpoint quantizes online
        ("fp8", "fp8", False),
        ("FP8", "fp8", False),  # SGLang lower-cases the argument
        ("w4afp8", "fp8", True),
        ("modelopt_fp8", "fp8", True),
        ("modelopt_fp4", "fp8", False),  # compatible_quantization_methods
        ("nvfp4_online", "fp8", False),
        ("nvfp4_online", "modelopt_fp4", True),
        ("w8a8_fp8", "compressed-tensors", False),
        ("w8a8_fp8", "fp8", True),
        ("quark_mxfp4", "fp8", False),  # requantizes any checkpoint
        ("humming", "fp8", False),
        ("humming", "mxfp4", True),
        ("awq", "modelopt_fp8", False),  # the ModelOpt class names the checkpoint's method
        ("gptq_marlin", "gptq", False),  # converted at load time
        ("modelopt", "fp8", True),
    ],
)
def test_quantization_against_the_checkpoint_s_method(
    asked: str | None, method: str | None, refused: bool
) -> None:
    assert quantization_refused(asked, method) is refused


@pytest.mark.parametrize(
    ("text", "length"),
    [
        ({"max_position_embeddings": 163840}, 163840),
        ({"max_position_embeddings": 4096, "rope_scaling": {"factor": 4}}, 16384),
        (
            {
                "max_position_embeddings": 163840,
                "rope_scaling": {"factor": 40, "original_max_position_embeddings": 4096},
            },
            163840,
        ),
        (
            {"max_position_embeddings": 8192, "rope_scaling": {"factor": 8, "rope_type": "llama3"}},
            8192,
        ),
        ({"seq_length": 32768, "max_position_embeddings": 4096}, 32768),  # the first key wins
        ({"rope_scaling": {}, "model_max_length": 2048}, 2048),
        ({"hidden_size": 7168}, None),  # a config class's default would apply
    ],
)
def test_the_derived_context_length_reads_sglang_s_keys_in_order(
    text: dict[str, object], length: int | None
) -> None:
    assert derived_context_length(text) == length


def test_hyv4_shares_top_k_by_default_and_a_v32_config_does_not() -> None:
    hyv4 = sglang_model(str(MODELS / "local" / "hyv4-dsa"))
    v32 = sglang_model(str(MODELS / "local" / "v32-finetune"))
    assert hyv4 is not None and hyv4.checkpoint is not None and hyv4.checkpoint.index_topk_shared
    assert v32 is not None and v32.checkpoint is not None
    assert not v32.checkpoint.index_topk_shared
    assert (v32.checkpoint.quantization, v32.checkpoint.context_length) == ("fp8", 163840)
    full = {"architectures": ["HYV4ForCausalLM"], "model_type": "hy_v4", "num_hidden_layers": 4}
    model = model_from_config({**full, "indexer_types": ["full"] * 4}, "config.json")
    assert model.checkpoint is not None and not model.checkpoint.index_topk_shared
    freq = {"architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048, "index_topk_freq": 2}
    model = model_from_config({**freq, "index_head_dim": 128}, "config.json")
    assert model.checkpoint is not None and model.checkpoint.index_topk_shared


def test_a_quantization_description_beside_the_config_is_not_checked(tmp_path: Path) -> None:
    config = {"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": {"bits": 4}}
    facts = checkpoint(config, config, None, tmp_path)
    assert (facts.quantization, facts.quantization_known) == (None, False)
    plain = {"architectures": ["DeepseekV3ForCausalLM"]}
    assert checkpoint(plain, plain, None, tmp_path).quantization_known
    (tmp_path / "hf_quant_config.json").write_text("{}")
    assert not checkpoint(plain, plain, None, tmp_path).quantization_known


def test_overrides_apply_to_a_folder_s_config_and_to_a_published_name() -> None:
    folder = str(MODELS / "local" / "dsv3-finetune")
    plain = sglang_model(folder)
    dsa = sglang_model(folder, overrides={"index_topk": 2048})
    complete = sglang_model(folder, overrides={"index_topk": 2048, "index_head_dim": 128})
    assert plain is not None and not plain.dsa
    assert dsa is not None and dsa.dsa and dsa.checkpoint is not None
    assert dsa.checkpoint.dsa_without_index_head_dim
    assert complete is not None and complete.checkpoint is not None
    assert not complete.checkpoint.dsa_without_index_head_dim
    named = sglang_model("deepseek-ai/DeepSeek-V3", overrides={"index_topk": 2048})
    assert named is not None and named.checkpoint is not None
    assert named.checkpoint.dsa_without_index_head_dim
    v32 = sglang_model("deepseek-ai/DeepSeek-V3.2", overrides={"index_topk": 1024})
    assert v32 is not None and v32.checkpoint is not None
    assert not v32.checkpoint.dsa_without_index_head_dim
    longer = with_overrides(PUBLISHED["glm-5"], {"max_position_embeddings": 262144})
    assert longer.context_length == 262144
    quantized = with_overrides(PUBLISHED["glm-5"], {"quantization_config": {"quant_method": "FP8"}})
    assert (quantized.quantization, quantized.quantization_known) == ("fp8", True)


def test_only_published_names_carry_checkpoint_facts() -> None:
    """A family's other checkpoints differ in quantization and context length."""
    known = sglang_model("moonshotai/Kimi-K2-Instruct")
    assert known is not None and known.checkpoint is not None
    assert known.checkpoint.context_length == 131072
    other = sglang_model("moonshotai/Kimi-K2-Instruct-0905")
    assert other is not None and other.checkpoint is None
    gqa = sglang_model("Qwen/Qwen3-8B")
    assert gqa is not None and gqa.checkpoint is not None and not gqa.mla


@pytest.mark.parametrize(
    ("text", "overrides"),
    [
        (None, {}),
        ("{}", {}),
        ('{"index_topk": 1024}', {"index_topk": 1024}),
        ("{bad", None),  # SGLang's json.loads raises
        ("[1]", None),  # and a list has no items to update the config with
    ],
)
def test_model_overrides_are_a_json_object_or_refused(
    text: str | None, overrides: dict[str, object] | None
) -> None:
    assert model_overrides(text) == overrides


def test_a_command_s_overrides_reach_the_config_plan_reads() -> None:
    """``cpkv plan --from-sglang`` counts a folder's model from ``SglangModel.config``."""
    folder = MODELS / "local" / "v32-finetune"
    command = (
        f"python -m sglang.launch_server --model-path {folder} --tp 8 "
        """--json-model-override-args '{"num_hidden_layers": 30}'"""
    )
    for text, layers in ((command, 30), (command.split(" --json")[0], 61)):
        model = read_sglang(text).sglang.model
        assert model is not None and model.config is not None
        assert model.config["num_hidden_layers"] == layers
