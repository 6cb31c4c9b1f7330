"""What a decode group is told (``DecodeSpec``) and what each of its ranks announces once it
listens (``DecodeStarted``).

A decode group is ``dcp_size`` decode ranks, each its own process with its own control
listener, transfer engine, scheduler and pool, joined in one torch.distributed group for
the decode step's merge. Rank ``b`` stores the page positions ``j % dcp_size == b`` of every
request (``planning.pd_reshard``); ``dcp_size`` 1 is the non-CP decode server.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.pd.layout import ANY_PREFILL


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    """One decode group's configuration; every rank of the group gets the same."""

    model: ModelConfig
    page_size: int
    """Tokens per KV page of the decode pools."""
    index_k_dtype: IndexKDtype
    num_pages: int
    """Pages of each decode rank's pool."""
    timeout_s: float
    """Seconds an attempt waits for its last sender after the first one settled."""
    dcp_size: int = 1
    """Decode CP ranks (``--decode-cp-size``); 1: a non-CP decode server."""
    prefill_cp_size: int = ANY_PREFILL
    """The prefill CP size the group serves (the handshake refuses another); ``ANY_PREFILL``
    (0) when it serves prefill groups of several sizes."""


@dataclass(frozen=True, slots=True)
class DecodeStarted:
    """A decode rank listens: where its control listener and its transfer engine are."""

    dcp_rank: int
    address: tuple[str, int]
    session: str
    """The transfer engine's session (``host:port``)."""
