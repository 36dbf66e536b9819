"""edgemon's parking in vLLM's own engine (`EDGEMON_PARKING`): a parked request sits steps
out with its KV blocks and its computed tokens kept, and resumes without recompute: vLLM
preempts nothing, and every request's greedy tokens are those it makes alone."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from edgemon.client.feed import stream_of

from mqtt_probe import probe

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokers import Broker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning"),
]

PROMPTS = {  # named as vLLM's OpenAI server names them (the engine adds `-` and 8 characters)
    "cmpl-a-0": [5, 6, 7, 8],
    "cmpl-b-0": [9, 10, 11],
    "cmpl-c-0": [12, 13, 14, 15, 16],
}
DEVICE = "cpu-box"
TOKENS = 64
WAIT_S = 120.0  # generous: a parked request rejoins on the wall clock


def _run(llm: Any, names: list[str], watch: Any = None) -> dict[str, list[int]]:
    """Add `names` at once and step the engine until they finish: their tokens."""
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True, detokenize=False)
    for name in names:
        engine.add_request(name, TokensPrompt(prompt_token_ids=PROMPTS[name]), params)
    done: dict[str, list[int]] = {}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        if watch is not None:
            watch()
        if not engine.has_unfinished_requests():
            return done
    raise AssertionError(f"not finished within {WAIT_S:g} s: {sorted(done)}")


def _preemptions(llm: Any) -> float:
    return sum(
        getattr(metric, "value", 0.0)
        for metric in llm.get_metrics()
        if metric.name == "vllm:num_preemptions"
    )


def test_a_parked_request_keeps_its_kv_and_resumes_without_recompute(
    edgemon_llm: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two seats, three requests: on the server's estimate the stream furthest ahead parks
    while the third waits. While parked it is out of no list of vLLM's, keeps the same KV
    blocks and computed tokens; it rejoins and finishes. vLLM counts no preemption, and
    each request's greedy tokens equal those it makes alone."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.delenv("EDGEMON_GATE_DEVICE", raising=False)
    monkeypatch.setenv("EDGEMON_PARKING", "estimated")
    llm = edgemon_llm(2, disable_log_stats=False)
    core = llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler
    parking = scheduler.edgemon_parking
    try:
        alone = {name: _run(llm, [name])[name] for name in PROMPTS}
        assert parking.parks == 0  # nobody waited: nobody parked

        seen: dict[str, tuple[Any, int]] = {}
        kept: list[str] = []

        def watch() -> None:
            for rid in parking.parked:
                request = scheduler.requests[rid]
                assert request in scheduler.running  # back in vLLM's list between steps
                state = (scheduler.kv_cache_manager.get_block_ids(rid), request.num_computed_tokens)
                if rid in seen:
                    assert seen[rid] == state  # nothing freed, nothing computed
                    kept.append(rid)
                seen[rid] = state
            for rid in list(seen):
                if rid not in parking.parked:
                    del seen[rid]

        together = _run(llm, list(PROMPTS), watch)
    finally:
        core.shutdown()
    assert parking.parks >= 1
    assert kept  # a request sat at least two steps out in a row
    assert together == alone
    assert all(len(tokens) == TOKENS for tokens in together.values())
    assert _preemptions(llm) == 0


def _feed(slack_ms: float) -> dict[str, Any]:
    """edgemon's slack feed of the device: stream `a` playing with `slack_ms` in hand."""
    now = time.time() * 1000.0
    stream = {"stream": "a", "slack_ms": slack_ms, "playing": True, "play_start_ms": now - 1e3}
    return {"device": DEVICE, "t_ms": now, "streams": [stream]}


def test_parking_on_the_slack_feed_parks_the_stream_its_player_says_is_ahead(
    edgemon_llm: Callable[..., Any], private_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`EDGEMON_PARKING=measured` reads edgemon's slack feed through a real Mosquitto and
    joins `cmpl-a-0-…` to stream `a`: while its player holds a minute of audio, `a` sits
    steps out for the waiting request; once the feed says it holds nothing, it rejoins and
    finishes with the tokens it makes alone, and the other streams (in no feed) never park."""
    host, port = private_broker.host, private_broker.port
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", f"mqtt://{host}:{port}")
    monkeypatch.setenv("EDGEMON_PARKING", "measured")
    topic = f"edgemon/v1/{DEVICE}/slack"
    with probe(host, port) as edgemon:
        llm = edgemon_llm(2, disable_log_stats=False)
        core = llm.llm_engine.engine_core.engine_core
        scheduler = core.scheduler
        parking = scheduler.edgemon_parking
        try:
            alone = {name: _run(llm, [name])[name] for name in PROMPTS}
            reader = parking.reader
            deadline = time.monotonic() + WAIT_S
            while reader.received == 0:  # QoS 0: published until the reader has subscribed
                assert time.monotonic() < deadline, "the engine never read the slack feed"
                edgemon.publish(topic, _feed(60_000.0), retain=False)
            parked: set[str] = set()

            def watch() -> None:
                parked.update(parking.parked)
                if parking.parked:
                    edgemon.publish(topic, _feed(0.0), retain=False)  # it rejoins

            together = _run(llm, list(PROMPTS), watch)
        finally:
            core.shutdown()
    assert {stream_of(rid) for rid in parked} == {"a"}
    assert together == alone
    assert _preemptions(llm) == 0
