"""The scheduler's runtime: cpkv's gate over the server's deployment, the running totals
and the shadow settings, built once by the start-up check (:func:`build`, :func:`current`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cpkv_core.config import DeploymentConfig
from cpkv_sglang.decision_file import DecisionFile
from cpkv_sglang.records import PLUGIN_PHASES, Totals
from cpkv_sglang.state import LOG
from flags import ResolvedFlags
from phases import Gate, PhaseId
from phases.decision_log import DecisionRecord, TailRecord

__all__ = ["LOG_EVERY", "Runtime", "build", "current", "set_current"]

LOG_EVERY = 1000
"""Decisions between two totals lines in the server log."""


@dataclass(slots=True)
class Runtime:
    """Everything a hook needs per batch, settled at start-up."""

    flags: ResolvedFlags
    """cpkv's settings overlaid by the server's resolved ``ServerArgs``."""
    deploy: DeploymentConfig
    gate: Gate
    """cpkv's gate, handed the enabled phases the plugin runs (phase 1), the ceiling and
    the kill switches tripped so far."""
    shadow_rate: float
    shadow_seed: int = 0
    totals: Totals = field(default_factory=Totals)
    next_batch: int = 0
    """Index the next decided forward batch gets."""
    decision_file: DecisionFile | None = None
    """Where each decision and tail gather is appended (``CPKV_DECISION_LOG``); None: not
    kept."""

    def keep(self, record: DecisionRecord | TailRecord) -> None:
        """Appends ``record`` to the decision log, when one is kept."""
        if self.decision_file is not None:
            self.decision_file.write(record)

    @property
    def narrow_on(self) -> bool:
        """Phase 1 is enabled and not killed."""
        phase = PhaseId.NARROW_OUTPUT
        return phase in self.gate.enabled and phase not in self.gate.killed

    def take_batch_index(self) -> int:
        """The next batch index (every CP rank counts the same forward batches)."""
        index = self.next_batch
        self.next_batch += 1
        if self.next_batch % LOG_EVERY == 0:
            LOG.info("%s", self.totals.line())
        return index


def build(flags: ResolvedFlags) -> Runtime:
    """The runtime of a server whose flags passed the start-up checks."""
    deploy = flags.flags.deployment()
    enabled = flags.flags.enabled_phases() & PLUGIN_PHASES
    gate = Gate(enabled, deploy, ceiling=flags.flags.max_phase)
    log = flags.flags.decision_log
    decision_file = None if log is None else DecisionFile(log)
    return Runtime(flags, deploy, gate, flags.flags.shadow_rate, decision_file=decision_file)


_CURRENT: Runtime | None = None


def set_current(runtime: Runtime | None) -> None:
    """Installs the runtime the hooks use (None: not started)."""
    global _CURRENT
    _CURRENT = runtime


def current() -> Runtime | None:
    """The runtime the start-up check built in this process, or None before it ran."""
    return _CURRENT
