"""Typed frames: every type a rank sends its launcher round-trips; anything else is refused.

A frame holds one value of a known annotation as JSON plus raw tensor bytes. These tests
round-trip what a real run's ranks send (results with shadow verdicts, loop steps, PD
records, the call's arguments, progress, errors), float8 tensors byte for byte, and show
that a pickle or a ``torch.save`` payload is refused unread (a payload that would create a
file when unpickled creates none), as are truncated, padded and tampered frames.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pydantic
import pytest
import torch

from cpkv.run.jobs import BatchProgress, RankJob, RankRun
from cpkv.run.loop import LoopStep
from cpkv.run.recovery import FailedAttempt, PhaseKill
from cpkv.run.runner import RankFault, _run_job, run_jobs_rank
from cpkv_core.config import MaterializeMode, model_preset
from cpkv_core.dist import run_local
from cpkv_core.dist.comm import CollectiveTimeout, Communicator
from cpkv_core.dist.rank_body import rank_signature
from cpkv_core.dist.rank_errors import RankError, rank_error
from cpkv_core.dist.typed import DTYPES, MAGIC, FrameError, codec_for, decode_frame, encode_frame
from cpkv_core.dist.value_collectives import broadcast_value, gather_value
from cpkv_core.pd import ConcurrentWrite, LargeWrite, PdFaults, PdTarget, SendResult, WriteStats
from cpkv_core.planning import KvLayout, ScheduleError, pages_for_trace
from cpkv_core.runtime import Fault, FaultKind, FaultPoint
from cpkv_core.traces import TraceError, load_trace
from phases import PhaseId
from tests.conftest import DATA, code_running_payloads, load_unsafely, make_deploy, mixed_trace

TINY = model_preset("tiny")
RESULT = rank_signature(run_jobs_rank).result
"""What a spawned rank of every cpkv run sends back: ``list[list[RankRun] | None]``."""
ARGS = rank_signature(run_jobs_rank).args


def _job(**changes: Any) -> RankJob:
    batches = mixed_trace(4).batches
    job = RankJob(TINY, make_deploy(2, 4), batches, (0, 5), pages_for_trace(batches, 4, 2))
    return dataclasses.replace(job, **changes)


@pytest.fixture(scope="module")
def rank_runs() -> list[list[RankRun]]:
    """Every rank's runs of a real two-rank job: shadowed, with a fault the shadow catches."""
    batches = load_trace(DATA / "long.jsonl", 4).batches
    job = _job(
        batches=batches,
        num_pages=pages_for_trace(batches, 4, 2),
        shadow_rate=1.0,
        fault=Fault(FaultPoint.DIRECT_WRITE, FaultKind.ROW),
    )
    return run_local(2, lambda comm: _run_job(comm, job, None))


def _pd_run(template: RankRun) -> RankRun:
    """A run with every PD record and a failed batch's records filled in (a PD run needs
    Mooncake, a failed batch another run: built by hand)."""
    stats = WriteStats(
        calls=3,
        descriptors=5,
        seconds=0.5,
        exposed_seconds=0.25,
        drain_seconds=0.125,
        bytes=4096,
        spans=[(1.0, 1.5), (2.0, 2.25)],
        flush_bytes=[1024, 3072],
        loop_seconds=0.75,
    )
    sent = dataclasses.replace(
        SendResult("a", 1, True, 2, 4096, True, ("attempt 0: timed out",), (0, -1)),
        bytes_by_dest=(4096, 0),
    )
    concurrent = ConcurrentWrite(4096, ((1.0, 2.0), (3.0, 4.5)))
    return dataclasses.replace(
        template,
        pd=[sent],
        pd_stats=stats,
        pd_probe=LargeWrite(8192, 0.01),
        pd_concurrent=concurrent,
        kills=(PhaseKill(5, 0, "error", True, ("kv_write",), (1,), "PathError: injected"),),
        failed=(FailedAttempt(0, 5, "error", 0.25),),
    )


def _classes_in(value: object, seen: set[type]) -> None:
    """Every dataclass, pydantic model and enum class ``value`` holds."""
    if isinstance(value, enum.Enum | pydantic.BaseModel):
        seen.add(type(value))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        seen.add(type(value))
        for field in dataclasses.fields(value):
            _classes_in(getattr(value, field.name), seen)
    elif isinstance(value, dict):
        for key, item in value.items():
            _classes_in(key, seen)
            _classes_in(item, seen)
    elif isinstance(value, list | tuple | frozenset):
        for item in value:
            _classes_in(item, seen)


