"""The Hit testing page's history: the last queries each operator tried, kept in the job
database so a reload or another tab of the same operator sees them (at most ``KEEP`` each)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Index, delete
from sqlmodel import Field, Session, SQLModel, col, select


def _now() -> datetime:
    return datetime.now(UTC)


KEEP = 20  # queries kept per operator
MAX_QUERY = 2000  # characters of a query kept


class HitTestQuery(SQLModel, table=True):
    __tablename__ = "hit_test_query"
    __table_args__ = (Index("ix_hit_test_query_operator_id", "operator", "id"),)

    id: int = Field(default=None, primary_key=True)
    operator: str = Field(max_length=120)
    dataset: str = Field(max_length=120)  # by name: a deleted dataset leaves its history readable
    query: str = Field(max_length=MAX_QUERY)
    mode: str = Field(max_length=10)
    k: int
    hits: int  # how many chunks it answered
    at: datetime = Field(default_factory=_now)


def record(
    *, session: Session, operator: str, dataset: str, query: str, mode: str, k: int, hits: int
) -> HitTestQuery:
    """Add a query to the operator's history and forget what falls past the last ``KEEP``."""
    row = HitTestQuery(
        operator=operator, dataset=dataset, query=query[:MAX_QUERY], mode=mode, k=k, hits=hits
    )
    session.add(row)
    session.flush()
    newest = session.exec(
        select(HitTestQuery.id)
        .where(HitTestQuery.operator == operator)
        .order_by(col(HitTestQuery.id).desc())
        .limit(KEEP)
    ).all()
    session.execute(
        delete(HitTestQuery).where(
            col(HitTestQuery.operator) == operator, col(HitTestQuery.id).not_in(newest)
        )
    )
    session.commit()
    session.refresh(row)
    return row


def recent(*, session: Session, operator: str, limit: int = KEEP) -> list[HitTestQuery]:
    """The operator's last queries, newest first."""
    stmt = select(HitTestQuery).where(HitTestQuery.operator == operator)
    return list(session.exec(stmt.order_by(col(HitTestQuery.id).desc()).limit(limit)).all())
