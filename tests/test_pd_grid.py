"""PD from cp N to dcp M, N and M in 1..4, at every level with sharded KV (2-5), in both split
modes, in process: the page tables the host loop schedules at each level, each prefill
rank's shard of the reference's KV at its physical rows, the sender's re-shard math and
packing, and real decode servers (their handlers called directly; the test copies each
packed block into the destination's receive slab, standing in for the transfer engine).
Every decode rank must hold exactly its owned slice of the reference's KV, byte for byte,
and the decode step (its ranks merging over an in-process group) must equal the
reference's. Real processes and Mooncake run in ``test_pd.py``."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from cpkv.run.jobs import final_seq_lens
from cpkv.run.loop import HostLoop
from cpkv.run.pd_check import ReferenceRequest, check_request, kv_matches, reference_requests
from cpkv_core.config import CpMode, IndexKDtype, model_preset
from cpkv_core.dist import LocalGroup
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.decode_group import DecodeSpec
from cpkv_core.pd.decode_report import request_report
from cpkv_core.pd.pack import pack_index, pack_rows
from cpkv_core.pd.protocol import Alloc, AllocReply, Await, Done, Piece, Report, ReportReply
from cpkv_core.pd.transport import Transport
from cpkv_core.planning import ScheduledBatch, pages_for_trace, token_ids
from cpkv_core.planning.pd_pack import completed_pages, page_runs, sender_first_rows, token_rows
from cpkv_core.planning.pd_reshard import decode_pages_per_rank, reshard_pieces
from cpkv_core.traces.trace import load_trace
from phases import PhaseId, level_enabled
from tests.conftest import DATA, make_deploy

TINY = model_preset("tiny")
PAGE = 16
BATCHES = load_trace(DATA / "long.jsonl", PAGE).batches
SEQ_LENS = final_seq_lens(BATCHES)
TOKEN_BYTES = 456
"""The tiny model's bytes a token: 2 layers x (fp32 latent 48 x 4, fp8 index K 32, scale 4)."""


@pytest.fixture(scope="module")
def reference() -> dict[str, ReferenceRequest]:
    return reference_requests(TINY, make_deploy(1, PAGE), BATCHES)


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[int, list[DecodeServer]]]:
    """One decode group of each size 1..4, reused by every case (pages freed after each)."""
    made = {}
    transport = Transport()  # NOTE: one engine for all ten servers: each start costs time
    for size in (1, 2, 3, 4):
        pages = decode_pages_per_rank(list(SEQ_LENS.values()), PAGE, size)
        spec = DecodeSpec(TINY, PAGE, IndexKDtype.FP8_E4M3, pages, 5.0, size)
        comms = LocalGroup(size).communicators() if size > 1 else [None]
        made[size] = [DecodeServer(spec, b"k", comm, transport=transport) for comm in comms]
    yield made
    for servers in made.values():
        for server in servers:
            server.close()
    transport.close()


def _scheduled(cp_size: int, mode: CpMode, level: int) -> list[ScheduledBatch]:
    """The trace as the host loop schedules it at ``level`` (page tables, owner-aware
    allocation at level 5)."""
    deploy = make_deploy(cp_size, PAGE, mode)
    num_pages = pages_for_trace(BATCHES, PAGE, cp_size)
    loop = HostLoop(deploy, level_enabled(level, frozenset(PhaseId)), num_pages)
    return [loop.step(batch).scheduled for batch in BATCHES]


