"""A sync's plan: the one function that decides what a sync does, which the preview shows and the
sync carries out, step by step, as each file is read.

Size, modification time and ETag decide which files are read again (``to_read``); the sha256 of
what was read decides whether a file changed; a file gone from the listing whose bytes show up
under a new path is a rename (its entry moves, nothing is embedded). Removals come only from a
complete listing, and ``hold_mass_removal`` holds them back when they look like a mistake.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.ops.sources.listing import Seen

ADD, CHANGE, TOUCH, RESTORE, RENAME = "add", "change", "touch", "restore", "rename"

Read = Callable[[str], tuple[bytes, Seen]]  # a file's bytes and how it was when read; OSError
CarryOut = Callable[["Step", bytes], "str | None"]  # None: done; else why it was refused


@dataclass(frozen=True)
class Known:
    path: str
    size: int
    mtime_ns: int
    sha256: str
    document_id: int | None = None
    removed: bool = False  # a tombstone
    etag: str = ""


@dataclass(frozen=True)
class Step:
    """What the sync does with one file it read: ``add``, ``change`` (a new version), ``touch``
    (a new time, the same bytes), ``restore`` (a tombstone back with its bytes) or ``rename``
    (its entry moves from ``old``)."""

    action: str
    path: str
    sha256: str
    seen: Seen  # the size, time and ETag the file had when read
    old: str = ""


@dataclass
class Plan:
    listed: int = 0
    live: int = 0  # the source's documents before the sync
    unchanged: int = 0  # listed and not read: size, time and ETag as recorded
    error: str | None = None  # the listing failed: what it holds is incomplete
    steps: list[Step] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # removals held back
    held_reason: str = ""
    failed: list[dict[str, str]] = field(default_factory=list)  # not read, or its step refused

    def _done(self, action: str) -> list[Step]:
        refused = {f["path"] for f in self.failed}
        return [s for s in self.steps if s.action == action and s.path not in refused]

    @property
    def add(self) -> list[str]:
        return [s.path for s in self._done(ADD)]

    @property
    def change(self) -> list[str]:
        return [s.path for s in self._done(CHANGE)]

    @property
    def touch(self) -> list[str]:
        return [s.path for s in self._done(TOUCH)]

    @property
    def restore(self) -> list[str]:
        return [s.path for s in self._done(RESTORE)]

    @property
    def rename(self) -> list[tuple[str, str]]:  # (old path, new path)
        return [(s.old, s.path) for s in self._done(RENAME)]

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
            "failed": len(self.failed),
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
    """The listed files whose bytes must be read: new ones, tombstoned ones, and those whose size,
    time or ETag moved."""
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
    """The live entries the listing no longer has."""
    return sorted(p for p, k in known.items() if not k.removed and p not in files)


def step_for(
    path: str, sha256: str, seen: Seen, known: Mapping[str, Known], gone_by_sha: dict
) -> Step:
    """The step of one read file; a rename takes its old path out of ``gone_by_sha`` (each gone
    file is renamed at most once)."""
    k = known.get(path)
    if k is not None and not k.removed:
        return Step(TOUCH if k.sha256 == sha256 else CHANGE, path, sha256, seen)
    olds = gone_by_sha.get(sha256)
    if olds:
        return Step(RENAME, path, sha256, seen, old=olds.pop(0))
    if k is not None and k.removed and k.sha256 == sha256:
        return Step(RESTORE, path, sha256, seen)
    return Step(ADD, path, sha256, seen)


def hold_mass_removal(plan: Plan, *, max_fraction: float, confirmed: bool) -> None:
    """Hold the plan's removals back (in place) when the listing failed, came back empty, or would
    remove more than ``max_fraction`` of the source's documents, unless confirmed: such a sync
    more likely saw a broken mount than an emptied share. A failed listing never removes anything:
    it does not say what is gone."""
    reason = ""
    if plan.error is not None:
        reason = f"the listing failed ({plan.error}); nothing is removed from an incomplete listing"
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
    elif reason and plan.error is not None:
        plan.held_reason = reason


def make_plan(
    files: Mapping[str, Seen],
    known: Mapping[str, Known],
    read: Read,
    *,
    error: str | None = None,
    max_fraction: float = 0.3,
    confirmed: bool = False,
    carry_out: CarryOut | None = None,
    into: Plan | None = None,
) -> Plan:
    """The plan of one sync, the same for its preview and for the sync itself.

    Each file of ``to_read`` is read (``read``; an OSError leaves it out, in ``failed``), hashed
    and planned, and its step handed to ``carry_out`` at once (the sync's writes; a refusal goes
    to ``failed``), so a sync holds one file's bytes at a time and one stopped halfway keeps what
    it did. The removals come last. ``into`` is filled in place (a sync stopped by an exception
    still reports what it did).
    """
    plan = into if into is not None else Plan()
    plan.listed, plan.error = len(files), error
    plan.live = sum(1 for k in known.values() if not k.removed)
    reading = to_read(files, known)
    plan.unchanged = len(files) - len(reading)
    missing = [] if error is not None else gone(files, known)
    by_sha: dict[str, list[str]] = {}
    for path in missing:
        by_sha.setdefault(known[path].sha256, []).append(path)
    for path in reading:
        try:
            data, seen = read(path)
        except OSError as exc:
            plan.failed.append({"path": path, "error": str(exc)})
            continue
        step = step_for(path, hashlib.sha256(data).hexdigest(), seen, known, by_sha)
        plan.steps.append(step)
        refused = carry_out(step, data) if carry_out is not None else None
        if refused is not None:
            plan.failed.append({"path": path, "error": refused})
    renamed = {s.old for s in plan.steps if s.action == RENAME}
    plan.remove = [p for p in missing if p not in renamed]
    hold_mass_removal(plan, max_fraction=max_fraction, confirmed=confirmed)
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
