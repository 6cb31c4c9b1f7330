"""What a phase declares: identity, needs, a start-up contract, a batch contract, strategies."""

from __future__ import annotations

from typing import ClassVar, Protocol, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import ExecutionPlan, ScheduledBatch
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class StartupContract(BaseModel):
    """A phase's start-up conditions on the deployment, validated once per deployment.

    Subclasses declare the fields they constrain (each with its rule as the attribute
    docstring) and fill them in ``from_deployment``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @classmethod
    def from_deployment(cls, deploy: DeploymentConfig) -> Self:
        """The contract filled from ``deploy``; raises ValidationError where a rule fails."""
        return cls()


class Phase(Protocol):
    """One migration phase.

    ``check_startup`` runs once per deployment (pydantic validation lives there);
    ``check_batch`` runs per batch on the scheduled batch's host metadata only and returns
    every reason it refuses, as structured ``Reason`` values (no text per batch).
    """

    id: PhaseId
    needs: tuple[PhaseId, ...]
    needs_split: bool
    """Its mechanics need the batch split over the ranks; a batch the gate runs unsplit
    (``CP_OFF``) leaves it off without checking the batch contract."""
    startup_contract: ClassVar[type[StartupContract]]
    summary: str

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        """Every reason this batch cannot take the phase; empty when it can."""
        ...

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """The plan with this phase's strategies in place."""
        ...


def check_startup(phase: Phase, deploy: DeploymentConfig) -> list[Reason]:
    """Validates ``phase``'s start-up contract against ``deploy``; every failure is a reason
    ``STARTUP_CONTRACT field=value: rule``, the rule being the field's documented one."""
    contract = phase.startup_contract
    try:
        contract.from_deployment(deploy)
    except ValidationError as exc:
        return [_contract_reason(contract, deploy, err["loc"], err["msg"]) for err in exc.errors()]
    return []


def _contract_reason(
    contract: type[StartupContract],
    deploy: DeploymentConfig,
    loc: tuple[int | str, ...],
    msg: str,
) -> Reason:
    name = str(loc[0]) if loc else "deployment"
    field = contract.model_fields.get(name)
    rule = field.description if field is not None and field.description else msg
    value = getattr(deploy, name, None)
    return Reason(ReasonCode.STARTUP_CONTRACT, ((name, str(value)),), rule)
