"""The PD prefill side: each CP rank sends the pages it owns of every finished request.

Per request: ask the decode server for pages (every rank asks; the answer is the same),
write this rank's merged page runs into the decode server's registered memory, report the
logical page positions sent, and wait for the verdict. The rank releases the request's
pages only after the decode side acknowledged them (page reuse waits for the ack); on a
failure it keeps them, reports the error naming the request and rank, and may retry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection

from cpkv_core.pd.pack import runs_for_rank
from cpkv_core.pd.protocol import Alloc, AllocReply, Await, Done, Fail, Verdict
from cpkv_core.pd.transport import LOOPBACK, TransferError, Transport, Write
from cpkv_core.planning.execution import KvLayout
from cpkv_core.planning.tokens import token_ids
from cpkv_core.runtime.engine import CPEngine

BAD_ADDRESS_OFFSET = 1 << 40
"""Fault injection: added to destination addresses to make the engine reject a write."""


@dataclass(frozen=True, slots=True)
class PdFaults:
    """Fault injection for tests and drills; applies to a request's first attempt only."""

    fail: tuple[str, int] | None = None
    """(rid, rank): that rank writes to an unregistered address, so the transfer fails."""
    stall: tuple[str, int] | None = None
    """(rid, rank): that rank writes but never reports, so the decode side times out."""


@dataclass(frozen=True, slots=True)
class PdTarget:
    """Where and how a prefill group sends its requests."""

    address: tuple[str, int]
    authkey: bytes
    rid_prefix: str = ""
    """Prepended to rids on the decode side (several runs can share one decode server)."""
    retries: int = 0
    """Attempts after a failed one."""
    faults: PdFaults = field(default_factory=PdFaults)
    local_host: str = LOOPBACK
    """This rank's address as the decode server reaches it (``--pd-local-host``): the
    host its transfer engine's session is named by."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """How one request went from one rank."""

    rid: str
    rank: int
    ready: bool
    attempts: int
    bytes_sent: int
    released: bool
    """The rank freed the request's pages (only after the decode side's ack)."""
    errors: tuple[str, ...]
    write_seconds: float = 0.0
    """Wall time of this rank's transfer-engine writes for the request."""


_transport: Transport | None = None


def process_transport(host: str = LOOPBACK) -> Transport:
    """This process's transfer engine on ``host``, started on first use.

    Raises:
        RuntimeError: the engine already runs on another host (one engine a process).
    """
    global _transport
    if _transport is None:
        _transport = Transport(host)
    if not _transport.session.startswith(f"{host}:"):
        raise RuntimeError(
            f"this process's transfer engine runs as {_transport.session}, not on {host}"
        )
    return _transport


def _writes(
    engine: CPEngine, reply: AllocReply, rid: str, rank: int, bad: bool
) -> tuple[list[Write], tuple[int, ...]]:
    req = engine.requests[rid]
    runs = runs_for_rank(
        req.page_table.tolist(),
        reply.page_table,
        req.seq_len,
        engine.deploy.page_size,
        engine.deploy.cp_size,
        rank,
        engine.kv_layout is KvLayout.SHARDED,
    )
    offset = BAD_ADDRESS_OFFSET if bad else 0
    writes = []
    for layer, targets in zip(engine.pool.layers, reply.targets, strict=True):
        for tensor, target in zip(
            (layer.latent, layer.index_k, layer.index_k_scale), targets, strict=True
        ):
            for run in runs:
                writes.append(
                    Write(
                        src=tensor.data_ptr() + run.src_row * target.row_bytes,
                        dst=target.address + run.dst_row * target.row_bytes + offset,
                        length=run.tokens * target.row_bytes,
                    )
                )
    return writes, tuple(p for run in runs for p in run.positions)


def _call(conn: Connection, message: object) -> object:
    conn.send(message)
    return conn.recv()


def _start_attempt(
    engine: CPEngine, conn: Connection, target: PdTarget, rid: str, attempt: int
) -> tuple[int, float, str]:
    """Asks for pages, writes this rank's pieces, reports them.

    Returns:
        (bytes written, write seconds, why pages were refused or "").
    """
    rank = engine.comm.rank
    remote = target.rid_prefix + rid
    faults = target.faults if attempt == 0 else PdFaults()
    req = engine.requests[rid]
    next_token = token_ids(req.rid_key, req.seq_len, engine.cfg.vocab_size)
    reply = _call(conn, Alloc(remote, attempt, req.seq_len, next_token, engine.deploy.cp_size))
    if not isinstance(reply, AllocReply):
        return 0, 0.0, f"decode refused pages: {reply}"
    writes, positions = _writes(engine, reply, rid, rank, faults.fail == (rid, rank))
    start = time.perf_counter()
    try:
        process_transport(target.local_host).write(reply.session, writes)
    except TransferError as exc:
        _call(conn, Fail(remote, attempt, rank, str(exc)))
        return 0, 0.0, ""
    seconds = time.perf_counter() - start
    sent = sum(w.length for w in writes)
    if faults.stall != (rid, rank):
        _call(conn, Done(remote, attempt, rank, positions, sent))
    return sent, seconds, ""


def send_requests(engine: CPEngine, rids: Sequence[str], target: PdTarget) -> list[SendResult]:
    """Sends every request in ``rids`` from this rank; never raises for a transfer failure.

    Every rank of the prefill group calls it with the same ``rids`` in the same order. All
    requests are started before any verdict is awaited, so one slow request does not hold
    the others back; failed ones are retried up to ``target.retries`` times.
    """
    rank = engine.comm.rank
    transport = process_transport(target.local_host)
    transport.register(
        [
            t
            for layer in engine.pool.layers
            for t in (layer.latent, layer.index_k, layer.index_k_scale)
        ]
    )
    sent = dict.fromkeys(rids, 0)
    seconds = dict.fromkeys(rids, 0.0)
    errors: dict[str, list[str]] = {rid: [] for rid in rids}
    ready: set[str] = set()
    attempts = dict.fromkeys(rids, 0)
    try:
        with Client(target.address, authkey=target.authkey) as conn:
            todo = list(rids)
            for attempt in range(target.retries + 1):
                for rid in todo:
                    attempts[rid] = attempt + 1
                    sent[rid], seconds[rid], refused = _start_attempt(
                        engine, conn, target, rid, attempt
                    )
                    if refused:
                        errors[rid].append(
                            f"request {rid} rank {rank} attempt {attempt}: {refused}"
                        )
                for rid in todo:
                    verdict = _call(conn, Await(target.rid_prefix + rid, attempt, rank))
                    assert isinstance(verdict, Verdict), verdict
                    if verdict.ready:
                        engine.forget(rid)  # page reuse waits for the ack
                        ready.add(rid)
                    else:
                        errors[rid].append(
                            f"request {rid} rank {rank} attempt {attempt}: {verdict.reason}"
                        )
                todo = [rid for rid in todo if rid not in ready]
    except (EOFError, OSError) as exc:
        for rid in rids:
            if rid not in ready:
                errors[rid].append(f"request {rid} rank {rank}: decode server unreachable: {exc!r}")
    finally:
        transport.close()
    return [
        SendResult(
            rid=rid,
            rank=rank,
            ready=rid in ready,
            attempts=attempts[rid],
            bytes_sent=sent[rid],
            released=rid in ready,
            errors=tuple(errors[rid]),
            write_seconds=seconds[rid],
        )
        for rid in rids
    ]
