"""An independent check of the model maths: ``attend_request`` against a plain dense float64
implementation written from the model's definition, not from its code.

The engine and the reference share ``model.py``, so a bug there (a wrong attention scale, a
wrong indexer weight) cancels out of every equivalence test; it cannot cancel out here.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from cpkv_core.config import IndexKDtype, ModelConfig, model_preset
from cpkv_core.runtime import model as model_mod
from cpkv_core.runtime.model import Projections, attend_request, project
from cpkv_core.runtime.weights import init_weights

TINY = model_preset("tiny")


def dense_topk(
    cfg: ModelConfig, proj: Projections, positions: Tensor, index_k: Tensor, index_k_scale: Tensor
) -> tuple[Tensor, list[list[int]]]:
    """Indexer scores ``[nq, num_keys]`` (float64) and each query's top-k key positions:
    ``score[i, j] = k_scale[j] * sum_h w[i, h] * q_scale[i, h] * relu(q[i, h] . k[j])``, keys
    at positions ``<= p`` only, highest score first, ties to the lower position."""
    q, k = proj.index_q.double(), index_k.double()
    dots = torch.einsum("qhd,kd->qhk", q, k).clamp(min=0)
    weight = proj.index_weights.double() * proj.index_q_scale.double()
    scores = torch.einsum("qhk,qh->qk", dots, weight) * index_k_scale.double()[None, :]
    chosen = []
    for i, p in enumerate(positions.tolist()):
        visible = range(min(p + 1, scores.shape[1]))
        best = sorted(visible, key=lambda j: (-float(scores[i, j]), j))[: cfg.index_topk]
        chosen.append(sorted(best))
    return scores, chosen


def dense_attention(
    cfg: ModelConfig, proj: Projections, latent: Tensor, chosen: list[list[int]]
) -> Tensor:
    """Per query and head: softmax over the chosen keys of ``q . latent / sqrt(kv_dim)``,
    then the probability-weighted sum of the keys' first ``kv_lora_rank`` values."""
    q, kv = proj.q.double(), latent.double()
    rows = []
    for i, keys in enumerate(chosen):
        selected = kv[keys]  # [n, kv_dim]
        logits = q[i] @ selected.T / cfg.kv_dim**0.5  # [heads, n]
        probs = torch.softmax(logits, dim=-1)
        rows.append((probs @ selected[:, : cfg.kv_lora_rank]).reshape(-1))
    return torch.stack(rows)


def inputs(seq_len: int, nq: int, dtype: IndexKDtype, seed: int) -> tuple[Projections, Tensor]:
    """Projections of a request's ``seq_len`` tokens from random hidden states; the last
    ``nq`` are the queries (the rest is history)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(seq_len, TINY.hidden_size, generator=gen)
    layer = init_weights(TINY).layers[0]
    return project(TINY, layer, hidden, dtype), torch.arange(seq_len - nq, seq_len)


def check_against_oracle(seq_len: int, nq: int, dtype: IndexKDtype, seed: int) -> None:
    proj, positions = inputs(seq_len, nq, dtype, seed)
    queries = proj.between(seq_len - nq, seq_len)
    attn, topk = attend_request(
        TINY, queries, positions, proj.latent, proj.index_k, proj.index_k_scale
    )
    _, chosen = dense_topk(TINY, queries, positions, proj.index_k, proj.index_k_scale)
    want_topk = [keys + [-1] * (TINY.index_topk - len(keys)) for keys in chosen]
    assert topk.tolist() == want_topk
    want = dense_attention(TINY, queries, proj.latent, chosen)
    torch.testing.assert_close(attn.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", list(IndexKDtype))
@pytest.mark.parametrize(("seq_len", "nq"), [(1, 1), (7, 7), (40, 40), (53, 9), (64, 1)])
def test_attend_request_matches_a_dense_float64_oracle(
    seq_len: int, nq: int, dtype: IndexKDtype
) -> None:
    """Fewer keys than index_topk, a whole chunk, a chunk after history, one last query."""
    check_against_oracle(seq_len, nq, dtype, seed=seq_len)


def test_oracle_catches_a_wrong_attention_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scale bug in the shared model code fails the oracle (engine and reference would
    agree on it)."""
    monkeypatch.setattr(model_mod, "attention_scale", lambda cfg: cfg.kv_lora_rank**-0.5)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        check_against_oracle(40, 40, IndexKDtype.FP8_E4M3, seed=1)


def test_oracle_catches_a_wrong_indexer_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping the per-head index weights changes which keys are chosen."""

    def unweighted(proj: Projections, keys: Tensor, keys_scale: Tensor) -> Tensor:
        ones = torch.ones_like(proj.index_weights)
        return real(Projections(**{**_fields(proj), "index_weights": ones}), keys, keys_scale)

    real = model_mod.index_scores
    monkeypatch.setattr(model_mod, "index_scores", unweighted)
    with pytest.raises(AssertionError):
        check_against_oracle(64, 16, IndexKDtype.FP32, seed=2)


def _fields(proj: Projections) -> dict[str, Tensor]:
    return {name: getattr(proj, name) for name in Projections.__slots__}
