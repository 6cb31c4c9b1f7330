"""``cpkv migrate``: the rollout of an SGLang 0.5.23 launch command, read by the reader's rules.

- Every step from level 0 to the highest SGLang runs; phases 4-5 listed, never as commands.
- The KV-sharding step names each missing flag with the reader's problem code.
- Every runnable step's command starts under ``cpkv flags --from-sglang`` (SGLang's rules and
  cpkv's), for several starting commands.
- The needs come from the reader's rules: a rule taken out of the reader leaves its flags out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.migrate import MigrateOptions, Migration, migration_json, plan_migration
from cpkv.migrate.launch import Edit, EditKind, LaunchCommand, group_arguments
from cpkv.render.migrate import render_migration
from flags import read_sglang
from flags.sglang import kv_shard

runner = CliRunner()
V32 = "deepseek-ai/DeepSeek-V3.2"
V32_REPLICATED = (
    f"python -m sglang.launch_server --model-path {V32} --tp 8 --enable-prefill-cp "
    "--cp-strategy interleave --attn-cp-size 8 --kv-cache-dtype bf16 --page-size 1"
)
"""DeepSeek-V3.2 on 8 ranks, interleave CP 8, bf16 KV, page 1, no PD: replicated KV."""
STARTS = {
    "v32-interleave": V32_REPLICATED,
    "glm5-zigzag": "sglang serve --model-path zai-org/GLM-5-FP8 --tp 8 --enable-prefill-cp "
    "--cp-strategy zigzag --attn-cp-size 4",
    "v32-pd-prefill-nixl": f"sglang serve --model-path {V32} --tp 8 --enable-prefill-cp "
    "--cp-strategy interleave --disaggregation-mode prefill --disaggregation-transfer-backend nixl",
    "v32-kv-sharding": f"sglang serve --model-path {V32} --tp 8 --enable-prefill-cp "
    "--cp-strategy interleave --disaggregation-mode prefill --kv-cache-dtype fp8_e4m3 "
    "--dsa-prefill-backend trtllm --dsa-decode-backend trtllm --enable-kv-cache-sharding",
    "glm5-zigzag-dp-attention": "sglang serve --model-path zai-org/GLM-5-FP8 --tp 8 --dp 2 "
    "--enable-dp-attention --enable-prefill-cp --cp-strategy zigzag --attn-cp-size 2",
    "v32-plain-tp": f"sglang serve --model-path {V32} --tp 8",
    "v32-seed-names": f"python -m sglang.launch_server --model-path {V32} --tp 8 "
    "--enable-nsa-prefill-context-parallel --nsa-prefill-cp-mode round-robin-split "
    "--enable-nsa-prefill-cp-narrow-output --nsa-prefill-cp-min-tokens 512",
}
"""Starting commands that SGLang 0.5.23 starts, each a different road to KV sharding."""
KV_SHARDING_NEEDS = {
    "--disaggregation-mode prefill": "SGLANG_KV_SHARDING_PD_PREFILL_ONLY",
    "--dsa-prefill-backend trtllm": "SGLANG_KV_SHARDING_DSA_KERNELS",
    "--dsa-decode-backend trtllm": "SGLANG_KV_SHARDING_DSA_KERNELS",
    "--kv-cache-dtype fp8_e4m3": "SGLANG_KV_SHARDING_DSA_KERNELS",
}
"""What the V3.2 command lacks for SGLang's KV sharding, with the reader's code."""


def _migrate(*args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["migrate", *args, "--json"], env={"CPKV_CONFIG": None})
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}


def test_lists_every_step_from_replicated_kv_to_sharding_and_the_engine_only_phases() -> None:
    code, document = _migrate("--from-sglang", V32_REPLICATED)
    assert code == 0, document
    assert [s["levels"] for s in document["steps"]] == [[0], [1], [2, 3]]
    assert all(s["runnable"] for s in document["steps"])
    assert document["highest_runnable_level"] == 3
    assert [e["level"] for e in document["engine_only"]] == [4, 5]
    assert all("command" not in e for e in document["engine_only"])
    assert "cp_interleave_input_ids" in document["engine_only"][0]["why"]
    base, narrow, sharded = document["steps"]
    assert base["command"].startswith("sglang serve --model-path deepseek-ai/DeepSeek-V3.2")
    assert narrow["changes"]["added"] == [
        "CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT=1",
        "CPKV_SHADOW_RATE=0.01",
    ]
    assert base["plugin"] is None
    for step in (narrow, sharded):
        assert step["plugin"]["entry_point"] == {"group": "sglang.srt.plugins", "name": "cpkv"}
        assert step["plugin"]["install"] == "pip install cpkv"
    assert narrow["rollback"] == base["command"] and sharded["rollback"] == narrow["command"]
    assert base["rollback"] is None
    assert document["last_runnable_command"] == sharded["command"]


def test_the_kv_sharding_step_names_each_missing_flag_with_its_code() -> None:
    _, document = _migrate("--from-sglang", V32_REPLICATED)
    sharded = document["steps"][2]
    needs = {n["flag"]: n for n in sharded["needs"]}
    for flag, code in KV_SHARDING_NEEDS.items():
        assert code in needs[flag]["codes"], needs[flag]
        assert needs[flag]["source"].endswith("sglang/srt/arg_groups/kv_shard_hook.py")
    assert needs["--disaggregation-mode prefill"]["changes_deployment"].startswith(
        "the server becomes a PD prefill worker"
    )
    assert "numerics" in needs["--kv-cache-dtype fp8_e4m3"]["changes_deployment"]
    page = needs["--page-size 64"]
    assert page["already_resolved"] and page["found"] == 1
    added = set(sharded["changes"]["added"])
    assert {"--enable-kv-cache-sharding", "--disaggregation-mode prefill"} <= added
    assert {"from": "--kv-cache-dtype bf16", "to": "--kv-cache-dtype fp8_e4m3"} in sharded[
        "changes"
    ]["changed"]


def test_sharding_multiplies_tokens_per_deployment_by_the_cp_group() -> None:
    _, document = _migrate("--from-sglang", V32_REPLICATED, "--gpu-mem-gib", "141")
    base, _, sharded = document["steps"]
    assert base["capacity"]["level"] == 0 and sharded["capacity"]["level"] == 2
    assert sharded["capacity_before"] == document["steps"][1]["capacity"]
    rank = sharded["capacity"]["tokens_per_rank"]
    assert sharded["capacity"]["tokens_per_deployment"] == 8 * rank
    assert base["capacity"]["tokens_per_deployment"] == base["capacity"]["tokens_per_rank"]
    assert rank > base["capacity"]["tokens_per_rank"]  # fp8 KV: fewer bytes a token


@pytest.mark.parametrize("name", STARTS)
def test_every_runnable_command_starts_under_cpkv_flags(name: str) -> None:
    code, document = _migrate("--from-sglang", STARTS[name])
    assert code == 0, document
    assert document["highest_runnable_level"] == 3
    commands = [s["command"] for s in document["steps"] if s["runnable"]]
    assert commands[-1] == document["last_runnable_command"]
    for command in commands:
        result = runner.invoke(
            app, ["flags", "--from-sglang", command, "--json"], env={"CPKV_CONFIG": None}
        )
        checked = json.loads(result.stdout)
        assert result.exit_code == 0 and checked["problems"] == [], (command, checked["problems"])
    last = json.loads(runner.invoke(app, ["flags", "--from-sglang", commands[-1], "--json"]).stdout)
    assert set(last["enabled_phases"]) == {1, 2}
    assert last["sglang"]["resolved"]["enable_kv_cache_sharding"] is True


@pytest.mark.parametrize(
    ("name", "levels"),
    [("v32-interleave", []), ("v32-seed-names", [1]), ("v32-kv-sharding", [2, 3])],
)
def test_given_levels_are_the_levels_the_command_already_runs(name: str, levels: list[int]) -> None:
    """None on replicated KV; 1 with narrow output on; 2-3 under SGLang's KV sharding."""
    code, document = _migrate("--from-sglang", STARTS[name])
    assert code == 0, document
    assert document["given_levels"] == levels


