"""The engine's replay output against the naive reference (``tests/reference.py``).

Every property feeds one generated trace (``tests/strategies.py``) to ``edgemon.replay.replay``
and to the reference, and compares the JSON lines of README. Replay is expected to run its
virtual clock past the last message until every stream has been removed, so expiries,
completions and throttle releases after the last message are part of the output.

Inputs are integers, so every value is exact except an ``eta_ms`` taken from a gap EWMA
(``0.3 * gap + 0.7 * ewma``); those are compared to 1e-9, and ``at_risk`` is not compared
where such a headroom is within 1e-6 of the margin.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edgemon.engine.config import EngineConfig, SlackPolicy
from edgemon.replay import replay

from properties import examples
from reference import Reference, headroom_of
from strategies import FOUND_EARLIER_T_MS, PLAYERS, Message, Scenario, scenarios

if TYPE_CHECKING:
    from edgemon.engine.config import PlayerModel

Line = dict[str, Any]

PROPERTY = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
FEWER = settings(PROPERTY, max_examples=examples(120))

#: Order of line kinds at one instant: messages and timers, then the throttle, then samples.
RANK = {"stream_end": 0, "underrun": 0, "throttle": 1, "sample": 2}


def run(sc: Scenario, *, samples: bool = False) -> dict[str, list[Line]]:
    """Replay the scenario; its lines grouped by kind (the summary checked to come last)."""
    lines = list(replay(sc.records(), sc.config, sample_ms=sc.sample_ms if samples else None))
    assert lines, "replay yields at least the summary"
    assert lines[-1]["kind"] == "summary"
    assert [line["kind"] for line in lines].count("summary") == 1
    grouped: dict[str, list[Line]] = defaultdict(list)
    for line in lines:
        grouped[line["kind"]].append(line)
    return grouped


def same(got: object, want: float) -> bool:
    """Exact for an integral expectation, else equal to 1e-9 (values from a gap EWMA)."""
    if not isinstance(got, int | float) or isinstance(got, bool):
        return False
    if float(want).is_integer():
        return got == want
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)


def sample_mismatches(got: dict[tuple[float, str, str], Line], sc: Scenario) -> list[str]:
    """What differs between the engine's samples and the reference's, field by field."""
    want = Reference(sc.events, sc.config).samples(sc.sample_ms)
    problems = [f"missing sample {key}" for key in sorted(want.keys() - got.keys())]
    problems += [f"unexpected sample {key}: {got[key]}" for key in sorted(got.keys() - want.keys())]
    for key in sorted(want.keys() & got.keys()):
        line, expected = got[key], want[key]
        for name in ("slack_ms", "eta_ms", "headroom_ms"):
            if not same(line[name], expected[name]):
                problems.append(f"{key} {name}: engine {line[name]!r}, reference {expected[name]}")
        headroom = expected["headroom_ms"]
        borderline = not float(headroom).is_integer() and abs(headroom - expected["margin"]) < 1e-6
        if not borderline and line["at_risk"] is not expected["at_risk"]:
            problems.append(f"{key} at_risk: engine {line['at_risk']!r}, reference {expected}")
    return problems


def samples_by_key(lines: list[Line]) -> dict[tuple[float, str, str], Line]:
    """Sample lines keyed by (t_ms, device, stream), each key checked to occur once."""
    keys = [(line["t_ms"], line["device"], line["stream"]) for line in lines]
    assert len(keys) == len(set(keys)), "a stream is sampled at most once per instant"
    return dict(zip(keys, lines, strict=True))


@pytest.mark.slow  # a property: many generated examples
@pytest.mark.parametrize("player", PLAYERS)
@FEWER
@given(data=st.data())
def test_samples_match_reference(player: PlayerModel, data: st.DataObject) -> None:
    """Samples: exactly the live streams at multiples of sample_ms, with the reference's values.

    Traces with delivery jitter (a later message may carry a smaller t_ms), equal timestamps,
    eta_ms 0 or absent (gap EWMA), duplicates, gaps, final chunks, both clocks, and batches.
    """
    sc = data.draw(scenarios(player=player))
    got = samples_by_key(run(sc, samples=True)["sample"])
    assert sample_mismatches(got, sc) == []


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(scenarios(eta_always=True))
@example(sc=FOUND_EARLIER_T_MS)
def test_samples_are_exact_with_integer_inputs(sc: Scenario) -> None:
    """With eta_ms on every chunk all sample values are integers and equal the reference's."""
    got = samples_by_key(run(sc, samples=True)["sample"])
    assert sample_mismatches(got, sc) == []
    for line in got.values():
        assert float(line["headroom_ms"]).is_integer()


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(scenarios(in_order=True))
def test_underruns_match_reference(sc: Scenario) -> None:
    """One `underrun` line at each instant the reference's underrun predicate begins to hold."""
    want = Counter(
        (u.device, u.stream, u.begin) for u in Reference(sc.events, sc.config).underruns()
    )
    got = Counter((line["device"], line["stream"], line["t_ms"]) for line in run(sc)["underrun"])
    assert got == want


