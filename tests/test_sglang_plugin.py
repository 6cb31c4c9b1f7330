"""Phase 1 inside SGLang 0.5.23's own CP tail (``EagerRunner._execute_extend_cp`` ->
``cp_gather_after_forward`` -> ``LogitsProcessor``), on CPU ranks: the narrow gather moves
``cp x bs`` rows, and every logit and kept row equals SGLang's as shipped, bit for bit;
each fallback keeps the stock gather and says why (jobs in ``sglang_cases``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from typer.main import get_command

from cpkv.cli import app as cli_app
from cpkv_sglang.cpu.ranks import TailJob, run_ranks
from tests.sglang_cases import (
    FALLBACKS,
    INNER_GATHER,
    JOBS,
    MUST_SHOW,
    NARROW,
    decision_log,
    decisions,
    random_batches,
    reports,
    same_bits,
)

pytestmark = [pytest.mark.gloo, pytest.mark.xdist_group("sglang")]


@pytest.mark.parametrize("strategy", ["interleave", "zigzag"])
def test_cp4_bs8_gathers_32_rows_with_logits_bitwise_equal_to_stock(strategy: str) -> None:
    stock, plugin = reports(f"{strategy}-4", False), reports(f"{strategy}-4", True)
    for s, p in zip(stock, plugin, strict=True):
        assert s.results[0].gathered_rows[0] >= MUST_SHOW.num_tokens == 306
        assert p.results[0].gathered_rows == (32,)
        assert same_bits(p.results[0].logits, s.results[0].logits)
        assert same_bits(p.results[0].pruned, s.results[0].pruned)


@pytest.mark.parametrize("name", list(JOBS))
def test_every_batch_keeps_stock_rows_and_logits_bit_for_bit_on_every_rank(name: str) -> None:
    stock, plugin = reports(name, False), reports(name, True)
    for s, p in zip(stock, plugin, strict=True):
        for shape, sr, pr in zip(JOBS[name][2], s.results, p.results, strict=True):
            assert same_bits(pr.logits, sr.logits), (p.rank, shape)
            assert same_bits(pr.pruned, sr.pruned), (p.rank, shape)
            assert pr.split == sr.split, (p.rank, shape)


@pytest.mark.parametrize("name", list(JOBS))
def test_phase_1_batches_gather_cp_x_bs_rows_and_the_others_as_stock(name: str) -> None:
    _, cp_size, batches = JOBS[name]
    stock, plugin = reports(name, False)[0], reports(name, True)[0]
    narrowed = 0
    rows = zip(batches, stock.results, plugin.results, decisions(plugin), strict=True)
    for shape, sr, pr, record in rows:
        if record["phase"] == 1 and not shape.bcg:
            narrowed += 1
            inner = sr.gathered_rows[:-1]  # NOTE: a gather inside the body stays whole
            assert pr.gathered_rows == (*inner, cp_size * len(shape.extend_lens)), shape
            assert len(inner) == (name in INNER_GATHER), shape
        else:
            assert pr.gathered_rows == sr.gathered_rows, shape
    assert narrowed >= 3, "the job must narrow some batches"


@pytest.mark.parametrize("name", ["interleave-4", "zigzag-4"])
def test_logprobs_full_capture_eagle_and_bcg_keep_the_stock_gather_with_reasons(
    name: str,
) -> None:
    batches = JOBS[name][2]
    first = batches.index(FALLBACKS[0])
    plugin = reports(name, True)[0]
    records = decisions(plugin)[first : first + len(FALLBACKS)]
    codes = [r["reasons"][0].split(" ")[0] for r in records[:3]]
    assert codes == ["1:RETURN_LOGPROB", "1:CAPTURE_HIDDEN", "1:SPEC_DECODE"]
    assert records[3]["phase"] == 1, "the gate gives the BCG batch phase 1; the tail declines"
    for reason in ("RETURN_LOGPROB", "CAPTURE_HIDDEN", "SPEC_DECODE", "BREAKABLE_CUDA_GRAPH"):
        assert f"stock:{reason} 1" in plugin.totals, plugin.totals


@pytest.mark.parametrize(
    ("model", "reason"),
    [({"aux": True}, "AUX_HIDDEN"), ({"last_pipeline_rank": False}, "PP_NOT_LAST")],
    ids=["aux-hidden-states", "middle-pipeline-rank"],
)
def test_aux_states_and_a_middle_pipeline_rank_keep_the_stock_path(
    model: dict[str, bool], reason: str
) -> None:
    batches = random_batches(5, 2, 4)
    for report in run_ranks(2, TailJob("interleave", batches, True, NARROW, **model)):
        assert f"stock:{reason} 2" in report.totals and "narrow" not in report.totals
        for shape, result in zip(batches, report.results, strict=True):
            if reason == "PP_NOT_LAST":
                assert result.gathered_rows == (), "a middle stage hands its rows on ungathered"
            else:
                assert min(result.gathered_rows) >= shape.num_tokens, "stock: every row"


@pytest.mark.parametrize("name", ["interleave-4", "zigzag-4"])
def test_the_decision_log_holds_every_batch_and_explain_reads_it(name: str) -> None:
    """``CPKV_DECISION_LOG`` keeps each rank's decisions and tail gathers; ``cpkv explain
    --decision-log`` gives them back with the totals of the plugin's log line."""
    for rank, report in enumerate(reports(name, True)):
        args = ["explain", str(decision_log(name, rank)), "--decision-log", "--json"]
        result = CliRunner().invoke(get_command(cli_app), args)
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        logged = [{k: v for k, v in b.items() if k != "tail"} for b in document["batches"]]
        assert logged == decisions(report)
        totals = document["totals"]
        tail = report.totals.split("tail: ", 1)[1].split(";", 1)[0]
        assert tail == ", ".join(f"{code} {n}" for code, n in totals["tail"].items())
        by_phase = sorted(totals["batches_by_phase"].items(), reverse=True)
        assert "phase " + ", ".join(f"{p}: {n}" for p, n in by_phase) + ";" in report.totals