def test_needs_come_from_the_readers_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the reader reports for the step's command plus KV sharding is what it needs; a
    DSA rule taken out of the reader takes its flags out of the answer."""
    migration = plan_migration(V32_REPLICATED, MigrateOptions())
    assert isinstance(migration, Migration)
    narrow = migration.steps[1].settled
    assert narrow is not None
    codes = {
        str(p.code)
        for p in read_sglang(narrow.command.text + " --enable-kv-cache-sharding").problems
    }
    needed = migration.steps[2].settled
    assert needed is not None
    assert codes == {c for n in needed.needs if not n.resolved for c in n.codes}
    monkeypatch.setattr(kv_shard, "_dsa", lambda state, index_kpool, compressed: None)
    without = plan_migration(V32_REPLICATED, MigrateOptions())
    assert isinstance(without, Migration) and without.steps[2].settled is not None
    flags = [n.edit.text for n in without.steps[2].settled.needs]
    assert flags == ["--disaggregation-mode prefill"]


def test_glm5_zigzag_keeps_its_cp_size_when_interleave_replaces_it() -> None:
    _, document = _migrate("--from-sglang", STARTS["glm5-zigzag"])
    base, _, sharded = document["steps"]
    assert base["capacity"]["cp_size"] == sharded["capacity"]["cp_size"] == 8
    changed = {c["from"]: c["to"] for c in sharded["changes"]["changed"]}
    assert changed == {
        "--cp-strategy zigzag": "--cp-strategy interleave",
        "--attn-cp-size 4": "--attn-cp-size 8",
    }
    moved = {c["field"] for c in sharded["resolves_differently"]}
    assert {"ep_size", "moe_a2a_backend"} <= moved


def test_a_decode_worker_stops_at_level_0_with_the_rule_that_stops_it() -> None:
    code, document = _migrate(
        "--from-sglang", f"sglang serve --model-path {V32} --tp 8 --disaggregation-mode decode"
    )
    assert code == 0
    base, narrow, sharded = document["steps"]
    assert base["runnable"] and not narrow["runnable"] and narrow["command"] is None
    assert [u["code"] for u in narrow["unmet"]] == ["SGLANG_CP_ON_DECODE"]
    assert sharded["blocked_by_step"] == 1 and sharded["command"] is None
    assert document["highest_runnable_level"] == 0


def test_refuses_a_command_sglang_would_refuse_with_every_problem() -> None:
    refused = f"sglang serve --model-path {V32} --tp 16 --enable-prefill-cp --cp-strategy zigzag"
    code, document = _migrate("--from-sglang", refused)
    assert code == 1 and document["refused"] and not document["ok"]
    codes = {p["code"] for p in document["problems"]}
    assert {"SGLANG_CP_STRATEGY_UNSUPPORTED", "SGLANG_CP_TP_ABOVE_8"} <= codes
    text = runner.invoke(app, ["migrate", "--from-sglang", refused])
    assert text.exit_code == 1 and "SGLANG_CP_TP_ABOVE_8" in text.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--from-sglang", f"sglang serve --model-path {V32} --cp-stratgy interleave"],
        ["--from-sglang", V32_REPLICATED, "--shadow-rate", "2"],
        ["--from-sglang", V32_REPLICATED, "--model", "llama"],
        ["--from-sglang", V32_REPLICATED, "--gpu-mem-gib", "0"],
    ],
    ids=["typo", "shadow-rate", "model", "gpu"],
)
def test_bad_input_exits_2_with_a_message(args: list[str]) -> None:
    result = runner.invoke(app, ["migrate", *args])
    assert result.exit_code == 2 and "error:" in result.stderr


def test_text_output_highlights_what_each_step_adds_and_changes() -> None:
    migration = plan_migration(V32_REPLICATED, MigrateOptions())
    assert isinstance(migration, Migration)
    console = Console(record=True, width=400, force_terminal=True, color_system="standard")
    render_migration(console, migration_json(migration))
    styled = console.export_text(styles=True, clear=False)
    assert "\x1b[1;32m--enable-kv-cache-sharding\x1b[0m" in styled
    assert "\x1b[1;33m--kv-cache-dtype fp8_e4m3\x1b[0m" in styled
    assert "\x1b[9;31m--kv-cache-dtype bf16\x1b[0m" in styled
    plain = console.export_text()
    assert "level 4 · page-aligned split: no SGLang step" in plain


def test_groups_options_as_sglangs_parser_reads_them() -> None:
    argv = [
        "--model-path", V32, "--tp", "8", "--cp-strat", "interleave", "--page-size=64",
        "--chunked-prefill-size", "-1", "--cuda-graph-bs-decode", "1", "2", "4",
        "--enable-prefill-cp", "--schedule-conservativeness", "-.5",
        "--bucket-time-to-first-token", "-0.5", "-.25", "1.5", "--tp-size", "8",
    ]  # fmt: skip
    groups = group_arguments(argv)
    assert [g.dest for g in groups] == [
        "model_path", "tp_size", "cp_strategy", "page_size", "chunked_prefill_size",
        "cuda_graph_bs_decode", "enable_prefill_cp", "schedule_conservativeness",
        "bucket_time_to_first_token", "tp_size",
    ]  # fmt: skip
    assert groups[5].tokens == ("--cuda-graph-bs-decode", "1", "2", "4")
    # NOTE: negative numbers, floats too, are values, as argparse reads them.
    assert groups[7].tokens == ("--schedule-conservativeness", "-.5")
    assert groups[8].tokens[1:] == ("-0.5", "-.25", "1.5")
    command = LaunchCommand.from_parts({"A": "x y"}, argv)
    env, again = command.env_dict, read_sglang(command.text)
    assert env == {"A": "x y"} and again.sglang.given["page_size"] == "--page-size"


def test_a_feature_kv_sharding_refuses_is_dropped_whole_and_said_so() -> None:
    eagle = (
        f"sglang serve --model-path {V32} --tp 8 --enable-prefill-cp --cp-strategy interleave "
        "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4"
    )
    _, document = _migrate("--from-sglang", eagle)
    sharded = document["steps"][2]
    assert sharded["runnable"]
    assert sharded["changes"]["removed"] == [
        "--speculative-algorithm EAGLE",
        "--speculative-num-steps 3",
        "--speculative-eagle-topk 1",
        "--speculative-num-draft-tokens 4",
    ]
    dropped = [n for n in sharded["needs"] if n["codes"] == ["SGLANG_KV_SHARDING_FEATURE"]]
    assert dropped and all("off on this worker" in n["changes_deployment"] for n in dropped)


def test_a_command_that_lists_its_plugins_gets_cpkv_added() -> None:
    _, document = _migrate("--from-sglang", f"SGLANG_PLUGINS=foo {V32_REPLICATED}")
    narrow = document["steps"][1]
    assert {"from": "SGLANG_PLUGINS=foo", "to": "SGLANG_PLUGINS=foo,cpkv"} in narrow["changes"][
        "changed"
    ]
    assert narrow["plugin"]["loading"].startswith("SGLANG_PLUGINS=foo,cpkv")


def test_an_edit_replaces_an_option_where_the_command_first_gave_it() -> None:
    """A repeated option is read as argparse reads it (the last one counts); setting it puts
    the new value where the command first gave it and drops the repeats, so the other
    options keep their places."""
    argv = ["--model-path", V32, "--tp", "4", "--page-size", "1", "--tp", "8"]
    command = LaunchCommand.from_parts({}, argv)
    tp = command.group("tp_size")
    assert tp is not None and tp.tokens == ("--tp", "8")
    edited = command.apply(Edit(EditKind.SET, "tp_size", "2"))
    assert edited.argv == ("--model-path", V32, "--tp-size", "2", "--page-size", "1")


def test_the_commands_own_shadow_rate_is_kept_when_none_is_given() -> None:
    """Without ``--shadow-rate`` the steps keep the ``CPKV_SHADOW_RATE`` the command sets
    (level 0 drops it; the plugin's step sets it back), not the default 0.01."""
    code, document = _migrate("--from-sglang", f"CPKV_SHADOW_RATE=0.05 {V32_REPLICATED}")
    assert code == 0, document
    assert document["shadow_rate"] == 0.05
    base, narrow, sharded = document["steps"]
    assert "CPKV_SHADOW_RATE" not in base["env"]
    assert narrow["env"]["CPKV_SHADOW_RATE"] == sharded["env"]["CPKV_SHADOW_RATE"] == "0.05"


def test_a_flag_two_rules_want_names_both_codes() -> None:
    """A nixl PD prefill worker needs Mooncake for SGLang's DSA KV-sharding transfer rule and
    for phase 2's start-up contract: the one flag carries both codes."""
    _, document = _migrate("--from-sglang", STARTS["v32-pd-prefill-nixl"])
    needs = {n["flag"]: n for n in document["steps"][2]["needs"]}
    mooncake = needs["--disaggregation-transfer-backend mooncake"]
    assert mooncake["codes"] == ["SGLANG_KV_SHARDING_DSA_TRANSFER", "STARTUP_CONTRACT"]
