"""The admission policy the simulator and edgemon's vLLM schedulers share: pure and
clock-free (the caller passes measurements and `now` in), importing no engine, no simulator
and no I/O.

- `edgemon.policy.realtime`: real-time admission, the batch whose decode step fits a frame;
- `edgemon.policy.deadlines`: start deadlines, from which requests are admitted, queued or
  shed (its values and settings in `edgemon.policy.values`);
- `edgemon.policy.lengths`: request lengths predicted from prompts;
- `edgemon.policy.estimates`: what a server can estimate of its players' buffers;
- `edgemon.policy.announced`: the step estimate a server announces to its players.
"""

from __future__ import annotations
