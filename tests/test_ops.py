"""Batch invariance of the model math: a row's result never depends on its neighbours."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.config import IndexKDtype, model_preset
from cpkv_core.runtime.model import (
    attend_request,
    attend_rows,
    attention_scale,
    index_scores,
    project,
)
from cpkv_core.runtime.ops import (
    exact_fp8_dot,
    linear,
    ordered_dot,
    ordered_sum,
    rms_norm,
    softmax_fp64,
)
from cpkv_core.runtime.topk import NO_KEY, SORT_KEYS, select_topk
from cpkv_core.runtime.weights import init_weights

TINY = model_preset("tiny")
WEIGHTS = init_weights(TINY)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 200), start=st.integers(0, 199), seed=st.integers(0, 2**16))
def test_linear_rows_do_not_depend_on_batch(n: int, start: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=gen)
    w = torch.randn(64, 48, generator=gen)
    row = start % n
    assert torch.equal(linear(x, w)[row], linear(x[row : row + 1], w)[0])
    assert torch.equal(rms_norm(x, w[:, 0])[row], rms_norm(x[row : row + 1], w[:, 0])[0])


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_projections_do_not_depend_on_batch(n: int, seed: int) -> None:
    hidden = torch.randn(n, TINY.hidden_size, generator=torch.Generator().manual_seed(seed))
    full = project(TINY, WEIGHTS.layers[0], hidden, IndexKDtype.FP8_E4M3)
    one = project(TINY, WEIGHTS.layers[0], hidden[-1:], IndexKDtype.FP8_E4M3)
    for name in (
        "latent",
        "q",
        "index_q",
        "index_q_scale",
        "index_weights",
        "index_k",
        "index_k_scale",
    ):
        a, b = getattr(full, name)[-1:], getattr(one, name)
        assert torch.equal(
            a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
            b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b,
        ), name


def test_topk_ties_break_by_logical_position() -> None:
    scores = torch.zeros(1, 10, dtype=torch.float64)
    scores[0, 7] = 1.0
    chosen = select_topk(scores, torch.tensor([9]), topk=4)
    assert chosen.tolist() == [[0, 1, 2, 7]]


def test_topk_pads_with_no_key_when_few_keys_are_visible() -> None:
    scores = torch.arange(6, dtype=torch.float64)[None, :].repeat(2, 1)
    chosen = select_topk(scores, torch.tensor([1, 5]), topk=4)
    assert chosen.tolist() == [[0, 1, NO_KEY, NO_KEY], [2, 3, 4, 5]]


def _topk_oracle(scores: list[float], query_position: int, topk: int) -> list[int]:
    """The first ``topk`` visible keys by (score descending, position ascending), ascending,
    ``NO_KEY`` padded."""
    visible = [p for p in range(len(scores)) if p <= query_position]
    best = sorted(sorted(visible, key=lambda p: (-scores[p], p))[:topk])
    return best + [NO_KEY] * (topk - len(best))


@settings(max_examples=25, deadline=None)
@given(
    num_keys=st.sampled_from([3, 40, SORT_KEYS, SORT_KEYS + 1, 700]),
    levels=st.integers(1, 6),
    topk=st.sampled_from([1, 5, 16]),
    seed=st.integers(0, 2**16),
)
def test_topk_takes_the_best_keys_ties_by_position_whatever_the_key_count(
    num_keys: int, levels: int, topk: int, seed: int
) -> None:
    """Scores drawn from ``levels`` values (ties everywhere), queries anywhere among the keys
    (a query sees its own key and those before it): the sort (up to ``SORT_KEYS`` keys) and
    the k-th score (past it) pick what a stable sort of every visible key picks."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (6, num_keys), generator=gen).double()
    positions = torch.randint(0, num_keys, (6,), generator=gen)
    chosen = select_topk(scores, positions, topk)
    for row, position in enumerate(positions.tolist()):
        assert chosen[row].tolist() == _topk_oracle(scores[row].tolist(), position, topk)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 5),
    k=st.integers(1, 6),
    m=st.integers(1, 5),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64]),
)
def test_reductions_on_meta_give_the_shapes_and_dtypes_the_cpu_gives(
    n: int, k: int, m: int, dtype: torch.dtype
) -> None:
    """On ``meta`` the fixed-order loops collapse to one op (a dry run has no values to
    order): every result has the shape and dtype the real loop gives."""
    x, w = torch.ones(n, k, dtype=dtype), torch.ones(k, m, dtype=dtype)
    a, b = torch.ones(n, 1, k, dtype=dtype), torch.ones(m, k, dtype=dtype)  # broadcast
    cases = [
        (linear, (x, w)),
        (lambda t: ordered_sum(t, 0), (x,)),
        (lambda t: ordered_sum(t, -1), (x,)),
        (ordered_dot, (a, b)),
    ]
    for op, args in cases:
        on_cpu = op(*args)
        on_meta = op(*(t.to("meta") for t in args))
        assert (on_meta.device.type, on_meta.shape, on_meta.dtype) == (
            "meta",
            on_cpu.shape,
            on_cpu.dtype,
        )


