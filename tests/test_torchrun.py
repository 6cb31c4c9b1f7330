"""CP ranks started by torchrun: two agents as two "nodes" on loopback, and the start-up errors.

The two-agent run is the real thing: ``python -m torch.distributed.run --nnodes 2
--nproc-per-node 2`` twice, a c10d rendezvous on 127.0.0.1, each worker one rank of
``cpkv verify`` (env:// rendezvous), rank 0 printing the report.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv_core.dist import TorchrunEnv, torchrun_env
from flags import FLAG_SPECS

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

AGENT_TIMEOUT_S = 120.0
"""Bound on the whole two-agent run (it takes ~15 s on two cores)."""

TORCHRUN_ENV = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29511",
    "TORCHELASTIC_RUN_ID": "cpkv-test",
}
"""What torchrun's agent hands the second of two workers."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_env() -> dict[str, str]:
    """This environment without cpkv's flag variables, a config file or torchrun's own."""
    drop = {spec.env for spec in FLAG_SPECS.values()} | {"CPKV_CONFIG", *TORCHRUN_ENV}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return env | {"PYTHONPATH": str(ROOT)}


def _agent(node: int, port: int, log_dir: Path) -> subprocess.Popen[str]:
    """One torchrun agent; its logs go to ``log_dir`` (else it leaves a ``torchelastic_*``
    folder in the temp folder)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--log-dir",
        str(log_dir / f"node{node}"),
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"cpkv-test-{port}",
        "--rdzv-conf",
        f"is_host={int(node == 0)},join_timeout=60",
        "--max-restarts",
        "0",
        "-m",
        "cpkv.cli",
        "verify",
        "tests/data/mixed.jsonl",
        "--phases",
        "all",
        "--cp-size",
        "4",
        "--page-size",
        "4",
        "--json",
    ]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.gloo
def test_two_torchrun_agents_on_loopback_verify_every_level(tmp_path: Path) -> None:
    port = _free_port()
    agents = [_agent(node, port, tmp_path) for node in (0, 1)]
    outputs: list[tuple[int, str, str]] = []
    try:
        for agent in agents:
            stdout, stderr = agent.communicate(timeout=AGENT_TIMEOUT_S)
            outputs.append((agent.returncode, stdout, stderr))
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    for code, _, stderr in outputs:
        assert code == 0, stderr[-3000:]
    printed = [stdout for _, stdout, _ in outputs if stdout.strip()]
    assert len(printed) == 1, "exactly one agent hosts rank 0, and only rank 0 prints"
    doc = json.loads(printed[0])
    assert doc["ok"] is True
    assert [lv["level"] for lv in doc["levels"]] == [0, 1, 2, 3, 4, 5]
    assert all(lv["ok"] and lv["max_abs_diff"] == 0.0 for lv in doc["levels"])
    assert len(doc["batches"]) == 4 * 6
    assert all(len(b["kv_bytes_by_rank"]) == 4 for b in doc["batches"])


def test_torchrun_env_reads_the_variables_the_agent_sets() -> None:
    assert torchrun_env(TORCHRUN_ENV) == TorchrunEnv(1, 2, 1, "127.0.0.1", 29511, "cpkv-test")
    assert torchrun_env({"PATH": "/bin"}) is None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"MASTER_PORT": ""}, r"incomplete: MASTER_PORT not set"),
        ({"RANK": "one"}, r"RANK='one' is not an integer"),
        ({"RANK": "2"}, r"RANK=2 must be < WORLD_SIZE=2"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE=0 must be >= 1"),
    ],
)
def test_torchrun_env_names_a_missing_or_malformed_variable(
    change: dict[str, str], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        torchrun_env(TORCHRUN_ENV | change)


def _verify(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    base = ["verify", "tests/data/mixed.jsonl", "--phases", "all", "--page-size", "4"]
    clean = {name: None for name in (*TORCHRUN_ENV, "CPKV_LAUNCHER")}
    result = runner.invoke(app, [*base, *args], env=clean | (env or {}))  # type: ignore[arg-type]
    return result.exit_code, result.stderr


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative trace paths resolve; no config file from the caller's environment."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("CPKV_CONFIG", raising=False)


def test_rejects_torchrun_world_size_other_than_cp_size() -> None:
    code, stderr = _verify("--cp-size", "4", env=TORCHRUN_ENV)
    assert code == 2
    assert "torchrun started WORLD_SIZE=2 ranks but --cp-size is 4" in " ".join(stderr.split())


def test_rejects_launcher_torchrun_without_its_environment() -> None:
    code, stderr = _verify("--cp-size", "2", "--launcher", "torchrun")
    assert code == 2 and "needs torchrun's environment" in stderr
    code, stderr = _verify("--cp-size", "2", env={"CPKV_LAUNCHER": "torchrun"})
    assert code == 2 and "needs torchrun's environment" in stderr


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--launcher", "spawn"), "--launcher spawn under torchrun"),
        (("--backend", "local"), "drop --backend local"),
        (("--device", "meta"), "dry run in one process"),
    ],
)
def test_rejects_what_a_torchrun_rank_cannot_run(args: tuple[str, ...], match: str) -> None:
    code, stderr = _verify("--cp-size", "2", *args, env=TORCHRUN_ENV)
    assert code == 2 and match in " ".join(stderr.split())


def test_pd_refuses_to_run_under_torchrun() -> None:
    result = runner.invoke(
        app,
        ["pd", "tests/data/pd_small.jsonl", "--cp-size", "2", "--page-size", "4"],
        env=TORCHRUN_ENV,
    )
    assert result.exit_code == 2
    assert "cpkv pd starts its own ranks" in " ".join(result.stderr.split())
