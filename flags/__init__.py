"""Flags, the "whether" layer: the typed flag set and its sources; entry point ``resolve_flags``."""

from flags.checks import Problem, ProblemCode, check_flags
from flags.config_file import (
    Action,
    ConfigChange,
    apply_change,
    disable,
    enable,
    plan_change,
    write_atomic,
)
from flags.model import (
    FLAG_SPECS,
    PHASE_FIELDS,
    PHASE_FLAGS,
    FlagError,
    FlagSet,
    FlagSpec,
    debug_benchmark_warning,
)
from flags.sglang.args import SglangImport, from_sglang, read_sglang
from flags.sglang.batch import batch_from_forward_batch
from flags.sglang.parser import SglangArgError
from flags.sglang.table import SGLANG_VERSION
from flags.sources import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    ConfigLocation,
    ResolvedFlags,
    locate_config,
    parse_config_text,
    parse_set_option,
    read_config,
    resolve_flags,
)

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "FLAG_SPECS",
    "PHASE_FIELDS",
    "PHASE_FLAGS",
    "SGLANG_VERSION",
    "Action",
    "ConfigChange",
    "ConfigLocation",
    "FlagError",
    "FlagSet",
    "FlagSpec",
    "Problem",
    "ProblemCode",
    "ResolvedFlags",
    "SglangArgError",
    "SglangImport",
    "apply_change",
    "batch_from_forward_batch",
    "check_flags",
    "debug_benchmark_warning",
    "disable",
    "enable",
    "from_sglang",
    "locate_config",
    "parse_config_text",
    "parse_set_option",
    "plan_change",
    "read_config",
    "read_sglang",
    "resolve_flags",
    "write_atomic",
]
