"""Turns a workload into prefill batches the way SGLang's scheduler does; :func:`schedule`.

Per batch (SGLang's ``PrefillAdder``, ``schedule_policy.py``, first come first served):

1. The request left mid-prefill by the last batch (the chunked request) comes first. Its
   next chunk is ``min(remaining, chunked_prefill_size)`` tokens, not rounded to pages, so
   a chunk size that is not a page multiple leaves it to resume mid-page.
2. Waiting requests follow in arrival order. Each is matched against the radix cache: the
   longest cached run of full pages, leaving at least one token to compute. A request whose
   page-rounded extend reaches the remaining ``max_prefill_tokens`` budget stops the batch
   (unless it is the first). One that does not fit the remaining chunk budget is cut to the
   pages that fit and becomes the chunked request; the batch ends there.
3. Both budgets are charged the extend rounded up to whole pages.

With ``kv_cache_sharding`` (SGLang's ``--enable-kv-cache-sharding``) the chunk size is first
rounded up to a page multiple and a chunked request's next chunk ends on a page boundary, so
no chunk resumes mid-page (the rules: ``cpkv_core.planning.chunking``).

After the batch, every request's computed full pages go into the radix cache, and a
finished turn releases its session's next turn (or, under ``max_concurrency``, frees a
place for the next session).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from cpkv.synth.radix import PageRadixTree
from cpkv.synth.workload import PageKey, Session, Turn, Workload, page_keys
from cpkv_core.planning import BatchSpec, RequestSpec
from cpkv_core.planning.chunking import sharded_chunk_size, sharded_next_chunk

DEFAULT_CHUNKED_PREFILL_SIZE = 8192
"""SGLang's ``--chunked-prefill-size`` on 60-160 GiB GPUs (H100, H200)."""
DEFAULT_MAX_PREFILL_TOKENS = 16384
"""SGLang's ``--max-prefill-tokens``."""


