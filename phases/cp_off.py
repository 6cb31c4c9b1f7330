"""Per-batch CP on or off: a batch too small to gain from CP runs unsplit.

Below ``--nsa-prefill-cp-min-tokens`` current tokens, splitting a batch over the CP ranks
costs more in collectives (the current chunk's all-gather per layer, the tail gather) than it
saves in compute. Such a batch takes the ``none`` split: every rank computes every token, as
if CP were off for it. KV at rest keeps its layout (every rank writes every page when
replicated, its own pages when sharded), reads keep the level's read strategy, and nothing is
gathered for the current chunk or at the tail. Phases whose mechanics need a split
(``Phase.needs_split``: 1, 4, 5) are off for the batch with the reason ``CP_OFF``.

The rule is stated here, once; the gate applies it and the flags layer hands it the minimum.
"""

from __future__ import annotations

from cpkv_core.config import DeploymentConfig
from phases.reasons import Reason, ReasonCode

__all__ = ["cp_off_reason", "runs_unsplit"]


def runs_unsplit(num_tokens: int, deploy: DeploymentConfig) -> bool:
    """True when a batch of ``num_tokens`` current tokens runs unsplit under ``deploy``.

    A CP deployment (``cp_size`` > 1) sends a batch down the ``none`` split when it has fewer
    current tokens than ``deploy.cp_min_tokens``; 0 never does, and at ``cp_size`` 1 there is
    nothing to split.
    """
    return deploy.cp_size > 1 and num_tokens < deploy.cp_min_tokens


def cp_off_reason(num_tokens: int, deploy: DeploymentConfig) -> Reason | None:
    """``CP_OFF tokens=.. min=..`` when the batch runs unsplit, else None."""
    if not runs_unsplit(num_tokens, deploy):
        return None
    return Reason(ReasonCode.CP_OFF, (("tokens", num_tokens), ("min", deploy.cp_min_tokens)))
