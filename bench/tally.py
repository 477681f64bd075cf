"""What one job costs, step by step: every SQL statement (counted and timed through SQLAlchemy's
``before_cursor_execute`` / ``after_cursor_execute`` events, and each commit), every call to Chroma
and to the embedding cache, attributed to the step of the pipeline that made it.

A statement's step is the outermost ``sluice.storage`` function on the stack (``claim``,
``progress``, ``succeed``, ``write_job``...), else the innermost ``sluice.pipeline`` one (``_load``,
``fence``...). Times are wall milliseconds in this process (for SQLite, which runs in the process,
nearly all CPU; on a busy machine they include waiting for a core).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from sqlalchemy import event


def step() -> str:
    """The pipeline step the current call belongs to (see the module's docstring)."""
    frame: FrameType | None = sys._getframe(2)
    storage = pipeline = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("sluice.storage.") and module not in (
            "sluice.storage.db",
            "sluice.storage.clock",
            "sluice.storage.vectors",
            "sluice.storage.cache",
        ):
            storage = frame.f_code.co_name
        elif pipeline is None and module.startswith("sluice.pipeline."):
            pipeline = frame.f_code.co_name
        frame = frame.f_back
    return storage or pipeline or "other"


def kind(statement: str) -> str:
    """``SELECT job``, ``UPDATE job``, ``INSERT job_event``...: the verb and its first table."""
    words = statement.replace("\n", " ").replace('"', "").split()
    if not words:
        return "?"
    verb = words[0].upper()
    after = {"SELECT": "FROM", "DELETE": "FROM", "INSERT": "INTO", "UPDATE": None}.get(verb)
    if verb == "UPDATE" and len(words) > 1:
        return f"UPDATE {words[1]}"
    if after:
        upper = [w.upper() for w in words]
        if after in upper:
            i = upper.index(after)
            if i + 1 < len(words):
                table = words[i + 1].strip("(")
                if table.upper() == "(SELECT" or not table:
                    table = "(subquery)"
                return f"{verb} {table}"
    return verb


class Tally:
    """Counts and times by (step, kind); thread-safe."""

    def __init__(self) -> None:
        self.count: Counter[tuple[str, str]] = Counter()
        self.ms: defaultdict[tuple[str, str], float] = defaultdict(float)
        self._lock = threading.Lock()
        self._started = threading.local()

    def add(self, key: tuple[str, str], ms: float) -> None:
        with self._lock:
            self.count[key] += 1
            self.ms[key] += ms

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"step": s, "kind": k, "count": n, "ms": round(self.ms[(s, k)], 3)}
            for (s, k), n in sorted(self.count.items())
        ]


@contextmanager
def counting(ctx) -> Iterator[tuple[Tally, Tally]]:
    """(SQL, calls): every statement and commit of ``ctx.engine``, every call ``ctx.vectors`` and
    ``ctx.cache`` make, while the block runs."""
    sql, calls = Tally(), Tally()
    engine = ctx.engine
    local = threading.local()

    def before(conn, cursor, statement, parameters, context, executemany):
        local.t0 = time.perf_counter()
        local.key = (step(), kind(statement))

    def after(conn, cursor, statement, parameters, context, executemany):
        sql.add(local.key, 1000 * (time.perf_counter() - local.t0))

    def commit(conn):
        sql.add((step(), "COMMIT"), 0.0)

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    event.listen(engine, "commit", commit)
    patched: list[tuple[Any, str]] = []

    def wrap(owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)

        def timed(*args, **kwargs):
            key = (step(), label)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                calls.add(key, 1000 * (time.perf_counter() - t0))

        setattr(owner, name, timed)
        patched.append((owner, name))

    for name in ("add", "ids_where", "get", "delete", "query"):
        wrap(ctx.vectors, name, f"Chroma {name}")
    for name in ("get_many", "put_many"):
        wrap(ctx.cache, name, f"cache {name}")
    try:
        yield sql, calls
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
        event.remove(engine, "commit", commit)
        for owner, name in patched:
            delattr(owner, name)  # the class's method again
