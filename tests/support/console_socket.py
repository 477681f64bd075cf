"""A raw Streamlit websocket client: what an attacker's page (or script) can say to the console.

It opens ``/_stcore/stream`` on the real server with any Host, Origin and forwarding headers, runs
the script, and sends widget values by the ids the server itself announced, the way the browser
does. Tests use it to prove what the console accepts from a connection, not what a helper returns.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect


class Refused(Exception):
    """The server refused the handshake or closed the socket at once."""


@dataclass
class Run:
    messages: list[ForwardMsg] = field(default_factory=list)

    def elements(self):
        for msg in self.messages:
            if msg.WhichOneof("type") == "delta" and msg.delta.WhichOneof("type") == "new_element":
                yield msg.delta.new_element

    @property
    def text(self) -> str:
        return "\n".join(str(e) for e in self.elements())

    @property
    def session_id(self) -> str:
        for msg in self.messages:
            if msg.WhichOneof("type") == "new_session":
                return msg.new_session.initialize.session_id
        raise LookupError("no new_session message in this run")

    def page_hash(self, url_path: str) -> str:
        for msg in self.messages:
            if msg.WhichOneof("type") == "navigation":
                for page in msg.navigation.app_pages:
                    if page.url_pathname == url_path:
                        return page.page_script_hash
        raise LookupError(f"no page {url_path!r} in the navigation")

    def widget_id(self, kind: str, label: str) -> str | None:
        for element in self.elements():
            if element.WhichOneof("type") == kind and getattr(element, kind).label == label:
                return getattr(element, kind).id
        return None


class ConsoleSocket:
    def __init__(
        self,
        port: int,
        *,
        host: str = "127.0.0.1",
        origin: str | None = None,
        headers: dict | None = None,
        source: str = "127.0.0.1",
        timeout: float = 30,
        host_port: bool = True,
        resume: str | None = None,
    ) -> None:
        sock = socket.create_connection(
            ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
        )
        extra = dict(headers or {})
        if origin is not None:
            extra["Origin"] = origin
        try:
            netloc = (
                f"{host}:{port}" if host_port else host
            )  # a proxy forwards the bare public name
            self.ws = connect(
                f"ws://{netloc}/_stcore/stream",
                sock=sock,
                additional_headers=extra,
                subprotocols=["streamlit", "xsrf-unused", resume] if resume else ["streamlit"],
                open_timeout=timeout,
                max_size=None,
            )
        except (InvalidStatus, ConnectionClosed, OSError) as exc:
            raise Refused(str(exc)) from exc
        self.timeout = timeout

    def run(self, *, query: str = "", widgets: list | None = None, page_hash: str = "") -> Run:
        msg = BackMsg()
        msg.rerun_script.query_string = query
        msg.rerun_script.page_script_hash = page_hash
        for state in widgets or []:
            msg.rerun_script.widget_states.widgets.append(state)
        try:
            self.ws.send(msg.SerializeToString())
            return self._until_finished()
        except ConnectionClosed as exc:
            raise Refused(str(exc)) from exc

    def _until_finished(self) -> Run:
        run = Run()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            raw = self.ws.recv(timeout=max(0.1, deadline - time.monotonic()))
            fwd = ForwardMsg()
            fwd.ParseFromString(raw)
            run.messages.append(fwd)
            if fwd.WhichOneof("type") == "script_finished":
                return run
        raise TimeoutError("the script did not finish")

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> ConsoleSocket:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def trigger(widget_id: str):
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    state = WidgetState(id=widget_id)
    state.trigger_value = True
    return state


def text(widget_id: str, value: str):
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    state = WidgetState(id=widget_id)
    state.string_value = value
    return state


def local_link(settings) -> str:
    """The query of a one-time link to a console without a password, as `sluice console-url`
    mints it for Sluice's own user (the console serves a loopback browser only after one)."""
    from sluice.ops.gate import TOKEN_PARAM, mint_local_link

    return f"{TOKEN_PARAM}={mint_local_link(settings)}"
