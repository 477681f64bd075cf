"""The console's API keys page: the same functions as ``sluice keys``, for operators only."""

from __future__ import annotations

from sluice.api import authentication
from sluice.console import auth
from sluice.ops import keys
from tests.support.apptest import assert_ok, open_console, texts


def test_an_operator_makes_a_key_sees_its_token_once_and_revokes_it(ctx):
    at = open_console("keys")
    assert at.title[0].value == "API keys" and "No API key yet." in texts(at)
    at.text_input(key="key_name").set_value("billing-app")
    at.selectbox(key="key_scope").set_value("ingest")
    at.multiselect(key="key_datasets").set_value(["default"])
    at.button[0].click().run()  # the form's submit button
    assert_ok(at)
    assert "shown only this once" in texts(at)
    token = at.code[0].value
    principal = authentication.authenticate(token)
    assert principal is not None and principal.scope == "ingest" and principal.name == "billing-app"
    assert [v.name for v in keys.list_keys()] == ["billing-app"]
    assert at.dataframe[0].value["Name"].tolist() == ["billing-app"]
    assert "at most once every 60 s per key" in texts(at)  # why "Last used" may lag

    at.run()  # the next run shows the key, never its token again
    assert not at.code and token not in texts(at)
    assert token not in repr(at.session_state)

    at.button(key="revoke_key").click().run()
    at.button(key="revoke_key:yes").click().run()
    assert_ok(at)
    assert "key 'billing-app' is revoked" in texts(at)
    assert authentication.authenticate(token) is None
    assert keys.list_keys()[0].revoked


def test_a_read_only_operator_sees_no_keys_and_no_controls(make_ctx):
    make_ctx(
        SLUICE_CONSOLE_PASSWORD="correct horse 7391", SLUICE_CONSOLE_READONLY_PASSWORD="peek-51"
    )
    auth.THROTTLE.reset()
    keys.create_key(auth.Operator("op", "operator"), "hidden-app", datasets=None, scope="read")
    at = open_console()
    at.text_input(key="login_password").set_value("peek-51")
    at.button[0].click().run()
    at.switch_page("views/keys_page.py").run()
    assert_ok(at)
    assert "signed in read-only" in texts(at)
    assert "hidden-app" not in texts(at)
    assert not at.dataframe and not at.code and not at.get("form")
    assert {b.key for b in at.button} == {"create_dataset", "sign_out"}  # the sidebar's only
