"""A column among a list of integer ids, the ids bound as one parameter (an array on PostgreSQL, a
JSON array on SQLite): a list of one parameter per id stops at the drivers' limits (SQLite's default
build binds 32,766, psycopg 65,535), and a metadata filter may allow more documents than that."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import BigInteger, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY


def sql(column: str, name: str, ids: Iterable[int], params: dict, *, pg: bool) -> str:
    """For a text statement: the condition, its parameter ``name`` put in ``params``."""
    values = [int(i) for i in ids]
    if pg:
        params[name] = values
        return f"{column} = ANY(CAST(:{name} AS BIGINT[]))"
    params[name] = json.dumps(values)
    return f"{column} IN (SELECT value FROM json_each(:{name}))"


def clause(column: Any, ids: Iterable[int], *, pg: bool) -> Any:
    """For a Core statement: the condition on ``column``."""
    values = [int(i) for i in ids]
    if pg:
        return column == any_(bindparam("among_ids", values, type_=ARRAY(BigInteger)))
    each = func.json_each(bindparam("among_ids", json.dumps(values))).table_valued("value")
    return column.in_(select(each.c.value))
