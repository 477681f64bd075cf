"""A sync's plan, as a pure function of a listing, the source's known entries and the sha256 of
the files read: additions, changes, renames, touches (new time, same bytes), restores (a
tombstoned file back with its bytes), removals, and the guard that holds removals back.

Size and modification time decide which files are read again (``to_read``); the sha256 decides
whether anything changed; a file gone from the listing whose bytes show up under a new path is a
rename, and moves its entry (nothing is embedded). Removals come only from a complete listing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.ops.sources.listing import Seen


@dataclass(frozen=True)
class Known:
    path: str
    size: int
    mtime_ns: int
    sha256: str
    document_id: int | None = None
    removed: bool = False  # a tombstone
    etag: str = ""


@dataclass
class Plan:
    listed: int = 0
    add: list[str] = field(default_factory=list)
    change: list[str] = field(default_factory=list)
    rename: list[tuple[str, str]] = field(default_factory=list)  # (old path, new path)
    touch: list[str] = field(default_factory=list)
    restore: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # removals the guard held back
    held_reason: str = ""
    unchanged: int = 0
    live: int = 0  # the source's documents before the sync

    def counts(self) -> dict[str, int]:
        return {
            "listed": self.listed,
            "added": len(self.add),
            "changed": len(self.change),
            "renamed": len(self.rename),
            "restored": len(self.restore),
            "touched": len(self.touch),
            "removed": len(self.remove),
            "held": len(self.held),
            "unchanged": self.unchanged,
        }

    def describe(self) -> str:
        text = (
            f"{self.listed} file(s) listed: {len(self.add)} to add, {len(self.change)} changed, "
            f"{len(self.rename)} renamed (nothing to embed), {len(self.remove)} to remove, "
            f"{self.unchanged + len(self.touch)} unchanged"
        )
        if self.restore:
            text += f", {len(self.restore)} back from the tombstones"
        if self.held:
            text += f"; {len(self.held)} removal(s) held: {self.held_reason}"
        return text


def to_read(files: Mapping[str, Seen], known: Mapping[str, Known]) -> list[str]:
    """The listed files whose bytes must be read: new ones, and those whose size, time or ETag
    moved."""
    out = []
    for path, seen in files.items():
        k = known.get(path)
        if (
            k is None
            or k.removed
            or (k.size, k.mtime_ns, k.etag) != (seen.size, seen.mtime_ns, seen.etag)
        ):
            out.append(path)
    return sorted(out)


def gone(files: Mapping[str, Seen], known: Mapping[str, Known]) -> list[str]:
    return sorted(p for p, k in known.items() if not k.removed and p not in files)


def classify(path: str, sha256: str, known: Mapping[str, Known], gone_by_sha: dict) -> str:
    """What one read file is: "touch", "change", "restore", "add" or "rename:<old path>". A
    rename takes its old path out of ``gone_by_sha`` (each gone file is renamed at most once)."""
    k = known.get(path)
    if k is not None and not k.removed:
        return "touch" if k.sha256 == sha256 else "change"
    olds = gone_by_sha.get(sha256)
    if olds:
        return "rename:" + olds.pop(0)
    if k is not None and k.removed and k.sha256 == sha256:
        return "restore"
    return "add"


def guard(plan: Plan, *, error: str | None, max_fraction: float, confirmed: bool) -> None:
    """Hold the plan's removals back (in place) when the listing failed, came back empty, or
    would remove more than ``max_fraction`` of the source's documents, unless confirmed. A failed
    listing never removes anything: it does not say what is gone."""
    reason = ""
    if error is not None:
        reason = f"the listing failed ({error}); nothing is removed from an incomplete listing"
    elif not confirmed and plan.remove and plan.listed == 0:
        reason = "the listing came back empty; confirm (--yes) if the source really is empty now"
    elif not confirmed and len(plan.remove) > max_fraction * plan.live:
        reason = (
            f"it would remove {len(plan.remove)} of the source's {plan.live} document(s), more "
            f"than {max_fraction:.0%} (SLUICE_SYNC_MAX_REMOVE_FRACTION); confirm (--yes) to "
            "remove them"
        )
    if reason and plan.remove:
        plan.held, plan.remove, plan.held_reason = plan.remove, [], reason
    elif reason and error is not None:
        plan.held_reason = reason


def make_plan(
    files: Mapping[str, Seen],
    known: Mapping[str, Known],
    hashes: Mapping[str, str],
    *,
    error: str | None = None,
    max_fraction: float = 0.3,
    confirmed: bool = False,
) -> Plan:
    """The whole plan at once (the preview, the tests): ``hashes`` has the sha256 of every path
    of ``to_read``; a path missing from it (it could not be read) is left out."""
    plan = Plan(listed=len(files), live=sum(1 for k in known.values() if not k.removed))
    reading = to_read(files, known)
    plan.unchanged = len(files) - len(reading)
    missing = [] if error is not None else gone(files, known)
    by_sha: dict[str, list[str]] = {}
    for path in missing:
        by_sha.setdefault(known[path].sha256, []).append(path)
    for path in reading:
        if path not in hashes:
            continue
        what = classify(path, hashes[path], known, by_sha)
        if what.startswith("rename:"):
            plan.rename.append((what[len("rename:") :], path))
        else:
            getattr(plan, what).append(path)
    renamed = {old for old, _ in plan.rename}
    plan.remove = [p for p in missing if p not in renamed]
    guard(plan, error=error, max_fraction=max_fraction, confirmed=confirmed)
    return plan


@dataclass
class SyncResult:
    source: str
    ran: bool
    preview: bool = False
    status: str = ""
    run_id: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    failed: list[dict[str, str]] = field(default_factory=list)
    held_reason: str = ""
    cost: str = ""
    to_embed: int = 0
    message: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
