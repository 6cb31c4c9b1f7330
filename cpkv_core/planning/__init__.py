"""Host planning, torch-free: the scheduler (entry point ``Scheduler``) and the host plan.

Batches, chunk and prefix rules, page ownership, the allocator, splits (per token as the
oracle, per segment in numpy) and their per-rank balance, remaps and ``build_host_plan``:
integer math on the host, O(pages + requests) per batch.
"""

from cpkv_core.planning.allocator import OutOfPagesError, PageAllocator, PageTable
from cpkv_core.planning.balance import (
    PAGE_INTERLEAVE_MAX_IMBALANCE,
    RankLoad,
    owner_load,
    page_interleave_fits,
    split_load,
)
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.execution import (
    DecisionPoint,
    ExecutionPlan,
    KvLayout,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    SplitStrategy,
)
from cpkv_core.planning.host_plan import AttendedRequest, HostPlan, KeySource, build_host_plan
from cpkv_core.planning.ownership import local_page, owner_of_loc, owner_of_page, physical_loc
from cpkv_core.planning.remap import ViewPlan, slot_view_plan, unique_view_plan
from cpkv_core.planning.scheduler import (
    NO_OWNER,
    OwnerPolicy,
    ScheduledBatch,
    ScheduledRequest,
    ScheduleError,
    Scheduler,
    SchedulerState,
    pages_for_trace,
)
from cpkv_core.planning.split_page_aligned import (
    compute_owner_of_pages,
    is_short_page_count,
    request_pages,
)
from cpkv_core.planning.tokens import rid_key, token_ids

__all__ = [
    "NO_OWNER",
    "PAGE_INTERLEAVE_MAX_IMBALANCE",
    "AttendedRequest",
    "BatchSpec",
    "DecisionPoint",
    "ExecutionPlan",
    "HostPlan",
    "KeySource",
    "KvLayout",
    "KvReadStrategy",
    "KvWriteStrategy",
    "OutOfPagesError",
    "OutputStrategy",
    "OwnerPolicy",
    "PageAllocator",
    "PageTable",
    "RankLoad",
    "RequestSpec",
    "ScheduleError",
    "ScheduledBatch",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerState",
    "SplitStrategy",
    "ViewPlan",
    "build_host_plan",
    "compute_owner_of_pages",
    "is_short_page_count",
    "local_page",
    "owner_load",
    "owner_of_loc",
    "owner_of_page",
    "page_interleave_fits",
    "pages_for_trace",
    "physical_loc",
    "request_pages",
    "rid_key",
    "slot_view_plan",
    "split_load",
    "token_ids",
    "unique_view_plan",
]
