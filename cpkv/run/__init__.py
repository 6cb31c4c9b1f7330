"""What the commands run: the host loop, the rank runner and its launchers, and the verify,
PD, dry-run, explain and fuzz runs with their reports."""
