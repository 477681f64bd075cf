"""The fault points live in storage (the lowest floor that has points); pipeline code imports them here."""

from sluice.storage.faults import hit, hook

__all__ = ["hit", "hook"]
