"""What a phase declares: identity, needs, a start-up contract, a batch contract, strategies."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ValidationError

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import ExecutionPlan
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class Phase(Protocol):
    """One migration phase.

    ``check_startup`` runs once per deployment (pydantic validation lives there);
    ``check_batch`` runs per batch on host metadata only and returns every reason it refuses.
    """

    id: PhaseId
    needs: tuple[PhaseId, ...]
    startup_contract: type[BaseModel]
    summary: str

    def check_batch(self, batch: BatchSpec, deploy: DeploymentConfig) -> list[Reason]:
        """Every reason this batch cannot take the phase; empty when it can."""
        ...

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """The plan with this phase's strategies in place."""
        ...


def check_startup(phase: Phase, deploy: DeploymentConfig) -> list[Reason]:
    """Validates ``phase``'s start-up contract against ``deploy``; every failure is a reason.

    The contract's fields name the deployment attributes it constrains; they are read from
    ``deploy`` by name and validated once.
    """
    contract = phase.startup_contract
    values = {name: getattr(deploy, name) for name in contract.model_fields}
    try:
        contract.model_validate(values)
    except ValidationError as exc:
        return [_contract_reason(contract, values, err["loc"], err["msg"]) for err in exc.errors()]
    return []


def _contract_reason(
    contract: type[BaseModel], values: dict[str, object], loc: tuple[int | str, ...], msg: str
) -> Reason:
    """``STARTUP_CONTRACT field=value: requirement``, the requirement being the field's
    documented rule (its attribute docstring) rather than pydantic's wording."""
    name = _field(loc)
    field = contract.model_fields.get(name)
    rule = field.description if field is not None and field.description else msg
    return Reason(ReasonCode.STARTUP_CONTRACT, f"{name}={values.get(name)!s}: {rule}")


def _field(loc: tuple[int | str, ...]) -> str:
    return str(loc[0]) if loc else "deployment"
