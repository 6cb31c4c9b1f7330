"""SGLang adapters: launch-command flags and forward-batch metadata."""

from __future__ import annotations

from enum import IntEnum
from types import SimpleNamespace

import pytest

from cpkv_core.config import CpMode, DisaggregationMode, TransferBackend
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from flags import FlagError, FlagSet, batch_from_forward_batch, from_sglang, read_sglang
from phases import PhaseId

LEGACY = (
    "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 "
    "--trust-remote-code --enable-nsa-prefill-context-parallel --attn-cp-size 8 "
    "--nsa-prefill-cp-mode round-robin-split --page-size 64 "
    "--disaggregation-mode prefill --disaggregation-transfer-backend mooncake"
)
NEWER = (
    "python3 -m sglang.launch_server --model zai-org/GLM-5 --attn-cp-size=4 --enable-prefill-cp "
    "--cp-strategy zigzag --enable-kv-cache-sharding --page-size=64 --mem-fraction-static 0.88"
)


def test_reads_the_legacy_nsa_names_and_reports_the_rest() -> None:
    flags, ignored = from_sglang(LEGACY)
    assert flags.enable_nsa_prefill_context_parallel and flags.attn_cp_size == 8
    assert flags.nsa_prefill_cp_mode is CpMode.ROUND_ROBIN_SPLIT and flags.page_size == 64
    assert flags.disaggregation_mode is DisaggregationMode.PREFILL
    assert flags.disaggregation_transfer_backend is TransferBackend.MOONCAKE
    assert ignored == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "deepseek-ai/DeepSeek-V3.2",
        "--tp",
        "8",
        "--trust-remote-code",
    ]


def test_reads_the_newer_cp_names_with_equals_values() -> None:
    imported = read_sglang(NEWER)
    flags = imported.flags
    assert flags.enable_nsa_prefill_context_parallel and flags.attn_cp_size == 4
    assert flags.nsa_prefill_cp_mode is CpMode.IN_SEQ_SPLIT
    assert flags.enabled_phases() == {PhaseId.SHARDED_KV}
    assert imported.resolved.sources["enable_nsa_prefill_cp_shared_kv"] == (
        "sglang:--enable-kv-cache-sharding"
    )
    assert imported.resolved.sources["page_size"] == "sglang:--page-size"
    assert imported.ignored[-2:] == ("--mem-fraction-static", "0.88")


def test_interleave_strategy_is_round_robin_split() -> None:
    flags, _ = from_sglang("--enable-prefill-cp --cp-strategy=interleave")
    assert flags.nsa_prefill_cp_mode is CpMode.ROUND_ROBIN_SPLIT


def test_reads_cpkv_phase_flags_and_env_assignments() -> None:
    imported = read_sglang(
        "SGLANG_DEBUG_CP_SHARED_KV=1 CPKV_MAX_PHASE=2 CUDA_VISIBLE_DEVICES=0,1 "
        "python -m sglang.launch_server --enable-nsa-prefill-cp-narrow-output"
    )
    flags = imported.flags
    assert flags.debug_cp_shared_kv and flags.max_phase == 2
    assert flags.enable_nsa_prefill_cp_narrow_output
    assert imported.resolved.sources["max_phase"] == "sglang:CPKV_MAX_PHASE"
    assert imported.ignored[0] == "CUDA_VISIBLE_DEVICES=0,1"


def test_legacy_cp_without_size_takes_the_attention_tp_size() -> None:
    imported = read_sglang(
        "--tp 8 --dp 2 --enable-dp-attention --enable-nsa-prefill-context-parallel"
    )
    assert imported.flags.attn_cp_size == 4
    assert imported.resolved.sources["attn_cp_size"] == "sglang:--tp/--dp"
    assert "inferred" in imported.resolved.notes[0] and imported.ignored == ()


def test_newer_cp_without_size_keeps_the_default() -> None:
    flags, ignored = from_sglang("--tp 8 --enable-prefill-cp")
    assert flags.attn_cp_size == 1 and ignored == ["--tp", "8"]


