"""What a read-only operator gets from a real ``sluice serve console``, over its websocket.

Signed in with the read-only password, the browser is the attacker: it must not see an endpoint's
own secret (a Slack- or Teams-style webhook URL), nor what that endpoint answered.
"""

from __future__ import annotations

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
