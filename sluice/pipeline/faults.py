"""Fault injection for crash and outage tests, driven by the SLUICE_FAULTS environment variable.

Unset (always, in production) it does nothing. Set, it is a comma-separated list of
``point=action`` where action is ``exit`` (the process dies at once, like kill -9), ``sleep:S``,
or ``transient`` / ``permanent`` (raise that error class). A point may carry a count after ``@``:
``embed_batch@3=exit`` fires at the third time the point is reached in this process.

Points: ``after_claim``, ``after_parse``, ``embed_batch``, ``after_index`` (vectors written, job
not yet marked succeeded).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

_counts: Counter[str] = Counter()
_lock = threading.Lock()


def _rules() -> dict[str, str]:
    spec = os.environ.get("SLUICE_FAULTS", "").strip()
    rules = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        point, _, action = item.partition("=")
        rules[point.strip()] = action.strip()
    return rules


def hit(point: str) -> None:
    rules = _rules()
    if not rules:
        return
    with _lock:
        _counts[point] += 1
        n = _counts[point]
    action = rules.get(f"{point}@{n}") or rules.get(point)
    if not action:
        return
    if action == "exit":
        os._exit(137)
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    elif action in ("transient", "permanent"):
        from sluice.errors import PermanentError, TransientError

        cls = TransientError if action == "transient" else PermanentError
        raise cls("injected_fault", f"injected {action} fault at {point}", "")
