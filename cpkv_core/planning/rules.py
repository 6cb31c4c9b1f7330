"""Chunk and prefix rules: the one place that decides whether a request follows from the state.

A rid seen before continues (chunked prefill): its ``prefix_len`` equals the tokens it has
and it names no ``prefix_from``. A new rid with ``prefix_len > 0`` shares a page-aligned
prefix of a request from an earlier batch (a radix-cache hit). A rid appears once per batch
and computes at least one token. The trace validator and the scheduler both ask here.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from cpkv_core.planning.batch import BatchSpec, RequestSpec

__all__ = ["Problem", "batch_problem", "request_problem"]

Problem = tuple[str, str]
"""``(field, message)``: the request field that breaks a rule and what is required."""


def _continuation_problem(req: RequestSpec, tokens: int) -> Problem | None:
    if req.prefix_from is not None:
        return "prefix_from", (
            f"{req.rid!r} continues an earlier chunk, so prefix_from is not allowed "
            f"(got {req.prefix_from!r}); remove it"
        )
    if req.prefix_len != tokens:
        return "prefix_len", (
            f"{req.rid!r} continues an earlier chunk and has {tokens} tokens so far, so "
            f"prefix_len must be {tokens}, got {req.prefix_len}"
        )
    return None


def _shared_prefix_problem(
    req: RequestSpec, tokens: Mapping[str, int], in_batch: Set[str], page_size: int
) -> Problem | None:
    src = req.prefix_from
    if src is None:
        return "prefix_from", (
            f"new request {req.rid!r} has prefix_len={req.prefix_len} but no prefix_from; "
            "name the earlier request it shares the prefix with, or set prefix_len to 0"
        )
    if req.prefix_len == 0:
        return "prefix_from", (
            f"prefix_from given but prefix_len is 0 (nothing to share); remove prefix_from "
            f"{src!r} or give the shared prefix length"
        )
    if src not in tokens:
        where = "first appears in this batch" if src in in_batch else "is not a known request"
        return "prefix_from", (
            f"prefix_from {src!r} {where}; a prefix can only be shared from a request "
            "of an earlier batch"
        )
    if req.prefix_len % page_size:
        return "prefix_len", (
            f"a shared prefix (radix-cache hit) must be page-aligned: prefix_len="
            f"{req.prefix_len} is not a multiple of page_size={page_size}"
        )
    if req.prefix_len > tokens[src]:
        return "prefix_len", (
            f"prefix_len={req.prefix_len} exceeds the {tokens[src]} tokens {src!r} has "
            "before this batch"
        )
    return None


def request_problem(
    req: RequestSpec, tokens: Mapping[str, int], in_batch: Set[str], page_size: int
) -> Problem | None:
    """The first rule ``req`` breaks, or None.

    Args:
        req: One request of a batch.
        tokens: Tokens every known request holds before this batch.
        in_batch: rids of the requests before ``req`` in the same batch.
        page_size: Tokens per KV page; shared prefixes are multiples of it.
    """
    if req.prefix_len < 0:
        return "prefix_len", f"must be >= 0, got {req.prefix_len}"
    if req.extend_len < 1:
        return "extend_len", f"must be >= 1, got {req.extend_len}"
    if req.rid in in_batch:
        return "rid", f"{req.rid!r} appears twice in this batch; a rid may appear once"
    if req.rid in tokens:
        return _continuation_problem(req, tokens[req.rid])
    if req.prefix_len > 0 or req.prefix_from is not None:
        return _shared_prefix_problem(req, tokens, in_batch, page_size)
    return None


def batch_problem(batch: BatchSpec, tokens: Mapping[str, int], page_size: int) -> Problem | None:
    """The first rule any request of ``batch`` breaks, its field prefixed ``requests[i].``.

    Lengths of this batch's requests do not count: a request cannot share tokens that are
    computed in the same batch.
    """
    if not batch.requests:
        return "requests", "must be a non-empty list, got an empty list"
    in_batch: set[str] = set()
    for i, req in enumerate(batch.requests):
        problem = request_problem(req, tokens, in_batch, page_size)
        if problem is not None:
            return f"requests[{i}].{problem[0]}", problem[1]
        in_batch.add(req.rid)
    return None
