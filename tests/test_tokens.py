"""Deterministic token ids: stable across runs, identical over shared prefixes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpkv_core.planning.batch import RequestSpec
from cpkv_core.planning.tokens import TokenLedger, token_id

VOCAB = 256
ROOT = Path(__file__).resolve().parents[1]


def test_token_id_is_stable_across_runs() -> None:
    # NOTE: values computed once; a change here changes every trace's tokens.
    assert token_id("a", 0, 256) == 242
    assert token_id("a", 1, 256) == 44
    assert token_id("req-7", 4095, 129280) == 2975
    assert token_id("b", 0, 2**64) == 9880291529469320745


def test_token_id_does_not_depend_on_hash_seed() -> None:
    code = "from cpkv_core.planning.tokens import token_id; print(token_id('a', 0, 256))"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "242"


def test_token_id_is_in_vocab() -> None:
    assert all(0 <= token_id("r", p, 7) < 7 for p in range(200))
    assert token_id("r", 5, 1) == 0


@pytest.mark.parametrize(("position", "vocab"), [(-1, 10), (0, 0)])
def test_token_id_rejects_bad_arguments(position: int, vocab: int) -> None:
    with pytest.raises(ValueError, match="must be >= "):
        token_id("r", position, vocab)


def test_extend_returns_current_chunk_and_records_it() -> None:
    ledger = TokenLedger()
    first = ledger.extend(RequestSpec("a", 0, 5), VOCAB)
    second = ledger.extend(RequestSpec("a", 5, 3), VOCAB)
    assert first == [token_id("a", p, VOCAB) for p in range(5)]
    assert second == [token_id("a", p, VOCAB) for p in range(5, 8)]
    assert ledger.tokens("a") == first + second
    assert "a" in ledger and "b" not in ledger


def test_shared_prefix_holds_identical_tokens() -> None:
    ledger = TokenLedger()
    ledger.extend(RequestSpec("a", 0, 10), VOCAB)
    chunk = ledger.extend(RequestSpec("b", 8, 4, prefix_from="a"), VOCAB)
    ledger.extend(RequestSpec("c", 4, 2, prefix_from="b"), VOCAB)
    assert ledger.tokens("b")[:8] == ledger.tokens("a")[:8]
    assert chunk == [token_id("b", p, VOCAB) for p in range(8, 12)]
    # c shares b's first 4 tokens, which b itself shares from a: written by a.
    assert ledger.tokens("c")[:4] == [token_id("a", p, VOCAB) for p in range(4)]
    assert ledger.tokens("c")[4:] == [token_id("c", p, VOCAB) for p in range(4, 6)]


def test_tokens_returns_a_copy() -> None:
    ledger = TokenLedger()
    ledger.extend(RequestSpec("a", 0, 3), VOCAB)
    ledger.tokens("a").append(1)
    assert len(ledger.tokens("a")) == 3


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (RequestSpec("a", 4, 1), "prefix_len must be 10, got 4"),
        (RequestSpec("a", 10, 1, prefix_from="a"), "prefix_from must be None"),
        (RequestSpec("b", 4, 1), "no prefix_from"),
        (RequestSpec("b", 4, 1, prefix_from="zzz"), "unknown request 'zzz'"),
        (RequestSpec("b", 11, 1, prefix_from="a"), r"prefix_len must be in \[1, 10\]"),
        (RequestSpec("b", 0, 1, prefix_from="a"), r"prefix_len must be in \[1, 10\]"),
    ],
)
def test_extend_rejects_inconsistent_chunk_and_records_nothing(
    spec: RequestSpec, words: str
) -> None:
    ledger = TokenLedger()
    ledger.extend(RequestSpec("a", 0, 10), VOCAB)
    with pytest.raises(ValueError, match=words):
        ledger.extend(spec, VOCAB)
    assert len(ledger.tokens("a")) == 10
    assert "b" not in ledger


def test_tokens_rejects_unknown_rid() -> None:
    with pytest.raises(ValueError, match="unknown request 'x'"):
        TokenLedger().tokens("x")
