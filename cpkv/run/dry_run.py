"""``--device meta``: every level's whole run step on shapes alone, on in-process ranks.

The runtime loop schedules and gates each batch as usual; every rank then plans it on the
host, copies the plan to the ``meta`` device and runs embed, projections, the current
gather, the write, the read, top-k, attention and the tail there. A step that reads a value
on the host (``.item()``, ``.tolist()``, a boolean mask) fails on ``meta``; a guard also
refuses any op handed a tensor that is not on ``meta`` (a host index would be a copy and a
sync on CUDA). The report says ok per level, or the first op that failed and where.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from cpkv.common.settings import RunSettings
from cpkv.run.loop import HostLoop, LoopStep
from cpkv_core.config import ModelConfig
from cpkv_core.dist import Communicator, broadcast_value, run_local
from cpkv_core.planning import BatchSpec, pages_for_trace
from cpkv_core.runtime import CPEngine, expand, upload
from phases import level_enabled

_META = torch.device("meta")


class OffDeviceError(RuntimeError):
    """An op of the run step got a tensor that is not on the run device."""


class MetaGuard(TorchFunctionMode):
    """Refuses every torch op whose tensor arguments are not all on ``meta``."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        for tensor in _tensors((*args, *kwargs.values())):
            if tensor.device.type != "meta":
                name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
                raise OffDeviceError(f"{name} got a {tensor.device} tensor {tuple(tensor.shape)}")
        return func(*args, **kwargs)


def _tensors(values: Sequence[Any]) -> Iterator[torch.Tensor]:
    """The tensors among ``values`` and inside their lists and tuples (op arguments)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple):
            yield from (v for v in value if isinstance(v, torch.Tensor))


@dataclass(frozen=True, slots=True)
class LevelDryRun:
    """One level's dry run: ok, or the first failure."""

    level: int
    batches: int
    """Batches whose step ran on ``meta`` on every rank (0 when one failed)."""
    error: str | None = None
    """The failing op and its message; None when every batch ran."""
    where: str | None = None
    """``file:line in function`` of the innermost cpkv frame of the failure."""

    @property
    def ok(self) -> bool:
        """Every batch's step ran on ``meta``."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class DryRunReport:
    """Every level's dry run."""

    cp_size: int
    levels: tuple[LevelDryRun, ...]
    """Level 0 up to the highest enabled phase, each on its own in-process group."""

    @property
    def ok(self) -> bool:
        """Every level ran."""
        return all(level.ok for level in self.levels)

    def to_json(self) -> dict[str, Any]:
        """The JSON document of a dry run (``verify --device meta --json``)."""
        levels = [{"level": lv.level, "ok": lv.ok} | asdict(lv) for lv in self.levels]
        return {"ok": self.ok, "device": "meta", "cp_size": self.cp_size, "levels": levels}


def _innermost_cpkv_frame(exc: BaseException) -> str | None:
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "site-packages" not in f.filename
        and "/cpkv" in f.filename
        and Path(f.filename).name != "dry_run.py"
    ]
    if not frames:
        return None
    frame = frames[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"


def _dry_run_level(
    comm: Communicator,
    model: ModelConfig,
    settings: RunSettings,
    batches: Sequence[BatchSpec],
    level: int,
) -> int:
    """One rank's part of one level, as the runner runs it; returns the batches done."""
    deploy = settings.deploy
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    enabled = level_enabled(level, settings.enabled)
    loop = HostLoop(deploy, enabled, num_pages, settings.ceiling) if comm.rank == 0 else None
    engine: CPEngine | None = None
    for batch in batches:
        step = broadcast_value(comm, loop.step(batch) if loop is not None else None, LoopStep)
        if engine is None:
            engine = CPEngine(
                model, deploy, comm, num_pages, step.decision.plan.kv_layout, device=_META
            )
        host = engine.host_plan(step.scheduled, step.decision.plan)
        packed = upload(host, _META)  # the one host-to-device copy, outside the guard
        with torch.no_grad(), MetaGuard():
            tensors = expand(host, packed, model.vocab_size)
            engine.run_step(host, tensors)
    return len(batches)


def dry_run_levels(
    model: ModelConfig, settings: RunSettings, batches: Sequence[BatchSpec]
) -> DryRunReport:
    """Runs every level 0..highest enabled (up to the ceiling) on ``meta``, each on its own
    in-process group, so a failure at one level does not hide the others."""
    levels = settings.levels()
    cp_size = settings.deploy.cp_size
    reports = []
    for level in levels:

        def rank(comm: Communicator, level: int = level) -> int:
            return _dry_run_level(comm, model, settings, batches, level)

        try:
            done = run_local(cp_size, rank)[0]
        except RuntimeError as exc:
            cause = exc.__cause__ or exc
            error = f"{type(cause).__name__}: {cause}"
            reports.append(LevelDryRun(level, 0, error, _innermost_cpkv_frame(cause)))
        else:
            reports.append(LevelDryRun(level, done))
    return DryRunReport(cp_size, tuple(reports))
