"""What a decode rank reports of a request: the state of its latest attempt and, once it is
ready, the rows it rebuilt (its own page positions) and the outputs of one decode step.

The decode step runs on every rank of the decode group at once, for the requests every
rank completed (``agreed_ready``). A non-CP decode server runs the reference's own step on
its whole pool; a decode group merges its ranks' partial attention (``runtime.dcp_decode``).
"""

from __future__ import annotations

import numpy as np
import torch

from cpkv_core.dist import Communicator, broadcast_value, gather_value
from cpkv_core.dist.typed.tensor_data import to_data
from cpkv_core.pd.attempt import Attempt, AttemptState
from cpkv_core.pd.protocol import RequestReport
from cpkv_core.planning import BatchSpec, RequestSpec, Scheduler
from cpkv_core.planning.pd_pack import token_rows
from cpkv_core.planning.pd_reshard import decode_owner, decode_positions, decode_tokens
from cpkv_core.runtime.dcp_decode import ShardKeys, dcp_decode_step
from cpkv_core.runtime.reference import ReferenceModel

Ready = tuple[tuple[str, int], ...]
"""(rid, attempt) of the attempts a decode rank completed."""


def agreed_ready(comm: Communicator | None, ready: Ready) -> Ready:
    """The attempts every rank of the decode group completed, in one order on every rank
    (a collective; ``comm`` None: a non-CP decode server's own)."""
    if comm is None or comm.world_size == 1:
        return ready
    every = gather_value(comm, ready, Ready, "completed attempts")
    common = None
    if every is not None:
        common = tuple(sorted(set(every[0]).intersection(*every[1:])))
    agreed: Ready = broadcast_value(comm, common, Ready, "agreed attempts")
    return agreed


def _local_locs(scheduler: Scheduler, key: str, tokens: int, page_size: int) -> torch.Tensor:
    """``[tokens]`` pool rows of a rank's first ``tokens`` local tokens of ``key``."""
    table = np.asarray(scheduler.page_table(key) if key in scheduler else (), dtype=np.int64)
    local = np.arange(tokens, dtype=np.int64)
    return torch.from_numpy(table[local // page_size] * page_size + local % page_size)


def decode_request(
    attempt: Attempt, model: ReferenceModel, scheduler: Scheduler, comm: Communicator | None
) -> tuple[torch.Tensor, ...]:
    """Decodes ``attempt.next_token`` after the request's ``seq_len`` tokens (on every rank
    of the group at once): the final-normed hidden state, logits and top-k positions."""
    seq_len, ps = attempt.seq_len, model.page_size
    rank, size = (0, 1) if comm is None else (comm.rank, comm.world_size)
    key, position = attempt.key, seq_len
    owns_new = int(decode_owner(np.asarray(position // ps), size)) == rank
    if owns_new:
        before = scheduler.seq_len(key) if key in scheduler else 0
        step = RequestSpec(key, before, 1)
        (scheduled,) = scheduler.schedule(BatchSpec(0, (step,))).requests
        if comm is None or size == 1:
            out = model.run_request(scheduled, [attempt.next_token])
            return out.last_hidden, out.logits, out.topk
    assert comm is not None, "a non-CP decode server owns every page"
    pages = -(-(seq_len + 1) // ps)
    positions = token_rows(
        np.arange(pages, dtype=np.int64) * ps, decode_positions(pages, rank, size), seq_len + 1, ps
    )
    locs = _local_locs(scheduler, key, len(positions), ps)
    keys = ShardKeys(locs, torch.from_numpy(positions))
    new_loc = int(locs[-1]) if owns_new else None
    token = (attempt.rid, attempt.next_token, position)
    out = dcp_decode_step(
        model.cfg, model.weights, model.pool, comm, token, keys, new_loc, model.index_k_dtype
    )
    return out.last_hidden, out.logits, out.topk


def request_report(
    attempt: Attempt,
    model: ReferenceModel,
    scheduler: Scheduler,
    decoded: dict[str, tuple[torch.Tensor, ...]],
    history: dict[str, list[str]],
    shard: tuple[int, int] = (0, 1),
) -> RequestReport:
    """The report of ``attempt`` on decode rank ``shard = (rank, dcp_size)``: its rows are
    those of the positions the rank owns, in position order; ``decoded`` holds the decode
    step of the attempts the whole group completed (by attempt key), ``history`` each rid's
    failed attempts."""
    failures = "; ".join(history.get(attempt.rid, []))
    pages = len(scheduler.page_table(attempt.key)) if attempt.key in scheduler else 0
    if attempt.state is not AttemptState.READY:
        state = failures or f"attempt {attempt.attempt} {attempt.state}"
        return RequestReport(attempt.rid, False, state, pages)
    tokens = decode_tokens(attempt.seq_len, model.page_size, *shard)
    locs = _local_locs(scheduler, attempt.key, tokens, model.page_size)
    kv = [model.pool.read(layer, locs) for layer in range(len(model.pool.layers))]
    rows = [t for k in kv for t in (k.latent, k.index_k.view(torch.uint8), k.index_k_scale)]
    step = decoded.get(attempt.key, ())
    return RequestReport(
        attempt.rid,
        True,
        failures,
        pages,
        tuple(to_data(t) for t in rows),
        tuple(to_data(t) for t in step),
    )
