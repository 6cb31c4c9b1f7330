"""Peer-read materialization: history pages read from the owners' mapped pools.

Every level equals the gather path and the reference bitwise, on in-process ranks and on a
real gloo group (pools in ``/dev/shm``); no history byte crosses a collective; the one-host
contract refuses ranks on several hosts; the debug check catches a peer pool that is not
mapped where its owner writes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.run.jobs import Backend
from cpkv.run.verify import VerifyReport, verify_levels
from cpkv_core.config import CpMode, DeploymentConfig, MaterializeMode, model_preset
from cpkv_core.planning.ownership import owner_of_page
from cpkv_core.planning.peer_view import history_entries, peer_view_plan
from cpkv_core.runtime import shared_pools as shared_mod
from cpkv_core.runtime.shared_pools import (
    PeerReadRefused,
    PoolSharing,
    RankPlace,
    SharedPools,
    check_one_host,
    sharing_for,
)
from flags import resolve_flags
from phases.registry import REGISTERED_PHASES
from tests.conftest import MIXED_TRACE, make_deploy, mixed_trace

TINY = model_preset("tiny")
ALL = frozenset(REGISTERED_PHASES)
runner = CliRunner()


def peer_read(deploy: DeploymentConfig) -> DeploymentConfig:
    return deploy.model_copy(update={"materialize": MaterializeMode.PEER_READ})


def run(deploy: DeploymentConfig, debug: bool = False) -> VerifyReport:
    batches = mixed_trace(deploy.page_size).batches
    return verify_levels(TINY, deploy, batches, range(6), ALL, Backend.LOCAL, debug_checks=debug)


@pytest.mark.parametrize("unique", [False, True])
@pytest.mark.parametrize("cp_size", [1, 3, 4])
def test_history_view_holds_each_history_page_once_per_slot_without_padding(
    cp_size: int, unique: bool
) -> None:
    page_size = 4
    table_lens = np.array([3, 0, 5, 2], np.int64)
    prefix = np.array([9, 0, 8, 0], np.int64)
    flat = np.array([7, 2, 11, 5, 6, 7, 2, 9, 4, 8], np.int64)
    history = history_entries(table_lens, prefix, page_size)
    assert history.tolist() == [True, True, True, True, True, False, False, False, False, False]
    view = peer_view_plan(flat, history, page_size, cp_size, unique)
    pages = flat[history]
    expected_slots = len(np.unique(pages)) if unique else len(pages)
    assert view.view_tokens == expected_slots * page_size  # no padding
    for owner, owned in enumerate(view.pages_by_owner):
        assert (owner_of_page(owned, cp_size) == owner).all()
        assert view.owner_rows[owner + 1] - view.owner_rows[owner] == len(owned) * page_size
    in_view = np.concatenate(view.pages_by_owner)
    for entry in np.flatnonzero(history):
        assert in_view[view.entry_rows[entry] // page_size] == flat[entry]


@pytest.mark.parametrize(
    ("cp_size", "page_size", "cp_mode"),
    [(2, 4, CpMode.IN_SEQ_SPLIT), (3, 1, CpMode.ROUND_ROBIN_SPLIT)],
)
def test_every_level_equals_the_reference_bitwise_on_local_ranks(
    cp_size: int, page_size: int, cp_mode: CpMode
) -> None:
    peer = run(peer_read(make_deploy(cp_size, page_size, cp_mode)))
    assert peer.ok
    for level in peer.levels:
        for row in level.rows:
            assert row.comparison.topk_equal and row.comparison.max_abs_diff == 0.0
            assert "materialize" not in row.gathered_bytes_by_tag, (level.level, row.batch)


def test_debug_checks_pass_with_peer_read() -> None:
    assert run(peer_read(make_deploy(3, 4)), debug=True).ok


def stale_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank maps a snapshot of its peers' pools, not the memory they write."""
    real = shared_mod.open_shared_pools

    def snapshot(*args: Any, **kwargs: Any) -> SharedPools:
        shared = real(*args, **kwargs)
        rank = shared.comm.rank
        copies = tuple(
            layers
            if r == rank
            else tuple(dataclasses.replace(layer, latent=layer.latent.clone()) for layer in layers)
            for r, layers in enumerate(shared.peers)
        )
        return dataclasses.replace(shared, peers=copies)

    monkeypatch.setattr(shared_mod, "open_shared_pools", snapshot)


