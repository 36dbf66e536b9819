"""Reading the settings: the TOML file, then the environment, then flags, merged and checked."""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import EnvSettingsSource, SettingsError

from edgemon.settings._display import is_secret_key
from edgemon.settings._errors import ConfigError, CrossFieldError
from edgemon.settings._models import ENV_PREFIX, DeviceSettings, Settings

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from pydantic_core import ErrorDetails

DEFAULT_CONFIG_PATH = Path("/etc/edgemon/edgemon.toml")

#: Secret keys that the config file may not hold, and the key to use instead.
_FILE_ONLY_SECRETS: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("mqtt", "password"): "mqtt.password_file",
        ("http", "basic_auth_password"): "http.basic_auth_password_file",
    }
)
#: Path keys whose relative values in the file are taken relative to the file's directory.
_PATH_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "mqtt": ("password_file", "ca_file", "cert_file", "key_file"),
        "http": ("cert_file", "key_file", "basic_auth_password_file"),
        "state": ("dir",),
    }
)
#: How each pydantic error type reads, with its context values filled in.
_MESSAGES: Mapping[str, str] = MappingProxyType(
    {
        "greater_than_equal": "must be ≥ {ge}",
        "greater_than": "must be > {gt}",
        "less_than_equal": "must be ≤ {le}",
        "less_than": "must be < {lt}",
        "literal_error": "must be {expected}",
        "int_parsing": "must be an integer",
        "int_from_float": "must be an integer",
        "int_type": "must be an integer",
        "float_parsing": "must be a number",
        "float_type": "must be a number",
        "finite_number": "must be a finite number",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "string_too_short": "must not be empty",
        "string_pattern_mismatch": "must match {pattern}",
        "path_type": "must be a path",
        "path_not_file": "no such file",
        "model_type": "must be a table",
        "model_attributes_type": "must be a table",
        "dict_type": "must be a table",
    }
)
_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def resolve_config_path(
    path: Path | None, *, default_path: Path | None = DEFAULT_CONFIG_PATH
) -> Path | None:
    """The file to read: `path`, which must exist, else `default_path` if it exists.

    `default_path=None` means no file unless one is named (e.g. replay: defaults only).
    """
    if path is None:
        return default_path if default_path is not None and default_path.exists() else None
    if not path.exists():
        raise ConfigError([f"{path}: no such file"], source=str(path))
    return path


def load_settings(
    path: Path | None = None,
    *,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
    environ: Mapping[str, str] | None = None,
    default_path: Path | None = DEFAULT_CONFIG_PATH,
) -> Settings:
    """Read the file (see `resolve_config_path`), apply the environment, then `overrides`.

    `overrides` are flags, by section and key: `{"slack": {"player": "rebuffer"}}`.
    `environ` defaults to `os.environ`, read now. Raises `ConfigError` with every problem.
    """
    config_path = resolve_config_path(path, default_path=default_path)
    source = str(config_path) if config_path is not None else "the settings (no config file)"
    problems: list[str] = []
    file_data = _read_file(config_path, problems) if config_path is not None else {}
    if problems:  # a file that cannot be parsed has nothing more to say
        raise ConfigError(problems, source=source)
    file_data = _take_out_secrets(file_data, problems)
    env_data = _environment_data(os.environ if environ is None else environ, problems)
    flags = overrides or {}
    try:
        settings = Settings(**_merge(_merge(file_data, env_data), flags))
    except ValidationError as exc:
        for error in exc.errors():
            problems.extend(_describe(error, env_data, flags))
    else:
        problems.extend(_secret_problems(settings))
    if problems:
        raise ConfigError(problems, source=source)
    return settings


#: `EDGEMON_GATE_*` configure the engine-side gate and scheduler (docs/client.md), not the daemon.
_OTHER_PREFIXES = (f"{ENV_PREFIX}GATE_",)


def environment_warnings(environ: Mapping[str, str]) -> list[str]:
    """`EDGEMON_*` variables that set nothing: a setting is `EDGEMON_<SECTION>__<KEY>` (two
    underscores), so `EDGEMON_SLACK_DEFAULT_MARGIN_MS` would otherwise be ignored silently.
    (Names with `__` that match no setting are errors, reported by `load_settings`.)"""
    warnings = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or "__" in name or upper.startswith(_OTHER_PREFIXES):
            continue
        rest = name[len(ENV_PREFIX) :]
        section = next((f for f in Settings.model_fields if rest.lower().startswith(f + "_")), None)
        hint = ""
        if section is not None:
            hint = f" (did you mean {ENV_PREFIX}{section.upper()}__{rest[len(section) + 1 :]}?)"
        warnings.append(
            f"{name}: not an edgemon setting, ignored; settings are "
            f"{ENV_PREFIX}<SECTION>__<KEY>, with two underscores{hint}"
        )
    return warnings


def _read_file(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        problems.append(f"cannot read {path}: {exc.strerror}")
        return {}
    except UnicodeDecodeError:
        problems.append(f"{path} is not UTF-8 text")
        return {}
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"TOML syntax error: {exc}")
        return {}
    for section, keys in _PATH_KEYS.items():
        table = data.get(section)
        if not isinstance(table, dict):
            continue
        for key in keys:
            value = table.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                table[key] = str(path.parent / value)
    return data