def _assert_same(got: object, want: object, path: str = "value") -> None:
    """``got`` equals ``want`` exactly: the same types all the way down, tensors and arrays
    bit for bit, floats equal (NaN to NaN)."""
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert (got.dtype, got.shape) == (want.dtype, want.shape), path
        assert got.reshape(-1).view(torch.uint8).equal(want.reshape(-1).view(torch.uint8)), path
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and np.array_equal(got, want), path
    elif dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):
            name = field.name
            _assert_same(getattr(got, name), getattr(want, name), f"{path}.{name}")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), path
        for key in want:
            _assert_same(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _assert_same(a, b, f"{path}[{i}]")
    elif isinstance(want, float) and want != want:
        assert isinstance(got, float) and got != got, path
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def test_every_result_type_round_trips_byte_for_byte(rank_runs: list[list[RankRun]]) -> None:
    results: list[list[RankRun] | None] = [
        [*rank_runs[0], _pd_run(rank_runs[0][0])],
        rank_runs[1],
        None,
    ]
    seen: set[type] = set()
    _classes_in(results, seen)
    assert codec_for(RESULT).classes() <= seen, "a result type the sample leaves out"
    frame = encode_frame(results, RESULT)
    back = decode_frame(frame, RESULT)
    _assert_same(back, results)
    assert encode_frame(back, RESULT) == frame
    outcomes = [o.shadow for run in rank_runs[0] for o in run.outputs if o.shadow is not None]
    assert any(outcome.mismatches for outcome in outcomes), "the fault was caught"


def test_the_call_progress_and_errors_round_trip() -> None:
    addresses = (("10.0.0.7", 7001), ("10.0.0.8", 7002))
    target = PdTarget(addresses, bytes(range(16)), "j/", 2, PdFaults(("a", 1)))
    deploy = make_deploy(3, 16).model_copy(update={"materialize": MaterializeMode.PEER_READ})
    job = _job(
        deploy=deploy,
        enabled=frozenset({PhaseId.SHARDED_KV, PhaseId.NARROW_OUTPUT}),
        ceiling=3,
        pd=target,
        shadow_rate=0.25,
        fault=Fault(FaultPoint.NARROW_OUTPUT, FaultKind.OWNER),
        exit_at=(1, 2),
        stall_at=(0, 1, 2.5),
    )
    for value, hint in [(((job, job),), ARGS), (BatchProgress(1, 3), BatchProgress)]:
        assert decode_frame(encode_frame(value, hint), hint) == value
    try:
        try:
            raise CollectiveTimeout(1, "all_gather('kv')", 61.5, 60.0)
        except CollectiveTimeout as cause:
            raise RankFault(1, 5, 3, cause, "rolled back") from cause
    except RankFault as exc:
        error = rank_error(exc)
    back = decode_frame(encode_frame(error, RankError), RankError)
    assert back == error
    assert [r.name for r in back.chain] == ["RankFault", "CollectiveTimeout"]
    fault, timeout = back.chain[0], back.find("CollectiveTimeout")
    assert (fault.field("rank"), fault.field("level"), fault.field("batch")) == (1, 5, 3)
    assert timeout is not None and timeout.field("waited_s") == 61.5
    assert "rolled back" in fault.message and "CollectiveTimeout" in back.traceback


def _replaced_timeout(suppress_context: bool) -> RankError:
    """A rank's error raised while it handled a collective timeout."""
    try:
        try:
            raise CollectiveTimeout(1, "all_gather('kv')", 61.5, 60.0)
        except CollectiveTimeout:
            if suppress_context:
                raise ValueError("replaced") from None
            raise ValueError("while handling")  # noqa: B904
    except ValueError as exc:
        return rank_error(exc)


def test_an_error_chain_holds_what_pythons_traceback_shows() -> None:
    """An implicit context is kept; one raised ``from None`` is not, so a timeout the rank
    handled and replaced is not reported as its stall."""
    kept, replaced = _replaced_timeout(False), _replaced_timeout(True)
    assert [r.name for r in kept.chain] == ["ValueError", "CollectiveTimeout"]
    assert [r.name for r in replaced.chain] == ["ValueError"]
    assert replaced.find("CollectiveTimeout") is None


@pytest.mark.parametrize(
    ("exc", "fields"),
    [
        (TraceError("bad", "t.jsonl", 3, "batch"), {"reason": "bad", "line": 3, "field": "batch"}),
        (ScheduleError(4, "requests[0].rid", "unknown"), {"batch": 4, "field": "requests[0].rid"}),
    ],
)
def test_an_error_crosses_as_its_type_message_and_fields(
    exc: Exception, fields: dict[str, object]
) -> None:
    back = decode_frame(encode_frame(rank_error(exc), RankError), RankError)
    record = back.chain[0]
    assert record.type == f"{type(exc).__module__}.{type(exc).__name__}"
    assert record.message == str(exc)
    assert {name: record.field(name) for name in fields} == fields


@pytest.mark.parametrize("dtype", sorted(DTYPES), ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (5,), (2, 3)])
def test_tensors_round_trip_every_dtype_bit_for_bit(dtype: str, shape: tuple[int, ...]) -> None:
    source = (torch.randn(shape) * 100).to(DTYPES[dtype])
    _assert_same(decode_frame(encode_frame(source, torch.Tensor), torch.Tensor), source)


