"""What an operator sets without edgemon, and what the peers do: vLLM's admission and prefill
flags (`edgemon.simulate.serving`) and the pacing by estimated buffers
(`edgemon.simulate.estimated`), as the simulated engine applies them."""

from __future__ import annotations

import pytest

from edgemon.simulate.engine import TtsEngine
from edgemon.simulate.estimated import EstimatedEdf, EstimatedPark, PacingSetting, Stream
from edgemon.simulate.policies import policy
from edgemon.simulate.profiles import JETSON, X86_GPU
from edgemon.simulate.serving import Serving
from edgemon.simulate.workload import Request


def request(name: str, prompt: int = 100, frames: int = 60, at: float = 0.0) -> Request:
    """A request arriving at `at` ms."""
    return Request(name, at, prompt_tokens=prompt, frames=frames)


def run_until(engine: TtsEngine, t_end: float, t: float = 0.0) -> float:
    """Step `engine` until `t_end` (or until it has nothing to run); the time reached."""
    while t < t_end and (step := engine.step(t)) is not None:
        t = step.end_ms
    return t


def test_the_api_server_refuses_once_m_requests_are_in_flight() -> None:
    """`--max-num-queued-reqs M` (vLLM's `current + 1 > M`): running and waiting requests
    both count; the M+1-th is refused at arrival, and a seat frees with the next finish."""
    engine = TtsEngine(JETSON, max_num_seqs=2, serving=Serving(max_num_queued_reqs=3))
    assert all(engine.submit(request(f"r{i}", frames=6)) for i in range(3))
    engine.step(0.0)
    assert (engine.running, engine.waiting) == (2, 1)
    assert not engine.submit(request("r3"))
    run_until(engine, 10_000.0)
    assert engine.submit(request("r4"))


def test_the_backlog_limit_counts_whole_prompts_until_their_first_frame() -> None:
    """`--max-num-queued-tokens T`: refused while the prompts of requests without a first
    frame (waiting, or admitted and still prefilling) add up to T; the new prompt is not
    counted, so the backlog may pass T by one prompt."""
    serving = Serving(max_num_queued_tokens=500, max_num_batched_tokens=256)
    engine = TtsEngine(JETSON, serving=serving)
    assert engine.submit(request("a", prompt=400))
    assert engine.submit(request("b", prompt=400))  # backlog 400 < 500 before it
    assert not engine.submit(request("c", prompt=10))  # backlog 800 ≥ 500
    engine.step(0.0)  # a takes 256 of its 400 tokens: still no first frame
    assert not engine.submit(request("c", prompt=10))
    engine.step(100.0)  # a finishes its prefill (first frame); b starts: 112 of 400
    assert engine.submit(request("c", prompt=10))  # backlog 400


def test_the_long_prefill_threshold_spreads_a_prompt_over_steps() -> None:
    """`--long-prefill-token-threshold 64`: with another request in the engine, a 200-token
    prompt prefills 64 tokens a step; alone, it takes what the budget allows."""
    serving = Serving(long_prefill_token_threshold=64)
    engine = TtsEngine(JETSON, serving=serving)
    engine.submit(request("a", prompt=200))
    engine.submit(request("b", prompt=200))
    first = engine.step(0.0)
    assert first is not None
    assert first.prefill_tokens == 128  # 64 each
    alone = TtsEngine(JETSON, serving=serving)
    alone.submit(request("a", prompt=200))
    step = alone.step(0.0)
    assert step is not None
    assert step.prefill_tokens == 200


def test_the_flags_read_as_vllm_takes_them() -> None:
    """`Serving.flags()` is the command line of the same settings; bad ones are refused."""
    assert Serving(max_num_queued_reqs=12, long_prefill_token_threshold=64).flags() == (
        "--max-num-queued-reqs 12 --long-prefill-token-threshold 64"
    )
    with pytest.raises(ValueError, match="max_num_queued_tokens"):
        Serving(max_num_queued_tokens=0)


