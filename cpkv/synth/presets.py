"""The three documented workload presets, each at full size and at a CPU-sized ``small``.

``full`` is shaped like production traffic for a 60-160 GiB GPU (SGLang's default 8192-token
chunks, 16384-token batches) and is meant for ``cpkv explain``; ``small`` keeps the shape
with fewer, shorter requests and 1024-token chunks, so ``cpkv verify`` runs it on a CPU.
``docs/workloads.md`` describes each and tabulates its phase mix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cpkv.synth.scheduler import SchedulerConfig
from cpkv.synth.shapes import (
    AgentShape,
    GspShape,
    LongDocShape,
    agent,
    generated_shared_prefix,
    long_doc,
)
from cpkv.synth.workload import Workload

SMALL_SCHEDULER = SchedulerConfig(chunked_prefill_size=1024, max_prefill_tokens=2048)
"""Chunks and batches of the CPU-sized presets."""


class Size(StrEnum):
    """How big a preset is."""

    FULL = "full"
    """Production-shaped lengths and counts."""
    SMALL = "small"
    """The same shape, CPU-sized for ``cpkv verify``."""


@dataclass(frozen=True, slots=True)
class Preset:
    """A workload shape and the scheduler settings it is meant to run under."""

    summary: str
    shape: GspShape | LongDocShape | AgentShape
    """What :meth:`make` builds: a ``GspShape`` is the chat preset's."""
    scheduler: SchedulerConfig

    def make(self, seed: int) -> Workload:
        """Builds the workload from a seed."""
        if isinstance(self.shape, LongDocShape):
            return long_doc(self.shape, seed)
        if isinstance(self.shape, AgentShape):
            return agent(self.shape, seed)
        return generated_shared_prefix(self.shape, seed, "chat")


PRESETS: dict[tuple[str, Size], Preset] = {
    ("chat", Size.FULL): Preset(
        "16 system prompts (512-2048 tokens) x 32 users, questions of 64-256 tokens, 64 in flight",
        GspShape(
            num_groups=16,
            prompts_per_group=32,
            system_prompt_len=2048,
            question_len=256,
            range_ratio=0.25,
            max_concurrency=64,
        ),
        SchedulerConfig(),
    ),
    ("chat", Size.SMALL): Preset(
        "2 system prompts (256-512 tokens) x 4 users, questions of 64-128 tokens",
        GspShape(
            num_groups=2,
            prompts_per_group=4,
            system_prompt_len=512,
            question_len=128,
            range_ratio=0.5,
        ),
        SMALL_SCHEDULER,
    ),
    ("long-doc", Size.FULL): Preset(
        "16 documents of 32K-128K tokens, 4 questions each (64-512 tokens) asked one after "
        "another, 4 documents in flight",
        LongDocShape(
            num_docs=16,
            doc_len_min=32768,
            doc_len_max=131072,
            questions_per_doc=4,
            question_len=512,
            max_concurrency=4,
        ),
        SchedulerConfig(),
    ),
    ("long-doc", Size.SMALL): Preset(
        "2 documents of 2K-4K tokens, 2 questions each (16-128 tokens), both in flight",
        LongDocShape(
            num_docs=2,
            doc_len_min=2048,
            doc_len_max=4096,
            questions_per_doc=2,
            question_len=128,
            max_concurrency=2,
        ),
        SMALL_SCHEDULER,
    ),
    ("agent", Size.FULL): Preset(
        "16 agents x 12 turns on a shared 4K-token system prompt; each turn adds the "
        "model's output (128-512) and a tool result (512-4096)",
        AgentShape(
            num_agents=16,
            turns=12,
            system_prompt_len=4096,
            task_len=1024,
            output_len=512,
            observation_len=4096,
        ),
        SchedulerConfig(),
    ),
    ("agent", Size.SMALL): Preset(
        "2 agents x 3 turns on a shared 512-token system prompt; each turn adds 24-96 "
        "output and 32-256 tool tokens",
        AgentShape(
            num_agents=2,
            turns=3,
            system_prompt_len=512,
            task_len=128,
            output_len=96,
            observation_len=256,
        ),
        SMALL_SCHEDULER,
    ),
}
"""``(name, size)`` to the preset."""

PRESET_NAMES = ("chat", "long-doc", "agent")
"""The preset names, in the order the docs list them."""
