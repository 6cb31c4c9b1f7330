"""The run step: KV pools, KV access, the model, the CP engine and the non-CP reference.

Entry point ``CPEngine.run_batch``: a ``ScheduledBatch`` and its strategies in, one rank's
outputs out; ``ReferenceModel`` computes the same without CP.
"""

from cpkv_core.runtime.device_plan import BatchTensors, expand, upload
from cpkv_core.runtime.engine import CPEngine
from cpkv_core.runtime.failures import (
    BatchFailed,
    BatchFailure,
    FailureCause,
    LocalFailure,
    PathError,
)
from cpkv_core.runtime.faults import FAILING_KINDS, FAULT_KINDS, Fault, FaultKind, FaultPoint
from cpkv_core.runtime.kv_access import materialize
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool, kv_bytes_per_page, kv_bytes_per_token
from cpkv_core.runtime.outputs import (
    OUTPUT_ATOL,
    BatchComparison,
    BatchOutput,
    RankBatchOutput,
    RequestOutput,
    ShadowMismatch,
    ShadowOutcome,
    StepOutput,
    compare_batch,
    max_abs_diff,
    merge_rank_outputs,
)
from cpkv_core.runtime.reference import ReferenceModel
from cpkv_core.runtime.shadow import SHADOW_TAG, ShadowPlan
from cpkv_core.runtime.weights import ModelWeights, init_weights

__all__ = [
    "FAILING_KINDS",
    "FAULT_KINDS",
    "OUTPUT_ATOL",
    "SHADOW_TAG",
    "BatchComparison",
    "BatchFailed",
    "BatchFailure",
    "BatchOutput",
    "BatchTensors",
    "CPEngine",
    "FailureCause",
    "Fault",
    "FaultKind",
    "FaultPoint",
    "KVRows",
    "LocalFailure",
    "ModelWeights",
    "PagedKVPool",
    "PathError",
    "RankBatchOutput",
    "ReferenceModel",
    "RequestOutput",
    "ShadowMismatch",
    "ShadowOutcome",
    "ShadowPlan",
    "StepOutput",
    "compare_batch",
    "expand",
    "init_weights",
    "kv_bytes_per_page",
    "kv_bytes_per_token",
    "materialize",
    "max_abs_diff",
    "merge_rank_outputs",
    "upload",
]
