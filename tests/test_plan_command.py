"""``cpkv plan``: weights counted per rank, the KV pool and tokens from hand arithmetic,
SGLang's memory fraction, ``--from-sglang``, --json round trips, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.plan.capacity import plan_capacity, scratch_tokens
from cpkv.plan.inputs import PlanInputs
from cpkv_core.config import MaterializeMode, model_preset

runner = CliRunner()

# NOTE: DeepSeek-V3.2's published dimensions (config.json of deepseek-ai/DeepSeek-V3.2-Exp),
# restated here so the expected figures do not come from the code under test.
DSV32 = {
    "hidden": 7168,
    "layers": 61,
    "dense_layers": 3,
    "vocab": 129280,
    "inter": 18432,
    "moe_inter": 2048,
    "experts": 256,
    "q_lora": 1536,
    "kv_lora": 512,
    "nope": 128,
    "rope": 64,
    "v_head": 128,
    "heads": 128,
    "index_heads": 64,
    "index_dim": 128,
}
GLM5 = {
    "hidden": 6144,
    "layers": 78,
    "dense_layers": 3,
    "vocab": 154880,
    "inter": 12288,
    "moe_inter": 2048,
    "experts": 256,
    "q_lora": 2048,
    "kv_lora": 512,
    "nope": 192,
    "rope": 64,
    "v_head": 256,
    "heads": 64,
    "index_heads": 32,
    "index_dim": 128,
}
DSV32_PER_LAYER = (512 + 64) * 2 + 128 + 4  # bf16 latent, fp8 index K, fp32 scale
DSV32_PER_TOKEN = DSV32_PER_LAYER * 61
GIB = 2**30
PAGE = 64


def published_counts(d: dict[str, int]) -> dict[str, int]:
    """Parameter groups from config.json dimensions (MTP layer excluded)."""
    h, layers, moe_layers = d["hidden"], d["layers"], d["layers"] - d["dense_layers"]
    q_lora, kv_lora, heads = d["q_lora"], d["kv_lora"], d["heads"]
    return {
        "attention_sharded_params": layers
        * (
            q_lora * heads * (d["nope"] + d["rope"])
            + kv_lora * heads * (d["nope"] + d["v_head"])
            + heads * d["v_head"] * h
        ),
        "attention_replicated_params": layers
        * (
            h * q_lora
            + h * (kv_lora + d["rope"])
            + q_lora * d["index_heads"] * d["index_dim"]
            + h * d["index_dim"]
        ),
        "dense_mlp_params": d["dense_layers"] * 3 * h * d["inter"]
        + moe_layers * 3 * h * d["moe_inter"],
        "routed_expert_params": moe_layers * d["experts"] * 3 * h * d["moe_inter"],
        "embedding_params": d["vocab"] * h,
        "lm_head_params": d["vocab"] * h,
        "small_params": layers
        * (2 * h + q_lora + kv_lora + h * d["index_heads"] + 2 * d["index_dim"])
        + moe_layers * (d["experts"] * h + d["experts"])
        + h,
    }


def fp8_bytes(params: int, split: int) -> int:
    shard = -(-params // split)
    return shard + -(-shard // (128 * 128)) * 4


def plan_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def bad_input_stderr(*args: str) -> str:
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    return result.stderr


@pytest.mark.parametrize(
    ("preset", "dims", "published"),
    [("deepseek-v3.2", DSV32, 671e9), ("glm-5", GLM5, 744e9)],
)
def test_preset_counts_are_the_config_arithmetic_and_sum_to_the_model_card(
    preset: str, dims: dict[str, int], published: float
) -> None:
    spec = model_preset(preset).weights
    assert spec is not None
    counts = published_counts(dims)
    assert spec.model_dump(include=set(counts)) == counts
    assert spec.published_total_params == published
    assert abs(spec.total_params - published) / published < 0.002


def test_deepseek_v32_tp8_cp8_on_h200_counts_weights_and_keeps_the_gain() -> None:
    # NOTE: the "Must show": weights counted, level 0 below 60% of the weight-free
    # figure (141 GiB x 0.85 / 78,324 B = 1.64M tokens), levels >= 2 over level 0 >= 7.5.
    doc = plan_json(
        "--model", "deepseek-v3.2", "--cp-size", "8", "--tp-size", "8", "--gpu-mem-gib", "141"
    )
    counts = published_counts(DSV32)
    experts = fp8_bytes(counts["routed_expert_params"], 8)
    attention = fp8_bytes(counts["attention_sharded_params"], 1) + fp8_bytes(
        counts["attention_replicated_params"], 1
    )
    dense = fp8_bytes(counts["dense_mlp_params"], 8)
    bf16 = 2 * (2 * -(-counts["embedding_params"] // 8) + counts["small_params"])
    weights = experts + attention + dense + bf16
    assert doc["weights"]["bytes_per_rank"] == weights
    assert 85 * GIB < weights < 92 * GIB  # "roughly 80+ GiB of weights per GPU"
    # NOTE: SGLang's reserve on a 141 GiB GPU at tp 8: 512 + 1.5 x 8192 + 2 x 512 + 1024 MiB.
    reserve_mib = 512 + 8192 * 1.5 + 2 * 512 + 8 / 8 * 1024
    fraction = round((141 * 1024 - reserve_mib) / (141 * 1024), 3)
    assert doc["memory"]["mem_fraction_static"] == fraction == 0.897
    static = 141 * GIB * 897 // 1000
    assert doc["memory"]["static_bytes"] == static
    pool = static - weights
    level0 = pool // DSV32_PER_TOKEN // PAGE * PAGE
    # NOTE: the gather scratch: 2,048 view pages, 256 slots per owner, 8 x 256 received
    # plus 256 sent.
    sharded = (pool - 9 * 256 * PAGE * DSV32_PER_LAYER) // DSV32_PER_TOKEN // PAGE * PAGE
    assert [lv["tokens_per_rank"] for lv in doc["levels"]] == [level0, sharded]
    weight_free = 141 * GIB * 85 // 100 // DSV32_PER_TOKEN // PAGE * PAGE
    assert weight_free == 1_643_008
    assert level0 < 0.6 * weight_free
    assert doc["capacity_gain"] == pytest.approx(8 * sharded / level0)
    assert doc["capacity_gain"] >= 7.5


def test_human_output_says_where_each_gib_goes() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "deepseek-v3.2",
            "--cp-size",
            "8",
            "--tp-size",
            "8",
            "--gpu-mem-gib",
            "141",
        ],
    )
    assert result.exit_code == 0, result.output
    for words in (
        "weights: routed experts (1/8, fp8)",
        "KV pool at level 0",
        "reserve: activations, CUDA graphs",
        "141.00",
        "100.0%",
        "mem_fraction_static 0.897, SGLang's default",
    ):
        assert words in result.stdout
    assert "longest request: level 0 163,840 tokens (model_context)" in result.stdout


def test_weights_that_do_not_fit_are_refused_with_sizes_and_a_fix() -> None:
    stderr = bad_input_stderr("--model", "deepseek-v3.2", "--cp-size", "8", "--gpu-mem-gib", "80")
    assert "the weights alone do not fit: 88.66 GiB per rank" in stderr
    assert "raise --tp-size" in stderr


def test_bf16_glm5_from_its_model_path_does_not_fit_eight_h200s() -> None:
    # NOTE: 744B bf16 parameters / 8 ranks = 186 GB per rank > 141 GiB.
    stderr = bad_input_stderr(
        "--model-path", "zai-org/GLM-5", "--tp-size", "8", "--gpu-mem-gib", "141"
    )
    assert "the weights alone do not fit" in stderr and "(bf16," in stderr
    assert "--weight-dtype fp8" in stderr
    doc = plan_json("--model-path", "zai-org/GLM-5-FP8", "--tp-size", "8", "--gpu-mem-gib", "141")
    assert (doc["model"], doc["weights"]["dtype"]) == ("glm-5", "fp8")
    assert doc["sources"]["weight_dtype"] == "cli:--model-path"


def test_cp_ranks_each_hold_a_whole_copy_of_the_attention_weights() -> None:
    base = {"model": "deepseek-v3.2", "gpu_mem_gib": 141.0, "tp_size": 8}
    tp_only = plan_capacity(PlanInputs(**base)).weights.bytes_per_rank
    with_cp = plan_capacity(PlanInputs(**base, cp_size=8)).weights.bytes_per_rank
    attention = published_counts(DSV32)["attention_sharded_params"]
    assert with_cp - tp_only == fp8_bytes(attention, 1) - fp8_bytes(attention, 8)


def test_dp_attention_keeps_the_input_embeddings_whole_on_every_rank() -> None:
    base = {"model": "deepseek-v3.2", "gpu_mem_gib": 141.0, "tp_size": 8}
    off = plan_capacity(PlanInputs(**base)).weights
    on = plan_capacity(PlanInputs(**base, dp_attention=8)).weights
    embed = {g.name: g for g in on.groups}["embeddings"]
    assert embed.split == 1 and embed.bytes_per_rank == 2 * DSV32["vocab"] * DSV32["hidden"]
    assert {g.name: g.split for g in off.groups}["embeddings"] == 8


def test_expert_parallelism_moves_experts_without_changing_their_bytes() -> None:
    base = {"model": "deepseek-v3.2", "gpu_mem_gib": 141.0, "tp_size": 8}
    tp = plan_capacity(PlanInputs(**base)).weights.bytes_per_rank
    ep = plan_capacity(PlanInputs(**base, ep_size=8)).weights.bytes_per_rank
    assert tp == ep


def test_reserve_gib_sets_the_static_share_to_what_is_left() -> None:
    doc = plan_json(
        "--model", "deepseek-v3.2", "--tp-size", "8", "--gpu-mem-gib", "141", "--reserve-gib", "20"
    )
    assert doc["memory"]["static_bytes"] == 121 * GIB
    assert doc["memory"]["reserve_bytes"] == 20 * GIB
    assert doc["memory"]["mem_fraction_source"] == "reserve"


def test_fp8_kv_cache_stores_flashmla_656_byte_latent_plus_index_k() -> None:
    doc = plan_json(
        "--model",
        "deepseek-v3.2",
        "--tp-size",
        "8",
        "--gpu-mem-gib",
        "141",
        "--kv-cache-dtype",
        "fp8_e4m3",
    )
    assert doc["bytes_per_token_per_layer"] == 512 + 4 * 4 + 64 * 2 + 128 + 4 == 788


def test_longest_request_is_bounded_by_the_pool_the_view_or_the_model() -> None:
    big = plan_json(
        "--model", "deepseek-v3.2", "--cp-size", "8", "--tp-size", "8", "--gpu-mem-gib", "141"
    )
    assert [(lv["max_request_tokens"], lv["max_request_limit"]) for lv in big["levels"]] == [
        (163840, "model_context"),
        (131072, "max_view_tokens"),
    ]
    small = plan_json(
        "--model",
        "tiny",
        "--cp-size",
        "2",
        "--gpu-mem-gib",
        "0.01",
        "--mem-fraction-static",
        "0.9",
        "--max-view-tokens",
        "64",
    )
    level0, level2 = small["levels"]
    assert (level0["max_request_tokens"], level0["max_request_limit"]) == (
        level0["tokens_per_rank"],
        "kv_pool",
    )
    assert level2["max_request_tokens"] == 64


LAUNCH = (
    "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 "
    "--enable-prefill-cp --cp-strategy interleave --attn-cp-size 8 --page-size 64 "
    "--mem-fraction-static 0.82 --kv-cache-dtype fp8_e4m3 --trust-remote-code"
)


def test_from_sglang_takes_model_tp_cp_page_fraction_and_kv_dtype_from_the_command() -> None:
    doc = plan_json("--from-sglang", LAUNCH, "--gpu-mem-gib", "141")
    assert (doc["model"], doc["tp_size"], doc["cp_size"], doc["page_size"]) == (
        "deepseek-v3.2",
        8,
        8,
        64,
    )
    assert doc["memory"]["mem_fraction_static"] == 0.82
    assert doc["memory"]["static_bytes"] == 141 * GIB * 82 // 100
    assert doc["kv_cache_dtype"] == "fp8_e4m3"
    assert doc["sources"]["tp_size"] == "sglang:--tp-size"
    assert doc["sources"]["mem_fraction_static"] == "sglang:--mem-fraction-static"
    assert doc["sources"]["model"] == "sglang:--model-path"
    assert doc["sources"]["page_size"] == "sglang:model_overrides/deepseek_v2.py"
    assert doc["ignored_args"] == ["--trust-remote-code"]


def test_command_line_options_override_the_sglang_command() -> None:
    doc = plan_json("--from-sglang", LAUNCH, "--gpu-mem-gib", "141", "--tp-size", "16")
    assert (doc["tp_size"], doc["attn_tp_size"], doc["sources"]["tp_size"]) == (16, 2, "cli")


def test_from_sglang_resolves_the_cp_size_as_sglang_does() -> None:
    launch = "--model-path deepseek-ai/DeepSeek-V3.2 --tp 8 --enable-prefill-cp"
    doc = plan_json("--from-sglang", launch + " --cp-strategy interleave", "--gpu-mem-gib", "141")
    assert doc["cp_size"] == 8 and doc["sources"]["cp_size"] == (
        "sglang:model_overrides/deepseek_v2.py"
    )
    assert any("attn_cp_size resolves to 8" in note for note in doc["notes"])
    stderr = bad_input_stderr("--from-sglang", launch, "--gpu-mem-gib", "141")
    assert "SGLang would refuse this command: SGLANG_CP_STRATEGY_UNSET" in stderr


def test_from_sglang_follows_the_preset_s_model_rules() -> None:
    launch = "--model-path /models/local-copy --tp 8 --enable-prefill-cp --cp-strategy zigzag"
    doc = plan_json("--model", "glm-5", "--from-sglang", launch, "--gpu-mem-gib", "141")
    assert (doc["model"], doc["cp_size"], doc["ep_size"]) == ("glm-5", 8, 8)
    stderr = bad_input_stderr(
        "--model", "deepseek-v3.2", "--from-sglang", launch, "--gpu-mem-gib", "141"
    )
    assert "SGLANG_CP_STRATEGY_UNSUPPORTED" in stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--model", "llama", "--gpu-mem-gib", "80"], "deepseek-v3.2, glm-5"),
        (
            ["--model-path", "acme/Mystery-MoE-7B", "--gpu-mem-gib", "80"],
            "maps to no preset; cpkv plans deepseek-v3.2, glm-5",
        ),
        (
            ["--model-path", "/mnt/ckpt/my-finetune", "--gpu-mem-gib", "80"],
            "is not a folder on this machine, so cpkv cannot read its config.json",
        ),
        (
            ["--model-path", "meta-llama/Llama-3-8B", "--gpu-mem-gib", "80"],
            "cannot shard meta-llama/Llama-3-8B: it is a grouped-query attention (GQA) model",
        ),
        (["--gpu-mem-gib", "80"], "give --model"),
        (["--model", "glm-5", "--model-path", "zai-org/GLM-5", "--gpu-mem-gib", "80"], "not both"),
        (["--model", "glm-5", "--cp-size", "0", "--gpu-mem-gib", "141"], "cp_size must be >= 1"),
        (["--model", "glm-5", "--gpu-mem-gib", "0"], "gpu_mem_gib must be"),
        (
            ["--model", "glm-5", "--gpu-mem-gib", "141", "--mem-fraction-static", "1.1"],
            "mem_fraction_static must be in (0, 1]",
        ),
        (
            [
                "--model",
                "glm-5",
                "--gpu-mem-gib",
                "141",
                "--mem-fraction-static",
                "0.9",
                "--reserve-gib",
                "9",
            ],
            "not both",
        ),
        (
            ["--model", "glm-5", "--gpu-mem-gib", "141", "--reserve-gib", "141"],
            "reserve_gib must be in [0, gpu_mem_gib=141)",
        ),
        (
            ["--model", "glm-5", "--gpu-mem-gib", "141", "--tp-size", "8", "--ep-size", "3"],
            "ep_size must divide tp_size",
        ),
        (
            ["--model", "glm-5", "--gpu-mem-gib", "141", "--tp-size", "8", "--cp-size", "16"],
            "tp_size must be a multiple of dp_attention x cp_size",
        ),
        (
            [
                "--model",
                "glm-5",
                "--gpu-mem-gib",
                "141",
                "--tp-size",
                "8",
                "--kv-cache-dtype",
                "fp8_e5m2",
            ],
            "kv_cache_dtype fp8_e5m2: glm-5 is a DSA model",
        ),
        (
            ["--model", "glm-5", "--gpu-mem-gib", "141", "--tp-size", "8", "--page-size", "0"],
            "page_size must be >= 1",
        ),
        (
            [
                "--model",
                "glm-5",
                "--gpu-mem-gib",
                "141",
                "--tp-size",
                "8",
                "--max-view-tokens",
                "0",
            ],
            "max_view_tokens must be >= 1",
        ),
        (
            [
                "--from-sglang",
                "--model-path deepseek-ai/DeepSeek-V3.2 --tp",
                "--gpu-mem-gib",
                "141",
            ],
            "--tp-size/--tensor-parallel-size: expected one argument",
        ),
    ],
)
def test_rejects_bad_input_with_exit_2_and_the_reason(args: list[str], words: str) -> None:
    assert words in bad_input_stderr(*args)


def test_rejects_a_pool_that_does_not_cover_the_scratch() -> None:
    # NOTE: 88.7 GiB static less 88.66 GiB of weights leaves ~41 MiB: more than a page
    # (64 x 78,324 B = 4.8 MiB), less than the scratch (147,456 x 1,284 B = 180.6 MiB).
    stderr = bad_input_stderr(
        "--model",
        "deepseek-v3.2",
        "--cp-size",
        "8",
        "--tp-size",
        "8",
        "--gpu-mem-gib",
        "100",
        "--reserve-gib",
        "11.3",
    )
    assert "does not cover the level >= 2 materialization scratch" in stderr
    assert "lower --max-view-tokens" in stderr


def test_json_document_round_trips_with_stable_keys() -> None:
    doc = plan_json(
        "--model",
        "glm-5",
        "--cp-size",
        "4",
        "--tp-size",
        "8",
        "--gpu-mem-gib",
        "141",
        "--page-size",
        "32",
        "--max-view-tokens",
        "65536",
    )
    assert list(doc) == [
        "model",
        "tp_size",
        "ep_size",
        "dp_attention",
        "cp_size",
        "attn_cp_size",
        "attn_tp_size",
        "page_size",
        "gpu_mem_gib",
        "kv_cache_dtype",
        "max_view_tokens",
        "materialize",
        "materialize_prefetch",
        "max_context_len",
        "memory",
        "weights",
        "kv_budget_bytes_per_rank",
        "bytes_per_token_per_layer",
        "bytes_per_token_all_layers",
        "levels",
        "capacity_gain",
        "sources",
    ]
    assert doc["bytes_per_token_all_layers"] == DSV32_PER_LAYER * 78
    # NOTE: gather: 2,048 pages over 4 owners, 512 slots each: 4 x 512 received + 512 sent.
    assert doc["levels"][1]["scratch_bytes_per_rank"] == 5 * 512 * 32 * DSV32_PER_LAYER
    assert all(level["tokens_per_rank"] % 32 == 0 for level in doc["levels"])
    memory = doc["memory"]
    assert memory["static_bytes"] + memory["reserve_bytes"] == memory["gpu_bytes"]
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize(
    ("view", "cp", "gather_tokens", "peer_read_tokens"),
    [(131072, 8, 147456, 131072), (100, 4, 5 * 1 * 64, 128), (64 * 9, 8, 9 * 2 * 64, 9 * 64)],
)
def test_peer_read_scratch_has_no_send_slots_and_no_padding(
    view: int, cp: int, gather_tokens: int, peer_read_tokens: int
) -> None:
    assert scratch_tokens(view, cp, 64, MaterializeMode.GATHER) == gather_tokens
    assert scratch_tokens(view, cp, 64, MaterializeMode.PEER_READ) == peer_read_tokens


def test_plan_counts_the_smaller_peer_read_scratch() -> None:
    args = ("--model", "deepseek-v3.2", "--cp-size", "8", "--tp-size", "8", "--gpu-mem-gib", "141")
    gather, peer = plan_json(*args), plan_json(*args, "--materialize", "peer-read")
    assert (gather["materialize"], peer["materialize"]) == ("gather", "peer-read")
    assert peer["levels"][1]["scratch_bytes_per_rank"] == 131072 * 1284
    assert gather["levels"][1]["scratch_bytes_per_rank"] == 147456 * 1284
    assert peer["levels"][1]["tokens_per_rank"] > gather["levels"][1]["tokens_per_rank"]
    doubled = plan_json(*args, "--materialize", "peer-read", "--materialize-prefetch")
    assert doubled["materialize_prefetch"] is True
    assert doubled["levels"][1]["scratch_bytes_per_rank"] == 2 * 131072 * 1284


V32_CONFIG = Path(__file__).parent / "data" / "models" / "deepseek-ai" / "DeepSeek-V3.2"


def test_plans_a_local_checkpoint_from_its_config_json(tmp_path: Path) -> None:
    """A folder the suite writes holds a V3.2-shaped ``config.json``; the plan reads it, as
    SGLang would, and gives the preset's figures."""
    folder = tmp_path / "my-finetune"
    folder.mkdir()
    (folder / "config.json").write_text((V32_CONFIG / "config.json").read_text())
    command = (
        f"python3 -m sglang.launch_server --model-path {folder} --tp 8 --enable-prefill-cp "
        "--cp-strategy interleave --attn-cp-size 8"
    )
    doc = plan_json("--from-sglang", command)
    preset = plan_json("--model", "deepseek-v3.2", "--tp-size", "8", "--cp-size", "8")
    assert doc["model"] == "my-finetune"
    assert doc["sources"]["model_dims"] == f"config:{folder / 'config.json'}"
    assert doc["weights"] == preset["weights"] and doc["levels"] == preset["levels"]
    assert (doc["cp_size"], doc["page_size"]) == (8, 64)


