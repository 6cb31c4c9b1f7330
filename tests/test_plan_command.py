"""``cpkv plan``: capacity arithmetic from first principles, --json round trips, bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from cpkv.capacity import plan_capacity
from cpkv.cli import app
from cpkv_core.config import model_preset

runner = CliRunner()

# NOTE: DeepSeek-V3.2's published dimensions, restated here so the expected figures do not
# come from the code under test.
DSV32_LAYERS = 61
DSV32_PER_LAYER = (512 + 64) * 2 + 128 * 1 + 4  # bf16 latent, fp8 index K, fp32 scale
GLM5_LAYERS = 78
PAGE = 64
VIEW_TOKENS = 131072


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


def test_deepseek_v32_stores_78324_bytes_per_token() -> None:
    assert DSV32_PER_LAYER == 1284
    assert DSV32_PER_LAYER * DSV32_LAYERS == 78324


def test_deepseek_v32_cp8_on_80_gib_matches_hand_arithmetic() -> None:
    per_token = DSV32_PER_LAYER * DSV32_LAYERS
    budget = 80 * 2**30 * 85 // 100
    replicated = budget // per_token // PAGE * PAGE
    scratch = VIEW_TOKENS * DSV32_PER_LAYER
    sharded = (budget - scratch) // per_token // PAGE * PAGE

    doc = plan_json("--model", "deepseek-v3.2", "--cp-size", "8", "--gpu-mem-gib", "80")

    assert doc["kv_budget_bytes_per_rank"] == budget == 73_014_444_032
    assert doc["bytes_per_token_all_layers"] == per_token
    assert doc["levels"] == [
        {
            "level": 0,
            "kv_bytes_per_token_per_rank": per_token,
            "scratch_bytes_per_rank": 0,
            "tokens_per_rank": replicated,
            "tokens_per_deployment": replicated,
        },
        {
            "level": 2,
            "kv_bytes_per_token_per_rank": per_token / 8,
            "scratch_bytes_per_rank": scratch,
            "tokens_per_rank": sharded,
            "tokens_per_deployment": 8 * sharded,
        },
    ]
    assert (replicated, sharded) == (932_160, 930_048)
    assert doc["capacity_gain"] == pytest.approx(8 * sharded / replicated)


def test_json_document_round_trips_with_stable_keys_and_inputs() -> None:
    doc = plan_json(
        "--model", "glm-5", "--cp-size", "4", "--gpu-mem-gib", "141", "--mem-fraction", "0.5",
        "--page-size", "32", "--max-view-tokens", "65536",
    )  # fmt: skip
    assert list(doc) == [
        "model",
        "cp_size",
        "page_size",
        "gpu_mem_gib",
        "mem_fraction",
        "max_view_tokens",
        "kv_budget_bytes_per_rank",
        "bytes_per_token_per_layer",
        "bytes_per_token_all_layers",
        "levels",
        "capacity_gain",
    ]
    assert (doc["model"], doc["cp_size"], doc["page_size"]) == ("glm-5", 4, 32)
    assert (doc["gpu_mem_gib"], doc["mem_fraction"], doc["max_view_tokens"]) == (141, 0.5, 65536)
    assert doc["kv_budget_bytes_per_rank"] == 141 * 2**30 // 2
    assert doc["bytes_per_token_all_layers"] == DSV32_PER_LAYER * GLM5_LAYERS
    assert doc["levels"][1]["scratch_bytes_per_rank"] == 65536 * DSV32_PER_LAYER
    assert all(level["tokens_per_rank"] % 32 == 0 for level in doc["levels"])
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize("cp_size", [1, 2, 3, 4, 8, 16])
def test_sharded_capacity_grows_cp_size_times_less_the_scratch(cp_size: int) -> None:
    plan = plan_capacity(model_preset("deepseek-v3.2"), cp_size, gpu_mem_gib=80.0)
    per_token = plan.bytes_per_token_all_layers
    scratch_tokens = plan.sharded.scratch_bytes_per_rank / per_token
    assert plan.sharded.tokens_per_deployment == cp_size * plan.sharded.tokens_per_rank
    assert plan.replicated.tokens_per_deployment == plan.replicated.tokens_per_rank
    # NOTE: the scratch costs a rank about max_view_tokens / num_layers tokens of pool,
    # and page rounding at most one page.
    lost = plan.replicated.tokens_per_rank - plan.sharded.tokens_per_rank
    assert scratch_tokens - PAGE <= lost <= scratch_tokens + PAGE
    assert cp_size * 0.99 < plan.capacity_gain <= cp_size


def test_a_one_token_view_costs_a_rank_at_most_one_token() -> None:
    plan = plan_capacity(model_preset("deepseek-v3.2"), 8, page_size=1, max_view_tokens=1)
    assert plan.replicated.tokens_per_rank - plan.sharded.tokens_per_rank in (0, 1)


def test_glm5_runs_and_prints_a_table_with_the_gain_line() -> None:
    result = runner.invoke(
        app, ["plan", "--model", "glm-5", "--cp-size", "8", "--gpu-mem-gib", "80"]
    )
    assert result.exit_code == 0, result.output
    assert "100,152 B/token" in result.stdout
    assert "replicated" in result.stdout and "sharded 1/8" in result.stdout
    assert "160.5 MiB" in result.stdout  # 131072 view tokens x 1284 B
    assert "level >= 2 holds 7.98x the tokens of level 0 (cp_size=8)" in result.stdout


def test_tiny_is_planned_with_production_storage() -> None:
    doc = plan_json("--model", "tiny", "--cp-size", "2", "--gpu-mem-gib", "1")
    per_layer = (32 + 16) * 2 + 32 + 4
    assert doc["bytes_per_token_per_layer"] == per_layer
    assert doc["bytes_per_token_all_layers"] == per_layer * 2


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--model", "llama", "--cp-size", "8", "--gpu-mem-gib", "80"], "deepseek-v3.2, glm-5"),
        (["--model", "glm-5", "--cp-size", "0", "--gpu-mem-gib", "80"], "cp_size must be >= 1"),
        (["--model", "glm-5", "--cp-size", "8", "--gpu-mem-gib", "0"], "gpu_mem_gib must be"),
        (["--model", "glm-5", "--cp-size", "8", "--gpu-mem-gib", "-8"], "gpu_mem_gib must be"),
        (
            ["--model", "glm-5", "--cp-size", "8", "--gpu-mem-gib", "80", "--mem-fraction", "0"],
            "mem_fraction must be in (0, 1]",
        ),
        (
            ["--model", "glm-5", "--cp-size", "8", "--gpu-mem-gib", "80", "--mem-fraction", "1.1"],
            "mem_fraction must be in (0, 1]",
        ),
        (
            ["--model", "glm-5", "--cp-size", "8", "--gpu-mem-gib", "80", "--page-size", "0"],
            "page_size must be >= 1",
        ),
        (
            ["--model", "glm-5", "--cp-size", "8", "--gpu-mem-gib", "80", "--max-view-tokens", "0"],
            "max_view_tokens must be >= 1",
        ),
    ],
)
def test_rejects_bad_input_with_exit_2_and_the_reason(args: list[str], words: str) -> None:
    assert words in bad_input_stderr(*args)


def test_rejects_a_budget_that_does_not_cover_the_scratch() -> None:
    # NOTE: 0.1 GiB x 0.85 = 87 MiB < 131072 x 1284 B = 160.5 MiB of scratch.
    stderr = bad_input_stderr("--model", "deepseek-v3.2", "--cp-size", "8", "--gpu-mem-gib", "0.1")
    assert "does not cover the level >= 2 materialization scratch" in stderr
    assert "lower max_view_tokens" in stderr


def test_smaller_view_fits_a_budget_too_small_for_the_default_scratch() -> None:
    doc = plan_json(
        "--model", "deepseek-v3.2", "--cp-size", "8", "--gpu-mem-gib", "0.1",
        "--max-view-tokens", "8192",
    )  # fmt: skip
    assert doc["levels"][1]["tokens_per_rank"] > 0


def test_rejects_a_budget_below_one_page() -> None:
    stderr = bad_input_stderr("--model", "deepseek-v3.2", "--cp-size", "8", "--gpu-mem-gib", "1e-4")
    assert "does not hold one page" in stderr


def test_plan_capacity_raises_value_error_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"cp_size must be >= 1 .* got 0"):
        plan_capacity(model_preset("glm-5"), 0)
