"""PD control messages: plain data (str, int, bool, bytes, tuples of them and of the nested
``Piece``, ``RequestReport`` and ``TensorData``), sent over a control channel to the decode host.

KV bytes of a transfer never travel here; they go through the transfer engine into registered
memory. The channel is ``multiprocessing.connection`` over TCP (``--pd-host``) with an auth key
that authenticates the peer; each message travels as one typed JSON frame (``pd/wire.py``),
never as a pickle, so a frame is data only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cpkv_core.dist.typed.tensor_data import TensorData


@dataclass(frozen=True, slots=True)
class PdLayout:
    """What one side of a PD transfer stores and expects: both sides exchange it before any
    page moves (``Hello``), and any difference refuses the transfer (``layout.py``)."""

    protocol: int
    """The control protocol's version (``layout.PD_PROTOCOL``)."""
    page_size: int
    """Tokens per KV page."""
    row_bytes: tuple[int, ...]
    """Bytes of one token row of each pool tensor, layer by layer (latent, index K, scale)."""
    dtypes: tuple[str, ...]
    """Storage dtypes of the latent, index K and scale (torch names, e.g. ``float32``)."""
    prefill_cp_size: int
    """The prefill group's CP size N; on a decode side, the one it serves (0: any)."""
    decode_cp_size: int
    """The decode group's CP size M (1: a non-CP decode server)."""


@dataclass(frozen=True, slots=True)
class Hello:
    """A prefill rank's first message to a decode rank: its layout. Replied with
    ``HelloReply``; nothing else is sent when either side refuses."""

    rank: int
    """The prefill rank."""
    layout: PdLayout


@dataclass(frozen=True, slots=True)
class HelloReply:
    """The decode rank's layout, and why it refused the prefill's ("" when it accepted)."""

    dcp_rank: int
    layout: PdLayout
    refused: str


@dataclass(frozen=True, slots=True)
class Alloc:
    """A prefill rank asks the decode side for pages of attempt ``attempt`` of ``rid``.

    Idempotent: every rank of the group asks; all get the same answer for one attempt.
    """

    rid: str
    attempt: int
    seq_len: int
    next_token: int
    """The first decode token, which prefill sends along with the KV."""
    senders: int
    """Prefill ranks that will send pieces (the CP size)."""


@dataclass(frozen=True, slots=True)
class AllocReply:
    """Pages for the request and the registered receive slab to write its pieces into.

    From decode rank ``b`` of ``M``: the pages of the positions it owns (``j % M == b``, in
    position order) and a slab of their tokens."""

    rid: str
    attempt: int
    session: str
    """Transfer-engine session of the decode server (``host:port``)."""
    page_table: tuple[int, ...]
    slab: int
    """Address of the attempt's receive slab: the rank's tokens x ``token_bytes``
    registered bytes (``seq_len x token_bytes`` on a non-CP decode server)."""
    row_bytes: tuple[int, ...]
    """Bytes of a token row of each pool tensor, layer by layer (latent, index K, scale);
    a sender checks its own pool has the same layout."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A packed block a rank wrote into the attempt's slab."""

    offset: int
    """Byte offset of the block in the slab."""
    positions: tuple[int, ...]
    """Logical page positions the block holds, in block order."""


@dataclass(frozen=True, slots=True)
class Done:
    """A prefill rank wrote all its pieces of an attempt; replied with None."""

    rid: str
    attempt: int
    rank: int
    pieces: tuple[Piece, ...]
    bytes_sent: int

    @property
    def positions(self) -> tuple[int, ...]:
        """Every page position the rank wrote."""
        return tuple(p for piece in self.pieces for p in piece.positions)


@dataclass(frozen=True, slots=True)
class Fail:
    """A prefill rank could not send its pieces."""

    rid: str
    attempt: int
    rank: int
    reason: str


@dataclass(frozen=True, slots=True)
class Await:
    """A prefill rank waits for an attempt's verdict (the decode side enforces timeouts).

    Sent after the rank's own write for the attempt, so it also tells the decode side that
    this rank will not write into the attempt's pages any more.
    """

    rid: str
    attempt: int
    rank: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decode side's answer to ``Await`` or ``Fail``: ready (the ack) or failed, why."""

    rid: str
    attempt: int
    ready: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Report:
    """Asks the decode server for every request's state, rebuilt KV and decode step."""


@dataclass(frozen=True, slots=True)
class RequestReport:
    """One request on the decode side."""

    rid: str
    ready: bool
    error: str
    pages: int
    """Pages the request holds on the decode side (0 once a failed attempt is released)."""
    kv: tuple[TensorData, ...] = ()
    """The rebuilt rows by position, three per layer, layer by layer: latent, index K (as
    uint8), scale; empty unless ready."""
    decode: tuple[TensorData, ...] = ()
    """The decode step's (last hidden, logits); empty unless ready."""


@dataclass(frozen=True, slots=True)
class ReportReply:
    """Every request the decode server has seen, and its free pages."""

    requests: tuple[RequestReport, ...]
    free_pages: int
    errors: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Probe:
    """Asks for a registered scratch buffer of ``nbytes`` to time one large write into
    (``cpkv bench``'s baseline); replied with ``ProbeReply``."""

    nbytes: int


@dataclass(frozen=True, slots=True)
class ProbeReply:
    """Where to write the probe."""

    session: str
    address: int


@dataclass(frozen=True, slots=True)
class ProbeEnd:
    """Frees the probe buffer at ``address``; replied with None."""

    address: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stops the decode server."""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """A request the decode server refused, with why."""

    reason: str
