"""The daemon's lifecycle: build everything once from Settings, run named tasks, stop cleanly.

Like uvicorn's server: signal handlers only set flags; one `asyncio.TaskGroup` owns the named
tasks `http`, `mqtt-ingest`, `publisher`, `scheduler`, `watchdog` and `reloader`. On
SIGTERM/SIGINT intake stops, the timer stops, every throttled device gets `throttle: false`,
the status goes `offline`, the session is closed, and `run()` returns 0, all within
`shutdown_timeout_s` (4 s: below the 5 s promised and far below systemd's stop timeout);
what is still running then is cancelled and named in the log. A second signal cancels at
once. SIGHUP reloads the config file into the running engine, keeping every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from edgemon import __version__
from edgemon.adapters.http import (
    basic_auth_from_settings,
    create_app,
    serve,
    ssl_context_from_files,
)
from edgemon.adapters.metrics import build_registry
from edgemon.adapters.state import ConnectionState
from edgemon.daemon.clock import MonotonicWallClock
from edgemon.daemon.logs import RejectionLog
from edgemon.daemon.mqtt import LinkHooks, MqttLink
from edgemon.daemon.publisher import PublishError, SeqSource, ThrottlePublisher
from edgemon.daemon.scheduler import Scheduler
from edgemon.daemon.state import StateStore
from edgemon.daemon.systemd import Notifier
from edgemon.engine.outputs import Rejected, StreamEnded, ThrottleChanged, UnderrunBegan
from edgemon.monitor import Monitor
from edgemon.settings import ConfigError
from edgemon.trace import TraceRecord, encode_record

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from edgemon.engine.outputs import Output
    from edgemon.settings import Settings

SHUTDOWN_TIMEOUT_S = 4.0
STATUS_EVERY_S = 5.0


class Daemon:
    """One edgemon daemon. `run()` until `request_stop()` (or a signal); returns the exit code."""

    def __init__(  # noqa: PLR0913 - keyword-only dependencies, each injectable
        self,
        settings: Settings,
        *,
        environ: Mapping[str, str],
        reload: Callable[[], Settings] | None = None,
        record: TextIO | None = None,
        clock: MonotonicWallClock | None = None,
        log: Any = None,
        shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
        install_signal_handlers: bool = True,
        snapshots: bool = True,
    ) -> None:
        self.settings = settings
        self.clock = clock or MonotonicWallClock()
        self.log = log if log is not None else structlog.get_logger("edgemon")
        self._reload_settings = reload
        self._record = record
        self._shutdown_timeout_s = shutdown_timeout_s
        self._install_signals = install_signal_handlers
        self.monitor = Monitor(settings.engine_config())
        #: Snapshots go to the state directory when it exists (systemd's StateDirectory=).
        state_dir = settings.state.dir
        self.state = StateStore(state_dir) if snapshots and state_dir.is_dir() else None
        self._restored = False
        self.connection = ConnectionState()
        self.notifier = Notifier(environ)
        self.registry = build_registry(
            self.monitor,
            wall_clock=self.clock.now_ms,
            connection=self.connection,
            per_stream_series=settings.limits.per_stream_series,
            version=__version__,
        )
        self._rejections = RejectionLog(self.log, now_ms=self.clock.now_ms)
        self.link = MqttLink(
            settings.mqtt,
            topics=self.monitor.topics,
            connection=self.connection,
            hooks=LinkHooks(
                on_message=self._on_message,
                on_drop=self._on_drop,
                status_payload=self._status_payload,
                on_subscribed=self._on_subscribed,
            ),
            log=self.log,
        )
        self.publisher = ThrottlePublisher(
            self.link, seq=SeqSource(self.clock), topic=self.monitor.topics.throttle
        )
        self.scheduler = Scheduler(self.monitor, clock=self.clock, handle=self._dispatch)
        self._out: list[Output] = []
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._reload = asyncio.Event()
        self._http_up = asyncio.Event()
        #: The port the HTTP server listens on, once it does.
        self.http_port: int | None = None
        #: Set once the first subscription is acknowledged (READY=1 is sent then).
        self.ready = asyncio.Event()

    # ------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Begin a clean shutdown (what SIGTERM and SIGINT do); a second call forces it."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    def request_reload(self) -> None:
        """Reload the config file (what SIGHUP does)."""
        self._reload.set()

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        """Run until stopped; 0 after a clean stop, 1 when a task failed."""
        self._install()
        try:
            return await self._run()
        finally:
            self._uninstall()
            self.notifier.close()

    async def _run(self) -> int:
        failed = False
        try:
            async with asyncio.TaskGroup() as group:
                http = group.create_task(self._serve_http(), name="http")
                await self._first(self._http_up.wait(), http)
                if http.done():
                    return 1  # the group re-raises the failure below
                ingest = group.create_task(
                    self.link.run(self._stop, self._farewell), name="mqtt-ingest"
                )
                scheduler = group.create_task(self.scheduler.run(), name="scheduler")
                rest = [
                    http,
                    group.create_task(self.publisher.run(), name="publisher"),
                    group.create_task(self._watchdog(), name="watchdog"),
                    group.create_task(self._reloader(), name="reloader"),
                    group.create_task(self._snapshots(), name="snapshots"),
                ]
                await self._first(self._stop.wait(), ingest)
                self.log.info("shutdown_started")
                self.notifier.stopping()
                scheduler.cancel()  # no more transitions after the releases are computed
                await self._finish(ingest)
                for task in rest:
                    task.cancel()
                await self._snapshot()  # after the releases: what a restart continues from
        except* Exception as group_error:
            failed = True
            for error in group_error.exceptions:
                self.log.error("daemon_failed", error=repr(error), exc_info=error)  # noqa: TRY400
        if failed:
            return 1
        self.log.info("shutdown_complete")
        return 0

    async def _finish(self, ingest: asyncio.Task[None]) -> None:
        """Let the ingest task say goodbye within the shutdown timeout, else cancel it."""
        forced = asyncio.ensure_future(self._force.wait())
        try:
            done, _ = await asyncio.wait(
                (ingest, forced), timeout=self._shutdown_timeout_s, return_when="FIRST_COMPLETED"
            )
        finally:
            forced.cancel()
        if ingest not in done:
            self.log.warning(
                "shutdown_cancelled",
                tasks=["mqtt-ingest"],
                reason="forced" if self._force.is_set() else "timeout",
                throttles_pending=self.publisher.pending,
            )
            ingest.cancel()

    @staticmethod
    async def _first(awaitable: Any, task: asyncio.Task[Any]) -> None:
        """Wait for `awaitable` or for `task` to end, whichever comes first."""
        waiter = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait((waiter, task), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    def _install(self) -> None:
        if not self._install_signals:
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)

    def _uninstall(self) -> None:
        if not self._install_signals:
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)

    # ------------------------------------------------------------------ tasks
    async def _serve_http(self) -> None:
        http = self.settings.http
        host, port = http.address
        ssl_context = None
        if http.cert_file is not None and http.key_file is not None:
            ssl_context = ssl_context_from_files(http.cert_file, http.key_file)
        app = create_app(
            registry=self.registry,
            monitor=self.monitor,
            connection=self.connection,
            wall_clock=self.clock.now_ms,
            basic_auth=basic_auth_from_settings(http),
        )
        async with serve(
            app, host=host, port=port, ssl_context=ssl_context, shutdown_timeout=1.0
        ) as bound:
            self.http_port = bound
            self.log.info("http_listening", host=host, port=bound)
            self._http_up.set()
            await asyncio.Future()  # until cancelled

    async def _watchdog(self) -> None:
        notifier = self.notifier
        if not notifier.enabled:
            return
        interval = notifier.watchdog_interval_s
        period = STATUS_EVERY_S if interval is None else min(interval, STATUS_EVERY_S)
        while True:
            if interval is not None:
                notifier.watchdog()  # this task running on time is the loop being healthy
            notifier.status(self.status_line())
            await asyncio.sleep(period)

    async def _reloader(self) -> None:
        while True:
            await self._reload.wait()
            self._reload.clear()
            self.reload()

    # ------------------------------------------------------------------ state
    def _restore(self) -> None:
        """Continue from the last snapshot, if any (a bad one is set aside, with a log)."""
        self._restored = True
        if self.state is None:
            self.log.warning("state_disabled", reason="no state directory", dir=str(
                self.settings.state.dir))  # fmt: skip
            return
        try:
            data = self.state.load()
            if data is not None:
                self.monitor.restore(data, self.clock.now_ms())
        except (OSError, ValueError) as exc:  # SnapshotError is a ValueError
            self.log.error("state_restore_failed", path=str(self.state.path), error=str(exc))  # noqa: TRY400
            return
        if data is not None:
            devices = list(self.monitor.engine.devices())
            self.log.info(
                "state_restored",
                devices=len(devices),
                streams=sum(len(device.streams) for device in devices),
            )

    async def _snapshots(self) -> None:
        while True:
            await asyncio.sleep(self.settings.state.snapshot_interval_s)
            await self._snapshot()

    async def _snapshot(self) -> None:
        """Take the state on the loop (it owns the engine); write it in a thread. Never before
        the last snapshot was restored: an empty state must not overwrite it."""
        if self.state is None or not self._restored:
            return
        data = self.monitor.snapshot(self.clock.now_ms())
        try:
            size = await asyncio.to_thread(self.state.save, data)
        except OSError as exc:
            self.log.error("snapshot_failed", path=str(self.state.path), error=str(exc))  # noqa: TRY400
            return
        self.log.debug("snapshot_written", bytes=size)

    def reload(self) -> bool:
        """Adopt the config file again, keeping every stream; False (and a log) if invalid."""
        if self._reload_settings is None:
            self.log.warning("config_reload_unavailable")
            return False
        try:
            new = self._reload_settings()
        except ConfigError as exc:
            # A bad file is expected input: its problems, not a traceback.
            self.log.error(  # noqa: TRY400
                "config_reload_failed", source=exc.source, problems=list(exc.problems)
            )
            return False
        restart = [
            section for section in ("mqtt", "http") if getattr(new, section) != getattr(
                self.settings, section
            )
        ]  # fmt: skip
        if new.mqtt.topic_prefix != self.settings.mqtt.topic_prefix:
            new = new.model_copy(update={"mqtt": new.mqtt.model_copy(
                update={"topic_prefix": self.settings.mqtt.topic_prefix}
            )})  # fmt: skip
        self.monitor.engine.reconfigure(new.engine_config(), self.clock.now_ms(), self._out)
        self._dispatch(self._out)
        self._out.clear()
        self.scheduler.poke()
        self.settings = new
        self.log.info("config_reloaded", needs_restart=restart)
        return True

    # ------------------------------------------------------------------ hot path
    def _on_message(self, topic: str, payload: bytes) -> None:
        """One MQTT message: record it, apply it, act on what it changed."""
        now = self.clock.now_ms()
        if self._record is not None:
            self._write_record(TraceRecord(now, topic, payload))
        out = self._out
        monitor = self.monitor
        try:
            monitor.advance(now, out, inclusive=False)  # as replay: due timers, then the message
            monitor.receive(topic, payload, now, out)
            monitor.advance(now, out)  # the throttle decision at this instant
        except Exception:  # no message may stop the daemon
            self.monitor.results["internal_error"] += 1
            self.log.exception("message_failed", topic=topic)
        if out:
            self._dispatch(out)
            out.clear()
        self.scheduler.poke()

    def _write_record(self, record: TraceRecord) -> None:
        assert self._record is not None
        try:
            self._record.write(encode_record(record) + "\n")
        except OSError as exc:  # a full disk stops the recording, not the daemon
            self.log.error("record_failed", error=str(exc))  # noqa: TRY400 - no traceback
            self._record = None

    def _on_drop(self, topic: str) -> None:
        self.monitor.messages += 1
        self._rejections(Rejected(self.clock.now_ms(), topic, None, "overloaded", "queue full"))
        self.monitor.results["overloaded"] += 1

    def _dispatch(self, outputs: list[Output]) -> None:
        log = self.log
        for output in outputs:
            if isinstance(output, ThrottleChanged):
                self.publisher.submit(output)
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
            elif isinstance(output, UnderrunBegan):
                log.info("underrun_began", device=output.device, stream=output.stream)
            elif isinstance(output, StreamEnded):
                log.debug("stream_ended", device=output.device, stream=output.stream,
                          reason=output.reason, underruns=output.underruns)  # fmt: skip

    # ------------------------------------------------------------------ edges
    def _on_subscribed(self) -> None:
        if not self.ready.is_set():
            # Restored now, not at process start: the devices' clocks resume when their
            # queued messages can flow (a broker still down at start costs no buffer), and
            # before the first of them is applied (the message pump starts after this).
            self._restore()
            self.ready.set()
            self.notifier.ready(self.status_line())

    async def _farewell(self) -> None:
        """Release every throttled device, then announce `offline` (still connected)."""
        releases: list[Output] = []
        self.monitor.engine.release_all(self.clock.now_ms(), releases)
        for release in releases:
            assert isinstance(release, ThrottleChanged)
            self.publisher.submit(release)
        released = len(releases)
        await self.publisher.drain()
        topic = self.monitor.topics.status(self.settings.mqtt.client_id)
        with contextlib.suppress(PublishError):
            await self.link.publish(topic, self._status_payload("offline"), qos=1, retain=True)
        self.log.info("farewell_published", throttles_released=released)

    def _status_payload(self, state: str) -> bytes:
        return json.dumps(
            {"state": state, "version": __version__, "t_ms": self.clock.now_ms()},
            separators=(",", ":"),
        ).encode()

    def status_line(self) -> str:
        """`STATUS=` text: devices, streams, throttled devices, broker state."""
        devices = list(self.monitor.engine.devices())
        streams = sum(len(device.streams) for device in devices)
        throttled = sum(device.throttle_on for device in devices)
        broker = "subscribed" if self.connection.ready else "broker unreachable"
        return f"{len(devices)} devices, {streams} streams, {throttled} throttled, {broker}"
