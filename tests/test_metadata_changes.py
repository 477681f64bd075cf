"""A re-upload of the same bytes under other metadata says so (``metadata_changed``) and, like a
``PATCH`` of the metadata, leaves a ``document.metadata_changed`` event in the stream; an upload
or a PATCH that changes nothing leaves none."""

from __future__ import annotations

from sluice.client import Client
from tests.support.api_server import make_key

TEXT = b"The orchard's pear trees flower in April, the apples a fortnight later. " * 20


def _metadata_events(client: Client) -> list[dict]:
    """Every metadata event the key may see, from the oldest kept (a bounded read)."""
    return [
        e.data
        for e in client.events(last_event_id=0, seconds=3)
        if e.type == "document.metadata_changed"
    ]


def test_a_reupload_with_other_metadata_says_so_and_leaves_an_event(api_process):
    client = Client(api_process.url, make_key("app", datasets=None, scope="manage"))
    first = client.upload(TEXT, filename="orchard.txt", metadata={"lang": "en"})
    assert first.metadata_changed is False
    same = client.upload(TEXT, filename="orchard.txt", metadata={"lang": "en"})
    assert same.existing and same.metadata_changed is False
    assert _metadata_events(client) == []

    other = client.upload(TEXT, filename="orchard.txt", metadata={"lang": "de", "year": 2024})
    assert other.existing and other.metadata_changed is True
    assert other.document_id == first.document_id
    assert client.document(first.document_id).metadata == {"lang": "de", "year": 2024}
    events = _metadata_events(client)
    assert [e["job"]["document_id"] for e in events] == [first.document_id]
    assert events[0]["message"] == "metadata replaced: 2 key(s)"
    assert "2024" not in str(events[0])  # the keys are counted, the values are not shown

    client.set_metadata(first.document_id, {"lang": "fr"})
    client.set_metadata(first.document_id, {"lang": "fr"})  # the same again: no event
    assert len(_metadata_events(client)) == 2
    client.close()
