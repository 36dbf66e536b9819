"""Budget-aware admission in the virtual loop (`edgemon.simulate.budget`): the costs it learns
from the steps, what it admits and spends, how policies name it, and that it is a no-op when
its budget never binds."""

from __future__ import annotations

import dataclasses

import pytest

from edgemon.simulate.budget import BudgetSetting, SpendableBudget
from edgemon.simulate.loop import LoopPlan, run_loop
from edgemon.simulate.policies import policy
from edgemon.simulate.profiles import JETSON

STEP = JETSON.step


def taught(setting: BudgetSetting) -> SpendableBudget:
    """A budget that has seen `jetson`'s steps: decodes of 4..14 and prefills of 100..500
    tokens next to 6 decodes, each lasting what the profile's model says."""
    budget = SpendableBudget(setting, frame_ms=JETSON.frame_ms)
    for _ in range(20):
        for n in range(4, 15):
            budget.observe(n, 0, STEP.step_ms(0, n))
        for tokens in (100, 300, 500):
            budget.observe(6, tokens, STEP.step_ms(tokens, 6))
    return budget


def test_the_costs_are_learned_from_the_steps_it_runs() -> None:
    """A prompt's cost is its prefill (0.2 ms a token on `jetson`) plus one decode (4 ms) in
    each of the `ahead_frames` next steps, as the profile's step model says."""
    budget = taught(BudgetSetting(ahead_frames=10.0, mode="stale"))
    assert budget.prefill_ms_per_token == pytest.approx(STEP.per_prefill_token_ms)
    assert budget.cost_ms(300) == pytest.approx(300 * 0.2 + 10 * 4.0)


def test_without_a_published_budget_or_known_costs_everything_fits() -> None:
    """Fail-open: no throttle object with a budget yet, or no step measured yet, admits (as a
    gate that ignores the field)."""
    unknown_costs = SpendableBudget(BudgetSetting())
    unknown_costs.published(-500.0)
    assert unknown_costs.admit(2000)
    no_budget = taught(BudgetSetting())
    assert no_budget.admit(2000)
    assert no_budget.refused == 0


def test_a_request_is_admitted_only_while_its_cost_fits_and_spends_it() -> None:
    """Budget 150 ms, allowance 0, no frames ahead: a 300-token prompt (60 ms) fits twice, the
    third does not (30 ms left) and is counted refused; with an allowance of 40 ms it fits."""
    budget = taught(BudgetSetting(ahead_frames=0.0, mode="stale"))
    budget.published(150.0)
    assert budget.admit(300)
    assert budget.admit(300)
    assert not budget.admit(300)
    assert budget.refused == 1
    assert budget.budget_ms == pytest.approx(30.0)
    loose = taught(BudgetSetting(ahead_frames=0.0, allowance_ms=40.0, mode="stale"))
    loose.published(30.0)
    assert loose.admit(300)


@pytest.mark.parametrize(("mode", "after"), [("refill", 30.0 + 3 * 10.0), ("stale", 30.0)])
def test_refill_credits_each_measured_step_with_what_its_frame_bought(
    mode: str, after: float
) -> None:
    """`refill`: each decoding step adds `frame − step` (80 − 70 ms here) to the budget;
    `stale`: the budget only changes with a throttle object or an admission."""
    budget = taught(BudgetSetting(mode="refill" if mode == "refill" else "stale"))
    budget.published(30.0)
    for _ in range(3):
        budget.observe(10, 0, 70.0)
    assert budget.budget_ms == pytest.approx(after)


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("realtime+budget", BudgetSetting()),
        ("budget:6", BudgetSetting(ahead_frames=6.0)),
        ("budget:0:40", BudgetSetting(ahead_frames=0.0, allowance_ms=40.0)),
        ("budget:0:120:fresh", BudgetSetting(ahead_frames=0.0, allowance_ms=120.0, mode="fresh")),
    ],
)
def test_budget_policies_parse_into_their_setting(text: str, setting: BudgetSetting) -> None:
    """`budget[:FRAMES[:ALLOW_MS[:MODE]]]`, each word optional from the right."""
    assert policy(text, JETSON).budget == setting


def test_edgemon_is_a_part_too() -> None:
    """`edgemon+budget` is the shipped policy with budget-aware admission added."""
    shipped = policy("edgemon", JETSON)
    both = policy("edgemon+budget", JETSON)
    assert both.budget == BudgetSetting()
    assert dataclasses.replace(both, label="edgemon", budget=None) == shipped


def edgemon_plan(*, seed: int, duration_ms: float) -> LoopPlan:
    """`edgemon`'s loop (real-time admission, the gate with a lasting 1100 ms release) on
    jetson at 0.9 of its capacity, without a budget."""
    return LoopPlan(
        profile=JETSON,
        rate_rps=0.9 * JETSON.capacity_rps(),
        seed=seed,
        duration_ms=duration_ms,
        policy=policy("realtime+lasting:80:1100", JETSON),
    )


def with_budget(plan: LoopPlan, budget: BudgetSetting) -> LoopPlan:
    """`plan` with its policy's admissions bounded by `budget`."""
    return dataclasses.replace(plan, policy=dataclasses.replace(plan.policy, budget=budget))


@pytest.mark.parametrize("text", ["budget:0:40:often", "budget:x", "budget:1:2:fresh:4"])
def test_a_bad_budget_is_refused_naming_the_policy(text: str) -> None:
    """A mode that is not refill/stale/fresh, a word that is not a number, or too many words."""
    with pytest.raises(ValueError, match="budget"):
        policy(text, JETSON)


def test_a_budget_that_never_binds_changes_nothing() -> None:
    """With an allowance beyond any cost the loop's run is the same as without the budget
    (what a gate that ignores the field does), in each mode."""
    base = edgemon_plan(seed=4, duration_ms=60_000.0)
    plain = run_loop(base)
    for mode in ("refill", "stale", "fresh"):
        loose = BudgetSetting(allowance_ms=1e9, mode=mode)
        assert run_loop(with_budget(base, loose)).score == plain.score


def test_a_binding_budget_moves_silence_from_gaps_to_starts() -> None:
    """Near capacity, admitting only what fits the throttle objects' budget leaves less gap
    silence and more start silence than the same policy without it (seed 1, 0.9 load)."""
    base = edgemon_plan(seed=1, duration_ms=120_000.0)
    plain = run_loop(base).score
    held = run_loop(with_budget(base, BudgetSetting())).score
    assert held.gap_silence_s < plain.gap_silence_s
    assert held.start_silence_s > plain.start_silence_s
