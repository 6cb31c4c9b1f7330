"""The PD control channel's typed frames: every message round-trips, every malformed frame is
refused with a WireError, the decode server answers a bad frame without crashing, and the
report's tensors travel as raw bytes that compare exactly."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pickle
import re
import threading
import typing
from multiprocessing.connection import Client
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.run.pd_check import identical
from cpkv_core.config import model_preset
from cpkv_core.dist.typed.tensor_data import DTYPES, TensorData, from_data, to_data
from cpkv_core.pd import protocol
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.decode_group import DecodeSpec
from cpkv_core.pd.protocol import (
    Alloc,
    AllocReply,
    Await,
    Done,
    ErrorReply,
    Fail,
    Hello,
    HelloReply,
    PdLayout,
    Piece,
    Probe,
    ProbeEnd,
    ProbeReply,
    Report,
    ReportReply,
    RequestReport,
    Shutdown,
    Verdict,
)
from cpkv_core.pd.wire import MAX_REQUEST_BYTES, MESSAGES, NESTED, WireError, decode, encode
from tests.conftest import make_deploy

TENSOR = to_data(torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))

LAYOUT = PdLayout(2, 64, (2048, 128, 4) * 61, ("bfloat16", "float8_e4m3fn", "float32"), 4, 2)

EXAMPLES = [
    Hello(3, LAYOUT),
    HelloReply(1, LAYOUT, ""),
    HelloReply(0, LAYOUT, "PD layouts differ in page_size: prefill {...} vs decode rank 0 {...}"),
    Alloc("j0/0/a", 1, 300, 17, senders=4),
    AllocReply("a", 0, "127.0.0.1:15000", (3, 1, 2), 140_000_000_000, (576, 128, 4)),
    Done("a", 0, 3, (Piece(0, (0, 4)), Piece(4096, ())), 8192),
    Fail("a", 2, 1, "write of 3 pieces (12 bytes) to 127.0.0.1:1 failed"),
    Await("a", 0, 0),
    Verdict("a", 0, True),
    Verdict("a", 1, False, "timed out after 5s waiting for ranks [1]"),
    Report(),
    ReportReply(
        (
            RequestReport("a", True, "", 3, (TENSOR, to_data(torch.zeros(0))), (TENSOR,)),
            RequestReport("b", False, "attempt 0: rank 1: rejected", 0),
        ),
        free_pages=12,
        errors=("x",),
    ),
    ReportReply((), 0),
    Probe(1 << 30),
    ProbeReply("127.0.0.1:15000", 139_000_000),
    ProbeEnd(139_000_000),
    Shutdown(),
    ErrorReply("a: attempt 0 is stale"),
]

GOOD_ALLOC = {
    "type": "Alloc",
    "rid": "a",
    "attempt": 0,
    "seq_len": 9,
    "next_token": 1,
    "senders": 2,
}


def _frame(obj: object) -> bytes:
    return json.dumps(obj).encode()


def _strategy(hint: Any) -> st.SearchStrategy[Any]:
    """Values of one field annotation, nested protocol dataclasses included."""
    if dataclasses.is_dataclass(hint):
        return _instances(typing.cast(type, hint))
    if typing.get_origin(hint) is tuple:
        return st.lists(_strategy(typing.get_args(hint)[0]), max_size=3).map(tuple)
    return st.from_type(hint)


def _instances(cls: type) -> st.SearchStrategy[Any]:
    """Every field drawn, defaulted ones included, from the dataclass's own annotations."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: _strategy(hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


def test_every_protocol_dataclass_is_on_the_wire() -> None:
    """A message added to protocol.py without a place in the codec fails here."""
    classes = {
        obj
        for _, obj in inspect.getmembers(protocol, inspect.isclass)
        if obj.__module__ == protocol.__name__
    }
    assert classes | {TensorData} == set(MESSAGES) | set(NESTED)  # TensorData: dist's


