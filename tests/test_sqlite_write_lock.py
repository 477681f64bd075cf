"""A write of the SQLite job database waits for another writer's lock (the busy timeout), also
right after another process changed the schema. bench.scale saw the first small job into a new
dataset fail at once with "database is locked" on its lexical write: the worker's connection,
told of the change by an earlier statement, prepared its cached ``DELETE FROM lexical_chunk``
again inside the transaction the driver had begun, reading the FTS5 tables' config first; SQLite
runs no busy handler for a transaction that already reads."""

from __future__ import annotations

import threading

from sqlmodel import Session

HOLD_SECONDS = 1.0  # how long the other writer keeps the lock at most (it lets go once ours ends)


def test_a_lexical_write_after_another_process_made_a_dataset_waits_for_the_lock(store_env):
    from sluice.settings import get_settings
    from sluice.storage import db, lexical

    url = get_settings().resolved_database_url
    worker = db.get_engine(url)  # the worker's engine
    other = db.make_engine(url)  # another process's: an upload into a new dataset, the bench
    with Session(worker) as session:
        dataset_id = db.ensure_dataset(session=session, name="scale").id
    worker.dispose()  # from here on one connection, used in turn (the pool hands them round)

    def write(job_id: int) -> int:
        row = lexical.Row(f"chunk-{job_id}", 0, 1, "the annual budget of the water station")
        return lexical.write_job(
            worker, dataset_id=dataset_id, document_id=job_id, job_id=job_id, rows=[row]
        )

    assert write(1) == 1  # the connection keeps its statements prepared
    with Session(other) as session:  # a new dataset: its FTS5 table and triggers, a new schema
        db.ensure_dataset(session=session, name="another")
    assert lexical.count_job(worker, 1) == 1  # a read on the worker's connection sees the change

    outcome: dict[str, object] = {}
    ended = threading.Event()

    def second_job() -> None:
        try:
            outcome["rows"] = write(2)
        except Exception as exc:
            outcome["error"] = exc
        finally:
            ended.set()

    with other.connect() as holder:
        holder.exec_driver_sql("BEGIN IMMEDIATE")  # another writer holds the lock
        thread = threading.Thread(target=second_job, name="second-job")
        thread.start()
        try:
            ended.wait(HOLD_SECONDS)  # a write that fails at once ends here, lock still held
        finally:
            holder.rollback()
    thread.join(30)
    assert not thread.is_alive(), "the write never ended after the lock was let go"
    assert "error" not in outcome, f"the write did not wait for the lock: {outcome['error']}"
    assert outcome["rows"] == 1 and lexical.count_job(worker, 2) == 1
