"""Full garbage collections at moments the daemon chooses (`edgemon.daemon.gcpacer`)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import TYPE_CHECKING

import pytest

from edgemon.daemon.gcpacer import GcPacer

if TYPE_CHECKING:
    from collections.abc import Iterator


class Cycle:
    """An object in a reference cycle with itself (only the cycle collector frees it)."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Leave the frozen generation as it was found: empty."""
    yield
    gc.unfreeze()


@pytest.mark.asyncio
async def test_no_automatic_full_collection_while_paced_and_thresholds_restored() -> None:
    """While the pacer runs, generation 2's threshold is out of reach (generations 0 and 1
    keep theirs); once it stops, the process's thresholds are what they were."""
    before = gc.get_threshold()
    pacer = GcPacer(lambda: None, interval_s=3600.0)
    task = asyncio.create_task(pacer.run())
    await asyncio.sleep(0)
    paced = gc.get_threshold()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert paced[:2] == before[:2]
    assert paced[2] > 1_000_000
    assert gc.get_threshold() == before


@pytest.mark.usefixtures("unfrozen")
def test_rounds_freeze_survivors_and_every_nth_reclaims_frozen_cycles() -> None:
    """A round collects what is not frozen and freezes the survivors; a cycle that became
    garbage after it was frozen survives ordinary rounds and is freed by the round that
    unfreezes first."""
    pacer = GcPacer(lambda: None, unfreeze_every=3)
    young = Cycle()
    young_ref = weakref.ref(young)
    del young
    pacer.collect()  # round 1: collects the young cycle, freezes the rest
    assert young_ref() is None
    assert gc.get_freeze_count() > 0

    frozen = Cycle()
    frozen_ref = weakref.ref(frozen)
    pacer.collect()  # round 2: `frozen` survives (still referenced) and is frozen
    del frozen
    pacer.collect()  # round 3 unfreezes first: the frozen cycle, now garbage, is freed
    assert frozen_ref() is None
    assert pacer.rounds == 3


@pytest.mark.usefixtures("unfrozen")
def test_frozen_garbage_waits_for_the_unfreezing_round() -> None:
    """Between unfreezing rounds a frozen cycle that became garbage is not scanned (that is
    what makes ordinary rounds cheap)."""
    pacer = GcPacer(lambda: None, unfreeze_every=100)
    frozen = Cycle()
    frozen_ref = weakref.ref(frozen)
    pacer.collect()
    del frozen
    pacer.collect()
    assert frozen_ref() is not None


@pytest.mark.asyncio
@pytest.mark.usefixtures("unfrozen")
async def test_a_round_waits_until_no_transition_is_near() -> None:
    """With a transition due within the clearance, the round starts only once it has
    passed (here: the deadline is reported near until the clock passes it)."""
    loop = asyncio.get_running_loop()
    due = loop.time() + 0.03

    def until_deadline() -> float | None:
        left = (due - loop.time()) * 1000.0
        return left if left > 0 else None

    started: list[float] = []
    collected = asyncio.Event()

    class Recording(GcPacer):
        def collect(self) -> None:
            started.append(loop.time())
            super().collect()
            collected.set()

    pacer = Recording(until_deadline, interval_s=0.0, clear_ms=50.0, max_wait_s=5.0)
    task = asyncio.create_task(pacer.run())
    async with asyncio.timeout(5):
        await collected.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert started[0] >= due
