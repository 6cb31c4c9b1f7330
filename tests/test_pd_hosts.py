"""PD peers are addressed by the configured host names, not a hard-coded loopback.

127.0.0.2 and 127.0.0.3 are loopback addresses other than the default 127.0.0.1: a value
that did not reach a socket or a transfer engine would leave 127.0.0.1 in its place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpkv.run.pd import PdHosts, PdJob, run_pd
from cpkv_core.config import model_preset
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.decode_group import DecodeSpec
from cpkv_core.traces.trace import load_trace
from flags import FlagSet, ProblemCode, check_flags, parse_config_text
from phases.ids import PhaseId
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
DECODE_HOST, PREFILL_HOST = "127.0.0.2", "127.0.0.3"


def test_decode_server_binds_and_names_its_session_by_the_configured_host() -> None:
    spec = DecodeSpec(TINY, 4, make_deploy().index_k_dtype, 8, 5.0)
    server = DecodeServer(spec, b"k", host=DECODE_HOST)
    try:
        assert server.address[0] == DECODE_HOST
        assert server.transport.session.startswith(f"{DECODE_HOST}:")
    finally:
        server.close()


@pytest.mark.gloo
def test_pd_runs_with_decode_and_prefill_on_configured_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill ranks and the decode server each start their transfer engine on their own
    host; the engines' logs (one file a process) name where each listened."""
    monkeypatch.setenv("CPKV_TRANSFER_LOG_DIR", str(tmp_path))
    deploy = make_deploy(2, 4)
    job = PdJob(deploy, load_trace(DATA / "pd_small.jsonl", 4).batches, (2,), frozenset(PhaseId))
    (report,), _ = run_pd(TINY, [job], hosts=PdHosts(DECODE_HOST, PREFILL_HOST))
    assert report.ok, report.errors or [r for r in report.requests if not r.ok]
    logs = [path.read_text(errors="replace") for path in tmp_path.glob("cpkv-transfer-*.log")]
    listening = sorted(
        line.rsplit("listening on ", 1)[1].split(":")[0]
        for text in logs
        for line in text.splitlines()
        if "listening on " in line
    )
    assert listening == [DECODE_HOST, PREFILL_HOST, PREFILL_HOST]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "node a"])
def test_rejects_a_pd_host_peers_cannot_dial(host: str) -> None:
    problems = check_flags(FlagSet(pd_host=host))
    assert [p.code for p in problems] == [ProblemCode.PD_HOST_INVALID]
    assert "--pd-host" in problems[0].hint


def test_pd_hosts_come_from_the_config_file() -> None:
    values = parse_config_text(
        'pd-host = "decode-0.example"\npd-local-host = "10.0.0.7"\n', Path("c")
    )
    assert values == {"pd_host": "decode-0.example", "pd_local_host": "10.0.0.7"}
