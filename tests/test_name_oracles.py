"""Names are no oracle: a key of some datasets that renames one of them to the name of a dataset it
does not reach gets, byte for byte, the answer a key that reaches both gets for the same rename
(the name is refused in words that do not say a dataset has it), and the code is the same."""

from __future__ import annotations

import httpx

from sluice.ops import actions
from sluice.ops.access import cli_operator
from tests.support.api_server import InProcessApi, auth, make_key


def _rename(url: str, token: str, old: str, new: str) -> httpx.Response:
    return httpx.patch(
        f"{url}/v1/datasets/{old}", json={"name": new}, headers=auth(token), timeout=30
    )


def _answer(r: httpx.Response) -> tuple[int, str, bytes]:
    return r.status_code, r.headers["content-type"], r.content


def test_a_rename_onto_an_unseen_dataset_answers_as_onto_a_seen_one(database_url, make_ctx):
    make_ctx()
    for name in ("alpha", "taken"):
        assert actions.create_dataset(cli_operator(), name)[0]
    alone = make_key("alone", datasets=["alpha"], scope="manage")  # does not reach "taken"
    both = make_key("both", datasets=["alpha", "taken"], scope="manage")
    with InProcessApi() as api:
        unseen = _rename(api.url, alone, "alpha", "taken")
        seen = _rename(api.url, both, "alpha", "taken")
        assert _answer(unseen) == _answer(seen)
        body = unseen.json()
        assert (unseen.status_code, body["code"]) == (409, "dataset_name_taken"), body
        assert body["detail"] == "the name 'taken' cannot be used: choose another", body
        # the dataset the key cannot see stays out of reach, by name, as a missing one
        gone = _rename(api.url, alone, "nope", "x")
        hidden = _rename(api.url, alone, "taken", "x")
        assert gone.status_code == hidden.status_code == 404
        assert gone.content.replace(b"nope", b"taken") == hidden.content
        # and the rename to a free name goes through
        ok = _rename(api.url, alone, "alpha", "free")
        assert ok.status_code == 200 and ok.json()["dataset"]["name"] == "free", ok.text
