"""The deadline policy's settings in a vLLM engine's environment: what the players' prebuffer
adds to every start, by default the prebuffer docs/client.md recommends (the simulated
players' too), so the engine does not predict starts earlier than its listeners hear them."""

from __future__ import annotations

import pytest

from edgemon.integrations._vllm_deadlines import (
    ENV_PREBUFFER_MS,
    ENV_SECOND_CHUNK_FRAMES,
    PREBUFFER_MS,
    SECOND_CHUNK_FRAMES,
    settings_from_environ,
)


def test_by_default_a_start_includes_the_recommended_prebuffer() -> None:
    """Unset, the policy adds the recommended player's cushion and its wait for the second
    chunk (25 frames), as the simulated players do; shedding follows the mode."""
    settings = settings_from_environ({}, "shed")
    assert (settings.prebuffer_ms, settings.second_chunk_frames) == (200.0, 25)
    assert (PREBUFFER_MS, SECOND_CHUNK_FRAMES) == (200.0, 25)
    assert settings.shed


def test_the_environment_sets_both() -> None:
    """Players that prebuffer less (or a server with smaller chunks) say so."""
    settings = settings_from_environ(
        {ENV_PREBUFFER_MS: " 50 ", ENV_SECOND_CHUNK_FRAMES: "4"}, "hold"
    )
    assert (settings.prebuffer_ms, settings.second_chunk_frames) == (50.0, 4)
    assert not settings.shed


@pytest.mark.parametrize(
    ("name", "text", "what"),
    [
        (ENV_PREBUFFER_MS, "-1", "a number of milliseconds ≥ 0"),
        (ENV_PREBUFFER_MS, "nan", "a number of milliseconds ≥ 0"),
        (ENV_SECOND_CHUNK_FRAMES, "2.5", "a whole number of frames ≥ 0"),
        (ENV_SECOND_CHUNK_FRAMES, "many", "a whole number of frames ≥ 0"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, text: str, what: str) -> None:
    """A bad value stops the engine at start-up with the variable's name."""
    with pytest.raises(ValueError, match=name) as raised:
        settings_from_environ({name: text}, "hold")
    assert str(raised.value) == f"{name}: {text!r} is not {what}"
