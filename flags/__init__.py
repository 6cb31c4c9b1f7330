"""Flags, the "whether" layer: the typed flag set and where its values come from (to come)."""

__all__: list[str] = []
