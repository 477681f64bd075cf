"""Property-based fuzzing of every operation of ``/openapi.json`` with schemathesis, against a real
API process: valid and invalid inputs alike, no answer is a 5xx, and every answer matches what the
document says of it (status, content type, body schema). The count of cases is printed."""

from __future__ import annotations

import os

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sluice.ops import actions
from sluice.ops.access import cli_operator
from tests.support.api_server import ApiServer, auth, make_key

pytestmark = pytest.mark.slow
# Cases per operation and mode. The suite's 8 (about 500 cases over 32 operations on each database)
# keep schemathesis's boundary values and the first random cases; `make fuzz` runs 100 of them.
EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "8"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _fuzz(operation, mode: GenerationMode, url: str, headers: dict, ran: list[str]) -> None:
    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        if operation.path == "/v1/events":  # a stream: bounded, so that the answer ends
            case.query = {**(case.query or {}), "seconds": 0.3}
        response = case.call(base_url=url, headers=headers, timeout=30)
        ran.append(f"{case.method} {operation.path} -> {response.status_code}")
        case.validate_response(response, checks=CHECKS)

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        assert mode == GenerationMode.NEGATIVE  # an operation with no input has no invalid one


@pytest.mark.timeout(max(600, EXAMPLES * 40))
def test_every_operation_takes_any_input_without_a_server_error(
    database_url, sluice_env, start_worker, tmp_path
):
    start_worker()
    assert actions.create_dataset(cli_operator(), "fuzz")[0]
    token = make_key("fuzzer", datasets=None, scope="manage")
    api = ApiServer({**os.environ, "SLUICE_API_RATE_PER_MINUTE": "0"}, tmp_path / "api.log")
    api.start()
    ran: list[str] = []
    try:
        schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 13
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz(operation, mode, api.url, auth(token), ran)
    finally:
        api.stop()
        print(f"schemathesis: {len(ran)} cases over {len(operations)} operations")
    assert "Traceback" not in api.output(), api.output()[-3000:]
