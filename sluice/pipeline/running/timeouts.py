"""A stage over its time limit: a busy host the first time, the file's fault the second.

A starved host makes any document slow, so a first stage timeout is retried. The same stage of
the same job (the same bytes) running out of time again is no accident: a file built to make the
parser slow (deeply nested HTML, a page of millions of vector paths) would otherwise cost the
stage timeout times the attempt limit. The second time the job fails for good, with a hint.
"""

from __future__ import annotations

from sqlmodel import Session, select

from sluice.errors import ErrorKind, PermanentError, TransientError
from sluice.storage.models import JobEvent, Stage

TIMEOUT_CODE = "stage_timeout"
FIRST_HINT = (
    "Sluice retries this by itself (a busy host makes any document slow). If it keeps "
    "happening, split the document or raise SLUICE_STAGE_TIMEOUT_SECONDS."
)
AGAIN_HINT = (
    "This stage ran out of time before on the same file, so the file itself is the cause (very "
    "large, or built to be slow to read) and it is not retried again. Split it or save it again "
    "in a simpler form and upload that, or raise SLUICE_STAGE_TIMEOUT_SECONDS and retry."
)


def timed_out_before(engine, job_id: int, stage: Stage) -> bool:
    """An earlier attempt of this job ended on a stage timeout in ``stage``."""
    with Session(engine) as session:
        events = session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "attempt_failed")
        ).all()
    # The event's own stage is the job row's, which lags behind the worker's counts (written per
    # batch); the message names the stage that ran out of time ("embedding took longer than ...").
    return any(
        (e.data or {}).get("code") == TIMEOUT_CODE and e.message.startswith(f"{stage.value} took")
        for e in events
    )


def kind_and_hint(engine, job_id: int, stage: Stage) -> tuple[ErrorKind, str]:
    """(kind, hint) of a stage timeout of this job now."""
    if timed_out_before(engine, job_id, stage):
        return ErrorKind.permanent, AGAIN_HINT
    return ErrorKind.transient, FIRST_HINT


def error(engine, job_id: int, stage: Stage, message: str) -> TransientError | PermanentError:
    kind, hint = kind_and_hint(engine, job_id, stage)
    if kind == ErrorKind.permanent:
        return PermanentError(TIMEOUT_CODE, f"{message}, again", hint)
    return TransientError(TIMEOUT_CODE, message, hint)