@pytest.mark.parametrize(
    ("text", "cap", "serving"),
    [
        ("queued:10:12", 10, Serving(max_num_queued_reqs=12)),
        ("tokens:10:400", 10, Serving(max_num_queued_tokens=400)),
        (
            "queued:10:10+chunked:256:64",
            10,
            Serving(
                max_num_queued_reqs=10, max_num_batched_tokens=256, long_prefill_token_threshold=64
            ),
        ),
    ],
)
def test_static_configurations_parse_into_vllms_flags(
    text: str, cap: int, serving: Serving
) -> None:
    """Each static configuration sets `max_num_seqs` and exactly the flags it names."""
    parsed = policy(text, JETSON)
    assert (parsed.max_num_seqs, parsed.serving, parsed.kind) == (cap, serving, "cap")


def test_the_peers_pacing_parses_with_its_defaults() -> None:
    """`estimated-park` takes sglang-omni's 1000/400 ms; `estimated-edf`'s window is the
    profile's N* unless given."""
    assert policy("estimated-park", JETSON).pacing == PacingSetting("park", 1000.0, 400.0)
    assert policy("estimated-park:800:200", JETSON).pacing == PacingSetting("park", 800.0, 200.0)
    assert policy("estimated-edf", X86_GPU).pacing == PacingSetting("edf", window=68)
    assert policy("estimated-edf:5", JETSON).kind == "estimated"
    with pytest.raises(ValueError, match="RESUME_MS"):
        policy("estimated-park:400:800", JETSON)
    with pytest.raises(ValueError, match="whole number"):
        policy("queued:10:0", JETSON)


def stream(name: str, first: float | None, sent: float, arrival: float = 0.0) -> Stream:
    """A running stream as the server sees it."""
    return Stream(name, arrival, first, sent)


def test_a_stream_far_ahead_is_parked_until_its_lead_would_be_down_to_the_resume_lead() -> None:
    """Lead = audio sent − time since the first chunk: 2000 − 600 = 1400 ms > 1000 parks it,
    to wake 1000 ms later (lead 400); a stream with nothing sent is never parked."""
    park = EstimatedPark()
    streams = [stream("ahead", 0.0, 2000.0), stream("behind", 0.0, 900.0), stream("new", None, 0)]
    assert park.held(600.0, streams, free_rows=0) == {"ahead"}
    assert park.held(1599.0, streams, free_rows=4) == {"ahead"}
    assert park.held(1600.0, [], free_rows=4) == frozenset()


def test_parked_streams_rejoin_four_a_step_into_free_rows_unless_overdue() -> None:
    """At most `max_resume` wake per step, and none without a free row, unless the most
    overdue has waited more than 200 ms past its wake."""
    park = EstimatedPark()
    streams = [stream(f"s{i}", 0.0, 3000.0) for i in range(6)]
    park.held(0.0, streams, free_rows=0)
    assert len(park.held(2600.0, [], free_rows=0)) == 6  # due at 2600, no row
    assert len(park.held(2700.0, [], free_rows=10)) == 2  # four woke
    overdue = EstimatedPark()
    overdue.held(0.0, streams, free_rows=0)
    assert len(overdue.held(2801.0, [], free_rows=0)) == 5  # one, overdue


def test_edf_decodes_the_window_earliest_due() -> None:
    """Due = first chunk sent + audio sent (estimated run-dry), or arrival + start SLO for a
    stream that sent nothing; beyond the window, the latest due sit the step out."""
    edf = EstimatedEdf(window=2, start_slo_ms=3000.0)
    streams = [
        stream("rich", 0.0, 5000.0),
        stream("poor", 0.0, 500.0),
        stream("new", None, 0.0, arrival=1000.0),  # due at 4000
    ]
    assert edf.held(100.0, streams, free_rows=0) == {"rich"}
    assert edf.held(100.0, streams[:2], free_rows=0) == frozenset()


def test_the_engine_leaves_parked_streams_out_and_gives_their_rows_away() -> None:
    """With `estimated-park` a stream far ahead decodes no frames while parked, and a parked
    stream frees its row: with one row, a second request starts while the first is parked,
    and steps then decode one of the two."""
    engine = TtsEngine(JETSON, max_num_seqs=1, pacing=EstimatedPark())
    engine.submit(request("a", prompt=10, frames=400))
    engine.submit(request("b", prompt=10, frames=400))
    t, shared = 0.0, 0
    while t < 20_000.0:
        step = engine.step(t)
        if step is None:  # both parked: the engine waits for one to wake
            t += 5.0
            continue
        shared += engine.running == 2 and step.decode_seqs == 1
        t = step.end_ms
    assert shared > 0
