"""The PD handshake's layouts: what a side stores (``pool_layout``) and whether two sides can
move pages between them (``layout_mismatch``); both sides run the same check.

A prefill rank sends its ``PdLayout`` in ``Hello`` before any request; the decode rank
compares it with its own and replies with its layout and its verdict, and the prefill rank
compares them too. A difference in the protocol version, the page size, a row width, a
dtype or the decode CP size (and the prefill CP size, when the decode side names the one it
serves) refuses every transfer between them at once, naming both layouts; no page moves
and no request can become ready.
"""

from __future__ import annotations

from dataclasses import fields

from cpkv_core.pd.pack import row_bytes, row_views
from cpkv_core.pd.protocol import PdLayout
from cpkv_core.runtime.kv_pool import PagedKVPool

PD_PROTOCOL = 2
"""Version of the PD control protocol: 2 adds the handshake and decode CP (re-shard)."""

ANY_PREFILL = 0
"""``PdLayout.prefill_cp_size`` of a decode side that serves prefill groups of any CP size."""

_COMPARED = ("protocol", "page_size", "row_bytes", "dtypes", "decode_cp_size")
"""Fields two layouts must agree on (``prefill_cp_size`` only when the decode side names one)."""


def pool_layout(pool: PagedKVPool, prefill_cp_size: int, decode_cp_size: int) -> PdLayout:
    """The layout of ``pool`` for a transfer from ``prefill_cp_size`` prefill ranks to
    ``decode_cp_size`` decode ranks."""
    first = pool.layers[0]
    dtypes = tuple(
        str(t.dtype).removeprefix("torch.")
        for t in (first.latent, first.index_k, first.index_k_scale)
    )
    return PdLayout(
        PD_PROTOCOL,
        pool.page_size,
        row_bytes(row_views(pool)),
        dtypes,
        prefill_cp_size,
        decode_cp_size,
    )


def describe(layout: PdLayout) -> str:
    """One line naming every field of ``layout``."""
    per_layer = layout.row_bytes[:3]
    layers = len(layout.row_bytes) // 3
    rows = (
        f"{layers} layers x rows {per_layer} B"
        if layout.row_bytes == per_layer * layers
        else f"rows {layout.row_bytes} B"
    )
    prefill = "any" if layout.prefill_cp_size == ANY_PREFILL else str(layout.prefill_cp_size)
    return (
        f"{{protocol {layout.protocol}, page_size {layout.page_size}, {rows}, dtypes "
        f"{'/'.join(layout.dtypes)}, cp {prefill} -> dcp {layout.decode_cp_size}}}"
    )


def layout_mismatch(prefill: PdLayout, decode: PdLayout, dcp_rank: int) -> str:
    """Why pages cannot move from a prefill rank of layout ``prefill`` to decode rank
    ``dcp_rank`` of layout ``decode``, naming both layouts; "" when they can."""
    names = {f.name for f in fields(PdLayout)}
    assert set(_COMPARED) < names, names
    differ = [name for name in _COMPARED if getattr(prefill, name) != getattr(decode, name)]
    if decode.prefill_cp_size not in (ANY_PREFILL, prefill.prefill_cp_size):
        differ.append("prefill_cp_size")
    if not differ:
        return ""
    return (
        f"PD layouts differ in {', '.join(differ)}: prefill {describe(prefill)} vs decode "
        f"rank {dcp_rank} {describe(decode)}"
    )
