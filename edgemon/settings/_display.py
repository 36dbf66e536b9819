"""Showing the settings safely: secrets masked, and warnings about file permissions."""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from edgemon.settings._models import Settings

_SECRET_WORDS = ("password", "secret", "token")
MASK = "***"


def is_secret_key(key: str) -> bool:
    """Whether a key holds a secret (a `*_file` key holds only where the secret is)."""
    return not key.endswith("_file") and any(word in key for word in _SECRET_WORDS)


def _mask(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {
        key: (None if item is None else MASK) if is_secret_key(key) else _mask(item)
        for key, item in value.items()
    }


def masked_dump(settings: Settings) -> dict[str, Any]:
    """The settings as JSON-ready data, every password, secret or token that is set as `***`."""
    dumped: dict[str, Any] = _mask(settings.model_dump(mode="json"))
    return dumped


def permission_warnings(settings: Settings, config_path: Path | None = None) -> list[str]:
    """Warnings for secret files readable by group or others, and for a config file others
    can read (it maps the deployment: broker, credential files, devices) or that group or
    others can change (anyone who can could point the daemon at another broker)."""
    warnings: list[str] = []
    secret_files = {
        "mqtt.password_file": settings.mqtt.password_file,
        "mqtt.key_file": settings.mqtt.key_file,
        "http.key_file": settings.http.key_file,
        "http.basic_auth_password_file": settings.http.basic_auth_password_file,
    }
    for key, path in secret_files.items():
        mode = _mode(path)
        if mode is not None and mode & (stat.S_IRGRP | stat.S_IROTH):
            warnings.append(
                f"{key}: {path} is readable by group or others (mode {mode:04o}); "
                "make it 0600, owned by the user the daemon runs as"
            )
    mode = _mode(config_path)
    if mode is not None and mode & (stat.S_IWGRP | stat.S_IWOTH):
        warnings.append(
            f"{config_path} is writable by group or others (mode {mode:04o}); "
            "anyone who can write it can redirect the daemon"
        )
    if mode is not None and mode & stat.S_IROTH:
        warnings.append(
            f"{config_path} is readable by others (mode {mode:04o}); it names the broker, the "
            "credentials' files and the devices: make it 0640, group of the daemon's user"
        )
    return warnings


def _mode(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