def test_debug_check_catches_a_peer_pool_not_mapped_where_its_owner_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stale_peers(monkeypatch)
    with pytest.raises(RuntimeError, match="peer-read history view differs from the gathered"):
        run(peer_read(make_deploy(2, 4)), debug=True)


def test_refuses_peer_read_when_ranks_span_hosts() -> None:
    places = [RankPlace("node-a", 1), RankPlace("node-a", 2), RankPlace("node-b", 3)]
    with pytest.raises(PeerReadRefused, match=r"one host.*node-a: ranks \[0, 1\]; node-b"):
        check_one_host(places)
    check_one_host(places[:2])


def test_picks_how_pools_are_shared_from_where_ranks_run() -> None:
    one_process = [RankPlace("h", 7), RankPlace("h", 7)]
    processes = [RankPlace("h", 7), RankPlace("h", 8)]
    assert sharing_for(one_process, torch.device("meta")) is PoolSharing.REFERENCE
    assert sharing_for(processes, torch.device("cpu")) is PoolSharing.SHARED_FILE
    assert sharing_for(processes, torch.device("cuda")) is PoolSharing.CUDA_IPC
    with pytest.raises(PeerReadRefused, match="cannot share meta pools"):
        sharing_for(processes, torch.device("meta"))


def per_thread(monkeypatch: pytest.MonkeyPatch, host: bool) -> None:
    """Each rank thread looks like its own process (and, with ``host``, its own host)."""
    real_pid = os.getpid()

    def rank_number() -> int:
        return int(threading.current_thread().name.rsplit("rank", 1)[-1])

    monkeypatch.setattr(shared_mod.os, "getpid", lambda: real_pid * 100 + rank_number())
    if host:
        monkeypatch.setattr(shared_mod.socket, "gethostname", lambda: f"node-{rank_number()}")


def test_engines_on_two_hosts_refuse_peer_read_at_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    per_thread(monkeypatch, host=True)
    with pytest.raises(RuntimeError, match="needs every CP rank on one host"):
        run(peer_read(make_deploy(2, 4)))


def test_shared_files_map_peer_pools_and_leave_nothing_in_dev_shm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank threads posing as processes share pools through /dev/shm files, as gloo ranks do."""
    per_thread(monkeypatch, host=False)
    opened: list[PoolSharing] = []
    real = shared_mod.open_shared_pools

    def recording(*args: Any, **kwargs: Any) -> SharedPools:
        shared = real(*args, **kwargs)
        opened.append(shared.sharing)
        return shared

    monkeypatch.setattr(shared_mod, "open_shared_pools", recording)
    before = set(Path("/dev/shm").glob("cpkv-pool-*"))
    assert run(peer_read(make_deploy(2, 4)), debug=True).ok
    assert set(opened) == {PoolSharing.SHARED_FILE}
    assert set(Path("/dev/shm").glob("cpkv-pool-*")) == before


@pytest.mark.gloo
def test_verify_peer_read_on_gloo_is_ok_at_every_level_with_no_history_collective() -> None:
    result = runner.invoke(
        app,
        [
            "verify",
            str(MIXED_TRACE),
            "--phases",
            "all",
            "--cp-size",
            "2",
            "--page-size",
            "4",
            "--materialize",
            "peer-read",
            "--backend",
            "gloo",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [level["ok"] for level in document["levels"]] == [True] * 6
    for batch in document["batches"]:
        assert batch["max_abs_diff"] == 0.0 and batch["topk_equal"]
        assert "materialize" not in batch["gathered_bytes_by_tag"]


def test_materialize_comes_from_flag_env_and_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "cpkv.toml"
    config.write_text('materialize = "peer-read"\n')
    flags = resolve_flags(config).flags
    assert flags.deployment().materialize is MaterializeMode.PEER_READ
    assert resolve_flags(config, {"materialize": "gather"}).flags.materialize == "gather"
    monkeypatch.setenv("CPKV_MATERIALIZE", "peer-read")
    monkeypatch.chdir(tmp_path / "..")
    assert resolve_flags().flags.materialize is MaterializeMode.PEER_READ
    bad = runner.invoke(app, ["verify", str(MIXED_TRACE), "--materialize", "scatter"])
    assert bad.exit_code == 2
