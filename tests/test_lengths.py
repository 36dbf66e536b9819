"""Request lengths predicted from prompts (`edgemon.policy.lengths`), checked against a
naive reference that refits from scratch after every finished request."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemon.policy.lengths import (
    HALF_LIFE,
    KEPT,
    MIN_FINISHED,
    OUTLIVED_SHARE,
    PRIOR_FRAMES,
    LengthModel,
)

from properties import examples


class NaiveLengths:
    """The same estimator, written plainly: the weighted least-squares fit recomputed over
    every request seen, each residual taken against the fit as it stood when its request
    finished, the mean remaining life a plain average over the kept residuals."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float]] = []
        self.residuals: list[float] = []

    def fit(self) -> tuple[float, float]:
        k = 0.5 ** (1.0 / HALF_LIFE)
        n = len(self.seen)
        weights = [k ** (n - 1 - i) for i in range(n)]
        total = sum(weights)
        mx = sum(w * x for w, (x, _) in zip(weights, self.seen, strict=True)) / total
        my = sum(w * y for w, (_, y) in zip(weights, self.seen, strict=True)) / total
        vx = sum(w * x * x for w, (x, _) in zip(weights, self.seen, strict=True)) / total - mx**2
        cxy = sum(w * x * y for w, (x, y) in zip(weights, self.seen, strict=True)) / total
        b = 0.0 if vx < 1e-6 else (cxy - mx * my) / vx
        return my - b * mx, b

    def learn(self, prompt: int, frames: int) -> None:
        self.seen.append((math.log(max(1, prompt)), math.log(frames)))
        if len(self.seen) < MIN_FINISHED:
            return
        a, b = self.fit()
        if len(self.seen) == MIN_FINISHED:
            self.residuals = [math.exp(y - (a + b * x)) for x, y in self.seen]
        else:
            x, y = self.seen[-1]
            self.residuals.append(math.exp(y - (a + b * x)))
        self.residuals = self.residuals[-KEPT:]

    def remaining(self, prompt: int, emitted: int) -> float:
        if len(self.seen) < MIN_FINISHED:
            mean = (
                statistics.fmean(math.exp(y) for _, y in self.seen) if self.seen else PRIOR_FRAMES
            )
            left = mean - emitted if emitted < mean else OUTLIVED_SHARE * emitted
            return max(1.0, left)
        a, b = self.fit()
        median = math.exp(a + b * math.log(max(1, prompt)))
        above = [r for r in self.residuals if r > emitted / median]
        if not above:
            return max(1.0, OUTLIVED_SHARE * emitted)
        return max(1.0, median * statistics.fmean(above) - emitted)


finished = st.lists(
    st.tuples(st.integers(1, 2000), st.integers(1, 400)), min_size=0, max_size=KEPT + 40
)


@settings(max_examples=examples(60), deadline=None)
@given(history=finished, prompt=st.integers(1, 2000), emitted=st.integers(0, 500))
def test_predictions_match_the_naive_reference(
    history: list[tuple[int, int]], prompt: int, emitted: int
) -> None:
    """After any finished requests, the prediction for any prompt and frames emitted is the
    naive reference's (the sorted residuals, their suffix sums and their eviction)."""
    model, naive = LengthModel(), NaiveLengths()
    for p, f in history:
        model.learn(p, f)
        naive.learn(p, f)
    assert model.remaining(prompt, emitted) == pytest.approx(
        naive.remaining(prompt, emitted), rel=1e-6
    )


@settings(max_examples=examples(60), deadline=None)
@given(history=finished, prompt=st.integers(1, 2000))
def test_what_is_expected_in_all_never_falls_as_frames_are_emitted(
    history: list[tuple[int, int]], prompt: int
) -> None:
    """Frames emitted plus frames predicted still to come never decrease: a request that
    has gone on is expected to end no earlier than it was before (E[F | F > e] grows)."""
    model = LengthModel()
    for p, f in history:
        model.learn(p, f)
    totals = [e + model.remaining(prompt, e) for e in range(0, 500, 7)]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(totals))


def test_speech_in_proportion_to_its_text_is_predicted_from_the_prompt() -> None:
    """Requests that speak 3 frames a prompt token: once learned, a 40-token prompt is
    expected to speak 120 frames, and after 100 of them, 20 more."""
    model = LengthModel()
    for prompt in range(10, 200, 3):
        model.learn(prompt, 3 * prompt)
    assert model.expected(40) == pytest.approx(120.0, rel=1e-6)
    assert model.remaining(40, 100) == pytest.approx(20.0, rel=1e-6)


def test_a_cap_bounds_the_prediction_and_alone_predicts_nothing() -> None:
    """The client's `max_tokens` caps what is left; a generous cap changes nothing."""
    model = LengthModel()
    for prompt in range(10, 200, 3):
        model.learn(prompt, 3 * prompt)
    assert model.remaining(40, 100, max_frames=110) == pytest.approx(10.0)
    assert model.remaining(40, 100, max_frames=4096) == pytest.approx(20.0, rel=1e-6)


def test_before_any_request_finished_the_prior_stands() -> None:
    """With nothing learned, a request is expected to take the prior; one that outlived it
    a tenth of what it said; then the mean of the first ones finished."""
    model = LengthModel(prior_frames=100.0)
    assert model.expected(30) == 100.0
    assert model.remaining(30, 60) == 40.0
    assert model.remaining(30, 200) == pytest.approx(20.0)
    model.learn(30, 60)
    model.learn(30, 80)
    assert model.expected(500) == pytest.approx(70.0)


def test_bad_settings_are_refused() -> None:
    """A prior that is not a positive number is a ValueError naming it."""
    with pytest.raises(ValueError, match="prior_frames"):
        LengthModel(prior_frames=0.0)
