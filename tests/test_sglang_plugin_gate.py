"""The gate inside SGLang 0.5.23 and the shadow, on CPU ranks: SGLang's ``can_apply``, its DSA
copy ``can_dsa_prefill_cp_interleave`` and cpkv's gate agree on every batch, on every rank;
cpkv's CP minimum runs small batches unsplit with SGLang's code agreeing; a corrupted narrow
gather is caught, phase 1 is killed and the stock rows are served (jobs in ``sglang_cases``).
"""

from __future__ import annotations

import pytest

from tests.sglang_cases import JOBS, NARROW, decisions, reports, same_bits

pytestmark = [pytest.mark.gloo, pytest.mark.xdist_group("sglang")]

MIN_TOKENS = 150
CP_MIN = (*NARROW, ("CPKV_NSA_PREFILL_CP_MIN_TOKENS", str(MIN_TOKENS)))
SHADOW = (*NARROW, ("CPKV_SHADOW_RATE", "1"))


@pytest.mark.parametrize("name", list(JOBS))
def test_can_apply_its_dsa_copy_and_cpkvs_gate_agree_on_every_batch_and_rank(name: str) -> None:
    strategy = JOBS[name][0]
    stock, plugin = reports(name, False), reports(name, True)
    for s, p in zip(stock, plugin, strict=True):
        assert decisions(p) == decisions(plugin[0]), "every rank decides the same"
        count = len(JOBS[name][2])
        assert [r["batch"] for r in decisions(p)] == list(range(count)), "once per batch"
        assert p.totals.startswith(f"cpkv totals: {count} batches;"), p.totals
        for sr, pr, record in zip(s.results, p.results, decisions(p), strict=True):
            assert record["sglang_split"] == sr.can_apply == sr.split
            assert pr.can_apply == pr.split == record["split"]
            dsa = pr.split if strategy == "interleave" else False
            assert pr.can_dsa == pr.can_dsa_at_backend == sr.can_dsa == dsa
            assert pr.dsa_seqlens == sr.dsa_seqlens
            cp_off = [r for r in record["reasons"] if r.startswith("CP_OFF")]
            assert bool(cp_off) == (not sr.can_apply), record
            assert all(r.startswith("CP_OFF rule=sglang") for r in cp_off), record


def test_cpkvs_cp_minimum_runs_small_batches_unsplit_with_sglangs_code_agreeing() -> None:
    _, _, batches = JOBS["interleave-4"]
    stock, plugin = reports("interleave-4", False), reports("interleave-4", True, CP_MIN)
    unsplit = 0
    for s, p in zip(stock, plugin, strict=True):
        for shape, sr, pr, record in zip(batches, s.results, p.results, decisions(p), strict=True):
            below = shape.num_tokens < MIN_TOKENS
            assert pr.split == pr.can_apply == pr.can_dsa == (sr.split and not below), shape
            if sr.split and below:
                unsplit += 1
                assert record["reasons"][0] == f"CP_OFF tokens={shape.num_tokens} min=150"
                assert pr.gathered_rows == () and pr.dsa_seqlens == shape.num_tokens
            assert same_bits(pr.logits, sr.logits) and same_bits(pr.pruned, sr.pruned), shape
    assert unsplit >= 4, "the job must hold batches SGLang splits and cpkv's minimum does not"


def test_a_corrupted_narrow_gather_is_caught_phase_1_killed_and_stock_rows_served() -> None:
    _, cp_size, batches = JOBS["interleave-4"]
    stock = reports("interleave-4", False)
    shadowed = reports("interleave-4", True, SHADOW, corrupt_batch=1)
    for s, p in zip(stock, shadowed, strict=True):
        records = decisions(p)
        bs = [len(b.extend_lens) for b in batches[:3]]
        assert p.results[0].gathered_rows == (cp_size * bs[0], s.results[0].gathered_rows[0])
        assert p.results[1].gathered_rows == (cp_size * bs[1], s.results[1].gathered_rows[0])
        assert records[1]["phase"] == 1 and records[2]["phase"] == 0
        assert "1:KILLED shadow=mismatch batch=1" in records[2]["reasons"]
        assert p.results[2].gathered_rows == s.results[2].gathered_rows
        for sr, pr in zip(s.results, p.results, strict=True):
            assert same_bits(pr.logits, sr.logits) and same_bits(pr.pruned, sr.pruned)
        assert "shadow: checked 2, mismatched 1" in p.totals, p.totals
        assert any("phase 1 is killed" in line for line in p.log)
