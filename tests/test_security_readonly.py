"""What a read-only operator gets from a real ``sluice serve console``, over its websocket.

Signed in with the read-only password, the browser is the attacker: it must not see an endpoint's
own secret (a Slack- or Teams-style webhook URL), nor what that endpoint answered.
"""

from __future__ import annotations

from types import SimpleNamespace

from sqlmodel import Session

from sluice.storage.models import WebhookDelivery
from tests.support.console_socket import ConsoleSocket, text, trigger
from tests.test_security_console import PASSWORD, READONLY, console  # noqa: F401  (fixture)

HOOK = "https://hooks.slack.example/services/T0001/B0002/pathSecret4f9c?token2=querySecret81"
LONG = "k" * 40  # a webhook secret of the length the settings now ask for


def signed_in_page(sock: ConsoleSocket, password: str, page: str):
    first = sock.run()
    field, button = first.widget_id("text_input", "Password"), first.widget_id("button", "Sign in")
    sock.run(widgets=[text(field, password), trigger(button)])
    return sock.run(page_hash=sock.run().page_hash(page))


def test_a_read_only_operator_sees_no_webhook_secret_nor_the_endpoints_answer(ctx, console):  # noqa: F811
    with Session(ctx.engine) as session:
        session.add(
            WebhookDelivery(
                event_id="e1",
                endpoint=HOOK,
                job_id=1,
                event="job.failed",
                body="{}",
                attempts=2,
                last_status=500,
                last_error="HTTP 500: internal answer with answerSecret23",
            )
        )
        session.commit()
    env = {"SLUICE_CONSOLE_PASSWORD": PASSWORD, "SLUICE_CONSOLE_READONLY_PASSWORD": READONLY}
    proc = console(launcher="sluice", SLUICE_WEBHOOK_URLS=HOOK, SLUICE_WEBHOOK_SECRET=LONG, **env)
    with ConsoleSocket(proc.port, headers={"Cookie": "_streamlit_xsrf=reader-1"}) as sock:
        seen = signed_in_page(sock, READONLY, "system").text
    assert "hooks.slack.example" in seen, seen[-3000:]
    for secret in ("pathSecret4f9c", "querySecret81", "answerSecret23", "T0001"):
        assert secret not in seen, secret
    with ConsoleSocket(proc.port, headers={"Cookie": "_streamlit_xsrf=operator-1"}) as sock:
        seen = signed_in_page(sock, PASSWORD, "system").text
    assert "pathSecret4f9c" in seen and "answerSecret23" in seen  # operators still see it all


def test_a_read_only_operator_cannot_make_the_console_parse_for_a_cost_count(make_ctx, monkeypatch):
    """Suspected in issue 26, confirmed: the bulk "count the embedding cost" toggle parsed a sample
    of documents in the console on every refresh, for a read-only operator too. The Jobs page,
    signed in read-only, with the toggle's value sent anyway (a disabled widget is only drawn
    so)."""
    from sluice.ops import reads
    from tests.support.apptest import assert_ok, open_console
    from tests.support.seed import seed_every_state

    ctx = make_ctx(SLUICE_CONSOLE_PASSWORD=PASSWORD, SLUICE_CONSOLE_READONLY_PASSWORD=READONLY)
    seed_every_state(ctx)
    parsed: list[list[int]] = []
    counted = SimpleNamespace(describe=lambda: "1 document parsed")
    monkeypatch.setattr(reads, "preview_jobs", lambda c, ids, **kw: parsed.append(ids) or counted)
    at = open_console()
    at.text_input(key="login_password").set_value(READONLY)
    at.button[0].click().run()
    at.switch_page("views/jobs_page.py").run()
    at.segmented_control(key="bulk_action").set_value("reindex").run()
    assert at.toggle(key="bulk_cost").disabled
    at.session_state["bulk_cost"] = True  # what a raw websocket client may send for it anyway
    at.run()
    assert_ok(at)
    assert parsed == []
    assert reads.bulk_preview("reindex", reads.queries.JobFilter(), with_cost=True) and parsed