def _take_out_secrets(data: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Refuse secrets written into the file itself (they would end up in backups and logs)."""
    for (section, key), instead in _FILE_ONLY_SECRETS.items():
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            data = {**data, section: {k: v for k, v in table.items() if k != key}}
            problems.append(
                f"{section}.{key}: secrets are not read from the config file; name a file "
                f"in {instead} or set {ENV_PREFIX}{section.upper()}__{key.upper()}"
            )
    return data


def _environment_data(environ: Mapping[str, str], problems: list[str]) -> dict[str, Any]:
    """`EDGEMON_SLACK__DEFAULT_MARGIN_MS=120` as `{"slack": {"default_margin_ms": "120"}}`."""
    ours = {name: value for name, value in environ.items() if name.upper().startswith(ENV_PREFIX)}
    for name in sorted(ours):
        section, nested, _ = name[len(ENV_PREFIX) :].partition("__")
        if nested and section.lower() not in Settings.model_fields:
            problems.append(f"{name}: no such section [{section.lower()}]")
    # Device ids are case-sensitive topic levels: read them here, as written, instead of
    # through pydantic-settings, which folds every variable name to lower case.
    devices: dict[str, dict[str, str]] = {}
    for name in [name for name in ours if name.count("__") == 2]:
        section, device, key = name[len(ENV_PREFIX) :].split("__")
        if section.lower() == "devices":
            devices.setdefault(device, {})[key.lower()] = ours.pop(name)
    source = EnvSettingsSource(Settings)
    source.env_vars = {name.lower(): value for name, value in ours.items()}
    try:
        data: dict[str, Any] = source()
    except SettingsError as exc:
        problems.append(f"environment: {exc}")
        return {}
    if devices:
        data["devices"] = _merge(data.get("devices", {}), devices)
    return data


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` over `base`, table by table."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge(below, value)
        else:
            merged[key] = value
    return merged


def _secret_problems(settings: Settings) -> list[str]:
    """Password files that cannot be read, found now rather than at the first connection."""
    problems: list[str] = []
    for resolve in (settings.mqtt.resolve_password, settings.http.resolve_basic_auth_password):
        try:
            resolve()
        except ConfigError as exc:
            problems.extend(exc.problems)
    return problems


def _describe(
    error: ErrorDetails, env_data: Mapping[str, Any], flags: Mapping[str, Any]
) -> list[str]:
    """One pydantic error as lines `section.key: what is wrong (got value)`."""
    loc = tuple(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx", {})
    cause = ctx.get("error")
    if isinstance(cause, CrossFieldError):
        return [f"{_dotted((*loc, key))}: {message}" for key, message in cause.problems]
    if loc[-1:] == ("[key]",):  # a dict key, i.e. a device id
        return [f"{_dotted(loc[:-1])}: invalid device id, must match {ctx.get('pattern')}"]
    if kind == "extra_forbidden":
        parent = tuple(str(part) for part in loc[:-1])
        message = "unknown key" if parent else "unknown section"
        close = difflib.get_close_matches(str(loc[-1]), list(_known_keys(parent)), n=1)
        message += f" (did you mean {_dotted((*parent, close[0]))}?)" if close else ""
    elif kind == "value_error" and cause is not None:
        message = str(cause)
    elif kind in _MESSAGES:
        message = _MESSAGES[kind].format(**{key: _whole_as_int(val) for key, val in ctx.items()})
    else:
        message = error["msg"]
    value = error.get("input")
    secret = any(is_secret_key(str(part)) for part in loc)
    if kind != "extra_forbidden" and not secret and isinstance(value, str | int | float):
        message += f" (got {value!r})"
    if _contains(env_data, loc) and not _contains(flags, loc):
        message += f" (from {ENV_PREFIX}{'__'.join(str(part).upper() for part in loc)})"
    return [f"{_dotted(loc)}: {message}"]


def _known_keys(parent: tuple[str, ...]) -> Iterable[str]:
    """The keys allowed under `parent`, to suggest the one an unknown key was meant to be."""
    if not parent:
        return Settings.model_fields
    if parent[0] == "devices":
        return DeviceSettings.model_fields if len(parent) == 2 else ()
    annotation = Settings.model_fields[parent[0]].annotation
    if len(parent) == 1 and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.model_fields
    return ()


def _dotted(loc: Sequence[str | int]) -> str:
    """`("devices", "cam.1", "margin_ms")` as `devices."cam.1".margin_ms`, as TOML writes it."""
    return ".".join(
        str(part)
        if isinstance(part, str) and set(part) <= _BARE_KEY and part
        else json.dumps(str(part), ensure_ascii=False)
        for part in loc
    )


def _contains(data: Mapping[str, Any], loc: Sequence[str | int]) -> bool:
    node: Any = data
    for part in loc:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _whole_as_int(value: object) -> object:
    """A whole float as an int (a limit of 5.0 reads "5"), anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
