"""One rank of a decode group as a spawned process (``serve_decode_rank``, the rank body the
app hands ``dist.spawn_group``): its decode server, announced to the parent, served until a
``Shutdown`` arrives."""

from __future__ import annotations

from cpkv_core.dist import Communicator, new_group_communicator, report_progress
from cpkv_core.pd.decode import DecodeServer
from cpkv_core.pd.decode_group import DecodeSpec, DecodeStarted

MERGE_TIMEOUT_S = 120.0
"""Seconds one collective of the decode step's merge waits for a peer decode rank."""


def serve_decode_rank(
    comm: Communicator,
    spec: DecodeSpec,
    authkey: bytes,
    die_on_done_of: str | None,
    host: str,
) -> int:
    """Runs decode rank ``comm.rank`` of ``spec.dcp_size``: builds its server on ``host``,
    reports where it listens (a ``DecodeStarted`` progress message), serves until
    ``Shutdown``. Returns the rank.

    The decode step merges over a subgroup of the decode ranks with its own collective
    timeout (``MERGE_TIMEOUT_S``): the spawn group's is the whole run's.
    """
    group = None
    if spec.dcp_size > 1:
        group = new_group_communicator(range(spec.dcp_size), MERGE_TIMEOUT_S)
    server = DecodeServer(spec, authkey, group, die_on_done_of, host)
    report_progress(DecodeStarted(comm.rank, server.address, server.transport.session))
    server.serve_forever()
    return comm.rank
