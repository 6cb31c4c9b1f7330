"""cpkv's one reader of SGLang launch commands: argparse as 0.5.23's, seed names with a
warning, and the resolved values as cpkv's flags with their provenance."""

from __future__ import annotations

import pytest

from cpkv_core.config import CpMode, DisaggregationMode, TransferBackend
from flags import FlagError, FlagSet, SglangArgError, from_sglang, read_sglang
from flags.sglang.seed import CPKV_ONLY, SEED_NAMES
from phases import PhaseId

LAUNCH = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8"
CP = LAUNCH + " --enable-prefill-cp --cp-strategy interleave"


def test_reads_the_0_5_23_cp_names_and_resolves_the_cp_size_from_tp() -> None:
    imported = read_sglang(CP + " --trust-remote-code")
    flags = imported.flags
    assert flags.enable_nsa_prefill_context_parallel and flags.attn_cp_size == 8
    assert flags.nsa_prefill_cp_mode is CpMode.ROUND_ROBIN_SPLIT and flags.page_size == 64
    assert imported.resolved.sources["attn_cp_size"] == "sglang:model_overrides/deepseek_v2.py"
    assert imported.resolved.sources["nsa_prefill_cp_mode"] == "sglang:--cp-strategy"
    assert imported.ignored == ("--trust-remote-code",) and not imported.warnings


@pytest.mark.parametrize(
    "spelling",
    [
        "--cp-strat interleave --attn-cp 4",
        "--cp-strategy=interleave --attention-context-parallel-size=4",
        "--cp-strategy interleave --attn-cp-size 4 --mem-frac 0.8",
    ],
)
def test_reads_unique_prefixes_aliases_and_equals_forms(spelling: str) -> None:
    flags = read_sglang(f"{LAUNCH} --enable-prefill-cp {spelling}").flags
    assert flags.attn_cp_size == 4 and flags.nsa_prefill_cp_mode is CpMode.ROUND_ROBIN_SPLIT


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            "--cp-stratgy interleave",
            "unrecognized arguments: --cp-stratgy interleave; "
            "--cp-stratgy: did you mean --cp-strategy?",
        ),
        (
            "--page 64",
            "ambiguous option: --page could match --page-size, "
            "--paged-experts-num-resident; did you mean --page-size",
        ),
        (
            "--cuda-graph-max-bs 8",
            "did you mean --cuda-graph-max-bs-decode or --cuda-graph-max-bs-prefill?",
        ),
        ("--enable-prefill-cp=true", "--enable-prefill-cp: ignored explicit argument 'true'"),
        ("--cp-strategy ring", "invalid choice: 'ring' (choose from 'zigzag', 'interleave')"),
        ("--attn-cp-size eight", "invalid int value: 'eight'"),
        ("--page-size", "expected one argument"),
        ("--help", "SGLang prints its help and starts nothing"),
    ],
)
def test_refuses_what_sglang_s_parser_refuses_naming_the_closest_option(
    args: str, words: str
) -> None:
    with pytest.raises(SglangArgError, match=r"^sglang serve: error: ") as caught:
        read_sglang(f"{LAUNCH} {args}")
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("--tp 8", "required: --model-path/--model"),
        ("python -m sglang.bench_serving --tp 8", "not an SGLang launch command"),
        ("--model-path 'unclosed", "cannot split"),
        (f"{LAUNCH} --nsa-prefill-cp-mode zigzag", "in-seq-split, round-robin-split"),
        (f"{LAUNCH} --enable-nsa-prefill-context-parallel=1", "takes no value"),
        (f"{LAUNCH} --nsa-prefill-cp-min-tokens", "needs a value"),
    ],
)
def test_refuses_malformed_commands(command: str, words: str) -> None:
    with pytest.raises(FlagError, match=words):
        read_sglang(command)


def test_sglang_serve_and_env_assignments_are_read() -> None:
    imported = read_sglang(
        "SGLANG_DEBUG_CP_SHARED_KV=1 CPKV_MAX_PHASE=2 CUDA_VISIBLE_DEVICES=0,1 sglang serve "
        "--model zai-org/GLM-5 --tp-size 4 --enable-prefill-cp --cp-strategy zigzag"
    )
    flags = imported.flags
    assert flags.debug_cp_shared_kv and flags.max_phase == 2 and flags.attn_cp_size == 4
    assert imported.resolved.sources["max_phase"] == "sglang:CPKV_MAX_PHASE"
    assert imported.ignored == ("CUDA_VISIBLE_DEVICES=0,1",)


@pytest.mark.parametrize(
    ("seed", "replacement"),
    [
        (
            "--enable-nsa-prefill-context-parallel --nsa-prefill-cp-mode round-robin-split",
            "--enable-prefill-cp",
        ),
        (
            "--enable-dsa-prefill-context-parallel --dsa-prefill-cp-mode=round-robin-split",
            "--cp-strategy",
        ),
        ("--enable-prefill-context-parallel --cp-strategy interleave", "--enable-prefill-cp"),
    ],
)
def test_seed_cp_names_are_read_as_their_replacement_with_a_warning(
    seed: str, replacement: str
) -> None:
    imported = read_sglang(f"{LAUNCH} {seed}")
    assert imported.flags.deployment().cp_size == 8
    assert imported.flags.nsa_prefill_cp_mode is CpMode.ROUND_ROBIN_SPLIT
    assert any(replacement in w and "seed-series" in w for w in imported.warnings)
    seed_name = seed.split()[0]
    assert imported.resolved.sources["enable_nsa_prefill_context_parallel"] == f"sglang:{seed_name}"


