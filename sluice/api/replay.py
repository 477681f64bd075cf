"""``Idempotency-Key`` around a POST's answer (the rule is sluice.api.idempotency): the first
answer is kept and replayed; a server error is not kept, so the client may try again."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from sluice.api import idempotency
from sluice.api.problems import answer as problem_answer
from sluice.errors import OperationError
from sluice.ops.keys import ApiPrincipal

KEPT_HEADERS = ("location", "retry-after", "content-type")


def idempotent(
    request: Request, key: ApiPrincipal, parts: Iterable[Any], answer: Callable[[], Response]
) -> Response:
    """The answer to a POST: ``answer()`` the first time, the kept answer after that."""
    header = request.headers.get("idempotency-key")
    if header is None:
        return answer()
    fingerprint = idempotency.fingerprint(request.method, request.url.path, parts)
    got = idempotency.begin(key, header, fingerprint)
    if isinstance(got, idempotency.Replay):
        return Response(
            got.body,
            status_code=got.status_code,
            headers={**got.headers, "Idempotent-Replayed": "true"},
        )
    try:
        try:
            response = answer()
        except OperationError as exc:  # a refusal (a Problem too) is an answer, kept as any
            response = problem_answer(exc)
    except BaseException:
        idempotency.abandon(got)
        raise
    if response.status_code >= 500:
        idempotency.abandon(got)
        return response
    body = bytes(response.body).decode()
    kept = {k: v for k, v in response.headers.items() if k.lower() in KEPT_HEADERS}
    idempotency.finish(got, status_code=response.status_code, headers=kept, body=body)
    return response