def _shards(
    steps: list[ScheduledBatch], cp_size: int, reference: dict[str, ReferenceRequest]
) -> list[list[torch.Tensor]]:
    """Each prefill rank's sharded pool as ``row_views`` (uint8, latent/index K/scale a
    layer): its owned pages at ``page // cp_size``, from the reference's rows by position."""
    final = {r.rid: r for step in steps for r in step.requests}
    views = {
        rid: [t.view(torch.uint8).view(t.shape[0], -1) for kv in ref.kv for t in kv]
        for rid, ref in reference.items()
    }
    rows = -(-pages_for_trace(BATCHES, PAGE, cp_size) // cp_size) * PAGE
    # NOTE: uninitialised: only owned rows are ever read
    shards = [[torch.empty(rows, v.shape[1], dtype=torch.uint8) for v in views["a"]]]
    shards += [[torch.empty_like(t) for t in shards[0]] for _ in range(cp_size - 1)]
    for rid, req in final.items():
        table = np.asarray(req.page_table, dtype=np.int64)
        positions = np.arange(req.seq_len) // PAGE
        at = torch.from_numpy(table[positions] // cp_size * PAGE + np.arange(req.seq_len) % PAGE)
        owners = torch.from_numpy(table[positions] % cp_size)
        for rank in range(cp_size):
            mine = owners == rank
            for shard, view in zip(shards[rank], views[rid], strict=True):
                shard.index_copy_(0, at[mine], view[mine])
    return shards


def _send(
    servers: list[DecodeServer],
    steps: list[ScheduledBatch],
    shards: list[list[torch.Tensor]],
    prefix: str,
) -> None:
    """Every prefill rank streams every request to the decode ranks as ``PdSender`` does:
    Alloc at the first chunk, the pieces each step completed, Done after the final one."""
    cp_size, dcp_size = len(shards), len(servers)
    state: dict[str, tuple[list[AllocReply], tuple[int, ...], int]] = {}
    landed: dict[tuple[str, int, int], list[Piece]] = {}
    for req in (r for step in steps for r in step.requests):
        final = SEQ_LENS[req.rid]
        if req.rid not in state:
            token = token_ids(req.rid_key, final, TINY.vocab_size)
            alloc = Alloc(prefix + req.rid, 0, final, token, cp_size)
            replies = [s._on_alloc(alloc) for s in servers]
            assert all(isinstance(r, AllocReply) for r in replies), replies
            state[req.rid] = ([r for r in replies if isinstance(r, AllocReply)], (0,) * dcp_size, 0)
        replies, cursors, sent = state[req.rid]
        stop = completed_pages(req.seq_len, PAGE, req.seq_len == final)
        table = np.asarray(req.page_table, dtype=np.int64)
        first_rows = sender_first_rows(table, PAGE, cp_size, True)
        next_cursors = cursors
        for rank in range(cp_size):
            pieces, next_cursors = reshard_pieces(
                table,
                sent,
                stop,
                final,
                PAGE,
                cp_size,
                rank,
                dcp_size,
                TOKEN_BYTES,
                cursors,
                1 << 30,
            )
            for piece in pieces:
                rows = page_runs(token_rows(first_rows, piece.positions, final, PAGE), PAGE)
                block = torch.zeros(len(rows) * TOKEN_BYTES, dtype=torch.uint8)
                pack_rows(shards[rank], pack_index(rows, "cpu"), block)
                server = servers[piece.dest]
                at = replies[piece.dest].slab - server.arena.address + piece.offset
                server.arena.buffer[at : at + len(block)] = block  # the transfer engine's write
                landed.setdefault((req.rid, rank, piece.dest), []).append(
                    Piece(piece.offset, tuple(piece.positions.tolist()))
                )
        state[req.rid] = (replies, next_cursors, max(sent, stop))
        if req.seq_len == final:
            for rank in range(cp_size):
                for dest, server in enumerate(servers):
                    pieces_sent = tuple(landed.get((req.rid, rank, dest), ()))
                    server._on_done(Done(prefix + req.rid, 0, rank, pieces_sent, 0))
    for rid in SEQ_LENS:
        for server in servers:
            assert server._on_await(Await(prefix + rid, 0, 0)).ready, server.history


def _reset(servers: list[DecodeServer]) -> None:
    for server in servers:
        for attempt in server.attempts.values():
            if attempt.key in server.scheduler:
                server.scheduler.release(attempt.key)
        server.attempts.clear()
        server.every_attempt.clear()
        server.decoded.clear()


def _tables(steps: list[ScheduledBatch]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(r.page_table.tolist()) for step in steps for r in step.requests)


@pytest.mark.parametrize("mode", [CpMode.IN_SEQ_SPLIT, CpMode.ROUND_ROBIN_SPLIT])
def test_every_decode_rank_holds_its_owned_slice_of_the_reference_kv(
    mode: CpMode,
    groups: dict[int, list[DecodeServer]],
    reference: dict[str, ReferenceRequest],
) -> None:
    """Levels 2-5, cp 1-4, dcp 1-4. What a level changes for PD is where its pages are
    (level 5 allocates by compute owner in-seq, levels 4-5 deal pages per batch under the
    page interleave): each distinct set of page tables is sent once, to every decode
    group."""
    for cp_size in (1, 2, 3, 4):
        distinct: dict[tuple[tuple[int, ...], ...], list[int]] = {}
        schedules = {}
        for level in (2, 3, 4, 5):
            steps = _scheduled(cp_size, mode, level)
            distinct.setdefault(_tables(steps), []).append(level)
            schedules[level] = steps
        for levels in distinct.values():
            steps = schedules[levels[0]]
            shards = _shards(steps, cp_size, reference)
            for dcp_size, servers in groups.items():
                prefix = f"{mode}/{cp_size}/{levels[0]}/"
                _send(servers, steps, shards, prefix)
                for rid, want in reference.items():
                    for rank, server in enumerate(servers):
                        attempt = server.attempts[prefix + rid]
                        shard = (rank, dcp_size)
                        got = request_report(attempt, server.model, server.scheduler, {}, {}, shard)
                        where = (levels, cp_size, dcp_size, rid, rank)
                        assert kv_matches(got, want, PAGE, shard), where
                _reset(servers)
        if cp_size > 1:  # NOTE: the two allocations differ, or a level's pages went untested
            assert len(distinct) == 2, (mode, cp_size, list(distinct.values()))


def _report_all(servers: list[DecodeServer]) -> list[ReportReply]:
    """Every decode rank's ``Report``, asked at once (each from its own thread)."""
    replies: list[object] = [None] * len(servers)

    def ask(rank: int) -> None:
        replies[rank] = servers[rank]._on_report(Report())

    threads = [threading.Thread(target=ask, args=(r,)) for r in range(len(servers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(r, ReportReply) for r in replies), replies
    return [r for r in replies if isinstance(r, ReportReply)]


@pytest.mark.parametrize("cp_size", [3])
def test_the_decode_step_of_every_group_equals_the_reference(
    cp_size: int, groups: dict[int, list[DecodeServer]], reference: dict[str, ReferenceRequest]
) -> None:
    """cp 3 at level 5 (round-robin, the page interleave) to dcp 1, 2, 3 and 4: every
    decode rank's ``Report`` runs the decode step, all ranks at once."""
    steps = _scheduled(cp_size, CpMode.ROUND_ROBIN_SPLIT, 5)
    shards = _shards(steps, cp_size, reference)
    for dcp_size, servers in groups.items():
        _send(servers, steps, shards, "step/")
        replies = _report_all(servers)
        for rid, want in reference.items():
            got = [next(q for q in r.requests if q.rid == "step/" + rid) for r in replies]
            checked = check_request(got, want, PAGE)
            assert checked.kv_equal and checked.topk_equal, (dcp_size, rid)
            assert checked.diff is not None and checked.diff <= 1e-5, (dcp_size, rid, checked.diff)
        _reset(servers)
