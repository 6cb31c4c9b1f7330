"""Host planning, torch-free: batches, ownership, splits, remaps, the allocator and scheduler."""