@pytest.mark.parametrize("fp8", ["fp8_e4m3", "fp8_e5m2"])
def test_an_mla_model_without_dsa_stores_no_index_k(fp8: str) -> None:
    """The latent alone: two bytes a value in bf16, one in either FP8 (DSA refuses e5m2;
    plain MLA stores it)."""
    doc = plan_json("--model", "deepseek-v3", "--tp-size", "8", "--cp-size", "8")
    assert doc["bytes_per_token_per_layer"] == (512 + 64) * 2
    quantized = plan_json(
        "--model", "kimi-k2", "--tp-size", "8", "--cp-size", "8", "--kv-cache-dtype", fp8
    )
    assert quantized["bytes_per_token_per_layer"] == 512 + 64


def test_sharded_level_charges_each_rank_one_cp_th_of_a_token() -> None:
    """Level 0 charges every rank a whole token (``B``); levels >= 2 store a page on its
    owner only, so a token costs each rank ``B / cp_size`` and the group caches ``cp_size``
    times what one rank's pool holds."""
    doc = plan_json(
        "--model", "deepseek-v3.2", "--cp-size", "8", "--tp-size", "8", "--gpu-mem-gib", "141"
    )
    level0, level2 = doc["levels"]
    assert level0["kv_bytes_per_token_per_rank"] == DSV32_PER_TOKEN
    assert level2["kv_bytes_per_token_per_rank"] == DSV32_PER_TOKEN / 8
    assert level0["tokens_per_deployment"] == level0["tokens_per_rank"]
    assert level2["tokens_per_deployment"] == 8 * level2["tokens_per_rank"]


def test_cuda_graph_max_bs_sizes_sglang_s_default_reserve() -> None:
    """``--cuda-graph-max-bs 1024`` reaches SGLang's reserve estimate (``memory_budget``'s
    docstring): the decode graph's ``2 x max_bs`` MiB, 2,048 instead of 1,024 at the default
    512, lowers the fraction."""
    args = ("--model", "deepseek-v3.2", "--tp-size", "8", "--gpu-mem-gib", "141")
    doc = plan_json(*args, "--cuda-graph-max-bs", "1024")
    base, chunk, tp_pp, graphs = 512, 1.5 * 8192, 8 * 1 / 8 * 1024, 2 * 1024
    reserve_mib = base + chunk + tp_pp + graphs
    fraction = round((141 * 1024 - reserve_mib) / (141 * 1024), 3)
    assert doc["memory"]["mem_fraction_static"] == fraction == 0.89
    assert doc["memory"]["cuda_graph_max_bs"] == 1024
    assert doc["sources"]["cuda_graph_max_bs"] == "cli"