def test_every_seed_and_cpkv_only_name_gets_a_warning_naming_what_to_use() -> None:
    for name, seed in {**SEED_NAMES, **CPKV_ONLY}.items():
        value = {"--nsa-prefill-cp-mode": " in-seq-split", "--dsa-prefill-cp-mode": " in-seq-split"}
        arg = name + (value.get(name, " 2") if seed.takes_value else "")
        imported = read_sglang(f"{CP} {arg}")
        (warning,) = [w for w in imported.warnings if w.startswith(name)]
        assert (seed.replacement or "no replacement") in warning, warning


def test_a_seed_without_replacement_sets_cpkv_s_own_flag() -> None:
    imported = read_sglang(
        f"{CP} --nsa-prefill-cp-min-tokens 4096 --enable-nsa-prefill-cp-narrow-output"
    )
    assert imported.flags.nsa_prefill_cp_min_tokens == 4096
    assert imported.flags.enable_nsa_prefill_cp_narrow_output
    assert "4096" not in imported.ignored


def test_kv_sharding_is_phase_2_and_mooncake_tcp_resolves_to_mooncake() -> None:
    imported = read_sglang(
        f"{CP} --enable-kv-cache-sharding --disaggregation-mode prefill --kv-cache-dtype "
        "fp8_e4m3 --dsa-prefill-backend trtllm --dsa-decode-backend trtllm "
        "--disaggregation-transfer-backend mooncake_tcp"
    )
    flags = imported.flags
    assert not imported.problems and flags.enabled_phases() == {PhaseId.SHARDED_KV}
    assert flags.disaggregation_mode is DisaggregationMode.PREFILL
    assert flags.disaggregation_transfer_backend is TransferBackend.MOONCAKE
    assert imported.resolved.sources["disaggregation_transfer_backend"] == (
        "sglang:pd_disaggregation_hook.py"
    )


def test_deprecated_dp_attention_warns_like_sglang_and_counts_attention_dp() -> None:
    imported = read_sglang(f"{CP} --dp 2 --enable-dp-attention")
    assert imported.sglang.values["attn_dp_size"] == 2 and imported.flags.attn_cp_size == 4
    assert imported.warnings == (
        "'--enable-dp-attention' is deprecated and will be removed in a future release. "
        "Use '--attn-dp-size <dp-size>' instead.",
    )


def test_a_command_without_cp_keeps_cpkv_s_cp_defaults() -> None:
    flags, ignored = from_sglang(LAUNCH + " --mem-fraction-static 0.8 --host 0.0.0.0")
    assert flags.deployment().cp_size == 1 and flags.page_size == 64
    assert flags.model_dump(exclude={"page_size"}) == FlagSet().model_dump(exclude={"page_size"})
    assert ignored == ["--host"]


@pytest.mark.parametrize(
    ("args", "dest", "value"),
    [
        ("--no-enable-tf32-matmul", "enable_tf32_matmul", False),
        ("--enable-tf32-matmul", "enable_tf32_matmul", True),
        ("--monokernel-backend amd", "enable_amd_monokernel", True),
        ("--gc-threshold 1 2 3", "gc_threshold", [1, 2, 3]),
        ("--max-total-tokens 25.6k", "max_total_tokens", 25600),
        ("--context-length 1Mi", "context_length", 2**20),
    ],
)
def test_reads_every_kind_of_sglang_option(args: str, dest: str, value: object) -> None:
    parsed = read_sglang(f"{LAUNCH} {args}").sglang
    assert parsed.values[dest] == value and dest in parsed.given


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("--monokernel-backend nvidia", "invalid choice: 'nvidia'"),
        ("--context-length 1.5Mi", "decimals are not allowed"),
        ("--cuda-graph-backend-decode tc_piecewise", "tc_piecewise was removed"),
    ],
)
def test_refuses_bad_values_of_special_options(args: str, words: str) -> None:
    with pytest.raises(SglangArgError, match=words):
        read_sglang(f"{LAUNCH} {args}")


@pytest.mark.parametrize(
    ("path", "architecture"),
    [
        ("deepseek-ai/DeepSeek-V3.2-Exp", "DeepseekV32ForCausalLM"),
        ("/models/deepseek_v3.2_speciale/", "DeepseekV32ForCausalLM"),
        ("zai-org/GLM-5-FP8", "GlmMoeDsaForCausalLM"),
        ("deepseek-ai/DeepSeek-R1-0528", "DeepseekV3ForCausalLM"),
        ("/models/ckpt", None),
    ],
)
def test_model_rules_follow_the_model_path_s_family(path: str, architecture: str | None) -> None:
    imported = read_sglang(f"sglang serve --model-path {path} --tp 8")
    model = imported.sglang.model
    assert (model.architecture if model else None) == architecture
