"""The gate: needs respected, highest active phase chosen, every inactive phase explained."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv_core.config import (
    CpMode,
    DeploymentConfig,
    DisaggregationMode,
    SplitGate,
    TransferBackend,
)
from cpkv_core.planning import (
    BatchSpec,
    ExecutionPlan,
    OutputStrategy,
    OwnerPolicy,
    RequestSpec,
    ScheduledBatch,
    Scheduler,
    SplitStrategy,
)
from phases import Gate, StartupContract, levels_of, startup_problems
from phases.ids import PHASE_NEEDS, PhaseId, closure_of_needs, parse_phase_list
from phases.reasons import Reason, ReasonCode
from phases.registry import REGISTERED_PHASES

DEPLOY = DeploymentConfig(cp_size=4, page_size=4)


class AnyDeployment(StartupContract):
    """Holds for every deployment."""


@dataclasses.dataclass
class FakePhase:
    """A phase whose batch contract refuses batches whose number is in ``refuse``."""

    id: PhaseId
    refuse: frozenset[int]
    needs: tuple[PhaseId, ...] = ()
    needs_split: bool = False
    startup_contract: ClassVar[type[StartupContract]] = AnyDeployment
    summary: str = "fake"

    def __post_init__(self) -> None:
        self.needs = PHASE_NEEDS[self.id]

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        refused = batch.batch in self.refuse
        return [Reason(ReasonCode.HAS_HISTORY, (("fake", 1),))] if refused else []

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        return plan


def schedule(batch: BatchSpec, policy: OwnerPolicy = OwnerPolicy.DEALT) -> ScheduledBatch:
    """``batch`` scheduled on a fresh scheduler for ``DEPLOY`` (requests must be new)."""
    return Scheduler(256, DEPLOY.page_size, DEPLOY.cp_size).schedule(batch, policy)


def make_batch(batch: int = 0, **request: object) -> ScheduledBatch:
    fields: dict[str, object] = {"rid": "a", "prefix_len": 0, "extend_len": 16} | request
    return schedule(BatchSpec(batch, (RequestSpec(**fields),)))  # type: ignore[arg-type]


def texts(reasons: tuple[Reason, ...]) -> tuple[str, ...]:
    return tuple(str(r) for r in reasons)


@settings(max_examples=200, deadline=None)
@given(
    enabled=st.frozensets(st.sampled_from(list(PhaseId))),
    refusals=st.lists(st.frozensets(st.integers(0, 3)), min_size=5, max_size=5),
    ceiling=st.none() | st.integers(0, 5),
    batch=st.integers(0, 3),
    split_needers=st.frozensets(st.sampled_from(list(PhaseId))),
    cp_min_tokens=st.sampled_from([0, 16, 17, 1000]),
    extend_len=st.sampled_from([1, 7, 8, 16]),
    split_gate=st.sampled_from(list(SplitGate)),
)
def test_gate_respects_needs_and_picks_the_highest_active(
    enabled: frozenset[PhaseId],
    refusals: list[frozenset[int]],
    ceiling: int | None,
    batch: int,
    split_needers: frozenset[PhaseId],
    cp_min_tokens: int,
    extend_len: int,
    split_gate: SplitGate,
) -> None:
    registry = {
        pid: FakePhase(pid, refusals[pid - 1], needs_split=pid in split_needers) for pid in PhaseId
    }
    deploy = DEPLOY.model_copy(update={"cp_min_tokens": cp_min_tokens, "split_gate": split_gate})
    plan = Gate(enabled, deploy, ceiling, registry).decide(make_batch(batch, extend_len=extend_len))
    active = {d.phase for d in plan.decisions if d.active}
    sglang_declines = split_gate is SplitGate.SGLANG and extend_len < 2 * DEPLOY.cp_size
    unsplit = sglang_declines or cp_min_tokens > extend_len
    assert (plan.cp_off is not None) == unsplit == (plan.plan.split is SplitStrategy.NONE)
    assert [d.phase for d in plan.decisions] == list(PhaseId)
    for decision in plan.decisions:
        if decision.active:
            assert decision.reasons == ()
            assert set(closure_of_needs(decision.phase)) <= active
            assert decision.phase in enabled
            assert ceiling is None or decision.phase <= ceiling
            assert not (unsplit and decision.phase in split_needers)
        else:
            assert decision.reasons, f"phase {decision.phase} inactive without a reason"
    assert plan.phase == max(active, default=0)


def test_every_reason_is_collected_not_the_first() -> None:
    batch = BatchSpec(
        0,
        (
            RequestSpec("a", 0, 8, return_logprob=True),
            RequestSpec("b", 0, 8, return_logprob=True, capture_hidden=True),
        ),
        spec="EAGLE",
    )
    decision = Gate(frozenset({PhaseId.NARROW_OUTPUT}), DEPLOY).decide(schedule(batch))
    decision = decision.decisions[0]
    assert not decision.active
    assert [r.code for r in decision.reasons] == [
        ReasonCode.SPEC_DECODE,
        ReasonCode.RETURN_LOGPROB,
        ReasonCode.RETURN_LOGPROB,
        ReasonCode.CAPTURE_HIDDEN,
    ]
    assert decision.reasons[1].values == (("rid", "a"),)
    assert texts(decision.reasons) == (
        "SPEC_DECODE spec=EAGLE",
        "RETURN_LOGPROB rid=a",
        "RETURN_LOGPROB rid=b",
        "CAPTURE_HIDDEN rid=b",
    )


def test_allows_narrow_output_for_a_plain_batch() -> None:
    plan = Gate(frozenset({PhaseId.NARROW_OUTPUT}), DEPLOY).decide(make_batch())
    assert plan.phase == 1
    assert plan.plan.output is OutputStrategy.NARROW_LAST_TOKEN


def test_disabled_phase_keeps_the_full_gather() -> None:
    plan = Gate(frozenset(), DEPLOY).decide(make_batch())
    assert plan.phase == 0
    assert plan.plan == ExecutionPlan.baseline(CpMode.IN_SEQ_SPLIT)
    assert texts(plan.decisions[0].reasons) == ("DISABLED",)
    assert plan.decisions[0].disabled


def test_ceiling_is_a_kill_switch() -> None:
    plan = Gate(frozenset({PhaseId.NARROW_OUTPUT}), DEPLOY, ceiling=0).decide(make_batch())
    assert plan.phase == 0
    assert texts(plan.decisions[0].reasons) == ("CEILING max_phase=0",)


@pytest.mark.parametrize("ceiling", [1, 2, 3, 4, 5])
def test_a_ceiling_keeps_its_own_phase_and_stops_the_next(ceiling: int) -> None:
    """``--max-phase N`` runs phase N on a batch every phase takes, and names the ceiling on
    the phases above N only (a 64-token request spans 16 pages: no phase refuses it)."""
    gate = Gate(frozenset(PhaseId), DEPLOY, ceiling=ceiling)
    scheduler = Scheduler(256, DEPLOY.page_size, DEPLOY.cp_size)
    batch = scheduler.schedule(BatchSpec(0, (RequestSpec("a", 0, 64),)), gate.owner_policy())
    plan = gate.decide(batch)
    assert plan.phase == ceiling
    for decision in plan.decisions:
        capped = any(r.code is ReasonCode.CEILING for r in decision.reasons)
        assert decision.active == (decision.phase <= ceiling), decision
        assert capped == (decision.phase > ceiling), decision


def test_a_tripped_kill_switch_acts_on_the_next_batch() -> None:
    gate = Gate(frozenset(PhaseId), DEPLOY)
    scheduler = Scheduler(256, DEPLOY.page_size, DEPLOY.cp_size)

    def next_batch(index: int) -> ScheduledBatch:
        batch = BatchSpec(index, (RequestSpec(f"r{index}", 0, 64),))
        return scheduler.schedule(batch, gate.owner_policy())

    assert gate.decide(next_batch(0)).phase == 5
    gate.kill(PhaseId.PAGE_ALIGNED_SPLIT, (("batch", 0), ("max_diff", "0.5")))
    after = gate.decide(next_batch(1))
    assert after.phase == 3
    assert texts(after.decisions[3].reasons) == ("KILLED batch=0 max_diff=0.5",)
    assert texts(after.decisions[4].reasons) == ("NEEDS_INACTIVE phase=4", "NOT_OWNER_ALLOCATED")
    assert gate.owner_policy() is OwnerPolicy.DEALT


def test_owner_policy_follows_what_could_take_phase_5() -> None:
    assert Gate(frozenset(PhaseId), DEPLOY).owner_policy() is OwnerPolicy.COMPUTE_OWNER
    assert Gate(frozenset(PhaseId), DEPLOY, ceiling=4).owner_policy() is OwnerPolicy.DEALT


def test_owner_policy_deals_the_batch_while_page_interleave_could_take_it() -> None:
    """Round-robin: the page interleave computes each page on its owner whatever the
    allocation, so phase 4 (not 5) decides, and the batch's pages are dealt in one cycle."""
    round_robin = DeploymentConfig(cp_size=4, page_size=4, cp_mode=CpMode.ROUND_ROBIN_SPLIT)
    assert Gate(frozenset(PhaseId), round_robin).owner_policy() is OwnerPolicy.BATCH_DEALT
    up_to_4 = frozenset(PhaseId) - {PhaseId.COMPUTE_OWNER_WRITE}
    assert Gate(up_to_4, round_robin).owner_policy() is OwnerPolicy.BATCH_DEALT
    assert Gate(frozenset(PhaseId), round_robin, ceiling=3).owner_policy() is OwnerPolicy.DEALT


