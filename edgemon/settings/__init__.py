"""The daemon's settings (README): one TOML file, the environment and a few flags.

Precedence, highest first: `overrides` (command-line flags), environment variables
`EDGEMON_<SECTION>__<KEY>`, the file, the defaults. `load_settings` is the one place where
they are merged; building a `Settings` directly never reads the environment, so tests and
SIGHUP reloads see exactly what they are given. Secrets (passwords) come from files named in
the config or from the environment, never from the config file itself, and are never shown.
"""

from __future__ import annotations

from edgemon.broker_url import Broker
from edgemon.settings._display import masked_dump, permission_warnings
from edgemon.settings._errors import ConfigError
from edgemon.settings._loading import (
    DEFAULT_CONFIG_PATH,
    environment_warnings,
    load_settings,
    resolve_config_path,
)
from edgemon.settings._models import (
    DEFAULT_STATE_DIR,
    DEVICE_ID_PATTERN,
    ENV_PREFIX,
    DeviceSettings,
    HttpSettings,
    LimitsSettings,
    LogSettings,
    MqttSettings,
    Settings,
    SlackSettings,
    SloSettings,
    StateSettings,
    parse_listen,
    parse_mqtt_url,
)

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_STATE_DIR",
    "DEVICE_ID_PATTERN",
    "ENV_PREFIX",
    "Broker",
    "ConfigError",
    "DeviceSettings",
    "HttpSettings",
    "LimitsSettings",
    "LogSettings",
    "MqttSettings",
    "Settings",
    "SlackSettings",
    "SloSettings",
    "StateSettings",
    "environment_warnings",
    "load_settings",
    "masked_dump",
    "parse_listen",
    "parse_mqtt_url",
    "permission_warnings",
    "resolve_config_path",
]