@pytest.mark.parametrize("message", [*EXAMPLES, None], ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Any) -> None:
    frame = encode(message)
    assert decode(frame) == message
    assert pickle.PROTO not in frame  # plain ASCII JSON, no pickle opcode


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(MESSAGES).flatmap(_instances))
def test_any_message_round_trips(message: Any) -> None:
    assert decode(encode(message)) == message


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (_frame({**GOOD_ALLOC, "type": "Evil"}), "unknown message type 'Evil'"),
        (_frame({k: v for k, v in GOOD_ALLOC.items() if k != "type"}), "unknown message type"),
        (_frame({"type": "Piece", "offset": 0, "positions": []}), "unknown message type"),
        (_frame({k: v for k, v in GOOD_ALLOC.items() if k != "seq_len"}), "missing.*seq_len"),
        (_frame({**GOOD_ALLOC, "admin": True}), "Alloc: unknown field 'admin'"),
        (_frame({**GOOD_ALLOC, "seq_len": "9"}), r"Alloc\.seq_len: expected an integer"),
        (_frame({**GOOD_ALLOC, "seq_len": True}), r"Alloc\.seq_len: .*got a boolean"),
        (_frame({**GOOD_ALLOC, "seq_len": 9.0}), r"Alloc\.seq_len: .*got a number"),
        (_frame({**GOOD_ALLOC, "seq_len": None}), r"Alloc\.seq_len: .*got null"),
        (_frame({**GOOD_ALLOC, "rid": 5}), r"Alloc\.rid: expected a string"),
        (_frame({"type": "Verdict", "rid": "a", "attempt": 0, "ready": 1, "reason": ""}), "ready"),
        (_frame({"type": "Verdict", "rid": "a", "attempt": 0, "ready": True}), "reason"),
        (
            _frame(
                {
                    "type": "Done",
                    **{"rid": "a", "attempt": 0, "rank": 0, "bytes_sent": 0},
                    "pieces": [{"offset": 0, "positions": [1, False]}],
                }
            ),
            r"Done\.pieces\[0\]\.positions\[1\]",
        ),
        (
            _frame(
                {
                    "type": "Done",
                    **{"rid": "a", "attempt": 0, "rank": 0, "bytes_sent": 0},
                    "pieces": [{"offset": 0, "positions": [], "type": "Piece"}],
                }
            ),
            r"Done\.pieces\[0\]: unknown field 'type'",
        ),
        (_frame({"type": "ProbeEnd", "address": [1]}), r"ProbeEnd\.address: .*got an array"),
        (
            _frame({"type": "ReportReply", "requests": {}, "free_pages": 0, "errors": []}),
            r"ReportReply\.requests: expected an array, got an object",
        ),
        (
            _frame(
                {
                    "type": "ReportReply",
                    "free_pages": 0,
                    "errors": [],
                    "requests": [
                        {
                            **{"rid": "a", "ready": True, "error": "", "pages": 1},
                            "kv": [{"dtype": "uint8", "shape": [1], "data": "!!"}],
                            "decode": [],
                        }
                    ],
                }
            ),
            r"requests\[0\]\.kv\[0\]\.data: not base64",
        ),
        (b'{"type": "Probe", "nbytes": NaN}', "NaN"),
        (b'{"type": "Probe", "nbytes": 1, "nbytes": 2}', "duplicate key"),
        (b"[1, 2]", "got an array"),
        (b'"Shutdown"', "got a string"),
        (b"", "not a JSON frame"),
        (b"\xff\xfe garbage", "not a JSON frame"),
        (b'{"type": "Probe", "nbytes": 1} trailing', "not a JSON frame"),
        (pickle.dumps(Probe(1)), "not a JSON frame"),
        (pickle.dumps(GOOD_ALLOC, protocol=0), "not a JSON frame"),
    ],
)
def test_rejects_malformed_frames(frame: bytes, words: str) -> None:
    with pytest.raises(WireError, match=words):
        decode(frame)


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (Piece(0, ()), "Piece is not a PD control message"),
        ("Report", "str is not a PD control message"),
        (Probe(True), r"Probe\.nbytes: expected int, got bool"),
        (Done("a", 0, 0, [Piece(0, ())], 0), r"Done\.pieces: expected tuple, got list"),  # type: ignore[arg-type]
        (ProbeEnd(torch.tensor(3).numpy()[()]), r"ProbeEnd\.address: expected int, got int64"),  # type: ignore[arg-type]
    ],
)
def test_encode_refuses_what_decode_would(message: Any, words: str) -> None:
    with pytest.raises(WireError, match=words):
        encode(message)