class Mode(enum.StrEnum):
    ON = "on"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class Sample:
    """One field of every kind a frame checks."""

    count: int
    ratio: float
    tensor: torch.Tensor
    table: npt.NDArray[np.int64]
    mode: Mode
    phases: frozenset[PhaseId]
    by_set: dict[frozenset[int], str]
    note: str | None
    layout: KvLayout = KvLayout.SHARDED


SAMPLE = Sample(
    count=3,
    ratio=float("nan"),
    tensor=torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.float8_e4m3fn),
    table=np.arange(4, dtype=np.int64),
    mode=Mode.ON,
    phases=frozenset({PhaseId.SHARDED_KV, PhaseId.NARROW_OUTPUT}),
    by_set={frozenset({1, 2}): "a", frozenset(): "b"},
    note=None,
)
GOOD = encode_frame(SAMPLE, Sample)


def _tamper(edit: Callable[[dict[str, Any]], None], tail: bytes | None = None) -> bytes:
    """``GOOD`` with its header edited (and its side bytes replaced by ``tail``)."""
    (length,) = struct.unpack_from("<Q", GOOD, len(MAGIC))
    start = len(MAGIC) + 8
    header = json.loads(GOOD[start : start + length])
    edit(header)
    raw = json.dumps(header).encode()
    rest = GOOD[start + length :] if tail is None else tail
    return MAGIC + struct.pack("<Q", len(raw)) + raw + rest


