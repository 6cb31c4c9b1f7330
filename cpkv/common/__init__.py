"""Shared by every layer of the app: the consoles and bad-input handling, the run device,
command help, and the settings a run resolves from the flags."""
