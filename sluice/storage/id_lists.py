"""A column among a list of integer ids, the ids bound as one parameter (an array on PostgreSQL, a
JSON array on SQLite): a list of one parameter per id stops at the drivers' limits (SQLite's default
build binds 32,766, psycopg 65,535), and a metadata filter may allow more documents than that."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import BigInteger, Boolean, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement


def sql(column: str, name: str, ids: Iterable[int], params: dict, *, pg: bool) -> str:
    """For a text statement: the condition, its parameter ``name`` put in ``params``."""
    values = [int(i) for i in ids]
    if pg:
        params[name] = values
        return f"{column} = ANY(CAST(:{name} AS BIGINT[]))"
    params[name] = json.dumps(values)
    return f"{column} IN (SELECT value FROM json_each(:{name}))"


class _Among(ColumnElement[bool]):
    """``column`` among ``values``, written for the dialect it is compiled for."""

    type = Boolean()
    inherit_cache = False  # the values are the statement's: nothing to share between calls

    def __init__(self, column: Any, values: list[int]) -> None:
        self.column, self.values = column, values


@compiles(_Among)
def _in_json(element: _Among, compiler: Any, **kw: Any) -> str:
    each = func.json_each(bindparam(None, json.dumps(element.values))).table_valued("value")
    return compiler.process(element.column.in_(select(each.c.value)), **kw)


@compiles(_Among, "postgresql")
def _any_array(element: _Among, compiler: Any, **kw: Any) -> str:
    values = bindparam(None, element.values, type_=ARRAY(BigInteger))
    return compiler.process(element.column == any_(values), **kw)


def clause(column: Any, ids: Iterable[int]) -> Any:
    """For a Core statement: the condition on ``column``, whichever database runs it."""
    return _Among(column, [int(i) for i in ids])