def _left_to_right(terms: list[torch.Tensor]) -> torch.Tensor:
    """The sum of ``terms`` one by one, first to last: the order the ops promise."""
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 7),
    k=st.integers(1, 70),
    m=st.integers(1, 9),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_reductions_add_their_terms_first_to_last(
    n: int, k: int, m: int, heads: int, seed: int
) -> None:
    """Each reduction gives the bits of the plain left-to-right loop over its terms (they run
    on contiguous copies: a faster layout, the same multiplies and adds in the same order),
    broadcast operands and a bf16 weight included."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=gen) * 1e3
    w = torch.randn(k, m, generator=gen).bfloat16()
    assert torch.equal(linear(x, w), _left_to_right([x[:, i, None] * w[i] for i in range(k)]))
    cube = torch.randn(n, k, m, generator=gen)
    for dim in (0, 1, 2, -1):
        terms = list(cube.unbind(dim))
        assert torch.equal(ordered_sum(cube, dim), _left_to_right(terms)), dim
    q, keys = torch.randn(n, heads, 1, k, generator=gen), torch.randn(1, 1, m, k, generator=gen)
    q64, keys64 = q.double(), keys.double()
    terms = [q64[..., i] * keys64[..., i] for i in range(k)]
    assert torch.equal(ordered_dot(q, keys), _left_to_right(terms))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (``torch.equal`` takes -0.0 for 0.0)."""
    width = {1: torch.uint8, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(width), b.view(width))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 50), layer=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_one_fused_projection_gives_each_projections_own_bits(
    n: int, layer: int, seed: int
) -> None:
    """``project`` runs one ``linear`` over the five input projections side by side: every
    output has the bits of its own projection's ``linear``."""
    weights = WEIGHTS.layers[layer]
    hidden = torch.randn(n, TINY.hidden_size, generator=torch.Generator().manual_seed(seed))
    x = rms_norm(hidden, weights.attn_norm)
    proj = project(TINY, weights, hidden, IndexKDtype.FP32)
    own = {
        "index_q": linear(x, weights.w_index_q).view(proj.index_q.shape),
        "index_k": linear(x, weights.w_index_k),
        "latent": linear(x, weights.w_kv),
        "q": linear(x, weights.w_q).view(proj.q.shape),
        "index_weights": linear(x, weights.w_index_weights) * TINY.index_n_heads**-0.5,
    }
    for name, expected in own.items():
        assert _same_bits(getattr(proj, name), expected), name


