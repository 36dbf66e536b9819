"""`benchmarks/real_engine.py`'s parts that need no vLLM: the policies as server options, the
players' prompts and step estimate, the model's dimensions, and its flags.

The real loop itself runs in the vLLM tier (`tests/vllm/test_real_engine.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _real_model import SIZES, config  # noqa: E402
from _real_players import StepEstimate, prompt_ids  # noqa: E402
from _real_server import MIDDLEWARE, SCHEDULERS, server_options  # noqa: E402

from edgemon.simulate.profiles import CPU_VLLM  # noqa: E402
from edgemon.simulate.workload import Request  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "real_engine.py"


def options(text: str) -> tuple[tuple[str, ...], dict[str, str], str | None]:
    """The server's arguments, environment and gated device for policy `text`."""
    made = server_options(
        text, CPU_VLLM, broker_url="mqtt://127.0.0.1:1", device="box", start_slo_ms=3000.0
    )
    return made.args, made.env, made.device


def test_each_policy_becomes_the_server_a_user_would_run() -> None:
    """open: vLLM's scheduler with the profile's limits; cap:N: --max-num-seqs N; realtime:
    edgemon's real-time scheduler without a gate; edgemon: that scheduler with the deadline
    policy shedding, the gate on the device and the shedding middleware."""
    args, env, device = options("open")
    assert args == ("--max-num-batched-tokens", "512", "--max-num-seqs", "16")
    assert (env, device) == ({}, None)
    args, _, _ = options("cap:10")
    assert args[-2:] == ("--max-num-seqs", "10")
    args, env, device = options("realtime")
    assert args[-2:] == ("--scheduler-cls", SCHEDULERS)
    assert (env, device) == ({"EDGEMON_REALTIME_FRAME_MS": "80"}, None)
    args, env, device = options("edgemon")
    assert args[-4:] == ("--scheduler-cls", SCHEDULERS, "--middleware", MIDDLEWARE)
    assert env == {
        "EDGEMON_REALTIME_FRAME_MS": "80",
        "EDGEMON_GATE_DEVICE": "box",
        "EDGEMON_GATE_BROKER": "mqtt://127.0.0.1:1",
        "EDGEMON_DEADLINES": "shed",
        "EDGEMON_SLO_START_MS": "3000",
    }
    assert device == "box"
    for text in ("cap:0", "gate:80:2000", "edgemon+budget"):
        with pytest.raises(ValueError, match="open, cap:N, realtime or edgemon"):
            options(text)


def test_prompts_are_the_request_length_seeded_per_request_and_never_specials() -> None:
    """A prompt has the request's token count, is the same for the same seed and request, and
    differs between requests (no shared prefix for vLLM to cache)."""
    one = Request("r1", 0.0, prompt_tokens=300, frames=10)
    two = Request("r2", 0.0, prompt_tokens=300, frames=10)
    first = prompt_ids(one, 7, 8192)
    assert len(first) == 300
    assert first == prompt_ids(one, 7, 8192)
    assert first[:8] != prompt_ids(two, 7, 8192)[:8]
    assert first[:8] != prompt_ids(one, 8, 8192)[:8]
    assert 4 <= min(first) <= max(first) < 8192


def test_the_step_estimate_weighs_one_step_of_n_streams_as_one_step() -> None:
    """Ten streams each seeing one 1,000 ms stall move the estimate as one 1,000 ms step
    would move an engine's EWMA (about 0.2 of the way), not ten times over."""
    step = StepEstimate(streams=10)
    step.interval(40.0)
    assert step.ms == 40.0
    for _ in range(10):
        step.interval(1000.0)
    assert step.ms is not None
    assert 200.0 < step.ms < 240.0


def test_the_default_model_is_a_117m_llama_in_fp32() -> None:
    """The default size's dimensions and parameter count (embeddings and the untied output
    layer included), as its config says."""
    size = SIZES["117m"]
    assert 117_000_000 < size.parameters() < 117_500_000
    made = config(size)
    assert made["architectures"] == ["LlamaForCausalLM"]
    assert (made["dtype"], made["num_hidden_layers"], made["vocab_size"]) == ("float32", 14, 8192)


@pytest.mark.integration  # runs the benchmark as a process
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--policy", "gate:80:2000"], "open, cap:N, realtime or edgemon"),
        (["--scenario", "contention", "--contention", "20:60:1"], "--contention"),
        (["--contention", "20:60"], "--contention W:P:SHARE"),
        (["--seeds", "x"], "--seeds"),
        (["--load", "0"], "--load"),
        (["--frame-ms", "0"], "--frame-ms"),
        (["--duration", "-1"], "--duration"),
    ],
)
def test_bad_flags_say_what_is_wrong_in_one_line(args: list[str], words: str) -> None:
    """Bad input: exit status 2, one line on stderr naming the flag, nothing started."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert words in line
