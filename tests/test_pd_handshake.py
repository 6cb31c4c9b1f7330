"""The PD handshake: a prefill rank and a decode rank exchange layouts before any page moves,
and a mismatch is refused at once on both sides, naming both layouts; nothing is allocated
and no request becomes ready. In process: a real decode server serving on a thread, a real
prefill sender (its engine on a one-rank in-process group)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from multiprocessing.connection import Client

import pytest
import torch

from cpkv_core.config import IndexKDtype, model_preset
from cpkv_core.dist import LocalGroup
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.decode_group import DecodeSpec
from cpkv_core.pd.layout import layout_mismatch, pool_layout
from cpkv_core.pd.prefill import PdSender
from cpkv_core.pd.protocol import Shutdown
from cpkv_core.pd.target import PdTarget
from cpkv_core.pd.wire import call
from cpkv_core.planning import BatchSpec, KvLayout, RequestSpec, Scheduler
from cpkv_core.runtime import CPEngine
from tests.conftest import make_deploy

TINY = model_preset("tiny")
FP8 = IndexKDtype.FP8_E4M3
WIDE = TINY.model_copy(update={"name": "tiny-wide", "kv_lora_rank": 64})
"""The tiny model with twice the latent rank: every latent row is 128 bytes wider."""
REFUSAL_S = 5.0
"""A refusal must come back well within this (it is one round trip per decode rank)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Peer:
    """A decode side of the table: its spec, and the dtype its pool stores index K in when
    that is not the spec's (the same bytes a row, read as another dtype)."""

    spec: DecodeSpec
    index_k_as: torch.dtype | None = None


def _retype_index_k(server: DecodeServer, dtype: torch.dtype) -> None:
    """Stores the server's index K as ``dtype`` (same itemsize: same row bytes), as a decode
    build with another index K dtype would, and takes its layout again."""
    pool = server.model.pool
    pool.layers = tuple(
        dataclasses.replace(layer, index_k=layer.index_k.view(dtype)) for layer in pool.layers
    )
    server.layout = pool_layout(pool, server.spec.prefill_cp_size, server.spec.dcp_size)


@pytest.fixture
def serving(request: pytest.FixtureRequest) -> Iterator[DecodeServer]:
    """A decode server configured by the test's ``Peer``, serving on a thread."""
    peer: Peer = request.param
    server = DecodeServer(peer.spec, b"k")
    if peer.index_k_as is not None:
        _retype_index_k(server, peer.index_k_as)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    with Client(server.address, authkey=b"k") as conn:
        call(conn, Shutdown())
    thread.join(10)


SAME = DecodeSpec(TINY, 4, FP8, 16, 5.0)
"""The prefill side's own layout (cp 1 serves any prefill CP size)."""
OURS = ("float8_e4m3fn",)
CASES = {
    "page size": (Peer(DecodeSpec(TINY, 8, FP8, 16, 5.0)), 1, "page_size", ()),
    "row width": (Peer(DecodeSpec(WIDE, 4, FP8, 16, 5.0)), 1, "row_bytes", ()),
    "decode cp size": (Peer(SAME), 2, "decode_cp_size", ()),
    "prefill cp size": (
        Peer(DecodeSpec(TINY, 4, FP8, 16, 5.0, prefill_cp_size=4)),
        1,
        "prefill_cp_size",
        (),
    ),
    # NOTE: the same row bytes in another dtype: only the dtypes tell them apart.
    "index K uint8": (Peer(SAME, torch.uint8), 1, "dtypes", (*OURS, "uint8")),
    "index K fp8 e5m2": (Peer(SAME, torch.float8_e5m2), 1, "dtypes", (*OURS, "float8_e5m2")),
}


@pytest.mark.parametrize(
    ("serving", "decode_cp_size", "field", "named"),
    list(CASES.values()),
    ids=list(CASES),
    indirect=["serving"],
)
def test_a_mismatched_layout_is_refused_at_once_on_both_sides(
    serving: DecodeServer, decode_cp_size: int, field: str, named: tuple[str, ...]
) -> None:
    """The prefill side: cp 1, page 4, the tiny rows, ``decode_cp_size`` decode ranks; the
    refusal names ``field`` and every value in ``named`` (both sides' dtypes)."""
    deploy = make_deploy(1, 4).model_copy(update={"decode_cp_size": decode_cp_size})
    (comm,) = LocalGroup(1).communicators()
    engine = CPEngine(TINY, deploy, comm, 16, KvLayout.SHARDED)
    target = PdTarget((serving.address,), b"k", staging_bytes=1 << 16)
    made: list[PdSender] = []
    thread = threading.Thread(target=lambda: made.append(PdSender(engine, target, {"a": 10})))
    thread.start()
    thread.join(REFUSAL_S)
    assert not thread.is_alive() and made, "the handshake did not come back"
    (sender,) = made
    for refusal in (sender.refused, *serving.errors):
        assert f"differ in {field}" in refusal
        assert "prefill {protocol 2" in refusal and "vs decode rank 0 {protocol 2" in refusal
        assert all(value in refusal for value in named), (named, refusal)
    assert len(serving.errors) == 1
    batch = Scheduler(16, 4).schedule(BatchSpec(0, (RequestSpec("a", 0, 10),)))
    sender.after_batch(batch)  # nothing goes out: no pages are asked for
    (result,) = sender.finish()
    assert not result.ready and not result.released and result.bytes_sent == 0
    assert any("handshake refused" in e and f"differ in {field}" in e for e in result.errors)
    assert serving.attempts == {}


def test_layouts_that_agree_are_accepted() -> None:
    """Every field equal, and a decode side that serves any prefill CP size."""
    (comm,) = LocalGroup(1).communicators()
    engine = CPEngine(TINY, make_deploy(1, 4), comm, 16, KvLayout.SHARDED)
    prefill = pool_layout(engine.pool, 1, 1)
    assert layout_mismatch(prefill, pool_layout(engine.pool, 0, 1), 0) == ""
    assert "prefill_cp_size" in layout_mismatch(prefill, pool_layout(engine.pool, 2, 1), 0)
