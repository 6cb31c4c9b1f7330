"""Launch commands in every spelling an operator writes, and ``--config FILE.yaml`` merged as
SGLang 0.5.23 merges it (``server_args.py``, ``utils/server_args_config_parser.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flags import FlagError, read_sglang
from flags.sglang.launcher import split_launch
from flags.sglang.table import OptionKind, sglang_options
from flags.sglang.yaml_config import SglangConfigError, config_to_args, merge_config

ARGS = ("--model-path", "deepseek-ai/DeepSeek-V3.2", "--tp", "8")
TAIL = " ".join(ARGS)


@pytest.mark.parametrize(
    "launcher",
    [
        "python -m sglang.launch_server",
        "python3 -u -m sglang.launch_server",
        "python3.11 -O -B -m sglang.launch_server",
        "/usr/bin/python3.12 -X dev -W ignore -m sglang.launch_server",
        "/opt/venv/bin/python -Xfaulthandler -m sglang.launch_server",
        "python -um sglang.launch_server",
        "python -msglang.launch_server",
        "python --check-hash-based-pycs never -m sglang.launch_server",
        "sglang serve",
        "/usr/local/bin/sglang serve --model-type llm",
        "sglang serve --model-type=llm",
        "",
    ],
)
def test_every_launcher_hands_sglang_the_same_arguments(launcher: str) -> None:
    assert split_launch(f"{launcher} {TAIL}".strip()).argv == ARGS


def test_environment_assignments_and_env_prefix_set_the_server_environment() -> None:
    launch = split_launch(f"A=1 env B=2 C= python3 -m sglang.launch_server {TAIL}")
    assert launch.env == {"A": "1", "B": "2", "C": ""}
    assert launch.argv == ARGS


def test_sglang_serve_reads_a_leading_positional_model_path() -> None:
    launch = split_launch("sglang serve deepseek-ai/DeepSeek-V3.2 --tp 8")
    assert launch.argv == ARGS and launch.serve


@pytest.mark.parametrize(
    ("command", "match"),
    [
        ("python -c 'import sglang'", "python -c runs a program"),
        ("python3 serve.py --tp 8", "python runs 'serve.py'"),
        ("python -m vllm.entrypoints.api_server --tp 8", "-m vllm.entrypoints.api_server"),
        ("python -Q -m sglang.launch_server", "unknown python option -Q"),
        ("python3 -u", "without -m sglang.launch_server"),
        ("sglang version", "want sglang serve"),
        ("sglang serve --tp 8 --model-pa x", "--model-path is required"),
        ("sglang serve --config c.yaml", "--model-path is required"),
        ("sglang serve --model-type", "--model-type requires a value"),
        ("python -m sglang.launch_server 'unclosed", "cannot split"),
    ],
)
def test_refuses_what_is_not_an_sglang_launch(command: str, match: str) -> None:
    with pytest.raises(FlagError, match=match):
        split_launch(command)


def _yaml(tmp_path: Path, text: str, name: str = "server.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_yaml_options_come_first_so_the_command_line_wins(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "model-path: zai-org/GLM-5\ntp: 4\npage-size: 16\n")
    merged = merge_config(["--tp", "8", "--config", path, "--page-size", "32"])
    assert merged.argv[:6] == ("--model-path", "zai-org/GLM-5", "--tp", "4", "--page-size", "16")
    assert merged.config_options == 3
    imported = read_sglang(f"python -m sglang.launch_server --tp 8 --config {path} --page-size 32")
    assert imported.sglang.values["tp_size"] == 8
    assert imported.sglang.parsed_values["page_size"] == 32
    assert imported.sglang.given["model_path"] == f"--config {path}: --model-path"
    assert imported.sglang.given["tp_size"] == "--tp-size"


@pytest.mark.parametrize("name", ["server.YAML", "server.Yml"])
def test_a_yaml_suffix_in_any_case_is_a_config_file(tmp_path: Path, name: str) -> None:
    """``_validate_yaml_file`` compares ``path.suffix.lower()``
    (``sglang/srt/utils/server_args_config_parser.py``)."""
    path = _yaml(tmp_path, "tp: 4\n", name)
    assert merge_config(["--config", path]).argv == ("--tp", "4")


def test_yaml_values_become_options_as_sglang_writes_them() -> None:
    config = {
        "enable-prefill-cp": True,
        "disable-radix-cache": False,
        "trust-remote-code": True,
        "cuda-graph-bs-decode": [1, 2, 4],
        "allowed-media-domains": [],
        "cuda-graph-config": {"decode": {"max_bs": 32}},
        "mem-fraction-static": 0.85,
        "dsa-topk-backend": None,
    }
    assert config_to_args(config) == [
        "--enable-prefill-cp",
        "--trust-remote-code",
        "--cuda-graph-bs-decode",
        "1",
        "2",
        "4",
        "--cuda-graph-config",
        '{"decode": {"max_bs": 32}}',
        "--mem-fraction-static",
        "0.85",
        "--dsa-topk-backend",
        "None",
    ]


def test_a_value_for_an_option_without_one_is_refused() -> None:
    for key in ("enable_dp_attention", "disable-cuda-graph", "no_enable_tf32_matmul", "lora_paths"):
        with pytest.raises(SglangConfigError, match="unsupported config option"):
            config_to_args({key: True})


def test_every_switch_and_valued_option_is_a_yaml_key() -> None:
    for option in sglang_options():
        if option.kind in (OptionKind.STORE_TRUE, OptionKind.STORE) and option.dest != "config":
            config_to_args({option.dest: "1" if option.kind is OptionKind.STORE else True})


@pytest.mark.parametrize(
    ("text", "name", "match"),
    [
        ("- a\n- b\n", "server.yaml", "mapping"),
        ("tp: [8\n", "server.yaml", "cannot read it as YAML"),
        ('{"tp": 8}', "server.json", r"must be a YAML file \(.yaml or .yml\)"),
    ],
)
def test_a_bad_config_file_is_a_clear_error(
    tmp_path: Path, text: str, name: str, match: str
) -> None:
    path = _yaml(tmp_path, text, name)
    with pytest.raises(SglangConfigError, match=match):
        read_sglang(f"python -m sglang.launch_server --model-path x --config {path}")


def test_a_missing_or_repeated_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SglangConfigError, match="config file not found"):
        merge_config(["--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(SglangConfigError, match="only one allowed"):
        merge_config(["--config", "a.yaml", "--config", "b.yaml"])
    with pytest.raises(SglangConfigError, match="no config file specified"):
        merge_config(["--tp", "8", "--config"])


def test_an_empty_yaml_sets_nothing(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "# nothing\n")
    assert merge_config(["--tp", "8", "--config", path]).argv == ("--tp", "8")


def test_config_with_equals_is_not_merged_and_warns(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "tp: 4\n")
    imported = read_sglang(f"python -m sglang.launch_server --model-path x --config={path}")
    assert imported.sglang.values["tp_size"] == 1
    assert any("--config=" in w and "reads nothing" in w for w in imported.warnings)