def throttle_mismatches(lines: list[Line], ref: Reference) -> list[str]:
    """What differs between the engine's throttle lines and the reference's transitions."""
    problems: list[str] = []
    for device in ref.devices:
        mine = [line for line in lines if line["device"] == device]
        want = ref.throttle(device)
        got_changes = [(line["t_ms"], line["active"]) for line in mine]
        want_changes = [(c.t, c.active) for c in want]
        if got_changes != want_changes:
            problems.append(f"{device}: engine {got_changes}, reference {want_changes}")
            continue
        for line, change in zip(mine, want, strict=True):
            streams = line["streams"]
            if set(streams) != change.streams or len(streams) != len(change.streams):
                problems.append(f"{device} at {change.t}: streams {streams}, want {change.streams}")
            elif [change.headrooms[s] for s in streams] != sorted(
                change.headrooms[s] for s in streams
            ):
                problems.append(f"{device} at {change.t}: streams {streams} not by lowest headroom")
            if line["min_headroom_ms"] != change.min_headroom:
                problems.append(
                    f"{device} at {change.t}: min_headroom_ms {line['min_headroom_ms']}, "
                    f"want {change.min_headroom}"
                )
    unknown = {line["device"] for line in lines} - set(ref.devices)
    problems += [f"throttle line for unknown device {d}" for d in sorted(unknown)]
    return problems


def throttle_on(lines: list[Line], device: str, t: float) -> bool:
    """The engine's throttle state on (t, t + 1), from its transition lines."""
    state = False
    for line in lines:
        if line["device"] == device and line["t_ms"] <= t:
            state = line["active"]
    return state


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(scenarios(in_order=True, eta_always=True, hysteresis_ms=0, min_on_ms=0))
def test_throttle_without_hysteresis_is_any_stream_at_risk(sc: Scenario) -> None:
    """hysteresis 0, min-on 0: transitions equal the reference's, and between transitions the
    throttle is ON exactly when some live stream of the device has headroom < margin."""
    ref = Reference(sc.events, sc.config)
    lines = run(sc)["throttle"]
    assert throttle_mismatches(lines, ref) == []
    for device in ref.devices:
        for k in range(math.floor(ref.horizon(device)) + 2):
            live = ref.live_views(device, k)
            at_risk = any(headroom_of(v, k + 0.5) < v.margin for v in live.values())
            assert throttle_on(lines, device, k) is at_risk, (device, k)


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(scenarios(in_order=True, eta_always=True))
def test_throttle_with_hysteresis_and_min_on_matches_reference(sc: Scenario) -> None:
    """Random hysteresis and min-on: the same transitions, stream lists and minimum headroom."""
    ref = Reference(sc.events, sc.config)
    assert throttle_mismatches(run(sc)["throttle"], ref) == []


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(
    st.tuples(st.integers(1, 60), st.integers(0, 400)).flatmap(
        lambda hm: scenarios(in_order=True, eta_always=True, hysteresis_ms=hm[0], min_on_ms=hm[1])
    )
)
def test_throttle_release_waits_for_hysteresis_and_min_on(sc: Scenario) -> None:
    """Never OFF while a live stream has headroom < margin + hysteresis just after; every ON
    lasts at least min_on_ms; ON only when a live stream is at risk; ON and OFF alternate."""
    ref = Reference(sc.events, sc.config)
    policy = sc.config.slack
    lines = run(sc)["throttle"]
    for device in ref.devices:
        mine = [line for line in lines if line["device"] == device]
        assert [line["active"] for line in mine] == [i % 2 == 0 for i in range(len(mine))]
        for on, off in zip(mine[::2], mine[1::2], strict=False):
            assert off["t_ms"] - on["t_ms"] >= policy.min_on_ms
        for line in mine:
            k = line["t_ms"]
            assert float(k).is_integer()
            live = ref.live_views(device, k)
            if line["active"]:
                assert any(headroom_of(v, k + 0.5) < v.margin for v in live.values())
            else:
                assert all(
                    headroom_of(v, k + 0.5) >= v.margin + policy.hysteresis_ms
                    for v in live.values()
                )


