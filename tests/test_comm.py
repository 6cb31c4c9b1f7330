"""Communication layer: LocalGroup collectives and byte counts, and a real gloo group through
the spawn harness giving the same results and counts."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from cpkv_core.dist import launch
from cpkv_core.dist.comm import CollectiveStats, CommStats, Communicator, new_group_communicator
from cpkv_core.dist.launch import (
    ERROR,
    PROGRESS,
    RESULT,
    ProgressEvent,
    report_progress,
    spawn_group,
)
from cpkv_core.dist.local_group import LocalGroup, run_local
from cpkv_core.dist.rank_errors import RankError, RankFailed, rank_error
from cpkv_core.dist.typed.frames import FrameError, encode_frame
from cpkv_core.dist.value_collectives import gather_value
from tests.conftest import code_running_payloads, load_unsafely

# (name, dtype, shape): every entry is all-gathered under tag ``name`` by the grid worker.
GRID: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...] = (
    ("f32", torch.float32, (5, 3)),
    ("bf16", torch.bfloat16, (4, 6)),
    ("f16", torch.float16, (7,)),
    ("i64", torch.int64, (2, 2, 2)),
    ("u8", torch.uint8, (9,)),
    ("bool", torch.bool, (3, 1)),
    ("fp8", torch.float8_e4m3fn, (6, 4)),
    ("scalar", torch.float32, ()),
    ("empty", torch.float32, (0, 8)),
)


def _rank_input(rank: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Deterministic per-rank values, exactly representable in every grid dtype."""
    numel = 1
    for d in shape:
        numel *= d
    values = (torch.arange(numel, dtype=torch.float32) * 0.5 + 2.0 * rank) % 8.0
    if dtype == torch.bool:
        return (values.to(torch.int64) % 2 == 1).reshape(shape)
    return values.to(dtype).reshape(shape)


