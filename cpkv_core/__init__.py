"""cpkv_core, the "how": CP prefill mechanics free of flags and phases; entry point ``CPEngine``."""

from cpkv_core.config import (
    MODEL_PRESETS,
    CpMode,
    DeploymentConfig,
    IndexKDtype,
    ModelConfig,
    model_preset,
)
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.execution import (
    ExecutionPlan,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    SplitStrategy,
)
from cpkv_core.runtime.engine import CPEngine
from cpkv_core.runtime.outputs import (
    BatchOutput,
    RankBatchOutput,
    compare_batch,
    merge_rank_outputs,
)
from cpkv_core.runtime.reference import ReferenceModel
from cpkv_core.traces.trace import Trace, TraceError, load_trace, parse_trace_text

__all__ = [
    "MODEL_PRESETS",
    "BatchOutput",
    "BatchSpec",
    "CPEngine",
    "CpMode",
    "DeploymentConfig",
    "ExecutionPlan",
    "IndexKDtype",
    "KvReadStrategy",
    "KvWriteStrategy",
    "ModelConfig",
    "OutputStrategy",
    "RankBatchOutput",
    "ReferenceModel",
    "RequestSpec",
    "SplitStrategy",
    "Trace",
    "TraceError",
    "compare_batch",
    "load_trace",
    "merge_rank_outputs",
    "model_preset",
    "parse_trace_text",
]
