"""Workload synthesis: traces from workload shapes through an SGLang-like scheduler; entry
point ``synthesize``."""

from __future__ import annotations

from cpkv.synth.presets import PRESET_NAMES, PRESETS, Preset, Size
from cpkv.synth.requests_file import read_requests_file
from cpkv.synth.scheduler import (
    SchedulerConfig,
    check_scheduler,
    effective_scheduler,
    schedule,
)
from cpkv.synth.shapes import GspShape, RandomShape, generated_shared_prefix, random_prompts
from cpkv.synth.trace_out import SynthSummary, summarize, trace_text
from cpkv.synth.workload import Session, Turn, Workload
from cpkv_core.planning import BatchSpec

__all__ = [
    "PRESETS",
    "PRESET_NAMES",
    "GspShape",
    "Preset",
    "RandomShape",
    "SchedulerConfig",
    "Session",
    "Size",
    "SynthSummary",
    "Turn",
    "Workload",
    "check_scheduler",
    "effective_scheduler",
    "generated_shared_prefix",
    "random_prompts",
    "read_requests_file",
    "schedule",
    "summarize",
    "synthesize",
    "trace_text",
]


def synthesize(workload: Workload, scheduler: SchedulerConfig) -> tuple[BatchSpec, ...]:
    """The prefill batches of ``workload``: the trace ``cpkv trace synth`` writes."""
    return schedule(workload, scheduler)