def check_stream_ends(sc: Scenario, lines: list[Line], *, fields: tuple[str, ...]) -> None:
    """One `stream_end` per stream, with the reference's values for ``fields``."""
    want = Reference(sc.events, sc.config).stream_ends()
    keys = [(line["device"], line["stream"]) for line in lines]
    assert sorted(keys) == sorted(want), "exactly one stream_end per stream"
    for line in lines:
        expected = want[line["device"], line["stream"]]
        for name in fields:
            if expected[name] is None and name == "underrun_ms":
                continue  # an underrun still open at removal: its duration is not defined
            assert line[name] == expected[name], (name, line, expected)


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(scenarios(in_order=True))
def test_stream_ends_match_reference(sc: Scenario) -> None:
    """stream_end: instant, reason, chunks and audio applied, underruns, underrun time (when
    every underrun was ended by a chunk), minimum slack before a chunk, and the service
    level: the longest gap (one open at removal lasting until then) and the outcome under
    the scenario's `[slo]`."""
    fields = (
        "t_ms",
        "reason",
        "chunks",
        "audio_ms",
        "underruns",
        "underrun_ms",
        "min_slack_ms",
        "longest_gap_ms",
        "outcome",
    )
    check_stream_ends(sc, run(sc)["stream_end"], fields=fields)


@pytest.mark.slow  # a property: many generated examples
@FEWER
@given(scenarios())
def test_stream_ends_with_delivery_jitter(sc: Scenario) -> None:
    """With jitter the removal instant, reason and chunk and audio counts still match."""
    check_stream_ends(sc, run(sc)["stream_end"], fields=("t_ms", "reason", "chunks", "audio_ms"))


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(scenarios())
def test_duplicates_are_rejected(sc: Scenario) -> None:
    """Each duplicate chunk (and only those) gives a `rejected` line with reason `duplicate`."""
    prefix = sc.config.topic_prefix
    want = Counter(
        (recv, f"{prefix}/{device}/events", reason)
        for recv, device, reason in Reference(sc.events, sc.config).rejected()
    )
    got = Counter((line["recv_ms"], line["topic"], line["reason"]) for line in run(sc)["rejected"])
    assert got == want


@pytest.mark.slow  # a property: many generated examples
@FEWER
@given(scenarios(in_order=True))
def test_summary_counts(sc: Scenario) -> None:
    """The summary counts messages, events applied, rejections, streams, underruns and
    engagements (``events`` read as events applied: ``events + rejected`` is every event)."""
    out = run(sc)
    ref = Reference(sc.events, sc.config)
    (summary,) = out["summary"]
    assert summary["messages"] == len(sc.messages)
    assert summary["rejected"] == len(out["rejected"]) == len(ref.rejected())
    assert summary["events"] == len(sc.events) - len(ref.rejected())
    assert summary["streams"] == len(ref.removals())
    assert summary["underruns"] == len(ref.underruns())
    assert summary["throttle_engagements"] == sum(line["active"] for line in out["throttle"])


@pytest.mark.slow  # a property: many generated examples
@FEWER
@given(scenarios())
def test_lines_are_in_time_order(sc: Scenario) -> None:
    """Per device, lines come in device-time order; at one instant removals and underruns come
    before the throttle decision, and samples last. An `underrun` line is written when the
    underrun is known (docs/semantics.md) with the instant it began: with delivery jitter a late
    chunk can show that the buffer ran dry before edgemon's clock for the device now, so
    in jittered traces its place is checked only against the lines that follow it."""
    records = sc.records()
    lines = list(replay(records, sc.config, sample_ms=sc.sample_ms))
    per_device: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for line in lines:
        if line["kind"] == "underrun" and not sc.in_order:
            continue
        if line["kind"] in RANK:
            per_device[line["device"]].append((line["t_ms"], RANK[line["kind"]]))
    for order in per_device.values():
        assert order == sorted(order)
    rejected = [line["recv_ms"] for line in lines if line["kind"] == "rejected"]
    assert rejected == sorted(rejected)


# ---------------------------------------------------------------- worked examples, end to end
def scenario(
    *events: dict[str, Any], hysteresis: int = 20, min_on: int = 250, sample_ms: int = 50
) -> Scenario:
    """Events on device ``d0``, received when they happen (trust clock); events with equal
    ``t_ms`` go in one batch. Nothing arrives late, so nothing waits for late chunks."""
    policy = SlackPolicy(
        hysteresis_ms=hysteresis,
        min_on_ms=min_on,
        stream_idle_timeout_ms=1000,
        clock="trust",
        allowed_lateness_ms=0,
    )
    messages: list[Message] = []
    for e in events:
        if messages and messages[-1].recv_ms == e["t_ms"]:
            messages[-1] = Message(e["t_ms"], "d0", (*messages[-1].events, e), batch=True)
        else:
            messages.append(Message(e["t_ms"], "d0", (e,), batch=False))
    return Scenario(EngineConfig(slack=policy), tuple(messages), sample_ms, in_order=True)


