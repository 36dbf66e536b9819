"""The one broker-URL parser: the rules every caller shares, and the two a caller chooses."""

from __future__ import annotations

import pytest

from edgemon.broker_url import Broker, BrokerUrlError, parse_broker_url
from edgemon.protocol import check_topic_prefix, topic_prefix_problem
from edgemon.settings import parse_mqtt_url


@pytest.mark.parametrize(
    "url",
    ["h:1883", "tcp://h", "mqtt://", "mqtt://h:0", "mqtt://h:99999", "mqtt://h/x", "mqtt://[zz"],
)
def test_both_callers_refuse_what_is_no_broker_url(url: str) -> None:
    """A URL without the mqtt(s) scheme, a host, a valid port, or with a path, is refused by
    the clients and by the daemon's settings alike."""
    with pytest.raises(BrokerUrlError):
        parse_broker_url(url)
    with pytest.raises(ValueError, match=r"^(must|has)"):
        parse_mqtt_url(url)


def test_credentials_in_the_url_are_the_clients_alone() -> None:
    """The clients take percent-encoded credentials from the URL; the daemon's settings
    refuse them (its password comes from a file, never from a URL)."""
    broker = parse_broker_url("mqtts://a%40b:p%3Aw@h")
    assert (broker.username, broker.password, broker.port, broker.tls) == ("a@b", "p:w", 8883, True)
    with pytest.raises(ValueError, match="must not hold credentials"):
        parse_mqtt_url("mqtt://u:p@h")


def test_embedded_is_the_daemons_alone() -> None:
    """`embedded` names the daemon's in-process broker; to a client it is no URL."""
    assert parse_mqtt_url("embedded") == Broker("127.0.0.1", 1883, embedded=True)
    with pytest.raises(BrokerUrlError, match="broker URL 'embedded' must be"):
        parse_broker_url("embedded")


def test_a_refused_url_never_shows_its_password() -> None:
    """The error names the URL with its password masked."""
    with pytest.raises(BrokerUrlError) as refused:
        parse_broker_url("mqtt://u:secret@h/path")
    assert "secret" not in str(refused.value)
    assert "u:***@h" in str(refused.value)


@pytest.mark.parametrize("prefix", ["", "/a", "a/", "a//b", "a/+", "#", "$SYS/x", "a\x00b"])
def test_one_topic_prefix_rule(prefix: str) -> None:
    """The clients and the settings refuse the same topic prefixes, for the same reason."""
    problem = topic_prefix_problem(prefix)
    assert problem is not None
    with pytest.raises(ValueError, match=r"topic prefix .* must"):
        check_topic_prefix(prefix)
    assert check_topic_prefix("site/a/edgemon") == "site/a/edgemon"
