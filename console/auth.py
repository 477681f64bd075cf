"""Console access: who may open the console, and whether they may act."""

from __future__ import annotations

from storage.settings import Settings, SettingsError


def check_bind(settings: Settings) -> None:
    """Refuse to serve the console beyond loopback without a password."""
    if not settings.console_is_loopback and settings.console_password is None:
        raise SettingsError(
            f"SLUICE_CONSOLE_ADDRESS={settings.console_address} listens beyond this machine, but "
            "SLUICE_CONSOLE_PASSWORD is not set. Set a password (and optionally "
            "SLUICE_CONSOLE_READONLY_PASSWORD), or listen on 127.0.0.1."
        )