def test_phase_5_names_a_batch_whose_pages_were_dealt() -> None:
    batch = schedule(BatchSpec(0, (RequestSpec("a", 0, 64),)), OwnerPolicy.DEALT)
    plan = Gate(frozenset(PhaseId), DEPLOY).decide(batch)
    assert plan.phase == 4
    assert texts(plan.decisions[4].reasons) == ("NOT_OWNER_ALLOCATED",)


def test_levels_cover_zero_to_the_highest_enabled_phase() -> None:
    assert levels_of(frozenset()) == (0,)
    assert levels_of(frozenset({PhaseId.NARROW_OUTPUT})) == (0, 1)


def test_parses_phase_lists() -> None:
    assert parse_phase_list("all") == frozenset(PhaseId)
    assert parse_phase_list("1,3") == {PhaseId.NARROW_OUTPUT, PhaseId.CURRENT_REUSE}
    assert parse_phase_list("none") == frozenset()


def test_needs_close_transitively() -> None:
    assert closure_of_needs(PhaseId.COMPUTE_OWNER_WRITE) == (
        PhaseId.SHARDED_KV,
        PhaseId.PAGE_ALIGNED_SPLIT,
    )


def test_an_enabled_phase_without_mechanics_is_unavailable_not_stubbed() -> None:
    registry = {
        pid: phase for pid, phase in REGISTERED_PHASES.items() if pid != PhaseId.COMPUTE_OWNER_WRITE
    }
    plan = Gate(frozenset(PhaseId), DEPLOY, registry=registry).decide(make_batch(extend_len=64))
    assert plan.phase == 4
    assert texts(plan.decisions[4].reasons) == ("UNAVAILABLE",)


