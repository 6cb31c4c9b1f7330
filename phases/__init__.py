"""Phases, the "when" layer: per-phase contracts and the runtime gate (none registered yet)."""

__all__: list[str] = []
