"""Batch-invariant tensor ops: a row's result never depends on how many rows share the call.

CP ranks compute a request's tokens in a different grouping than the one-request-at-a-time
reference, so every reduction here runs in a fixed, shape-independent order:

- fp32 reductions are unrolled into a Python loop of elementwise ``mul``/``add`` over the
  reduced dimension. Each elementwise op is correctly rounded whatever SIMD path the
  kernel takes, so the result is bitwise identical for any batch size.
- fp8 x fp8 dot products run as an fp64 matmul: every product of two e4m3 values is a
  multiple of 2**-18 below 2**18, so all partial sums are exact in fp64 and any
  summation order (any BLAS blocking) gives the same bits.
- ``exp`` is evaluated in fp64 and rounded once to fp32: SIMD and scalar ``exp`` may differ
  by an fp64 ulp, which survives the rounding only with probability ~2**-29 per value.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

FP8_E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn value."""


def _shapes_only(*tensors: Tensor) -> bool:
    """Every tensor is on ``meta`` (a dry run): it has no values, so a summation order means
    nothing, and the one-op form of a reduction gives the same shape and dtype.

    NOTE: meta kernels run as Python references (~0.2 ms an op): the unrolled loops cost
    ``3 k`` ops a call, about 4 s a projection at a model's real width (k = 7,168).
    """
    return all(t.device.type == "meta" for t in tensors)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight`` accumulated over the input dimension in a fixed order.

    Args:
        x: ``[n, k]`` activations.
        weight: ``[k, m]`` weights.

    Returns:
        ``[n, m]``, bitwise independent of ``n``.
    """
    if _shapes_only(x, weight) and x.dtype == weight.dtype:
        return x @ weight
    # NOTE: column i as one contiguous run (same ops, faster)
    columns = x.t().contiguous()[:, :, None].unbind(0)
    return _added_in_order(columns, weight.unbind(0))


def ordered_sum(x: Tensor, dim: int) -> Tensor:
    """Sum over ``dim`` slice by slice, first to last; removes ``dim``."""
    if _shapes_only(x):
        return x.sum(dim, dtype=x.dtype)
    if x.shape[dim] == 1:
        return x.select(dim, 0)
    slices = x.movedim(dim, 0).contiguous().unbind(0)
    out = slices[0] + slices[1]
    for later in slices[2:]:
        out.add_(later)
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dimension: ``x / sqrt(mean(x**2) + eps) * weight``.

    Args:
        x: ``[n, d]``.
        weight: ``[d]``.
    """
    mean_square = ordered_sum(x * x, dim=-1) / x.shape[-1]
    # NOTE: sqrt and division are correctly rounded in every SIMD path; rsqrt is not.
    return x / torch.sqrt(mean_square + eps)[:, None] * weight


def softmax_fp64(scores: Tensor, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` computed in fp64 with a fixed-order denominator.

    Entries equal to ``-inf`` get probability 0; a row must hold at least one finite entry.
    """
    scores64 = scores.double()
    row_max = scores64.amax(dim=dim, keepdim=True)
    weights = torch.exp(scores64 - row_max)
    return weights / ordered_sum(weights, dim=dim).unsqueeze(dim)


def quantize_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Quantizes rows to float8_e4m3fn with one fp32 scale per row.

    Args:
        x: ``[..., d]`` fp32.

    Returns:
        ``(values [..., d] float8_e4m3fn, scale [...] fp32)`` with ``x ~= values * scale``.
    """
    amax = x.abs().amax(dim=-1)
    scale = torch.clamp(amax, min=1e-12) / FP8_E4M3_MAX
    values = (x / scale[..., None]).to(torch.float8_e4m3fn)
    return values, scale


def exact_fp8_dot(a: Tensor, b: Tensor) -> Tensor:
    """All dot products of fp8 rows, exact in fp64.

    Args:
        a: ``[..., n, d]`` float8_e4m3fn.
        b: ``[m, d]`` float8_e4m3fn.

    Returns:
        ``[..., n, m]`` fp64, exact (so independent of summation order and batch shape).
    """
    return torch.matmul(a.double(), b.double().transpose(0, 1))


def ordered_dot(a: Tensor, b: Tensor) -> Tensor:
    """Dot products over the last dimension of broadcast ``a`` and ``b``, fixed order, fp64.

    Products of fp32 values are exact in fp64; the fixed order makes the sum reproducible.
    """
    a64, b64 = a.double(), b.double()
    if _shapes_only(a, b):
        return (a64 * b64).sum(-1)
    # NOTE: the reduced dimension first, so each term's operands are contiguous; the same
    # multiplies and adds in the same order as the plain loop (``test_ops``), 5x faster
    # where its slices were strided (300 queries x 4 heads against 1,000 keys, 128 wide).
    return sum_of_products(a64.movedim(-1, 0).contiguous(), b64.movedim(-1, 0).contiguous())


def sum_of_products(a_terms: Tensor, b_terms: Tensor) -> Tensor:
    """``a_terms[0] * b_terms[0] + a_terms[1] * b_terms[1] + ...``, added first to last.

    The terms run along dimension 0 of both; the rest broadcast. A caller that lays its
    operands out terms-first (each term's slice contiguous) saves the copy
    ``ordered_dot`` or ``ordered_sum(a * b, dim)`` would make, with the same multiplies and
    adds in the same order.
    """
    if _shapes_only(a_terms, b_terms):
        return (a_terms * b_terms).sum(0)
    return _added_in_order(a_terms.unbind(0), b_terms.unbind(0))


def _added_in_order(a_terms: Sequence[Tensor], b_terms: Sequence[Tensor]) -> Tensor:
    """``a_terms[0] * b_terms[0] + a_terms[1] * b_terms[1] + ...``, added first to last.

    NOTE: the terms come in as views made once (``unbind``): at a few hundred terms of a
    few thousand elements, indexing a term out of its tensor each step took about a third
    of the call (``linear`` at 300 x 512 -> 64: 8.5-9.4 ms so, 6.2-6.3 ms from views).
    """
    out = a_terms[0] * b_terms[0]
    term = torch.empty_like(out)
    for a, b in zip(a_terms[1:], b_terms[1:], strict=True):
        torch.mul(a, b, out=term)
        out.add_(term)
    return out
