"""Per-batch CP on or off: a batch the server would not split, or too small to gain from CP,
runs unsplit.

Two rules, checked in this order:

1. SGLang 0.5.23's split gate (``deploy.split_gate`` ``sglang``, the default; the integer
   rule is ``cpkv_core.planning.sglang_cp``): zigzag does not split a batch in which any
   request has fewer than ``2 * cp_size`` current tokens, interleave one with fewer than
   ``cp_size`` current tokens in all (``srt/layers/cp/zigzag.py`` and ``interleave.py``,
   ``can_apply``). The reason names the rule: ``CP_OFF rule=sglang rid=r3 tokens=5 need=8``
   (zigzag) or ``CP_OFF rule=sglang tokens=3 need=4`` (interleave). ``split-anyway`` turns
   this rule off: cpkv splits every batch, as before 0.5.23.
2. ``--nsa-prefill-cp-min-tokens``: below that many current tokens, the collectives of a
   split (the current chunk's all-gather per layer, the tail gather) cost more than the
   compute they save: ``CP_OFF tokens=612 min=4096``.

An unsplit batch takes the ``none`` split: every rank computes every token, as if CP were
off for it. KV at rest keeps its layout (every rank writes every page when replicated, its
own pages when sharded), reads keep the level's read strategy, and nothing is gathered for
the current chunk or at the tail. Phases whose mechanics need a split
(``Phase.needs_split``: 1, 4, 5) are off for the batch with the ``CP_OFF`` reason.

The rules are stated here, once; the gate applies them and the flags layer hands them the
deployment.
"""

from __future__ import annotations

from cpkv_core.config import DeploymentConfig, SplitGate
from cpkv_core.planning import ScheduledBatch
from cpkv_core.planning.sglang_cp import sglang_declines
from phases.reasons import Reason, ReasonCode

__all__ = ["cp_off_reason", "runs_unsplit"]


def runs_unsplit(batch: ScheduledBatch, deploy: DeploymentConfig) -> bool:
    """True when ``batch`` runs unsplit under ``deploy`` (see the module docstring)."""
    return cp_off_reason(batch, deploy) is not None


def cp_off_reason(batch: ScheduledBatch, deploy: DeploymentConfig) -> Reason | None:
    """``CP_OFF rule=sglang ...`` or ``CP_OFF tokens=.. min=..`` when ``batch`` runs unsplit,
    else None. O(requests); allocates only for a batch it turns off.

    At ``cp_size`` 1 there is nothing to split and no reason is given.
    """
    if deploy.cp_size <= 1:
        return None
    if deploy.split_gate is SplitGate.SGLANG:
        decline = sglang_declines(batch.extend_lens, deploy.cp_mode, deploy.cp_size)
        if decline is not None:
            who = () if decline.request is None else (("rid", batch.requests[decline.request].rid),)
            values = (("rule", "sglang"), *who, ("tokens", decline.tokens), ("need", decline.need))
            return Reason(ReasonCode.CP_OFF, values)
    num_tokens = batch.num_tokens
    if num_tokens < deploy.cp_min_tokens:
        return Reason(ReasonCode.CP_OFF, (("tokens", num_tokens), ("min", deploy.cp_min_tokens)))
    return None
