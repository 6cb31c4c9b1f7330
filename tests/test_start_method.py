"""The fork server runs the program's main script once, for every rank it forks
(``cpkv_core.dist.forkserver_main``): CPython's own ``__main__`` preload loads nothing up to
3.13.7, so each rank ran the script again (for ``cpkv``, its whole CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cpkv_core.dist.forkserver_main import load_main
from cpkv_core.dist.start_method import MAIN_PATH_ENV, main_path_entry

MAIN_SCRIPT = textwrap.dedent(
    """
    import json
    import os
    import sys

    with open(os.environ["RUNS_FILE"], "a") as runs:
        runs.write(f"{os.getpid()}\\n")  # NOTE: at module level: every run of the script

    from cpkv_core.dist import Communicator, forked_ranks, spawn_group


    def rank_pid(comm: Communicator) -> int:
        return os.getpid()


    if __name__ == "__main__":
        with forked_ranks(["__main__"]):
            first = spawn_group(3, rank_pid)
            second = spawn_group(2, rank_pid)
        print(json.dumps({"main": os.getpid(), "ranks": first + second}))
    """
)


@pytest.mark.gloo
def test_forked_ranks_run_the_main_script_once_in_the_server_and_never_in_a_rank(
    tmp_path: Path,
) -> None:
    script, runs = tmp_path / "main_script.py", tmp_path / "runs.txt"
    script.write_text(MAIN_SCRIPT)
    env = {"RUNS_FILE": str(runs), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**{k: v for k, v in os.environ.items() if k != MAIN_PATH_ENV}, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout.splitlines()[-1])
    ran = [int(line) for line in runs.read_text().split()]
    assert len(set(pids["ranks"])) == 5, "each rank is a process of its own"
    assert not set(ran) & set(pids["ranks"]), f"a rank ran the main script: {ran}"
    # NOTE: the program itself, then the fork server (one for both groups: same preload).
    assert ran[0] == pids["main"] and len(ran) == 2, ran


def test_the_main_script_loads_only_in_the_servers_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, runs = tmp_path / "other_main.py", tmp_path / "runs.txt"
    script.write_text(f"open({str(runs)!r}, 'a').write('ran\\n')\n")
    before = sys.modules["__main__"]
    monkeypatch.setenv(MAIN_PATH_ENV, main_path_entry(12345678, str(script)))
    load_main()  # NOTE: named for another process's server: this one's parent is not it
    assert not runs.exists() and sys.modules["__main__"] is before


ADOPT_SCRIPT = textwrap.dedent(
    """
    import json
    import multiprocessing as mp
    import os
    from multiprocessing import forkserver

    from cpkv_core.dist import Communicator, spawn_group
    from cpkv_core.dist.start_method import adopt_fork_server


    def rank_parent(comm: Communicator) -> int:
        return os.getppid()


    if __name__ == "__main__":
        mp.set_forkserver_preload(["torch", "cpkv_core.dist.rank_child", "json"])
        forkserver.ensure_running()
        started = forkserver._forkserver._forkserver_pid
        try:
            adopt_fork_server(["os"])
            wrong = ""
        except RuntimeError as refused:
            wrong = str(refused)
        adopt_fork_server(["json"])
        parents = spawn_group(2, rank_parent, preload=["json"])
        print(json.dumps({"started": started, "parents": parents, "wrong": wrong}))
    """
)


@pytest.mark.gloo
def test_an_adopted_fork_server_forks_the_ranks_and_another_list_is_refused(
    tmp_path: Path,
) -> None:
    """A program that starts its server itself (``cpkv_sglang.cpu.bench``, before it imports
    torch) has its ranks forked by that server, not by one started again."""
    script = tmp_path / "adopt.py"
    script.write_text(ADOPT_SCRIPT)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["parents"] == [seen["started"]] * 2, seen
    assert "adopting it needs exactly ['torch', 'cpkv_core.dist.rank_child', 'os']" in seen["wrong"]