def test_unrelated_command_keeps_defaults() -> None:
    flags, ignored = from_sglang("python -m sglang.launch_server --model-path X --tp 8")
    assert flags == FlagSet() and len(ignored) == 7


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ("--attn-cp-size eight", r"--attn-cp-size.*got 'eight'"),
        ("--cp-strategy ring", r"--cp-strategy must be one of zigzag, interleave"),
        ("--page-size", r"--page-size needs a value"),
        ("--nsa-prefill-cp-mode zigzag", r"--nsa-prefill-cp-mode"),
        ("--disaggregation-transfer-backend carrier-pigeon", r"transfer-backend"),
        ("--enable-prefill-cp='unclosed", r"cannot split"),
    ],
)
def test_rejects_bad_values_of_relevant_args(args: str, match: str) -> None:
    with pytest.raises(FlagError, match=match):
        from_sglang(args)


class SpeculativeAlgorithm(IntEnum):
    NONE = 0
    EAGLE = 1

    def is_none(self) -> bool:
        return self is SpeculativeAlgorithm.NONE


class CaptureHiddenMode(IntEnum):
    NULL = 0
    FULL = 1
    LAST = 2

    def need_capture(self) -> bool:
        return self is not CaptureHiddenMode.NULL


def forward_batch(**overrides: object) -> SimpleNamespace:
    fields: dict[str, object] = {
        "extend_prefix_lens_cpu": [0, 128],
        "extend_seq_lens_cpu": [300, 40],
        "return_logprob": False,
        "spec_algorithm": SpeculativeAlgorithm.NONE,
        "capture_hidden_mode": CaptureHiddenMode.NULL,
    }
    return SimpleNamespace(**(fields | overrides))


def test_builds_batch_spec_with_generated_rids() -> None:
    assert batch_from_forward_batch(forward_batch(), batch_index=7) == BatchSpec(
        7, (RequestSpec("r0", 0, 300), RequestSpec("r1", 128, 40)), None
    )


def test_uses_rids_when_present() -> None:
    spec = batch_from_forward_batch(forward_batch(rids=["a", "b"]))
    assert [r.rid for r in spec.requests] == ["a", "b"]


@pytest.mark.parametrize(
    ("algorithm", "name"),
    [
        (None, None),
        (SpeculativeAlgorithm.NONE, None),
        (SpeculativeAlgorithm.EAGLE, "EAGLE"),
        ("EAGLE3", "EAGLE3"),
        ("NONE", None),
    ],
)
def test_reads_the_speculative_algorithm(algorithm: object, name: str | None) -> None:
    assert batch_from_forward_batch(forward_batch(spec_algorithm=algorithm)).spec == name


@pytest.mark.parametrize(
    ("mode", "captured"),
    [
        (None, False),
        (CaptureHiddenMode.NULL, False),
        (CaptureHiddenMode.LAST, True),
        ("FULL", True),
        ("null", False),
        (SimpleNamespace(name="FULL"), True),
    ],
)
def test_reads_capture_hidden_mode(mode: object, captured: bool) -> None:
    spec = batch_from_forward_batch(forward_batch(capture_hidden_mode=mode))
    assert all(r.capture_hidden is captured for r in spec.requests)


def test_return_logprob_applies_to_every_request() -> None:
    spec = batch_from_forward_batch(forward_batch(return_logprob=True))
    assert all(r.return_logprob for r in spec.requests)


def test_missing_optional_fields_mean_off() -> None:
    fb = SimpleNamespace(extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[5])
    assert batch_from_forward_batch(fb) == BatchSpec(0, (RequestSpec("r0", 0, 5),))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"extend_prefix_lens_cpu": None}, "extend_prefix_lens_cpu is missing"),
        ({"extend_seq_lens_cpu": [1]}, "has 2 entries but extend_seq_lens_cpu has 1"),
        ({"extend_seq_lens_cpu": [3, 0]}, "request 'r1' needs .* extend_len=0"),
        ({"rids": ["a", "a"]}, "rids must be 2 distinct ids"),
    ],
)
def test_rejects_malformed_forward_batches(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(FlagError, match=match):
        batch_from_forward_batch(forward_batch(**overrides))


def test_reads_the_cp_minimum_from_a_launch_command() -> None:
    flags, ignored = from_sglang(NEWER + " --nsa-prefill-cp-min-tokens 4096")
    assert flags.nsa_prefill_cp_min_tokens == 4096
    assert "--nsa-prefill-cp-min-tokens" not in ignored and "4096" not in ignored
