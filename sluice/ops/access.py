"""Who is acting, and whether they may: the one operator check every action goes through.

Both front ends name their user the same way (``Operator``); every function in
``sluice.ops.actions`` takes one and refuses a read-only operator before touching anything, so a
disabled button in the console is a convenience, not the protection.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import Literal

from sluice.errors import OperationError, SettingsError
from sluice.settings import Settings

Role = Literal["operator", "readonly"]
Channel = Literal["console", "cli", "api", "system"]


def check_bind(settings: Settings) -> None:
    """Refuse to serve the console beyond loopback without a password."""
    if not settings.console_is_loopback and settings.console_password is None:
        raise SettingsError(
            f"SLUICE_CONSOLE_ADDRESS={settings.console_address} listens beyond this machine, but "
            "SLUICE_CONSOLE_PASSWORD is not set. Set a password (and optionally "
            "SLUICE_CONSOLE_READONLY_PASSWORD), or listen on 127.0.0.1."
        )


@dataclass(frozen=True)
class Operator:
    name: str
    role: Role
    channel: Channel = "console"
    address: str = ""  # where the request came from, when known (the audit log's source address)
    key: str = ""  # an API key's public lookup id (the audit log's actor key)

    @property
    def can_act(self) -> bool:
        return self.role == "operator"

    @property
    def actor(self) -> str:
        """How this person appears in job events."""
        return f"{self.channel}:{self.name}"


LOCAL_OPERATOR = Operator("local", "operator")


class ReadOnlyOperator(OperationError):
    """A read-only operator tried to change something."""

    code, status = "read_only", 403
    hint = "Ask an operator who may change things, or sign in as one."


def require_operator(who: Operator, action: str) -> None:
    if not who.can_act:
        raise ReadOnlyOperator(f"{who.name} is signed in read-only and cannot {action}")


def cli_operator() -> Operator:
    """Whoever runs the ``sluice`` command on this machine: an operator, named after the OS user."""
    try:
        name = getpass.getuser()
    except Exception:  # no user name in this environment (a bare container)
        name = "unknown"
    return Operator(name, "operator", channel="cli")