def test_a_done_for_a_million_page_request_fits_the_frame_limit() -> None:
    positions = tuple(range(1 << 20))
    pieces = tuple(Piece(i << 30, positions[i : i + 4096]) for i in range(0, len(positions), 4096))
    assert len(encode(Done("j0/0/" + "r" * 64, 9, 7, pieces, 1 << 40))) < MAX_REQUEST_BYTES


@pytest.mark.parametrize("dtype", sorted(DTYPES), ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (5,), (2, 3)])
def test_tensor_data_round_trips_every_dtype_byte_for_byte(
    dtype: str, shape: tuple[int, ...]
) -> None:
    source = torch.randn(shape).to(DTYPES[dtype])
    data = to_data(source)
    reply = decode(encode(ReportReply((RequestReport("a", True, "", 0, (data,)),), 0)))
    assert isinstance(reply, ReportReply)
    back = from_data(reply.requests[0].kv[0])
    assert back.dtype == source.dtype and back.shape == source.shape
    assert to_data(back) == data


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (TensorData("object", (1,), b"\0"), "unknown tensor dtype 'object'"),
        (TensorData("float32", (2,), b"\0" * 7), "needs 8 bytes, got 7"),
        (TensorData("uint8", (-1,), b""), "negative dimension"),
    ],
)
def test_tensor_data_refuses_a_wrong_description(data: TensorData, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        from_data(data)


def test_identical_compares_bytes_and_never_matches_nan() -> None:
    values = torch.tensor([1.0, -2.5, 3.0])
    assert identical(to_data(values), values)
    assert not identical(to_data(values), values.to(torch.float64))
    assert not identical(to_data(values), values.reshape(3, 1))
    assert not identical(to_data(torch.tensor([0.0])), torch.tensor([-0.0]))
    nan = torch.tensor([1.0, float("nan")])
    assert not identical(to_data(nan), nan)


@pytest.fixture
def serving() -> Any:
    """An in-process decode server on loopback, serving on a thread."""
    spec = DecodeSpec(model_preset("tiny"), 4, make_deploy().index_k_dtype, 16, 5.0)
    server = DecodeServer(spec, b"k")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        if thread.is_alive():
            with Client(server.address, authkey=b"k") as conn:
                conn.send_bytes(encode(Shutdown()))
                conn.recv_bytes()
        thread.join(10)


def _ask(conn: Any, frame: bytes) -> Any:
    conn.send_bytes(frame)
    return decode(conn.recv_bytes())


def test_decode_server_answers_a_bad_frame_and_keeps_the_connection(serving: Any) -> None:
    with Client(serving.address, authkey=b"k") as conn:
        for frame, words in [
            (pickle.dumps(Report()), "bad frame: not a JSON frame"),
            (_frame({**GOOD_ALLOC, "seq_len": True}), r"bad frame: Alloc\.seq_len"),
            (_frame({**GOOD_ALLOC, "extra": 1}), "bad frame: Alloc: unknown field 'extra'"),
            (encode(Verdict("a", 0, True)), "Verdict is not a request"),
            (encode(None), "NoneType is not a request"),
        ]:
            reply = _ask(conn, frame)
            assert isinstance(reply, ErrorReply), reply
            assert re.search(words, reply.reason), reply.reason
        reply = _ask(conn, encode(Report()))  # the same connection still serves
        assert reply == ReportReply((), 16)
        assert isinstance(_ask(conn, encode(Alloc("a", 0, 9, 1, senders=2))), AllocReply)


def test_decode_server_closes_a_connection_on_an_oversized_frame(serving: Any) -> None:
    with Client(serving.address, authkey=b"k") as conn, pytest.raises((EOFError, OSError)):
        conn.send_bytes(b" " * (MAX_REQUEST_BYTES + 1))
        conn.recv_bytes()
    with Client(serving.address, authkey=b"k") as conn:  # the server still serves others
        assert _ask(conn, encode(Report())) == ReportReply((), 16)
