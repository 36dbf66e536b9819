"""What the daemon does with the engine's outputs: throttle changes are published (unless a
restart is still catching up) and logged at info; rejections go to the rate-limited
rejection log; a forgotten device's retained throttle is cleared; per-stream transitions are
counted for the devices' summaries (and logged at debug only: a struggling stream has one or
two per chunk)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemon.engine.outputs import DeviceForgotten, Rejected, ThrottleChanged

if TYPE_CHECKING:
    from edgemon.daemon.catchup import CatchUp
    from edgemon.daemon.digest import DeviceDigest
    from edgemon.daemon.logs import RejectionLog
    from edgemon.daemon.publisher import ThrottlePublisher
    from edgemon.engine.outputs import Output


class Dispatcher:
    """`dispatcher(outputs)` acts on each output, in order."""

    __slots__ = ("_catchup", "_digest", "_log", "_publisher", "_rejections")

    def __init__(
        self,
        *,
        digest: DeviceDigest,
        rejections: RejectionLog,
        publisher: ThrottlePublisher,
        catchup: CatchUp,
        log: Any,
    ) -> None:
        self._digest = digest
        self._rejections = rejections
        self._publisher = publisher
        self._catchup = catchup
        self._log = log

    def __call__(self, outputs: list[Output]) -> None:
        note = self._digest.note
        log = self._log
        for output in outputs:
            if note(output):
                continue
            if isinstance(output, ThrottleChanged):
                if not self._catchup.active:
                    self._publisher.submit(output)
                log.info(
                    "throttle_changed",
                    device=output.device,
                    active=output.active,
                    t_ms=output.t_ms,
                    streams=list(output.streams),
                    min_headroom_ms=output.min_headroom_ms,
                )
            elif isinstance(output, Rejected):
                self._rejections(output)
            elif isinstance(output, DeviceForgotten):
                self._publisher.forget(output.device)
                log.info("device_forgotten", device=output.device)
