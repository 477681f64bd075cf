"""Fault points for crash, outage and race tests: the SLUICE_FAULTS environment variable (any
process, also a real worker) and in-process hooks (``hook``, for tests that force an interleaving).

Unset (always, in production) it does nothing. Set, it is a comma-separated list of
``point=action`` where action is ``exit`` (the process dies at once, like kill -9), ``sleep:S``,
``wait:PATH`` (create ``PATH.waiting``, then hold until ``PATH`` exists, at most WAIT_SECONDS: a
test in another process holds a child at a point, looks at it, and lets it go), or ``transient`` /
``permanent`` (raise that error class). A point may carry a count after ``@``:
``embed_batch@3=exit`` fires at the third time the point is reached in this process.

Points: ``after_claim``, ``after_parse``, ``embed_batch``, ``after_index`` (vectors written, job
not yet marked succeeded), ``reap_selected`` (the reaper read a stale job, before it takes it back),
``upload_resolved`` (an upload read its dataset, by id or name, before it stores the bytes and
writes its rows), ``before_document_insert`` (an upload found no document with its bytes, before it
adds one), ``upload_dispatch`` (the API's dispatcher thread was woken by an upload's commit, before
it publishes the outbox),
``redeliver_selected`` (recovery picked a stranded job, before it publishes it again),
``before_supersede`` (a success read the document's other jobs, before it writes),
``before_cleanup`` (an ended attempt's cleanup, ``remove_partial``, has the job as its caller ended
it, before its fenced delete),
``after_switch`` (a success committed, the chunks of the jobs it superseded or replaced not yet
removed),
``before_fail_write`` (a failure read the job, before it writes), ``before_verify`` (the runner
wrote its chunks, before it checks the index), ``reconcile_before_delete`` (repair confirmed
orphans, before it deletes them), ``heartbeat_lost`` (the heartbeat found the lease gone),
``webhook_selected`` (a webhook dispatcher read a due delivery, before it claims it),
``webhook_claimed`` (it claimed the delivery, before it posts), ``extract_page`` (a parse child is
about to read a PDF page), ``decrypt_authenticated`` (the decrypt child holds the password and has
opened the file with it, before it writes the copy), ``idempotency_before_insert`` (an API request
found no record of its Idempotency-Key, before it adds one), ``blob_unused`` (a blob removal
found no document using the bytes, before it moves them aside), ``blob_retired`` (it moved them
aside, before it looks at the users again), ``blob_migrated`` (``sluice blobs migrate`` sent a
blob, before it removes the local file), ``dataset_delete_marked`` (a dataset delete marked the
dataset deleting, before it cancels its jobs), ``dataset_delete_document`` (it removed one of the
dataset's documents, before the next), ``dataset_delete_documents_removed`` (every document went,
before it drops the collection and the rows), ``api_warm_up`` (an API process warmed
up everything its first request needs, before ``/v1/health`` says ``ready``), ``source_listed`` (a
sync or preview listed its source, before it reads what its syncs recorded),
``source_before_read`` (a source's file was stat-ed, before its bytes are read),
``source_uploaded`` (a sync uploaded an added or changed file, before it records its entry),
``source_applied`` (a sync carried out one file's step), ``source_purge_selected`` (the tombstone
purge found the sources with expired tombstones, before it takes their leases), ``query_export``
(the query encoder's export holds its lock and found no export, before it loads the model),
``before_document_switch`` (a document switch read the live document, before its UPDATE),
``search_between_rankers`` (a hybrid search's two rankers run at once: hit by the lexical one
once it has read, ``ranker="lexical"``, and by the dense one before it reads,
``ranker="dense"``; a hook holding the dense one until the lexical one has come lands a write
between the two reads),
``after_chunk_edit_recorded`` (a chunk's edit committed, before it is written into the chunks the
document serves).

A hook is a callable run where its point is hit, with keyword arguments that say what is there
(``job_id=...``); it may block on a barrier or an event to hold a window open, or change the
database to land a write inside it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

WAIT_SECONDS = 60.0
_counts: Counter[str] = Counter()
_lock = threading.Lock()
_hooks: dict[str, list[Callable[..., None]]] = {}


@contextmanager
def hook(point: str, fn: Callable[..., None]) -> Iterator[None]:
    """Run ``fn(**info)`` each time ``point`` is hit in this process, while the block runs."""
    with _lock:
        _hooks.setdefault(point, []).append(fn)
    try:
        yield
    finally:
        with _lock:
            _hooks[point].remove(fn)


def _rules() -> dict[str, str]:
    spec = os.environ.get("SLUICE_FAULTS", "").strip()
    rules = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        point, _, action = item.partition("=")
        rules[point.strip()] = action.strip()
    return rules


def hit(point: str, **info) -> None:
    if _hooks:
        with _lock:
            fns = list(_hooks.get(point, ()))
        for fn in fns:
            fn(**info)
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
    elif action.startswith("wait:"):
        _wait_for_file(action.split(":", 1)[1])
    elif action in ("transient", "permanent"):
        from sluice.errors import PermanentError, TransientError

        cls = TransientError if action == "transient" else PermanentError
        raise cls("injected_fault", f"injected {action} fault at {point}", "")


def _wait_for_file(path: str) -> None:
    with open(f"{path}.waiting", "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
