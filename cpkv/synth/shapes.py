"""Workload shapes: SGLang bench_serving's datasets and cpkv's multi-turn shapes.

Every generator draws from one ``random.Random(seed)`` in a fixed order, so a seed gives
the same workload on every machine. Lengths drawn "with range ratio ``r``" are uniform in
``[max(1, int(full * r)), full]``, as bench_serving draws them.
"""

from __future__ import annotations

import random
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from cpkv.synth.workload import Segment, Session, Turn, Workload, extend_turn

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Count = Annotated[int, Field(ge=1)]
"""A count or a length: a whole number, at least 1."""
Ratio = Annotated[float, Field(ge=0.0, le=1.0)]
"""A share, from 0 to 1."""


def _lens(rng: random.Random, full: int, range_ratio: float, count: int) -> list[int]:
    low = max(int(full * range_ratio), 1)
    return [rng.randint(low, full) for _ in range(count)]


class GspShape(BaseModel):
    """bench_serving's ``generated-shared-prefix``: groups of prompts sharing a system prompt."""

    model_config = _FROZEN

    num_groups: Count = 64
    """Groups (``--gsp-num-groups``), each with its own system prompt."""
    prompts_per_group: Count = 16
    """Prompts per group (``--gsp-prompts-per-group``)."""
    system_prompt_len: Count = 2048
    """Tokens of each system prompt (``--gsp-system-prompt-len``)."""
    question_len: Count = 128
    """Tokens of each question (``--gsp-question-len``)."""
    range_ratio: Ratio = 1.0
    """Lengths drawn in ``[full * ratio, full]`` (``--gsp-range-ratio``); 1 means fixed."""
    max_concurrency: Count | None = None
    """Sessions in flight; None: all at once (``--max-concurrency`` overrides it)."""


def generated_shared_prefix(
    shape: GspShape, seed: int, name: str = "generated-shared-prefix"
) -> Workload:
    """One single-turn session per prompt, system prompt then question, shuffled."""
    rng = random.Random(seed)
    systems = _lens(rng, shape.system_prompt_len, shape.range_ratio, shape.num_groups)
    count = shape.num_groups * shape.prompts_per_group
    questions = _lens(rng, shape.question_len, shape.range_ratio, count)
    sessions = [
        Session((Turn(f"g{g}-p{p}", ((f"sys{g}", systems[g]), (f"q{g}-{p}", questions[i]))),))
        for i, (g, p) in enumerate(
            (g, p) for g in range(shape.num_groups) for p in range(shape.prompts_per_group)
        )
    ]
    rng.shuffle(sessions)
    return Workload(name, tuple(sessions), shape.max_concurrency)


class RandomShape(BaseModel):
    """bench_serving's ``random``: independent prompts of random length, no shared prefix."""

    model_config = _FROZEN

    num_prompts: Count = 1000
    """Prompts (``--num-prompts``)."""
    input_len: Count = 1024
    """Longest prompt (``--random-input-len``)."""
    range_ratio: Ratio = 0.0
    """Shortest prompt as a share of the longest (``--random-range-ratio``)."""


def random_prompts(shape: RandomShape, seed: int) -> Workload:
    """One single-turn session per prompt, its tokens its own."""
    rng = random.Random(seed)
    lens = _lens(rng, shape.input_len, shape.range_ratio, shape.num_prompts)
    sessions = (Session((Turn(f"r{i}", ((f"r{i}", n),)),)) for i, n in enumerate(lens))
    return Workload("random", tuple(sessions))


class LongDocShape(BaseModel):
    """Long documents, each asked several questions one after another."""

    model_config = _FROZEN

    num_docs: Count
    """Documents."""
    doc_len_min: Count
    """Shortest document, in tokens."""
    doc_len_max: Count
    """Longest document, in tokens."""
    questions_per_doc: Count
    """Questions per document: the first with the document, then follow-ups."""
    question_len: Count
    """Longest question; drawn with range ratio 0.125."""
    max_concurrency: Count
    """Documents in flight at once."""


def long_doc(shape: LongDocShape, seed: int) -> Workload:
    """Per document, turn ``j`` is the document then question ``j``: a follow-up arrives
    once the previous question's prefill is done and hits the cached document."""
    rng = random.Random(seed)
    sessions = []
    for d in range(shape.num_docs):
        doc: Segment = (f"doc{d}", rng.randint(shape.doc_len_min, shape.doc_len_max))
        questions = _lens(rng, shape.question_len, 0.125, shape.questions_per_doc)
        turns = tuple(
            Turn(f"doc{d}-q{j}", (doc, (f"doc{d}-q{j}", n))) for j, n in enumerate(questions)
        )
        sessions.append(Session(turns))
    return Workload("long-doc", tuple(sessions), shape.max_concurrency)


class AgentShape(BaseModel):
    """Agents looping over tool calls: the history grows every turn."""

    model_config = _FROZEN

    num_agents: Count
    """Agents, all in flight at once."""
    turns: Count
    """Turns per agent."""
    system_prompt_len: Count
    """Tokens of the system prompt and tool definitions, shared by every agent."""
    task_len: Count
    """Longest task description; drawn with range ratio 0.5."""
    output_len: Count
    """Longest model output per turn; drawn with range ratio 0.25."""
    observation_len: Count
    """Longest tool result per turn; drawn with range ratio 0.125."""


def agent(shape: AgentShape, seed: int) -> Workload:
    """Turn 1 is the shared system prompt and the task; turn ``k + 1`` is turn ``k``'s prompt,
    the model's output (decoded elsewhere under PD, so new to the prefill server) and the
    tool result."""
    rng = random.Random(seed)
    system: Segment = ("agent-sys", shape.system_prompt_len)
    sessions = []
    for a in range(shape.num_agents):
        turn = Turn(f"a{a}-t0", (system, (f"a{a}-task", _lens(rng, shape.task_len, 0.5, 1)[0])))
        turns = [turn]
        for k in range(1, shape.turns):
            output = (f"a{a}-out{k}", _lens(rng, shape.output_len, 0.25, 1)[0])
            observation = (f"a{a}-obs{k}", _lens(rng, shape.observation_len, 0.125, 1)[0])
            turn = extend_turn(turn, f"a{a}-t{k}", (output, observation))
            turns.append(turn)
        sessions.append(Session(tuple(turns)))
    return Workload("agent", tuple(sessions), shape.num_agents)
