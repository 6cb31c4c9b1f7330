"""The capacity planner of ``cpkv plan``: weights, memory budget and KV capacity per rank;
entry point ``capacity.plan_capacity``. Pure integer arithmetic, no torch."""