def test_phase_2s_startup_reason_names_the_deployments_transfer_backend() -> None:
    """``STARTUP_CONTRACT pd_backend=nixl: needs Mooncake ...`` (docs/phases/README.md): the
    value is the deployment's, the text after it the contract field's rule; Mooncake, over
    TCP too, and no PD pass."""

    def prefill(backend: TransferBackend) -> DeploymentConfig:
        mode = DisaggregationMode.PREFILL
        return DeploymentConfig(
            cp_size=4, page_size=4, disaggregation_mode=mode, transfer_backend=backend
        )

    sharded = frozenset({PhaseId.SHARDED_KV})
    refused = (
        "STARTUP_CONTRACT pd_backend=nixl: "
        "needs Mooncake (owned-page transfer with logical positions) or no PD",
    )
    problems = startup_problems(sharded, prefill(TransferBackend.NIXL))
    assert texts(tuple(problems[PhaseId.SHARDED_KV])) == refused
    plan = Gate(sharded, prefill(TransferBackend.NIXL)).decide(make_batch())
    decision = next(d for d in plan.decisions if d.phase == PhaseId.SHARDED_KV)
    assert not decision.active and texts(decision.reasons) == refused
    for deploy in (prefill(TransferBackend.MOONCAKE_TCP), DEPLOY):
        assert startup_problems(sharded, deploy) == {PhaseId.SHARDED_KV: []}
