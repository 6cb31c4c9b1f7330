"""The trace format: JSON Lines, one prefill batch a line; parse, validate, load."""