class SchedulerConfig(BaseModel):
    """The scheduler settings that shape prefill batches (SGLang's server arguments)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    page_size: int = 64
    """Tokens per KV page; radix-cache hits are whole pages."""
    chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL_SIZE
    """Most tokens one batch computes, chunking long prompts; -1 turns chunking off."""
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS
    """Token budget of one batch: a request that would reach it waits for the next batch."""
    kv_cache_sharding: bool = False
    """SGLang's ``--enable-kv-cache-sharding``: page-multiple chunks, each starting on a page
    boundary."""


def effective_scheduler(config: SchedulerConfig) -> SchedulerConfig:
    """The settings the server runs: with KV sharding, the chunk size rounded up to a page
    multiple (10000 -> 10048 at page 64).

    Raises:
        ValueError: KV sharding with chunked prefill off or a page size below 2.
    """
    if not config.kv_cache_sharding:
        return config
    if config.page_size <= 1:
        raise ValueError(
            f"KV sharding requires a page size above 1, got {config.page_size} "
            "(sglang 0.5.23, srt/arg_groups/kv_shard_hook.py)"
        )
    chunk = sharded_chunk_size(config.chunked_prefill_size, config.page_size)
    return config.model_copy(update={"chunked_prefill_size": chunk})


def check_scheduler(config: SchedulerConfig) -> None:
    """Raises ValueError for settings under which no batch could be built."""
    config = effective_scheduler(config)
    page, chunk = config.page_size, config.chunked_prefill_size
    if page < 1:
        raise ValueError(f"page_size must be >= 1, got {page}")
    if chunk != -1 and chunk < page:
        raise ValueError(
            f"chunked_prefill_size must be -1 (off) or at least one page ({page} tokens), "
            f"got {chunk}; a smaller chunk cannot admit a new request"
        )
    if config.max_prefill_tokens < 1:
        raise ValueError(f"max_prefill_tokens must be >= 1, got {config.max_prefill_tokens}")


@dataclass(slots=True)
class _Live:
    """A turn the server has received: its page keys and the tokens computed so far."""

    turn: Turn
    session: int
    index: int
    keys: list[PageKey]
    done: int = 0


@dataclass(slots=True)
class _Budget:
    """What is left of one batch's budgets (SGLang's ``rem_input_tokens`` and
    ``rem_chunk_tokens``)."""

    page_size: int
    input_tokens: int
    chunk_tokens: int | None

    def paged(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def charge(self, tokens: int) -> None:
        self.input_tokens -= self.paged(tokens)
        if self.chunk_tokens is not None:
            self.chunk_tokens -= self.paged(tokens)

    @property
    def open(self) -> bool:
        return self.input_tokens > 0 and (self.chunk_tokens is None or self.chunk_tokens > 0)


@dataclass(slots=True)
class _State:
    sessions: tuple[Session, ...]
    limit: int
    tree: PageRadixTree = field(default_factory=PageRadixTree)
    waiting: deque[_Live] = field(default_factory=deque)
    chunked: _Live | None = None
    next_session: int = 0
    in_flight: int = 0


def schedule(workload: Workload, config: SchedulerConfig) -> tuple[BatchSpec, ...]:
    """The prefill batches SGLang's scheduler would run for ``workload``.

    Raises:
        ValueError: scheduler settings under which no batch could be built.
    """
    check_scheduler(config)
    config = effective_scheduler(config)
    limit = workload.max_concurrency or len(workload.sessions)
    state = _State(workload.sessions, limit)
    batches: list[BatchSpec] = []
    while True:
        _admit_sessions(state, config.page_size)
        if not state.waiting and state.chunked is None:
            return tuple(batches)
        scheduled = _build_batch(state, config)
        assert scheduled, f"batch {len(batches)} admitted nothing; the config check missed it"
        batches.append(BatchSpec(len(batches), tuple(spec for _, spec in scheduled)))
        _finish_batch(state, scheduled, config.page_size)


def _live(state: _State, session: int, index: int, page_size: int) -> _Live:
    turn = state.sessions[session].turns[index]
    return _Live(turn, session, index, page_keys(turn.segments, page_size))


def _admit_sessions(state: _State, page_size: int) -> None:
    while state.in_flight < state.limit and state.next_session < len(state.sessions):
        state.waiting.append(_live(state, state.next_session, 0, page_size))
        state.next_session += 1
        state.in_flight += 1


def _build_batch(state: _State, config: SchedulerConfig) -> list[tuple[_Live, RequestSpec]]:
    chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else None
    budget = _Budget(config.page_size, config.max_prefill_tokens, chunk)
    scheduled: list[tuple[_Live, RequestSpec]] = []
    carried, state.chunked = state.chunked, None
    if carried is not None:
        remaining = carried.turn.prompt_len - carried.done
        extend = remaining if budget.chunk_tokens is None else min(remaining, budget.chunk_tokens)
        if config.kv_cache_sharding and budget.chunk_tokens is not None:
            fits = sharded_next_chunk(carried.done, budget.chunk_tokens, config.page_size)
            extend = min(remaining, fits)
        scheduled.append((carried, RequestSpec(carried.turn.rid, carried.done, extend)))
        budget.charge(extend)
        state.chunked = carried if extend < remaining else None
    while state.waiting and state.chunked is None and budget.open:
        live = state.waiting[0]
        spec = _admit(live, state.tree, budget, first=not scheduled)
        if spec is None:
            break
        state.waiting.popleft()
        live.done = spec.prefix_len
        scheduled.append((live, spec))
        budget.charge(spec.extend_len)
        if spec.seq_len < live.turn.prompt_len:
            state.chunked = live
    return scheduled


def _admit(live: _Live, tree: PageRadixTree, budget: _Budget, first: bool) -> RequestSpec | None:
    """The request's part of the batch, or None when it has to wait for the next one."""
    page = budget.page_size
    prompt_len = live.turn.prompt_len
    pages, writer = tree.match(live.keys, (prompt_len - 1) // page)
    prefix = pages * page
    extend = prompt_len - prefix
    if budget.paged(extend) >= budget.input_tokens and not first:
        return None
    if budget.chunk_tokens is not None and budget.paged(extend) > budget.chunk_tokens:
        extend = budget.chunk_tokens // page * page
        if extend <= 0:
            return None
    return RequestSpec(live.turn.rid, prefix, extend, prefix_from=writer)


def _finish_batch(
    state: _State, scheduled: list[tuple[_Live, RequestSpec]], page_size: int
) -> None:
    for live, spec in scheduled:
        live.done = spec.seq_len
        state.tree.insert(live.turn.rid, live.keys[: live.done // page_size])
        if live.done < live.turn.prompt_len:
            continue
        turns = state.sessions[live.session].turns
        if live.index + 1 < len(turns):
            state.waiting.append(_live(state, live.session, live.index + 1, page_size))
        else:
            state.in_flight -= 1