def chunk(t: int, seq: int, audio: int, **extra: Any) -> dict[str, Any]:
    """A chunk of stream ``s0``."""
    return {"type": "chunk", "stream": "s0", "t_ms": t, "seq": seq, "audio_ms": audio, **extra}


def test_worked_example_slack_and_underrun() -> None:
    """Chunks (0, 200), (150, 200), (500, 200): slack 100 at 100, 250 at 150, 0 at 400, 100 at
    500; underruns begin at 400 and 600; expired at 1600 with min slack -100."""
    sc = scenario(chunk(0, 0, 200), chunk(150, 1, 200), chunk(500, 2, 200))
    out = run(sc, samples=True)
    slack = {line["t_ms"]: line["slack_ms"] for line in out["sample"]}
    assert (slack[100], slack[150], slack[400], slack[500]) == (100, 250, 0, 100)
    assert [line["t_ms"] for line in out["underrun"]] == [400, 600]
    (end,) = out["stream_end"]
    assert (end["t_ms"], end["reason"], end["chunks"], end["audio_ms"]) == (1600, "expired", 3, 600)
    assert (end["underruns"], end["min_slack_ms"]) == (2, -100)
    assert max(slack) == 1550


def test_worked_example_throttle() -> None:
    """Headroom reaches margin 80 at 220 (ON); a chunk at 250 lifts it to 90: with hysteresis 0
    and min-on 50 OFF at 270, ON again at 310, OFF at 1390 when the stream expires; with
    hysteresis 20 it stays ON until then."""
    events = (chunk(0, 0, 300, eta_ms=100), chunk(250, 1, 90, eta_ms=50))
    lines = run(scenario(*events, hysteresis=0, min_on=50))["throttle"]
    assert [(line["t_ms"], line["active"]) for line in lines] == [
        (220, True),
        (270, False),
        (310, True),
        (1390, False),
    ]
    assert (lines[0]["streams"], lines[0]["min_headroom_ms"]) == (["s0"], 80)
    lines = run(scenario(*events, hysteresis=20, min_on=50))["throttle"]
    assert [(line["t_ms"], line["active"]) for line in lines] == [(220, True), (1390, False)]


def test_worked_example_duplicate_and_gap() -> None:
    """A repeated seq is rejected as duplicate; a gap with audio_total_ms resynchronises."""
    dup = chunk(0, 0, 200)
    sc = scenario(chunk(0, 0, 200), chunk(100, 2, 100, audio_total_ms=500))
    sc = Scenario(
        sc.config,
        (sc.messages[0], Message(50, "d0", (dup,), batch=False), sc.messages[1]),
        sc.sample_ms,
        in_order=True,
    )
    out = run(sc, samples=True)
    assert [(line["recv_ms"], line["reason"]) for line in out["rejected"]] == [(50, "duplicate")]
    assert {line["t_ms"]: line["slack_ms"] for line in out["sample"]}[100] == 400


def test_sample_at_a_falling_crossing_uses_the_strict_formula() -> None:
    """A sample is the formula at its instant (semantics.md: headroom < margin, strict), while a
    transition reports the state just after its instant (docs/semantics.md). Headroom reaches
    margin 80 at 220 and falls: the sample at 220 is not at risk, the throttle line at 220
    already lists the stream, and the sample at 240 is at risk."""
    out = run(scenario(chunk(0, 0, 300, eta_ms=100), sample_ms=20), samples=True)
    sample = {line["t_ms"]: line for line in out["sample"]}
    assert (sample[200]["headroom_ms"], sample[200]["at_risk"]) == (100, False)
    assert (sample[220]["headroom_ms"], sample[220]["at_risk"]) == (80, False)
    assert (sample[240]["headroom_ms"], sample[240]["at_risk"]) == (60, True)
    assert (out["throttle"][0]["t_ms"], out["throttle"][0]["streams"]) == (220, ["s0"])


def test_underrun_is_judged_after_all_messages_of_an_instant() -> None:
    """Messages at one instant all apply before the underrun check ("a chunk with t_i = t
    counts at t"): a first chunk that alone would leave start + B = t, followed at the same
    instant by another chunk, begins no underrun then; the underrun begins at 150."""
    first = chunk(50, 0, 50, play_start_ms=0)
    out = run(scenario(first, chunk(50, 1, 100)))
    assert [line["t_ms"] for line in out["underrun"]] == [150]
