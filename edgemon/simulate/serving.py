"""vLLM's own admission and prefill flags, as an operator sets them on `vllm serve`.

Besides `--max-num-seqs` (the running batch), vLLM 0.32 has:

- `--max-num-queued-reqs M`: the API server answers HTTP 503 to a request that arrives while
  M requests are in flight (`current + 1 > M`; waiting, running and preempted alike,
  `AsyncLLM.check_admission`);
- `--max-num-queued-tokens T`: it answers 503 while the prefill backlog (the whole prompt of
  every request that has not yet produced its first token, a partly prefilled one included)
  is at least T; the new request's own prompt is not counted, so the backlog may pass T by
  one prompt;
- `--max-num-batched-tokens B`: the tokens one step may schedule. The running requests take
  theirs first, in the order they were admitted (a decode one token, a prefill under way what
  it still needs), then waiting requests start in arrival order with what is left;
- `--long-prefill-token-threshold L`: the most prompt tokens one request may prefill in a
  step, when more than one request is running or waiting.

`Serving` holds the flags and applies the API server's check (`refuses`); the simulated engine
(`edgemon.simulate.engine`) applies the rest. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Serving:
    """vLLM's flags besides `--max-num-seqs` (None: the flag is not set)."""

    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    max_num_batched_tokens: int | None = None
    """None: the profile's."""
    long_prefill_token_threshold: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_num_queued_reqs",
            "max_num_queued_tokens",
            "max_num_batched_tokens",
            "long_prefill_token_threshold",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1, not {value}")

    @property
    def limits_arrivals(self) -> bool:
        """Whether the API server may refuse a request at arrival."""
        return self.max_num_queued_reqs is not None or self.max_num_queued_tokens is not None

    def refuses(self, in_flight: int, backlog_tokens: int) -> bool:
        """Whether the API server answers 503 to a request arriving while `in_flight`
        requests are waiting or running and `backlog_tokens` prompt tokens have not yet
        produced a first token."""
        reqs, tokens = self.max_num_queued_reqs, self.max_num_queued_tokens
        return (reqs is not None and in_flight + 1 > reqs) or (
            tokens is not None and backlog_tokens >= tokens
        )

    def prefill_chunk(self, needed: int, budget: int, *, alone: bool) -> int:
        """Prompt tokens a request that still needs `needed` prefills this step, with `budget`
        tokens left (`alone`: no other request is running or waiting, so the threshold does not
        apply)."""
        threshold = self.long_prefill_token_threshold
        take = min(needed, budget)
        return take if threshold is None or alone else min(take, threshold)

    def flags(self) -> str:
        """The flags as `vllm serve` takes them."""
        named = (
            ("--max-num-queued-reqs", self.max_num_queued_reqs),
            ("--max-num-queued-tokens", self.max_num_queued_tokens),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--long-prefill-token-threshold", self.long_prefill_token_threshold),
        )
        return " ".join(f"{flag} {value}" for flag, value in named if value is not None)


OPEN_SERVING = Serving()
"""vLLM's defaults: no admission limit, the profile's token budget, no threshold."""
