"""SGLang 0.5.23's memory defaults (``memory_hook.py``) and its boolean environment values
(``environ.py``), on the H200 cpkv's reader models: the issue's figures, by hand."""

from __future__ import annotations

import pytest

from flags import read_sglang
from flags.sglang.environ import env_bool
from flags.sglang.memory import H200_MIB, default_chunk_and_decode_bs, planned_memory

V32 = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8"
KV_SHARDING = (
    " --enable-prefill-cp --cp-strategy interleave --disaggregation-mode prefill"
    " --enable-kv-cache-sharding --dsa-prefill-backend trtllm --dsa-decode-backend trtllm"
    " --kv-cache-dtype fp8_e4m3"
)


def _resolved(args: str) -> dict[str, object]:
    imported = read_sglang(V32 + args)
    assert not imported.problems, [str(p) for p in imported.problems]
    return imported.sglang.values


@pytest.mark.parametrize(
    ("args", "reserve_mib"),
    [
        ("", 512 + 8192 * 1.5 + 1024 + 512 * 2),
        (" --pp-size 2", 512 + 8192 * 1.5 + 2048 + 512 * 2),
        (" --disaggregation-mode prefill", 512 + 8192 * 1.5 + 1024),
        (" --disaggregation-mode decode", 10 * 1024),
        (" --moe-a2a-backend deepep", 512 + 8192 * 1.5 + 1024 + 512 * 2 + 2048),
        (" --cuda-graph-max-bs-decode 128", 512 + 8192 * 1.5 + 1024 + 128 * 2),
        (" --disable-cuda-graph", 512 + 8192 * 1.5 + 1024),
        (" --attn-dp-size 2", 512 + 8192 * 1.5 + 1024 + 512 * (2 + 2 * 3 + 2 * 1.5)),
        (" --cuda-graph-backend-prefill breakable", 512 + 8192 * 1.5 + 1024 + 1024 + 1536),
    ],
)
def test_the_fraction_leaves_sglang_s_reserve(args: str, reserve_mib: float) -> None:
    expected = round((H200_MIB - reserve_mib) / H200_MIB, 3)
    assert _resolved(args)["mem_fraction_static"] == expected


def test_the_issue_s_figures() -> None:
    assert _resolved(" --pp-size 2")["mem_fraction_static"] == 0.89
    assert _resolved(" --disaggregation-mode prefill")["mem_fraction_static"] == 0.904
    assert _resolved(" --disaggregation-mode decode")["mem_fraction_static"] == 0.929
    rounded = _resolved(KV_SHARDING + " --chunked-prefill-size 4097")
    assert rounded["chunked_prefill_size"] == 4160
    assert rounded["mem_fraction_static"] == 0.929 - 1.5 * (4160 - 4097) / H200_MIB


def test_a_given_fraction_is_kept() -> None:
    values = _resolved(KV_SHARDING + " --chunked-prefill-size 4097 --mem-fraction-static 0.8")
    assert values["mem_fraction_static"] == 0.8


def test_attention_dp_divides_the_chunk_after_the_memory_rule() -> None:
    values = _resolved(" --attn-dp-size 2")
    assert values["chunked_prefill_size"] == 4096
    given = _resolved(" --attn-dp-size 4 --chunked-prefill-size 6000")
    assert given["chunked_prefill_size"] == 1500


def test_gpu_classes_pick_sglang_s_chunk_and_decode_graph() -> None:
    assert default_chunk_and_decode_bs(H200_MIB, 8) == (8192, 512)
    assert default_chunk_and_decode_bs(H200_MIB, 2) == (8192, 256)
    assert default_chunk_and_decode_bs(80 * 1024 - 1, 8) == (8192, 512)
    assert default_chunk_and_decode_bs(180 * 1024, 8) == (16384, 512)
    assert default_chunk_and_decode_bs(40 * 1024, 2) == (4096, 32)
    assert planned_memory(H200_MIB, 8).mem_fraction_static == 0.897


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        *[("1", True), ("true", True), ("YES", True), ("y", True)],
        *[("0", False), ("N", False), ("on", False), ("off", False), ("", False)],
        ("enabled", False),
    ],
)
def test_environment_booleans_follow_sglang_s_table(raw: str, value: bool) -> None:
    assert env_bool({"SGLANG_DISAGG_STAGING_BUFFER": raw}, "SGLANG_DISAGG_STAGING_BUFFER") is value


def test_staging_buffer_y_is_on_and_refuses_a_backend_without_staging() -> None:
    command = "SGLANG_DISAGG_STAGING_BUFFER={} " + V32 + " --disaggregation-mode prefill"
    command += " --disaggregation-transfer-backend mori"
    assert [p.code.value for p in read_sglang(command.format("y")).problems] == [
        "SGLANG_PD_TRANSFER_BACKEND"
    ]
    ignored = read_sglang(command.format("on"))
    assert not ignored.problems
    assert any("not a boolean SGLang reads" in note for note in ignored.resolved.notes)
