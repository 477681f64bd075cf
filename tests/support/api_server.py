"""The HTTP API for tests: a real ``sluice serve api`` process (uvicorn) on a free port with the
test's settings, or the same app under uvicorn in a thread of the test (where ``faults.hook`` must
reach it); and keys made through sluice.ops.keys, as ``sluice keys create`` makes them."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support.servers import ManagedProcess, free_port


class ApiServer(ManagedProcess):
    def __init__(self, env: dict, log: Path, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [str(Path(sys.executable).with_name("sluice")), "serve", "api"]
        super().__init__(argv, log=log, env={**env, "SLUICE_API_PORT": str(self.port)})

    def start(self, timeout: float = 60.0) -> None:
        super().start()
        wait_healthy(self.url, timeout, alive=self.alive, output=self.output)


def wait_healthy(url: str, timeout: float, *, alive=lambda: True, output=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"the API exited:\n{output()[-3000:]}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the API did not answer in {timeout} s:\n{output()[-3000:]}")


class InProcessApi:
    """uvicorn serving sluice.api.server:app in a thread of the test process."""

    def __init__(self) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            "sluice.api.server:app", host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> InProcessApi:
        self.thread.start()
        wait_healthy(self.url, 30, alive=self.thread.is_alive)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def make_key(name: str, *, datasets: list[str] | None, scope: str) -> str:
    from sluice.ops.access import cli_operator
    from sluice.ops.keys import create_key

    return create_key(cli_operator(), name, datasets=datasets, scope=scope)[1]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
