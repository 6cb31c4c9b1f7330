"""SGLang 0.5.23's rules for where experts go and how the LM head is split:
:func:`eplb_and_dispatch`, :func:`lm_head`.

EPLB places expert replicas over the EP ranks, so it needs EP above 1, and a dispatch that
picks a replica per rank needs an MoE all-to-all backend to route each token to one rank
(``sglang/srt/arg_groups/parallel_hook.py``: ``handle_eplb_and_dispatch``). The DP LM head and
the TP LM head's all-to-all need attention DP (``overrides.py``: ``_data_parallelism_defaults``,
``_dp_lm_head_validation``). Both run on the resolved layout, after the MoE backend and EP.
"""

from __future__ import annotations

from flags.checks import ProblemCode
from flags.sglang.rules import OVERRIDES, PARALLEL_HOOK, Resolving, SglangRule

__all__ = ["EXPERT_RULES", "eplb_and_dispatch", "lm_head"]

C = ProblemCode
EPLB_WITHOUT_EP = SglangRule(
    C.SGLANG_EXPERT_PARALLEL,
    PARALLEL_HOOK,
    "--enable-eplb needs expert parallelism: assert ep_size > 1.",
    "add --ep-size (or an MoE all-to-all backend), or drop --enable-eplb",
)
DISPATCH_WITHOUT_A2A = SglangRule(
    C.SGLANG_EXPERT_PARALLEL,
    PARALLEL_HOOK,
    "--ep-dispatch-algorithm static/lp picks a different physical replica per rank, which "
    "only holds up when an a2a backend routes each token to a single rank.",
    "use --ep-dispatch-algorithm dynamic with --moe-a2a-backend none",
)
DP_LM_HEAD_WITHOUT_ATTN_DP = SglangRule(
    C.SGLANG_LM_HEAD,
    OVERRIDES,
    "--enable-dp-lm-head requires attention DP (--attn-dp-size).",
    "add --attn-dp-size, or drop --enable-dp-lm-head",
)
TP_LM_HEAD_A2A_WITHOUT_ATTN_DP = SglangRule(
    C.SGLANG_LM_HEAD,
    OVERRIDES,
    "--enable-tp-lm-head-all-to-all requires attention DP (--attn-dp-size).",
    "add --attn-dp-size, or drop --enable-tp-lm-head-all-to-all",
)
TP_LM_HEAD_A2A_WITH_DP_LM_HEAD = SglangRule(
    C.SGLANG_LM_HEAD,
    OVERRIDES,
    "--enable-tp-lm-head-all-to-all uses a TP-sharded LM head and is incompatible with "
    "--enable-dp-lm-head.",
    "drop one of the two",
)
TP_LM_HEAD_A2A_LAYOUT = SglangRule(
    C.SGLANG_LM_HEAD,
    OVERRIDES,
    "--enable-tp-lm-head-all-to-all currently requires tp_size == attn_dp_size and "
    "attn_cp_size == 1.",
    "set --attn-dp-size to the TP size without prefill CP",
)
EXPERT_RULES = (
    EPLB_WITHOUT_EP,
    DISPATCH_WITHOUT_A2A,
    DP_LM_HEAD_WITHOUT_ATTN_DP,
    TP_LM_HEAD_A2A_WITHOUT_ATTN_DP,
    TP_LM_HEAD_A2A_WITH_DP_LM_HEAD,
    TP_LM_HEAD_A2A_LAYOUT,
)


def eplb_and_dispatch(state: Resolving) -> None:
    """parallel_hook.py: handle_eplb_and_dispatch. Unset, EPLB or a non-trivial expert
    location picks ``dynamic`` dispatch without an MoE all-to-all backend, ``static`` with
    one; an elastic-EP scale joiner may run EPLB alone."""
    rank_invariant = state["moe_a2a_backend"] == "none"
    experts_placed = state["enable_eplb"] or state["init_expert_location"] != "trivial"
    if experts_placed and state["ep_dispatch_algorithm"] is None:
        algorithm = "dynamic" if rank_invariant else "static"
        state.declare(PARALLEL_HOOK, ep_dispatch_algorithm=algorithm)
    algorithm = state["ep_dispatch_algorithm"]
    if rank_invariant and algorithm in ("static", "lp"):
        state.add(DISPATCH_WITHOUT_A2A.problem(ep_dispatch_algorithm=algorithm))
    if state["enable_eplb"] and state["ep_join_mode"] != "scale" and state["ep_size"] <= 1:
        state.add(EPLB_WITHOUT_EP.problem(enable_eplb=True, ep_size=state["ep_size"]))


def lm_head(state: Resolving) -> None:
    """overrides.py: _data_parallelism_defaults, then _dp_lm_head_validation. Without DP
    ranks (``dp x attn_dp`` of 1) the DP LM head is off; DP replicas without attention DP
    cannot run it. An elastic-EP scale joiner counts as attention DP."""
    attn_dp, dp = state["attn_dp_size"], state["dp_size"]
    scale_joiner = state["ep_join_mode"] == "scale"
    attn_dp_on = attn_dp > 1 or scale_joiner
    dp_lm_head = state["enable_dp_lm_head"] and (dp * attn_dp > 1 or scale_joiner)
    if dp_lm_head and not attn_dp_on:
        state.add(DP_LM_HEAD_WITHOUT_ATTN_DP.problem(enable_dp_lm_head=True, dp_size=dp))
    if not state["enable_tp_lm_head_all_to_all"]:
        return
    if not attn_dp_on:
        state.add(TP_LM_HEAD_A2A_WITHOUT_ATTN_DP.problem(attn_dp_size=attn_dp))
    if dp_lm_head:
        state.add(TP_LM_HEAD_A2A_WITH_DP_LM_HEAD.problem(enable_dp_lm_head=True))
    tp, cp = state["tp_size"], state["attn_cp_size"]
    if tp != attn_dp or cp != 1:
        problem = TP_LM_HEAD_A2A_LAYOUT.problem(tp_size=tp, attn_dp_size=attn_dp, attn_cp_size=cp)
        state.add(problem)
