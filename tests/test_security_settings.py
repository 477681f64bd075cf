"""Settings a hostile environment must not bend: a .env in the working directory, and passwords
given as ``?password=`` in a URL (masked on the System page, counted as set)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.apptest import assert_ok, open_console

SECRET = "pw-in-Query-9c1e"


@pytest.mark.parametrize("how", ["another user's", "writable by others"])
def test_a_dotenv_in_the_working_directory_that_is_not_the_users_own_is_not_read(
    tmp_path, sluice_env, how
):
    """``./.env`` configures every entry point only when it is the user's alone: one another user
    made, or one anybody may write, in a directory someone else controls must not redirect the
    job database."""
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    redirected = tmp_path / "attacker.db"
    dotenv = hostile / ".env"
    dotenv.write_text(f"SLUICE_DATABASE_URL=sqlite:///{redirected}\n")
    if how == "writable by others":
        dotenv.chmod(0o666)
    elif os.getuid() == 0:
        os.chown(dotenv, 65534, 65534)
    else:
        pytest.skip("making a file of another user needs root")
    env = {k: v for k, v in sluice_env.items() if k != "SLUICE_ENV_FILE"}
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "datasets", "--create", "notes"],
        cwd=hostile,
        env={**env, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not redirected.exists(), "a .env in the working directory redirected the job database"
    assert "ignoring" in done.stderr
    own = tmp_path / "data" / "sluice.db"
    assert own.exists()


def test_a_password_in_the_url_query_is_masked_and_counted_as_set(make_ctx):
    from sluice.settings import get_settings

    cache = os.environ["SLUICE_CACHE_REDIS_URL"]
    make_ctx(SLUICE_CACHE_REDIS_URL=f"{cache}?password={SECRET}")
    assert get_settings().secrets_status()["cache Redis password"]
    db = get_settings().model_copy(
        update={"database_url": f"postgresql://db.internal/sluice?password={SECRET}"}
    )
    assert db.secrets_status()["database password"] and SECRET not in repr(db.public_view())
    at = open_console()
    at.switch_page("views/system_page.py").run()
    assert_ok(at)
    shown = [
        str(e.value)
        for kind in ("markdown", "caption", "error", "success", "warning")
        for e in getattr(at, kind)
    ]
    shown += [frame.value.to_string() for frame in at.dataframe]
    assert not [s for s in shown if SECRET in s], "the System page shows a password"
    secrets = dict(at.dataframe[-2].value.itertuples(index=False))
    assert secrets["cache Redis password"] == "set"
