"""The migration of an SGLang 0.5.23 launch command to cpkv's levels, step by step; entry
point :func:`~cpkv.migrate.rollout.plan_migration`, document
:func:`~cpkv.migrate.document.migration_json`."""

from cpkv.migrate.capacity import DEFAULT_GPU_MEM_GIB
from cpkv.migrate.document import migration_json, refusal_json
from cpkv.migrate.rollout import MigrateOptions, Migration, Refusal, plan_migration

__all__ = [
    "DEFAULT_GPU_MEM_GIB",
    "MigrateOptions",
    "Migration",
    "Refusal",
    "migration_json",
    "plan_migration",
    "refusal_json",
]
