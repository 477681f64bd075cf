"""Console sign-in: constant-time password check, lockout kept by the server, read-only
operators."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from sluice.console import auth
from sluice.ops import access
from sluice.settings import SettingsError, load_settings
from sluice.storage.models import Job, JobStatus
from tests.support.apptest import assert_ok, open_console, texts
from tests.support.seed import seed_every_state

PASSWORD = "correct horse 7391"
READONLY = "just looking 5120"


@pytest.fixture
def seeded(ctx):
    """Jobs in every state in the default dataset: {label: [job ids]} (see
    tests/support/seed.py)."""
    return seed_every_state(ctx)


@pytest.fixture(autouse=True)
def _fresh_throttle():
    auth.THROTTLE.reset()
    yield
    auth.THROTTLE.reset()


@pytest.fixture
def guarded(make_ctx):
    return make_ctx(
        SLUICE_CONSOLE_PASSWORD=PASSWORD,
        SLUICE_CONSOLE_READONLY_PASSWORD=READONLY,
        SLUICE_LOGIN_MAX_FAILURES="3",
        SLUICE_LOGIN_LOCKOUT_SECONDS="600",
    )


def _sign_in(at, password: str):
    at.text_input(key="login_password").set_value(password)
    at.button[0].click().run()
    assert_ok(at)
    return at


def test_no_page_without_signing_in_and_a_wrong_password_is_refused(guarded):
    at = open_console()
    assert "Sign in to the operator console" in texts(at)
    assert not at.metric and not at.dataframe  # nothing of the console leaks before sign-in
    _sign_in(at, "wrong")
    assert "Wrong password (2 more tries before a lockout)." in texts(at)
    _sign_in(at, PASSWORD)
    assert at.title[0].value == "Overview"
    assert "Signed in as **operator** (operator)." in texts(at)


def test_lockout_after_repeated_failures_holds_across_sessions(guarded):
    at = open_console()
    for _ in range(3):
        _sign_in(at, "guess")
    assert "Sign-in is locked for 600 s" in texts(at)
    _sign_in(at, PASSWORD)  # even the right password waits out the lockout
    assert "Too many failed sign-ins" in texts(at)
    assert not at.metric
    fresh = open_console()  # a new browser session does not reset the count
    assert "Too many failed sign-ins" in texts(fresh)
    _sign_in(fresh, PASSWORD)
    assert "Too many failed sign-ins" in texts(fresh)
    assert not fresh.metric


def test_read_only_operator_sees_everything_but_cannot_act(ctx, guarded, seeded):
    failed = seeded["failed:corrupt_pdf"][0]
    at = open_console()
    at.switch_page("views/jobs_page.py")  # a deep link to a job, opened before signing in
    at.query_params["job"] = str(failed)
    at.run()
    assert "Sign in to the operator console" in texts(at) and not at.dataframe
    _sign_in(at, READONLY)
    assert at.title[0].value == "Jobs"  # the link survives the sign-in
    assert "Signed in as **readonly** (read-only)." in texts(at)
    assert "signed in read-only" in texts(at)
    assert "the PDF is damaged" in texts(at)
    assert at.button(key=f"retry_{failed}").disabled
    at.query_params["job"] = str(seeded["succeeded"][0])
    at.run()
    assert at.button(key=f"reindex_{seeded['succeeded'][0]}").disabled
    at.query_params["job"] = str(seeded["running"][0])
    at.run()
    assert at.button(key=f"cancel_{seeded['running'][0]}").disabled
    at.switch_page("views/dead_letters_page.py").run()
    assert_ok(at)
    assert all(b.disabled for b in at.button if b.key and b.key.startswith(("retry_", "dismiss_")))
    at.switch_page("views/upload_page.py").run()
    assert at.get("file_uploader")[0].proto.disabled


def test_action_functions_refuse_a_read_only_operator(ctx, seeded):
    from sluice.ops import actions

    viewer = auth.Operator("readonly", "readonly")
    failed, running = seeded["failed:corrupt_pdf"][0], seeded["running"][0]
    for outcome in (
        actions.retry(viewer, [failed]),
        actions.cancel(viewer, [running]),
        actions.reindex(viewer, seeded["succeeded"][:1]),
        actions.dismiss(viewer, [failed]),
    ):
        assert outcome.ok == 0 and "read-only" in outcome.results[0].message
    ok, message = actions.create_dataset(viewer, "sneaky")
    assert not ok and "read-only" in message
    refused = actions.upload(
        viewer, dataset="default", filename="x.txt", stream=__import__("io").BytesIO(b"hi")
    )
    assert not refused.accepted and refused.error_code == "read_only"
    with Session(ctx.engine) as session:
        assert session.get(Job, failed).status == JobStatus.failed
        assert not session.get(Job, running).cancel_requested
        assert session.get(Job, seeded["succeeded"][0]).status == JobStatus.succeeded


def test_throttle_locks_for_the_configured_time_then_again_at_the_next_failure():
    now = [1000.0]
    throttle = auth.LoginThrottle(clock=lambda: now[0])
    settings = load_settings(
        _env_file=None, console_password=PASSWORD, login_max_failures=2, login_lockout_seconds=30
    )
    assert auth.attempt_login(settings, "a", client="ip1", throttle=throttle).operator is None
    locked = auth.attempt_login(settings, "b", client="ip1", throttle=throttle)
    assert "locked for 30 s" in locked.message
    assert auth.attempt_login(settings, PASSWORD, client="ip1", throttle=throttle).operator is None
    assert (
        auth.attempt_login(settings, PASSWORD, client="ip2", throttle=throttle).operator is not None
    )
    now[0] += 31
    assert auth.attempt_login(settings, "c", client="ip1", throttle=throttle).message.endswith(
        "locked for 30 s."
    )
    now[0] += 31
    who = auth.attempt_login(settings, PASSWORD, client="ip1", throttle=throttle).operator
    assert who == auth.Operator("operator", "operator") and who.can_act
    assert throttle.wait_seconds("ip1", max_failures=2, lockout_seconds=30) == 0


def test_passwords_pick_the_role():
    settings = load_settings(
        _env_file=None, console_password=PASSWORD, console_readonly_password=READONLY
    )
    assert auth.operator_for_password(settings, PASSWORD).role == "operator"
    assert auth.operator_for_password(settings, READONLY).role == "readonly"
    assert auth.operator_for_password(settings, "") is None
    only_full = load_settings(_env_file=None, console_password=PASSWORD)
    assert (
        auth.operator_for_password(only_full, "") is None
    )  # an unset read-only password matches nothing


def test_console_refuses_to_listen_beyond_loopback_without_a_password():
    with pytest.raises(SettingsError, match="SLUICE_CONSOLE_PASSWORD is not set"):
        access.check_bind(load_settings(_env_file=None, console_address="0.0.0.0"))
    access.check_bind(
        load_settings(_env_file=None, console_address="0.0.0.0", console_password=PASSWORD)
    )
    assert load_settings(
        _env_file=None, console_address="0.0.0.0", console_password=PASSWORD
    ).login_required


def test_oidc_people_are_read_only_unless_listed():
    assert auth.oidc_role("Ops@Example.com", ["ops@example.com"]) == "operator"
    assert auth.oidc_role("someone@example.com", ["ops@example.com"]) == "readonly"
    assert auth.oidc_role(None, ["ops@example.com"]) == "readonly"


def test_parallel_sign_ins_from_one_address_get_only_the_allowed_password_checks(monkeypatch):
    """Twenty attempts at once: the check and the count happen together, so only max_failures are
    tried."""
    import threading

    settings = load_settings(
        _env_file=None, console_password=PASSWORD, login_max_failures=3, login_lockout_seconds=600
    )
    throttle = auth.LoginThrottle()
    barrier = threading.Barrier(20)
    checked = []
    real = auth.operator_for_password

    def slow_check(s, given):  # every thread is inside the check at the same time
        checked.append(given)
        try:
            barrier.wait(timeout=2)
        except threading.BrokenBarrierError:
            pass
        return real(s, given)

    monkeypatch.setattr(auth, "operator_for_password", slow_check)
    threads = [
        threading.Thread(
            target=auth.attempt_login,
            args=(settings, f"guess-{i}"),
            kwargs={"client": "198.51.100.1", "throttle": throttle},
        )
        for i in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(checked) == 3
