"""Queue messages as JSON data: reading one can never run code.

Huey pickles its messages by default, so whoever can write to the queue Redis runs code in every
process that reads the queue (workers, the console's queue-position lookup, ``sluice recover``).
``JsonSerializer`` writes the same Huey ``Message`` as plain JSON and reads back only JSON: the
task name is a string looked up in Huey's registry, the arguments are JSON values. A message that
is not such JSON (an old pickle, or something planted) fails to deserialize and is dropped by the
consumer with a log line; the job database still knows the job and recovery publishes it again.

Beyond JSON's own types, four are written as one-key objects: ``{"$tuple": [...]}``,
``{"$datetime": "ISO"}``, ``{"$timedelta": seconds}`` and ``{"$message": {...}}`` (a nested Huey
message: on_complete, on_error, a chord callback). A dict of the caller's own whose only key starts
with ``$`` is wrapped as ``{"$dict": {...}}`` so it comes back unchanged.
"""

from __future__ import annotations

import datetime as dt
import json

from huey.registry import Message
from huey.serializer import Serializer


class MessageError(ValueError):
    """A queue entry that is not a Sluice JSON message."""


def _encode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Message):
        return {"$message": {name: _encode(v) for name, v in value._asdict().items()}}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("queue messages take only dicts with string keys")
        encoded = {k: _encode(v) for k, v in value.items()}
        return {"$dict": encoded} if _is_tagged(encoded) else encoded
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$timedelta": value.total_seconds()}
    raise TypeError(
        f"a {type(value).__name__} cannot travel in a queue message; pass ids and plain values"
    )


def _is_tagged(obj: dict) -> bool:
    return len(obj) == 1 and next(iter(obj)).startswith("$")


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if not _is_tagged(value):
        return {k: _decode(v) for k, v in value.items()}
    [(tag, inner)] = value.items()
    if tag == "$dict" and isinstance(inner, dict):
        return {k: _decode(v) for k, v in inner.items()}
    if tag == "$tuple" and isinstance(inner, list):
        return tuple(_decode(v) for v in inner)
    if tag == "$datetime" and isinstance(inner, str):
        return dt.datetime.fromisoformat(inner)
    if tag == "$timedelta" and isinstance(inner, (int, float)):
        return dt.timedelta(seconds=inner)
    if tag == "$message" and isinstance(inner, dict):
        unknown = set(inner) - set(Message._fields)
        if unknown or not isinstance(inner.get("name"), str):
            raise MessageError(f"not a task message (fields {sorted(inner)})")
        return Message(**{k: _decode(v) for k, v in inner.items()})
    raise MessageError(f"unknown tag {tag!r} in a queue message")


class JsonSerializer(Serializer):
    """Huey's serializer, with JSON in place of pickle (compression options still apply)."""

    def _serialize(self, data) -> bytes:
        return json.dumps(_encode(data), separators=(",", ":"), allow_nan=False).encode("utf-8")

    def _deserialize(self, data: bytes):
        try:
            decoded = json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise MessageError(f"queue entry is not JSON ({len(data)} bytes); ignored") from exc
        return _decode(decoded)
