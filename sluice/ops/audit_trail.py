"""Recording who changed what (sluice.storage.audit_log), in the transaction of the change.

An action runs inside ``recording(who, action, ...)``. While it runs, a session listener watches
every flush, statement and commit of this thread (or task) for the mark of the change: a job event
of the action's kinds by this actor, as its INSERT is executed (one row per job, or one per
action), a new row of a model (a key, a pause), or a ``check`` that is true before a commit (an
UPDATE or DELETE the session cannot see).
Where it sees the mark it adds the audit row to that very session, so the row commits with the
change or rolls back with it; the storage functions that make the change need not know. What the
action then says it refused (or did without changing anything) gets its row in a transaction of
its own, by ``settle``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState
from sqlalchemy.orm import Session as OrmSession
from sqlmodel import Session, col, select

from sluice import faults
from sluice.errors import OperationError
from sluice.ops.access import Operator
from sluice.ops.reads import ctx
from sluice.storage import audit_log
from sluice.storage.audit_log import AuditEntry
from sluice.storage.clock import as_utc, db_now
from sluice.storage.jobs.event_log import INSERT_EVENT
from sluice.storage.models import MAX_ID, Dataset, Job, JobEvent

log = logging.getLogger(__name__)

PAGE = 50
MAX_PAGE = 500
SINCE = re.compile(r"^(\d{1,6})\s*([smhdw])$")
OWN = "sluice_audit_own_row"
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
FLOOD_SPAN = timedelta(minutes=1)  # refused API tokens: one row per token and address this often
_flood_lock = threading.Lock()  # the API's threads count a flood's refusals one at a time
_floods_lock = threading.Lock()  # the counts of this process not yet written (``_floods``)
FLOOD_FLUSH_SECONDS = 1.0  # a flood's refusals reach its row at most this much later


class BadAuditQuery(OperationError):
    """A filter of the audit log that cannot be read (a ``since`` that is no time)."""

    code, status = "invalid_request", 422
    hint = "since is a span back (2h, 30m, 7d) or an ISO time; outcome is done or refused."


@dataclass
class Watch:
    """One action being recorded: what it is, and how its change is recognised."""

    who: Operator
    action: str
    target_kind: str = ""
    target_id: str | int | None = None
    dataset: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    kinds: frozenset[str] = frozenset()  # job events that mark the change
    model: type | None = None  # a new row of this class marks it
    check: Callable[[Session], bool] | None = None  # true before a commit that made the change
    per_job: bool = False  # one row per job (retry of three jobs: three rows)
    # The action's name from what the change made (an upload that is a new version: a replace).
    refine: Callable[[OrmSession, Job], str] | None = None
    done: set[str] = field(default_factory=set)  # targets whose row committed
    pending: dict[int, set[str]] = field(default_factory=dict)  # session id -> rows not committed

    @property
    def recorded(self) -> bool:
        return bool(self.done) or any(self.pending.values())

    def row(self, target: str | int | None = None, dataset: str | None = None, **kw: Any):
        who = self.who
        return audit_log.entry(
            actor_kind=who.channel,
            actor_name=who.name,
            actor_key=who.key or None,
            address=who.address or None,
            action=kw.pop("action", self.action),
            target_kind=kw.pop("target_kind", self.target_kind),
            target_id=self.target_id if target is None else target,
            dataset=dataset or self.dataset,
            params=kw.pop("params", self.params),
            **kw,
        )

    def write(self, target: str | int | None = None, **kw: Any) -> None:
        """A row of its own (a refusal, or an action that had nothing to change)."""
        with Session(ctx().engine) as session:
            session.info[OWN] = True  # not a change of the action: the listener leaves it alone
            audit_log.write(session=session, row=self.row(target, **kw))
        self.done.add(str(target if target is not None else self.target_id))

    def settle(self, ok: bool, reason: str = "", *, code: str | None = None, **kw: Any) -> None:
        """After the action: its row, if the change did not already write one."""
        if self.recorded:
            return
        if ok:
            self.write(reason=reason, **kw)
        else:
            self.write(outcome="refused", reason=reason, code=code or "refused", **kw)

    def settle_jobs(self, results: Iterable[Any]) -> None:
        """After a per-job action: a row for each job the change did not record (refused ones)."""
        for r in results:
            if str(r.job_id) in self.done:
                continue
            outcome = "done" if r.ok else "refused"
            self.write(
                r.job_id or None,
                outcome=outcome,
                reason=r.message,
                code=None if r.ok else "refused",
            )


_current: ContextVar[Watch | None] = ContextVar("sluice_audit_watch", default=None)


@contextmanager
def recording(who: Operator, action: str, **kw: Any) -> Iterator[Watch]:
    """Record ``action`` by ``who`` while the block runs (see the module's docstring)."""
    watch = Watch(who, action, **kw)
    token = _current.set(watch)
    try:
        yield watch
    finally:
        _current.reset(token)


def add_row(
    session: Session,
    who: Operator,
    action: str,
    *,
    target_kind: str = "",
    target_id: str | int | None = None,
    dataset: str | None = None,
    params: dict[str, Any] | None = None,
    **kw: Any,
) -> None:
    """The row of a change made in steps of its own (a source's sync, remove, undo or purge),
    added to ``session``, the transaction of the step that settles it, to commit with it.
    ``kw``: ``outcome``, ``code``, ``reason``."""
    watch = Watch(
        who,
        action,
        target_kind=target_kind,
        target_id=target_id,
        dataset=dataset,
        params=params or {},
    )
    session.add(watch.row(**kw))


def refused(who: Operator, action: str, reason: str, **kw: Any) -> None:
    """Record a refusal (a read-only operator, a bad password, a dead key) at once."""
    code = kw.pop("code", "refused")
    Watch(who, action, **kw).write(outcome="refused", reason=reason, code=code)


@dataclass
class _Flood:
    """The refusals of one (action, key, address) that this process counts before their row does."""

    written: float  # time.monotonic() of this process's last write of the row
    pending: int = 0  # refusals since, counted here only
    latest: tuple[timedelta, Operator, str, dict[str, Any]] | None = None
    engine: Any = None  # the job database they were counted for
    span: timedelta = FLOOD_SPAN  # remembered this long after its last write


FloodKey = tuple[str, str | None, str | None]  # action, API key lookup id (or none), address
# Bounds of what this process remembers of floods, so that no flood can grow it: an address has
# at most FLOOD_KEYS_PER_ADDRESS floods of its own tokens; the refusals of its further tokens
# share one flood (and one row) under the lookup id MANY_KEYS; and at most FLOOD_MAP_SIZE floods
# are remembered in all: the oldest is written (what it counted) and forgotten for a new one.
FLOOD_KEYS_PER_ADDRESS = 4
FLOOD_MAP_SIZE = 4096
MANY_KEYS = "*"
_floods: OrderedDict[FloodKey, _Flood] = OrderedDict()  # oldest first
_per_address: Counter[tuple[str, str | None]] = Counter()  # (action, address) -> floods held
_flusher: list[threading.Thread] = []

_Due = tuple[str, int, tuple[timedelta, Operator, str, dict[str, Any]], Any]


def _forget(key: FloodKey) -> _Flood | None:  # under _floods_lock
    flood = _floods.pop(key, None)
    if flood is not None:
        place = (key[0], key[2])
        _per_address[place] -= 1
        if _per_address[place] <= 0:
            del _per_address[place]
    return flood


def _remember(key: FloodKey, flood: _Flood) -> list[_Due]:  # under _floods_lock
    """Put ``flood`` in the map as the newest; what the floods it pushed out still counted."""
    due: list[_Due] = []
    if key not in _floods:
        while len(_floods) >= FLOOD_MAP_SIZE:
            old_key = next(iter(_floods))
            old = _forget(old_key)
            if old is not None and old.pending and old.latest is not None:
                due.append((old_key[0], old.pending, old.latest, old.engine))
        _per_address[(key[0], key[2])] += 1
    _floods[key] = flood
    _floods.move_to_end(key)
    return due


def _write_due(due: Iterable[_Due]) -> None:
    for action, pending, (span, who, reason, kw), engine in due:
        _write_refusals(engine, span, who, action, reason, pending, **kw)


def flood_count() -> int:
    """How many floods this process remembers now (at most FLOOD_MAP_SIZE)."""
    with _floods_lock:
        return len(_floods)


def refused_once_per(span: timedelta, who: Operator, action: str, reason: str, **kw: Any) -> None:
    """A refusal that can come in a flood (a bad token, hammered): at most one row per (action,
    API key lookup id or none, address) in ``span`` of the database's clock from that row's time;
    the refusals after it in the span only count, in the row's ``params["repeats"]`` and reason.
    Beyond FLOOD_KEYS_PER_ADDRESS lookup ids from one address, the refusals of every further one
    count in one row of that address (lookup id ``*``): varying the token buys no rows.

    A flood costs the job database one write a second, not one per refusal: the refusals that
    follow a write within ``FLOOD_FLUSH_SECONDS`` are counted in this process and written
    together by a background thread (``flush_refusals`` writes them at once)."""
    engine = ctx().engine
    address = (who.address or None) and who.address[:64]
    key: FloodKey = (action, who.key or None, address)
    now = time.monotonic()
    with _floods_lock:
        flood = _floods.get(key)
        if flood is None and _per_address[(action, address)] >= FLOOD_KEYS_PER_ADDRESS:
            key = (action, MANY_KEYS, address)  # one more token of a busy address: the shared row
            who = replace(who, name="many keys", key=MANY_KEYS)
            reason = "tokens of many keys from one address"
            kw = {**kw, "target_id": "many keys"}
            flood = _floods.get(key)
        if (
            flood is not None
            and flood.engine is engine
            and now - flood.written < FLOOD_FLUSH_SECONDS
        ):
            flood.pending += 1
            flood.latest = (span, who, reason, kw)
            _floods.move_to_end(key)
            _start_flusher()
            return
        # what was counted for another job database (a test's process moved on) is not this one's
        earlier = flood.pending if flood is not None and flood.engine is engine else 0
        due = _remember(key, _Flood(written=now, engine=engine, span=span))
    _write_due(due)
    _write_refusals(engine, span, who, action, reason, 1 + earlier, **kw)


def flush_refusals() -> int:
    """Write every refusal counted and not yet written, and forget the floods (the next refusal
    of each is written at once). Returns how many were written."""
    with _floods_lock:
        due = [(key[0], f.pending, f.latest, f.engine) for key, f in _floods.items() if f.pending]
        _floods.clear()
        _per_address.clear()
    _write_due((a, p, latest, e) for a, p, latest, e in due if latest is not None)
    return sum(pending for _, pending, _, _ in due)


def _flush_due() -> None:
    """The background thread's round: the floods whose count waited a flush interval are written;
    floods quiet for their span are forgotten (until then they hold their address's place)."""
    now = time.monotonic()
    due: list[_Due] = []
    with _floods_lock:
        for key, flood in list(_floods.items()):
            if now - flood.written < FLOOD_FLUSH_SECONDS:
                continue
            if flood.pending and flood.latest is not None:
                due.append((key[0], flood.pending, flood.latest, flood.engine))
                _floods[key] = _Flood(written=now, engine=flood.engine, span=flood.span)
            elif now - flood.written >= flood.span.total_seconds():
                _forget(key)
    _write_due(due)


def _start_flusher() -> None:  # under _floods_lock
    if _flusher and _flusher[0].is_alive():
        return

    def run() -> None:
        while True:
            time.sleep(FLOOD_FLUSH_SECONDS)
            try:
                _flush_due()
            except Exception:  # the job database hiccuped: the counts wait for the next round
                log.exception("could not write the count of refused API calls")

    _flusher[:] = [threading.Thread(target=run, name="sluice-refusals", daemon=True)]
    _flusher[0].start()


def _write_refusals(
    engine: Any, span: timedelta, who: Operator, action: str, reason: str, count: int, **kw: Any
) -> None:
    """``count`` refusals into the row of their flood in ``engine``'s job database: a new row if
    none is within ``span`` (the first of them; the rest its repeats), else that row's repeats."""
    code = kw.pop("code", "refused")
    with _flood_lock, Session(engine) as session:
        session.info[OWN] = True
        row = session.exec(
            select(AuditEntry)
            .where(
                col(AuditEntry.action) == action,
                col(AuditEntry.outcome) == "refused",
                _same(col(AuditEntry.actor_key), who.key or None),
                _same(col(AuditEntry.address), (who.address or None) and who.address[:64]),
                col(AuditEntry.at) >= db_now(session) - span,
            )
            .order_by(col(AuditEntry.id).desc())
            .limit(1)
            .with_for_update()  # PostgreSQL: two API processes count one after the other
        ).first()
        if row is None:  # the first of them makes the row
            row = Watch(who, action, **kw).row(outcome="refused", reason=reason, code=code)
            count -= 1
        if count:
            repeats = int((row.params or {}).get("repeats", 0)) + count
            row.params = {**(row.params or {}), "repeats": repeats}
            # the count where the operator reads (the audit table's outcome), not only in params
            more = f"{reason} (and {repeats} more within {span.total_seconds():.0f} s)"
            row.reason = audit_log.scrub(more)[: audit_log.MAX_TEXT]
        audit_log.write(session=session, row=row)


def _same(column: Any, value: str | None) -> Any:
    return column.is_(None) if value is None else column == value


# --- the listener ---------------------------------------------------------------------------------


def _add(
    session: OrmSession,
    watch: Watch,
    target: str | int | None,
    dataset: str | None,
    action: str | None = None,
) -> None:
    session.add(watch.row(target, dataset, action=action or watch.action))
    watch.pending.setdefault(id(session), set()).add(str(target))
    # The change and its row are in the session, not yet committed: a fault here rolls both back.
    faults.hit("audit_recorded", action=watch.action, target=target)


Mark = tuple[str | int | None, str | None, str | None]  # target, dataset, action
Logged = tuple[int, str, str]  # a job event: its job id, kind and actor


def _job_marks(session: OrmSession, watch: Watch, events: Iterable[Logged]) -> list[Mark]:
    marks: list[Mark] = []
    for job_id, kind, actor in events:
        if kind not in watch.kinds or actor != watch.who.actor:
            continue
        with session.no_autoflush:
            job = session.get(Job, job_id)
            ds = session.get(Dataset, job.dataset_id) if job is not None else None
        name = ds.name if ds is not None else None
        with session.no_autoflush:
            action = watch.refine(session, job) if watch.refine and job is not None else None
        if watch.per_job:
            marks.append((job_id, name, action))
        else:
            target = watch.target_id
            if target is None and watch.target_kind == "document" and job is not None:
                target = job.document_id
            marks.append((target, name, action))
    return marks


def _watching(session: OrmSession) -> Watch | None:
    """The action being recorded, if this session's changes may still mark it."""
    watch = _current.get()
    if watch is None or session.info.get(OWN) or (watch.recorded and not watch.per_job):
        return None
    return watch


def _mark_jobs(session: OrmSession, watch: Watch, events: Iterable[Logged]) -> bool:
    """The audit rows of the job events ``events`` that mark ``watch``'s change; True when the
    action's one row (not one per job) was added."""
    seen = watch.done | watch.pending.get(id(session), set())
    for target, name, action in _job_marks(session, watch, events):
        if str(target) not in seen:
            _add(session, watch, target, name, action)
            seen.add(str(target))
            if not watch.per_job:
                return True
    return False


@event.listens_for(OrmSession, "do_orm_execute")
def _on_execute(state: ORMExecuteState) -> None:
    """A job event's INSERT (``sluice.storage.jobs.event_log``): the audit row goes into the same
    transaction, before the event itself."""
    if state.statement is not INSERT_EVENT:
        return
    watch = _watching(state.session)
    if watch is None or not watch.kinds:
        return
    p = state.parameters
    if not isinstance(p, dict):  # an event is written one at a time, with its own parameters
        return
    _mark_jobs(state.session, watch, [(p["job_id"], p["kind"], p["actor"])])


@event.listens_for(OrmSession, "before_flush")
def _before_flush(session: OrmSession, _context: Any, _instances: Any) -> None:
    watch = _watching(session)
    if watch is None:
        return
    if watch.kinds:
        added = [o for o in session.new if isinstance(o, JobEvent)]  # any written as objects
        if _mark_jobs(session, watch, [(e.job_id, e.kind, e.actor) for e in added]):
            return
    if watch.model is not None and any(isinstance(o, watch.model) for o in session.new):
        _add(session, watch, watch.target_id, None)


@event.listens_for(OrmSession, "before_commit")
def _before_commit(session: OrmSession) -> None:
    watch = _current.get()
    if watch is None or session.info.get(OWN) or watch.check is None or watch.recorded:
        return
    if watch.check(session):  # type: ignore[arg-type]
        _add(session, watch, watch.target_id, None)


@event.listens_for(OrmSession, "after_commit")
def _after_commit(session: OrmSession) -> None:
    watch = _current.get()
    if watch is not None:
        watch.done |= watch.pending.pop(id(session), set())


@event.listens_for(OrmSession, "after_rollback")
def _after_rollback(session: OrmSession) -> None:
    watch = _current.get()
    if watch is not None:
        watch.pending.pop(id(session), None)


# --- reading the log ------------------------------------------------------------------------------


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """``2h``, ``30m``, ``7d`` (ago) or an ISO time; None or "" for no limit."""
    text = (text or "").strip()
    if not text:
        return None
    found = SINCE.match(text.lower())
    try:
        if found:
            ago = timedelta(**{UNITS[found.group(2)]: int(found.group(1))})
            return (now or datetime.now(UTC)) - ago
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except (ValueError, OverflowError):
        raise BadAuditQuery(
            f"since {text!r}: write a span like 2h, 30m or 7d, or an ISO time like 2026-01-31T12:00"
        ) from None


def as_dict(row: audit_log.AuditEntry) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": as_utc(row.at).isoformat(),
        "actor_kind": row.actor_kind,
        "actor_name": row.actor_name,
        "actor_key": row.actor_key,
        "address": row.address,
        "action": row.action,
        "target_kind": row.target_kind,
        "target_id": row.target_id,
        "dataset": row.dataset,
        "params": row.params or {},
        "outcome": row.outcome,
        "code": row.code,
        "reason": row.reason,
    }


def rows(
    *,
    since: str | datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    dataset: str | None = None,
    outcome: str | None = None,
    before_id: int | None = None,
    limit: int = PAGE,
) -> list[dict[str, Any]]:
    """Audit rows newest first (anyone who may read the console may read them)."""
    if outcome and outcome not in audit_log.OUTCOMES:
        raise BadAuditQuery(f"outcome {outcome!r}: one of {', '.join(audit_log.OUTCOMES)}")
    start = since if isinstance(since, datetime) else parse_since(since)
    with Session(ctx().engine) as session:
        found = audit_log.entries(
            session=session,
            since=start,
            actor=actor or None,
            action=action or None,
            dataset=dataset or None,
            outcome=outcome or None,
            before_id=None if before_id is None else min(before_id, MAX_ID),
            limit=max(1, min(limit, MAX_PAGE)),
        )
        return [as_dict(r) for r in found]
