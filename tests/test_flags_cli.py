"""``cpkv flags``, ``cpkv enable`` and ``cpkv disable`` through typer's runner and ``--json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cpkv.commands.flags import register
from flags import FLAG_SPECS

runner = CliRunner()
CP_ON = "enable-nsa-prefill-context-parallel = true\nattn-cp-size = 4\n"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for spec in FLAG_SPECS.values():
        monkeypatch.delenv(spec.env, raising=False)
    monkeypatch.delenv("CPKV_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def invoke(app: typer.Typer, *args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_flags_json_shows_values_sources_and_phases(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cpkv.toml").write_text(CP_ON + "enable-nsa-prefill-cp-shared-kv = true\n")
    monkeypatch.setenv("CPKV_PAGE_SIZE", "16")
    code, doc = invoke(app, "flags", "--set", "attn-cp-size=8")
    assert code == 0 and doc["ok"] is True and doc["problems"] == []
    assert doc["flags"]["attn_cp_size"] == {
        "value": 8,
        "source": "cli",
        "flag": "--attn-cp-size",
        "env": "CPKV_ATTN_CP_SIZE",
        "toml": "attn-cp-size",
    }
    assert doc["flags"]["page_size"]["source"] == "env:CPKV_PAGE_SIZE"
    assert doc["flags"]["enable_nsa_prefill_cp_shared_kv"]["source"] == "config:cpkv.toml"
    assert doc["flags"]["nsa_prefill_cp_mode"] == {
        "value": "in-seq-split",
        "source": "default",
        "flag": "--nsa-prefill-cp-mode",
        "env": "CPKV_NSA_PREFILL_CP_MODE",
        "toml": "nsa-prefill-cp-mode",
    }
    assert doc["enabled_phases"] == [2] and doc["max_phase"] is None
    assert doc["config"] == {"path": "cpkv.toml", "origin": "default", "found": True}


def test_flags_exits_1_and_lists_every_problem(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "p.toml"
    config.write_text("enable-nsa-prefill-cp-current-reuse = true\n")
    monkeypatch.setenv("CPKV_MAX_PHASE", "7")
    code, doc = invoke(app, "flags", "--config", str(config))
    assert code == 1 and doc["ok"] is False
    assert [p["text"] for p in doc["problems"]] == [
        "MAX_PHASE_OUT_OF_RANGE CPKV_MAX_PHASE=7",
        "PHASE_WITHOUT_CP phase=3",
        "NEEDS_DISABLED phase=3 needs=2",
    ]
    assert doc["problems"][2]["values"] == {"phase": 3, "needs": 2}
    assert doc["flagged_phases"] == [3] and doc["enabled_phases"] == []


def test_flags_warns_when_debug_checks_are_on(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_DEBUG_CP_SHARED_KV", "true")
    _, doc = invoke(app, "flags")
    assert "SGLANG_DEBUG_CP_SHARED_KV is on" in doc["warnings"][0]


def test_flags_from_sglang_shows_flags_ignored_args_and_problems(app: typer.Typer) -> None:
    args = (
        "python -m sglang.launch_server --model-path X --tp 8 --enable-prefill-cp --attn-cp-size 8 "
        "--cp-strategy interleave --enable-nsa-prefill-cp-page-aligned-split"
    )
    code, doc = invoke(app, "flags", "--from-sglang", args + " --trust-remote-code")
    assert code == 1
    assert doc["config"] is None
    assert doc["ignored_args"] == ["--trust-remote-code"]
    assert doc["flags"]["nsa_prefill_cp_mode"]["source"] == "sglang:--cp-strategy"
    assert doc["enabled_phases"] == [4]
    # NOTE: interleave (round-robin-split) has a page-aligned split: only the need is missing.
    assert [p["code"] for p in doc["problems"]] == ["NEEDS_DISABLED"]
    assert (
        "--enable-nsa-prefill-cp-page-aligned-split is not an SGLang option" in doc["warnings"][0]
    )
    assert doc["sglang"]["version"] == "0.5.23" and doc["sglang"]["cp_size"] == 8


SEED_LAUNCH = (
    "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 "
    "--enable-nsa-prefill-context-parallel --nsa-prefill-cp-mode round-robin-split"
)


def test_flags_from_sglang_warns_of_a_seed_name_naming_its_replacement(app: typer.Typer) -> None:
    code, doc = invoke(app, "flags", "--from-sglang", SEED_LAUNCH)
    assert code == 0, doc["problems"]
    assert any("--enable-prefill-cp" in w for w in doc["warnings"]), doc["warnings"]
    assert any("--cp-strategy" in w for w in doc["warnings"]), doc["warnings"]
    assert doc["flags"]["attn_cp_size"]["value"] == 8


def test_flags_from_sglang_lists_the_rules_sglang_refuses_with_their_source(
    app: typer.Typer,
) -> None:
    launch = SEED_LAUNCH.replace("round-robin-split", "in-seq-split") + " --tp 16"
    code, doc = invoke(app, "flags", "--from-sglang", launch)
    assert code == 1
    assert [(p["code"], p["source"]) for p in doc["problems"]] == [
        (
            "SGLANG_CP_TP_ABOVE_8",
            "sglang 0.5.23 sglang/srt/arg_groups/model_overrides/deepseek_v2.py",
        ),
        ("SGLANG_CP_STRATEGY_UNSUPPORTED", "sglang 0.5.23 sglang/srt/arg_groups/parallel_hook.py"),
    ]
    result = runner.invoke(app, ["flags", "--from-sglang", launch])
    assert "[sglang 0.5.23 sglang/srt/arg_groups/parallel_hook.py]" in result.stdout


def test_flags_from_sglang_refuses_a_typo_naming_the_option(app: typer.Typer) -> None:
    launch = SEED_LAUNCH.replace("--nsa-prefill-cp-mode round-robin-split", "--cp-stratgy zigzag")
    result = runner.invoke(app, ["flags", "--from-sglang", launch])
    assert result.exit_code == 2
    assert "did you mean --cp-strategy?" in result.stderr


def test_flags_human_output_names_sources(app: typer.Typer, tmp_path: Path) -> None:
    (tmp_path / "cpkv.toml").write_text(CP_ON)
    result = runner.invoke(app, ["flags"])
    assert result.exit_code == 0, result.output
    assert "config:cpkv.toml" in result.stdout and "start-up checks: ok" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["flags", "--config", "missing.toml"], "does not exist"),
        (["flags", "--set", "page-size=big"], "--page-size"),
        (["flags", "--from-sglang", "--tp 8", "--config", "x.toml"], "drop --config"),
        (["enable", "6"], "phase must be a number 1..5, got 6"),
        (["disable", "0"], "phase must be a number 1..5, got 0"),
    ],
)
def test_bad_input_exits_2_with_a_message(app: typer.Typer, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_malformed_config_exits_2_naming_the_key(app: typer.Typer, tmp_path: Path) -> None:
    (tmp_path / "cpkv.toml").write_text("attn_cp_size = 2\n")
    result = runner.invoke(app, ["enable", "1"])
    assert result.exit_code == 2
    assert "unknown key 'attn_cp_size'" in result.stderr


def test_enable_then_disable_round_trip(app: typer.Typer, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CP_ON)
    code, doc = invoke(app, "enable", "5", "--with-needs", "--config", str(config))
    assert code == 0 and doc["applied"] is True and doc["enabled_phases"] == [2, 4, 5]
    code, doc = invoke(app, "disable", "4", "--config", str(config))
    assert code == 1 and doc["refused"] is True
    assert doc["reasons"] == ["NEEDS_DISABLED phase=5 needs=4"]
    code, doc = invoke(app, "disable", "4", "--cascade", "--config", str(config))
    assert code == 0 and doc["enabled_phases"] == [2]
    assert doc["writes"] == {
        "enable-nsa-prefill-cp-page-aligned-split": False,
        "enable-nsa-prefill-cp-compute-owner-write": False,
    }


def test_refused_enable_exits_1_and_leaves_file_identical(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "env.toml"
    config.write_text(CP_ON + "# keep me\n")
    monkeypatch.setenv("CPKV_CONFIG", str(config))
    before = config.read_bytes()
    result = runner.invoke(app, ["enable", "3"])
    assert result.exit_code == 1
    assert "NEEDS_DISABLED phase=3 needs=2" in result.stderr
    assert "--with-needs" in result.stderr
    assert config.read_bytes() == before


def test_enable_creates_the_default_config_file(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CPKV_ENABLE_NSA_PREFILL_CONTEXT_PARALLEL", "1")
    result = runner.invoke(app, ["enable", "1"])
    assert result.exit_code == 0, result.output
    assert "enable-nsa-prefill-cp-narrow-output = true" in (tmp_path / "cpkv.toml").read_text()
    assert "enabled phases: 1" in result.stdout


def test_flags_from_sglang_follows_the_model_preset_given(app: typer.Typer) -> None:
    launch = "python -m sglang.launch_server --model-path /models/ckpt --tp 8 --enable-prefill-cp"
    launch += " --cp-strategy zigzag"
    code, doc = invoke(app, "flags", "--from-sglang", launch)
    assert (code, doc["sglang"]["cp_size"], doc["sglang"]["model"]) == (0, 1, None)
    assert any("name the model with --model PRESET" in note for note in doc["notes"])
    code, doc = invoke(app, "flags", "--from-sglang", launch, "--model", "deepseek-v3.2")
    assert code == 1 and doc["sglang"]["model"] == "DeepseekV32ForCausalLM"
    assert [p["code"] for p in doc["problems"]] == ["SGLANG_CP_STRATEGY_UNSUPPORTED"]
    result = runner.invoke(app, ["flags", "--model", "glm-5"])
    assert result.exit_code == 2 and "add --from-sglang" in result.stderr