def _tamper_text(old: bytes, new: bytes) -> bytes:
    """``GOOD`` with ``old`` replaced by ``new`` in its header's text."""
    (length,) = struct.unpack_from("<Q", GOOD, len(MAGIC))
    start = len(MAGIC) + 8
    raw = GOOD[start : start + length].replace(old, new)
    return MAGIC + struct.pack("<Q", len(raw)) + raw + GOOD[start + length :]


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(header: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = header["value"]
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DROP:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


_DROP = object()


def test_a_sample_of_every_kind_round_trips() -> None:
    back = decode_frame(GOOD, Sample)
    _assert_same(back, SAMPLE)
    assert encode_frame(back, Sample) == GOOD


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
@pytest.mark.parametrize("hint", [RESULT, RankError, BatchProgress])
def test_a_pickle_or_torch_save_payload_is_refused_and_never_runs(
    how: str, hint: Any, tmp_path: Path
) -> None:
    control = tmp_path / "control"
    load_unsafely(how, code_running_payloads(control)[how])
    assert control.exists(), "the payload runs code when the old loader reads it"
    victim = tmp_path / "victim"
    looks = "a pickle" if how == "pickle" else r"a zip archive \(torch.save"
    with pytest.raises(FrameError, match=rf"rank 1's result: not a typed frame \({looks}"):
        decode_frame(code_running_payloads(victim)[how], hint, "rank 1's result")
    assert not victim.exists()


@pytest.mark.parametrize("keep", [0, 7, 15, 40, len(GOOD) - 1])
def test_a_truncated_frame_is_refused(keep: int) -> None:
    with pytest.raises(FrameError, match=r"not a typed frame|truncated"):
        decode_frame(GOOD[:keep], Sample)


def test_bytes_after_the_last_value_are_refused() -> None:
    with pytest.raises(FrameError, match="1 bytes after the last value"):
        decode_frame(GOOD + b"\0", Sample)


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (_tamper(lambda h: h.update(type="RankRun")), "holds 'RankRun', expected 'Sample'"),
        (_tamper(lambda h: h.update(extra=1)), 'the header must be {"type", "value"}'),
        (_tamper(_set("admin", True)), "Sample: unknown field 'admin'"),
        (_tamper(_set("count", _DROP)), "Sample: missing field 'count'"),
        (_tamper(_set("count", True)), r"Sample\.count: expected an integer, got a boolean"),
        (_tamper(_set("count", 3.0)), r"Sample\.count: expected an integer, got a number"),
        (_tamper(_set("ratio", "inf")), r"Sample\.ratio: expected a number, got a string"),
        (_tamper(_set("mode", "maybe")), r"Sample\.mode: 'maybe' is not a Mode"),
        (_tamper(_set("phases", [2, 2])), r"Sample\.phases: a set holds an item twice"),
        (_tamper(_set("phases", [9])), r"Sample\.phases\[0\]: 9 is not a PhaseId"),
        (_tamper(_set("by_set", [[[1], "a"], [[1], "b"]])), r"by_set\[1\]\[0\]: key .* twice"),
        (_tamper(_set("by_set", {"1": "a"})), r"Sample\.by_set: expected an array"),
        (_tamper(_set("note", 5)), r"Sample\.note: expected a string or null, got an integer"),
        (_tamper(_set("tensor.dtype", "object")), r"tensor: unknown tensor dtype 'object'"),
        (_tamper(_set("tensor.shape", [-2, -3])), r"tensor: negative dimension"),
        (_tamper(_set("tensor.shape", [2, 4])), r"tensor: .* needs 8 bytes, got 6"),
        (_tamper(_set("tensor.data", 1 << 40)), r"tensor\.data: truncated: needs"),
        (_tamper(_set("tensor.data", -1)), r"tensor\.data: expected a byte count"),
        (_tamper(_set("table.dtype", "int32")), r"table\.dtype: expected 'int64', got 'int32'"),
        (_tamper(lambda h: None, tail=b""), r"truncated: needs 6 bytes"),
        (_tamper(_set("count", {"__reduce__": "os.system"})), r"Sample\.count: expected an int"),
        (_tamper_text(b'"count":3', b'"count":3,"count":4'), "holds a key twice"),
    ],
)
def test_a_tampered_frame_is_refused_naming_the_field(frame: bytes, words: str) -> None:
    with pytest.raises(FrameError, match=words):
        decode_frame(frame, Sample)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (dataclasses.replace(SAMPLE, count=np.int64(3)), r"Sample\.count: expected int, got int64"),
        (dataclasses.replace(SAMPLE, phases={PhaseId.SHARDED_KV}), r"expected frozenset, got set"),
        (dataclasses.replace(SAMPLE, table=np.arange(2, dtype=np.int32)), "expected an int64 a"),
        (dataclasses.replace(SAMPLE, mode="on"), r"Sample\.mode: expected Mode, got str"),
        (dataclasses.replace(SAMPLE, by_set=[]), r"Sample\.by_set: expected dict, got list"),
    ],
)
def test_encode_refuses_a_value_of_another_type(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        encode_frame(value, Sample)


class Loose(pydantic.BaseModel):
    name: str


@pytest.mark.parametrize(
    ("hint", "words"),
    [
        (dict[str, Any], "cannot carry Any"),
        (object, "cannot carry object"),
        (list[int] | tuple[int, ...], "two members take the same JSON kind"),
        (Loose, "must forbid extra fields"),
    ],
)
def test_an_annotation_the_codec_cannot_carry_fails_when_built(hint: Any, words: str) -> None:
    with pytest.raises(TypeError, match=words):
        codec_for(hint)


def test_a_peer_that_sends_a_pickle_is_refused_in_a_gather_and_a_broadcast(
    tmp_path: Path,
) -> None:
    """Torchrun's result gather and the per-batch step broadcast: whichever rank sends the
    payload, the rank that reads it refuses it."""
    payload = code_running_payloads(tmp_path / "victim")["torch.save"]

    def gather(comm: Communicator) -> object:
        if comm.rank == 1:
            return comm.gather_bytes(payload)
        return gather_value(comm, 0, int)

    def broadcast(comm: Communicator) -> object:
        if comm.rank == 0:
            return comm.broadcast_bytes(payload)
        return broadcast_value(comm, None, LoopStep, "step")

    for fn, words in [
        (gather, r"local rank 0 failed: FrameError: rank 1's result: not a typed frame"),
        (broadcast, r"local rank 1 failed: FrameError: rank 0's step: not a typed frame"),
    ]:
        with pytest.raises(RuntimeError, match=words):
            run_local(2, fn, timeout_s=30.0)
    assert not (tmp_path / "victim").exists()
