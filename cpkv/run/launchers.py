"""``--launcher``: whether this process spawns every CP rank or is one rank torchrun started."""

from __future__ import annotations

from collections.abc import Mapping

from cpkv.common.console import BadInput
from cpkv.common.devices import Device
from cpkv.run.jobs import Backend
from cpkv_core.config import Launcher
from cpkv_core.dist import TorchrunEnv, torchrun_env

TORCHRUN_HINT = (
    "start it as `torchrun --nnodes N --nproc-per-node M ... -m cpkv.cli verify ...` "
    "(see docs/multi-node.md)"
)


def dist_backend(device: Device) -> str:
    """The torch.distributed backend of a torchrun group: NCCL on CUDA, gloo on CPU."""
    return "nccl" if device is Device.CUDA else "gloo"


def torchrun_worker(
    launcher: Launcher,
    backend: Backend,
    cp_size: int,
    device: Device,
    environ: Mapping[str, str] | None = None,
) -> TorchrunEnv | None:
    """This process's torchrun place when it is to run as one rank, None to spawn the ranks.

    Raises:
        BadInput: torchrun asked for without its environment, spawn asked for under torchrun,
            a combination torchrun cannot run (``--backend local``, ``--device meta``), or a
            torchrun world size other than ``cp_size``.
        ValueError: torchrun's environment is malformed.
    """
    env = torchrun_env(environ)
    if launcher is Launcher.SPAWN:
        if env is not None:
            raise BadInput(
                f"--launcher spawn under torchrun (RANK={env.rank}, WORLD_SIZE={env.world_size}):"
                " every worker would spawn a group of its own; use --launcher torchrun (or auto),"
                " or run the command without torchrun"
            )
        return None
    if env is None:
        if launcher is Launcher.TORCHRUN:
            raise BadInput(
                "--launcher torchrun needs torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, "
                f"MASTER_ADDR, MASTER_PORT) and none is set: {TORCHRUN_HINT}"
            )
        return None
    if backend is Backend.LOCAL:
        raise BadInput(
            "--backend local runs every rank as a thread of one process; under torchrun each "
            "process is one rank: drop --backend local"
        )
    if device is Device.META:
        raise BadInput("--device meta is a dry run in one process: run it without torchrun")
    if env.world_size != cp_size:
        raise BadInput(
            f"torchrun started WORLD_SIZE={env.world_size} ranks but --cp-size is {cp_size}: "
            "make --nnodes x --nproc-per-node equal the CP size"
        )
    return env


def refuse_torchrun(command: str, launcher: Launcher) -> None:
    """Exit 2 for a command that starts its own processes when torchrun is asked for or
    detected.

    Raises:
        BadInput: ``launcher`` is torchrun, or auto while this process runs under torchrun.
    """
    under = torchrun_env() is not None
    if launcher is Launcher.TORCHRUN or (launcher is Launcher.AUTO and under):
        why = "under torchrun" if under else "with --launcher torchrun"
        raise BadInput(
            f"{command} starts its own ranks (and decode process) and cannot run {why}; "
            "run it without torchrun (cpkv verify runs under torchrun)"
        )
