"""Server-sent events as the API streams them (``GET /v1/events``): each event's id, type and JSON
data, read line by line; the comments say why a stream ended (``: closed: the key was revoked``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

CLOSED = "closed: "
API_STOPPING = "the API is stopping"  # the one ending after which a stream resumes elsewhere


@dataclass
class Event:
    """One job event: ``id`` (resume after it), ``type`` (``job.succeeded``, ...) and ``data``
    (the event's ``kind``, ``at``, ``actor``, ``message`` and its ``job``)."""

    id: int
    type: str
    data: dict[str, Any] = field(default_factory=dict)


class StreamClosed(Exception):
    """The API ended the stream for good: its key was revoked or its datasets were deleted."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the event stream was closed: {reason}")
        self.reason = reason


class EventParser:
    """Feeds on a stream's lines; gives an Event at each blank line ending one, or a comment."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def feed(self, line: str) -> Event | str | None:
        """An Event its last line completed, a comment's text, or None (``retry:`` included)."""
        if not line:
            fields, self._fields = self._fields, {}
            if "data" not in fields:
                return None
            return Event(
                int(fields.get("id", "0") or 0),
                fields.get("event", "message"),
                json.loads(fields["data"]),
            )
        if line.startswith(":"):
            return line[1:].strip()
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data" and name in self._fields:
            value = f"{self._fields[name]}\n{value}"
        self._fields[name] = value
        return None


def parse_events(lines: Iterable[str]) -> Iterator[Event]:
    """Server-sent events from their lines (comments and ``retry:`` skipped)."""
    parser = EventParser()
    for line in lines:
        got = parser.feed(line)
        if isinstance(got, Event):
            yield got
