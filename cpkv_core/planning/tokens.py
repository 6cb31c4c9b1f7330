"""Deterministic token ids: a function of (the request that first wrote them, position).

A request that shares a prefix copies the source's token ids, so shared prefixes hold
identical tokens and every CP rank, process and Python run sees the same ids.
"""

from __future__ import annotations

import hashlib

from cpkv_core.planning.batch import RequestSpec

__all__ = ["TokenLedger", "token_id"]


def token_id(writer_rid: str, position: int, vocab_size: int) -> int:
    """Returns the token id that request ``writer_rid`` writes at ``position``.

    Stable across processes and Python runs (blake2b of ``"{rid}:{position}"``, not the
    salted built-in ``hash``).

    Args:
        writer_rid: The request that first wrote the token.
        position: 0-based logical position in that request.
        vocab_size: Number of token ids; the result is in ``[0, vocab_size)``.

    Raises:
        ValueError: ``position < 0`` or ``vocab_size < 1``.
    """
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    digest = hashlib.blake2b(f"{writer_rid}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


class TokenLedger:
    """The token ids of every request so far, fed one request chunk at a time.

    Invariant: ``tokens(rid)[p]`` is ``token_id(w, p, vocab_size)`` where ``w`` is the
    request that first wrote position ``p`` (``rid`` itself, or the request it shares a
    prefix with, followed transitively).
    """

    def __init__(self) -> None:
        self._tokens: dict[str, list[int]] = {}

    def __contains__(self, rid: object) -> bool:
        return rid in self._tokens

    def tokens(self, rid: str) -> list[int]:
        """Returns a copy of the token ids ``rid`` has so far.

        Raises:
            ValueError: ``rid`` has not been seen.
        """
        return list(self._known(rid))

    def extend(self, req: RequestSpec, vocab_size: int) -> list[int]:
        """Records ``req``'s chunk and returns its token ids.

        Args:
            req: The request's part of a batch (a continuation, a new request, or a new
                request sharing the first ``prefix_len`` tokens of ``prefix_from``).
            vocab_size: Number of token ids.

        Returns:
            The ids of positions ``[prefix_len, seq_len)``.

        Raises:
            ValueError: The chunk does not follow from what the ledger holds (a
                continuation with the wrong ``prefix_len``, an unknown ``prefix_from``...).
                Nothing is recorded then.
        """
        history = self._history(req)
        new = [token_id(req.rid, pos, vocab_size) for pos in range(req.prefix_len, req.seq_len)]
        self._tokens[req.rid] = history + new
        return new

    def _known(self, rid: str) -> list[int]:
        try:
            return self._tokens[rid]
        except KeyError:
            raise ValueError(f"unknown request {rid!r}; extend it first") from None

    def _history(self, req: RequestSpec) -> list[int]:
        """Returns the ids of positions ``[0, prefix_len)`` that ``req`` builds on."""
        if req.extend_len < 0:
            raise ValueError(f"{req.rid!r}: extend_len must be >= 0, got {req.extend_len}")
        if req.rid in self._tokens:
            return self._continuation_history(req)
        if req.prefix_from is None:
            if req.prefix_len != 0:
                raise ValueError(
                    f"new request {req.rid!r} has prefix_len={req.prefix_len} but no "
                    "prefix_from; name the request it shares the prefix with"
                )
            return []
        source = self._known(req.prefix_from)
        if not 0 < req.prefix_len <= len(source):
            raise ValueError(
                f"{req.rid!r}: prefix_len must be in [1, {len(source)}] (the tokens of "
                f"{req.prefix_from!r}), got {req.prefix_len}"
            )
        return source[: req.prefix_len]

    def _continuation_history(self, req: RequestSpec) -> list[int]:
        history = self._tokens[req.rid]
        if req.prefix_from is not None:
            raise ValueError(
                f"{req.rid!r} continues an earlier chunk; prefix_from must be None, got "
                f"{req.prefix_from!r}"
            )
        if req.prefix_len != len(history):
            raise ValueError(
                f"{req.rid!r} has {len(history)} tokens so far, so prefix_len must be "
                f"{len(history)}, got {req.prefix_len}"
            )
        return history