def _expected_gather(world_size: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.stack([_rank_input(r, dtype, shape) for r in range(world_size)])


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit-exact comparison form: float8 has no equality kernels everywhere."""
    return t.view(torch.uint8) if t.dtype.itemsize == 1 and t.dtype.is_floating_point else t


def _assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert torch.equal(_bits(actual), _bits(expected))


def _expected_stats(world_size: int) -> dict[str, dict[str, int]]:
    stats = {}
    for name, dtype, shape in GRID:
        contributed = _rank_input(0, dtype, shape).numel() * dtype.itemsize
        stats[name] = stats[f"{name}/async"] = {
            "calls": 1,
            "bytes_contributed": contributed,
            "bytes_gathered": world_size * contributed,
        }
    return stats


ASYNC_INTO = frozenset({"f32", "fp8", "empty"})
"""Grid entries whose async gather lands in a caller's buffer."""


@dataclass(frozen=True, slots=True)
class SubResult:
    """What the last rank saw on a subgroup holding only itself."""

    rank: int
    world_size: int
    gathered: torch.Tensor
    stats: dict[str, dict[str, int]]
    objects: list[str] | None


@dataclass(frozen=True, slots=True)
class GridResult:
    """What one rank saw of the grid (it travels back from a spawned rank as a frame)."""

    gathered: dict[str, torch.Tensor]
    in_flight: dict[str, torch.Tensor]
    stats: dict[str, dict[str, int]]
    objects: list[dict[str, int]] | None
    payloads: list[bytes] | None
    """``gather_bytes`` of ``_payload(rank)``: on rank 0 only."""
    broadcast: bytes
    values: list[torch.Tensor] | None
    """``gather_value`` of a float8 tensor per rank: on rank 0 only."""
    sub: SubResult | None = None


def _payload(rank: int) -> bytes:
    """Lengths differ by rank (rank 0 sends none); every byte value occurs."""
    return bytes(i % 256 for i in range(rank * 300))


BROADCAST = b"\x00from rank 0\xff"


def grid_worker(comm: Communicator) -> GridResult:
    """All-gathers every GRID entry, then a barrier, an uncounted object gather and the
    uncounted byte collectives."""
    gathered = {
        name: comm.all_gather(_rank_input(comm.rank, dtype, shape), tag=name)
        for name, dtype, shape in GRID
    }
    # NOTE: every async gather is in flight before the first wait.
    handles = {
        name: comm.all_gather_async(
            _rank_input(comm.rank, dtype, shape),
            f"{name}/async",
            torch.empty((comm.world_size, *shape), dtype=dtype) if name in ASYNC_INTO else None,
        )
        for name, dtype, shape in GRID
    }
    in_flight = {name: handle.wait() for name, handle in handles.items()}
    comm.barrier()
    objects = cast(list[dict[str, int]] | None, comm.gather_objects({"rank": comm.rank}))
    payloads = comm.gather_bytes(_payload(comm.rank))
    broadcast = comm.broadcast_bytes(BROADCAST if comm.rank == 0 else None)
    fp8 = _rank_input(comm.rank, torch.float8_e4m3fn, (2, 3))
    values = gather_value(comm, fp8, torch.Tensor)
    stats = comm.stats.as_dict()
    return GridResult(gathered, in_flight, stats, objects, payloads, broadcast, values)


def spawn_grid_worker(comm: Communicator) -> GridResult:
    """grid_worker on the default group, then on the subgroup holding only the last rank."""
    result = grid_worker(comm)
    report_progress(comm.rank)
    sub = new_group_communicator([comm.world_size - 1])
    if sub is None:
        return result
    gathered = sub.all_gather(_rank_input(7, torch.float8_e4m3fn, (2, 3)), "sub")
    objects = cast(list[str] | None, sub.gather_objects("from-sub"))
    found = SubResult(sub.rank, sub.world_size, gathered, sub.stats.as_dict(), objects)
    return dataclasses.replace(result, sub=found)


def failing_worker(comm: Communicator) -> None:
    """Rank 1 raises while rank 0 waits for it in an all-gather."""
    if comm.rank == 1:
        raise ValueError("rank one breaks on purpose")
    comm.all_gather(torch.zeros(4), tag="never")


def _check_grid_results(results: list[GridResult], world_size: int) -> None:
    assert len(results) == world_size
    for rank, result in enumerate(results):
        for name, dtype, shape in GRID:
            _assert_same(result.gathered[name], _expected_gather(world_size, dtype, shape))
            _assert_same(result.in_flight[name], _expected_gather(world_size, dtype, shape))
        assert result.stats == _expected_stats(world_size)
        expected_objects = [{"rank": r} for r in range(world_size)] if rank == 0 else None
        assert result.objects == expected_objects
        assert result.broadcast == BROADCAST
        if rank != 0:
            assert result.payloads is None and result.values is None
            continue
        assert result.payloads == [_payload(r) for r in range(world_size)]
        assert result.values is not None and len(result.values) == world_size
        for r, value in enumerate(result.values):
            _assert_same(value, _rank_input(r, torch.float8_e4m3fn, (2, 3)))


# ---------------------------------------------------------------------------- CommStats


def test_stats_accumulate_per_tag_and_reset() -> None:
    stats = CommStats()
    stats.record("kv", contributed=10, gathered=40)
    stats.record("kv", contributed=5, gathered=20)
    stats.record("hidden", contributed=1, gathered=4)
    assert stats.by_tag["kv"] == CollectiveStats(calls=2, bytes_contributed=15, bytes_gathered=60)
    assert stats.total_gathered() == 64
    assert stats.total_contributed() == 16
    assert stats.as_dict()["hidden"] == {"calls": 1, "bytes_contributed": 1, "bytes_gathered": 4}
    stats.reset()
    assert stats.as_dict() == {}
    assert stats.total_gathered() == 0


# ---------------------------------------------------------------------------- LocalGroup


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_local_all_gather_stacks_in_rank_order_and_counts_bytes(world_size: int) -> None:
    _check_grid_results(run_local(world_size, grid_worker), world_size)


def test_local_all_gather_counts_exact_bytes() -> None:
    def fn(comm: Communicator) -> dict[str, dict[str, int]]:
        comm.all_gather(torch.zeros(10, 576, dtype=torch.bfloat16), tag="kv")
        comm.all_gather(torch.zeros(10, 128, dtype=torch.float8_e4m3fn), tag="index_k")
        comm.all_gather(torch.zeros(10, 576, dtype=torch.bfloat16), tag="kv")
        return comm.stats.as_dict()

    for stats in run_local(4, fn):
        assert stats == {
            "kv": {"calls": 2, "bytes_contributed": 2 * 11520, "bytes_gathered": 2 * 46080},
            "index_k": {"calls": 1, "bytes_contributed": 1280, "bytes_gathered": 5120},
        }


def test_local_gather_objects_are_not_counted() -> None:
    def fn(comm: Communicator) -> tuple[list[object] | None, int]:
        return comm.gather_objects(comm.rank * 10), comm.stats.total_gathered()

    results = run_local(3, fn)
    assert results == [([0, 10, 20], 0), (None, 0), (None, 0)]


def test_local_all_gather_returns_a_new_tensor() -> None:
    def fn(comm: Communicator) -> bool:
        local = torch.ones(3)
        out = comm.all_gather(local, tag="x")
        out.zero_()
        return bool(local.eq(1).all())

    assert run_local(2, fn) == [True, True]


def test_local_rank_exception_surfaces_without_hanging() -> None:
    start = time.monotonic()
    with pytest.raises(
        RuntimeError, match="local rank 1 failed: ValueError: rank one breaks"
    ) as info:
        run_local(3, failing_worker, timeout_s=30.0)
    assert isinstance(info.value.__cause__, ValueError)
    assert time.monotonic() - start < 10.0


def _ragged(comm: Communicator) -> torch.Tensor:
    return comm.all_gather(torch.zeros(comm.rank + 1), tag="ragged")


def _mixed_dtypes(comm: Communicator) -> torch.Tensor:
    dtype = torch.float32 if comm.rank == 0 else torch.float64
    return comm.all_gather(torch.zeros(2, dtype=dtype), tag="mixed")


@pytest.mark.parametrize("fn", [_ragged, _mixed_dtypes], ids=["shape", "dtype"])
def test_local_rejects_mismatched_shapes_and_dtypes(
    fn: Callable[[Communicator], torch.Tensor],
) -> None:
    """Parts that differ in shape or dtype are refused: ``torch.stack`` alone would promote
    a float32 part to float64 and hide the mismatch."""
    with pytest.raises(RuntimeError, match="same shape and dtype on every rank"):
        run_local(2, fn, timeout_s=30.0)


def test_local_group_abort_releases_waiting_ranks() -> None:
    group = LocalGroup(2, timeout_s=30.0)
    comm0 = group.communicators()[0]
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            comm0.barrier()
        except threading.BrokenBarrierError as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    group.abort()
    t.join(timeout=10.0)
    assert not t.is_alive()
    assert len(errors) == 1


# ---------------------------------------------------------------------------- spawn harness


class _FakeProc:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode


class _FakeInbox:
    """Hands ``_collect`` the given ``(rank, kind, frame)`` messages, then nothing."""

    def __init__(self, *messages: tuple[int, bytes, bytes]) -> None:
        self.messages = list(messages)

    def get(self, timeout: float) -> tuple[int, bytes, bytes]:
        if self.messages:
            return self.messages.pop(0)
        time.sleep(timeout)
        raise queue.Empty


def _collect(inbox: _FakeInbox, procs: list[Any], **expect: Any) -> dict[int, object]:
    expect.setdefault("result", int)
    return launch._collect(inbox, procs, 30.0, launch._Expect(**expect))


def test_collect_times_out_naming_missing_ranks() -> None:
    procs: list[Any] = [_FakeProc(None), _FakeProc(None)]
    with pytest.raises(
        RuntimeError, match=r"timed out after 0.2 s; ranks without a result: \[0, 1\]"
    ):
        launch._collect(_FakeInbox(), procs, 0.2, launch._Expect(int))


@pytest.mark.parametrize("code", [-9, 1, 0])
def test_collect_reports_rank_that_died_without_result(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Killed, failed, or exited cleanly (``os._exit(0)``) without a result: named once the
    grace runs out, not after the whole timeout."""
    monkeypatch.setattr(launch, "_EXIT_GRACE_S", 0.1)
    procs: list[Any] = [_FakeProc(None), _FakeProc(code)]
    with pytest.raises(RuntimeError, match=f"rank 1 exited with code {code} before reporting"):
        _collect(_FakeInbox(), procs)


def test_collect_decodes_typed_progress_and_results() -> None:
    events: list[object] = []
    inbox = _FakeInbox(
        (1, PROGRESS, encode_frame(7, int)),
        (1, RESULT, encode_frame([b"one"], list[bytes])),
        (0, RESULT, encode_frame([], list[bytes])),
    )
    procs: list[Any] = [_FakeProc(None), _FakeProc(None)]
    done = _collect(inbox, procs, result=list[bytes], progress=int, on_progress=events.append)
    assert done == {0: [], 1: [b"one"]}
    assert events == [ProgressEvent(1, 7)]


def test_collect_raises_the_typed_error_a_rank_reported() -> None:
    try:
        try:
            raise OSError("disk gone")
        except OSError as cause:
            raise ValueError("rank one breaks on purpose") from cause
    except ValueError as exc:
        report = encode_frame(rank_error(exc), RankError)
    procs: list[Any] = [_FakeProc(None), _FakeProc(None)]
    with pytest.raises(RankFailed, match=r"rank 1 failed:\n(.|\n)*OSError: disk gone") as info:
        _collect(_FakeInbox((1, ERROR, report)), procs)
    assert info.value.rank == 1
    assert [(r.name, r.message) for r in info.value.error.chain] == [
        ("ValueError", "rank one breaks on purpose"),
        ("OSError", "disk gone"),
    ]


@pytest.mark.parametrize("kind", [RESULT, ERROR, PROGRESS], ids=lambda k: k.decode())
@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_collect_refuses_a_pickled_message_and_never_runs_it(
    kind: bytes, how: str, tmp_path: Path
) -> None:
    control = tmp_path / "control"
    load_unsafely(how, code_running_payloads(control)[how])
    assert control.exists(), "the payload runs code when unpickled"
    victim = tmp_path / "victim"
    inbox = _FakeInbox((1, kind, code_running_payloads(victim)[how]))
    procs: list[Any] = [_FakeProc(None), _FakeProc(None)]
    looks = "a pickle" if how == "pickle" else "a zip archive"
    with pytest.raises(FrameError, match=rf"rank 1's .*: not a typed frame \({looks}"):
        _collect(inbox, procs, progress=int, on_progress=lambda event: None)
    assert not victim.exists()


def test_collect_refuses_a_message_of_unknown_kind() -> None:
    procs: list[Any] = [_FakeProc(None)]
    with pytest.raises(FrameError, match="rank 0 sent a message of unknown kind b'X'"):
        _collect(_FakeInbox((0, b"X", encode_frame(1, int))), procs)


def unannotated_worker(comm: Communicator, count):  # type: ignore[no-untyped-def]
    return count


def untyped_worker(comm: Communicator) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize(
    ("fn", "error", "words"),
    [
        (unannotated_worker, TypeError, r"annotate every .* \(missing: \['count', 'return'\]\)"),
        (untyped_worker, TypeError, r"cannot carry Any"),
        (lambda comm: 1, ValueError, "a module-level function"),
    ],
)
def test_spawn_group_refuses_a_body_it_cannot_type_before_starting_ranks(
    fn: Any, error: type[Exception], words: str
) -> None:
    start = time.monotonic()
    with pytest.raises(error, match=words):
        spawn_group(2, fn, (3,) if fn is unannotated_worker else ())
    assert time.monotonic() - start < 2.0, "no rank was started"


def test_report_progress_is_a_noop_outside_spawned_ranks() -> None:
    report_progress("nobody listens")


@pytest.mark.gloo
def test_gloo_group_matches_local_group_results_and_bytes() -> None:
    events: list[object] = []
    start = time.monotonic()
    results = spawn_group(
        2, spawn_grid_worker, timeout_s=120.0, on_progress=events.append, progress_type=int
    )
    elapsed = time.monotonic() - start
    _check_grid_results(results, 2)
    local = run_local(2, grid_worker)
    for spawned, in_process in zip(results, local, strict=True):
        assert spawned.stats == in_process.stats
        for name, _, _ in GRID:
            _assert_same(spawned.gathered[name], in_process.gathered[name])
    assert sorted((e.rank, e.message) for e in events if isinstance(e, ProgressEvent)) == [
        (0, 0),
        (1, 1),
    ]
    assert results[0].sub is None
    sub = results[1].sub
    assert sub is not None and (sub.rank, sub.world_size) == (0, 1)
    _assert_same(sub.gathered, _rank_input(7, torch.float8_e4m3fn, (2, 3)).unsqueeze(0))
    assert sub.stats == {"sub": {"calls": 1, "bytes_contributed": 6, "bytes_gathered": 6}}
    assert sub.objects == ["from-sub"]
    assert elapsed < 60.0, f"two-rank gloo spawn took {elapsed:.1f} s"


@pytest.mark.gloo
def test_gloo_failing_rank_is_named_and_does_not_hang() -> None:
    start = time.monotonic()
    with pytest.raises(
        RankFailed, match=r"rank 1 failed:\n(.|\n)*ValueError: rank one breaks"
    ) as info:
        spawn_group(2, failing_worker, timeout_s=60.0)
    assert time.monotonic() - start < 30.0
    error = info.value.error.chain[0]
    assert (error.type, error.message) == ("builtins.ValueError", "rank one breaks on purpose")
