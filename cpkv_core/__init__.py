"""cpkv_core, the "how": CP prefill mechanics free of flags and phases.

Entry points: ``planning.Scheduler`` (host: one ``ScheduledBatch`` per batch) and
``runtime.CPEngine`` (device: one rank's run of it). Sub-packages: ``planning`` (host,
torch-free), ``runtime`` (the run step), ``dist`` (communication), ``pd`` (prefill to
decode transfer), ``traces`` (the trace format).
"""

from cpkv_core.config import (
    MODEL_PRESETS,
    CpMode,
    DeploymentConfig,
    IndexKDtype,
    ModelConfig,
    model_preset,
)
from cpkv_core.planning import BatchSpec, ExecutionPlan, RequestSpec, ScheduledBatch, Scheduler
from cpkv_core.runtime import CPEngine, ReferenceModel
from cpkv_core.traces import Trace, TraceError, load_trace, parse_trace_text

__all__ = [
    "MODEL_PRESETS",
    "BatchSpec",
    "CPEngine",
    "CpMode",
    "DeploymentConfig",
    "ExecutionPlan",
    "IndexKDtype",
    "ModelConfig",
    "ReferenceModel",
    "RequestSpec",
    "ScheduledBatch",
    "Scheduler",
    "Trace",
    "TraceError",
    "load_trace",
    "model_preset",
    "parse_trace_text",
]