@settings(max_examples=20, deadline=None)
@given(
    nq=st.integers(1, 40),
    num_keys=st.integers(1, 90),
    dtype=st.sampled_from([IndexKDtype.FP8_E4M3, IndexKDtype.FP32]),
    seed=st.integers(0, 2**16),
)
def test_index_scores_add_the_heads_first_to_last(
    nq: int, num_keys: int, dtype: IndexKDtype, seed: int
) -> None:
    """The indexer's heads are summed one by one, first to last, each ``relu(q . k) * w``:
    the bits of ``ordered_sum`` over every head's term at once, fp8 and fp32 keys."""
    gen = torch.Generator().manual_seed(seed)
    proj = project(TINY, WEIGHTS.layers[0], torch.randn(nq, TINY.hidden_size, generator=gen), dtype)
    keys_of = project(
        TINY, WEIGHTS.layers[0], torch.randn(num_keys, TINY.hidden_size, generator=gen), dtype
    )
    keys, keys_scale = keys_of.index_k, keys_of.index_k_scale
    if dtype is IndexKDtype.FP8_E4M3:
        dots = exact_fp8_dot(proj.index_q, keys)
    else:
        dots = ordered_dot(proj.index_q[:, :, None, :], keys[None, None, :, :])
    head_weight = (proj.index_weights.double() * proj.index_q_scale.double())[:, :, None]
    terms = list((torch.relu(dots) * head_weight).unbind(1))
    expected = _left_to_right(terms) * keys_scale.double()[None, :]
    assert _same_bits(index_scores(proj, keys, keys_scale), expected)


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_requests_attended_in_one_call_get_the_bits_each_gets_alone(
    lengths: list[int], seed: int
) -> None:
    """``attend_rows`` over the selected rows of several requests' keys side by side gives
    each query the bits ``attend_request`` gives it, one request at a time: short requests
    (fewer keys than ``index_topk``, invalid slots) included."""
    gen = torch.Generator().manual_seed(seed)
    alone, queries, latents, rows, valid, start = [], [], [], [], [], 0
    for length in lengths:
        hidden = torch.randn(length, TINY.hidden_size, generator=gen)
        proj = project(TINY, WEIGHTS.layers[0], hidden, IndexKDtype.FP8_E4M3)
        positions = torch.arange(length)
        attn, topk = attend_request(
            TINY, proj, positions, proj.latent, proj.index_k, proj.index_k_scale
        )
        alone.append(attn)
        queries.append(proj.q)
        latents.append(proj.latent)
        rows.append(start + topk.clamp(min=0))
        valid.append(topk != NO_KEY)
        start += length
    together = attend_rows(
        TINY, torch.cat(queries), torch.cat(latents), torch.cat(rows), torch.cat(valid)
    )
    assert _same_bits(together, torch.cat(alone))


@settings(max_examples=15, deadline=None)
@given(
    nq=st.integers(1, 30),
    num_rows=st.integers(1, 60),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_attention_over_selected_rows_gives_the_plain_forms_bits(
    nq: int, num_rows: int, heads: int, seed: int
) -> None:
    """``attend_rows`` lays both its sums out terms-first: the bits of the plain form, the
    selected rows gathered, ``ordered_dot`` for the logits and ``ordered_sum`` of every
    weighted value at once; more selected rows than latent rows and fewer, invalid slots
    included."""
    cfg = TINY.model_copy(update={"num_heads": heads})
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(nq, heads, cfg.kv_dim, generator=gen)
    latent = torch.randn(num_rows, cfg.kv_dim, generator=gen)
    rows = torch.randint(0, num_rows, (nq, cfg.index_topk), generator=gen)
    valid = torch.rand(nq, cfg.index_topk, generator=gen) < 0.8
    valid[:, 0] = True
    selected = latent[rows]
    logits = ordered_dot(q[:, :, None, :], selected[:, None, :, :]) * attention_scale(cfg)
    probs = softmax_fp64(logits.masked_fill(~valid[:, None, :], float("-inf"))).float()
    plain = ordered_sum(probs[..., None] * selected[:, None, :, : cfg.kv_lora_rank], dim=2)
    got = attend_rows(cfg, q, latent, rows, valid)
    assert _same_bits(got, plain.reshape(nq, heads * cfg.kv_lora_rank))
