"""The daemon's lifecycle: build everything once from Settings, run named tasks, stop cleanly.

Like uvicorn's server: signal handlers only set flags; one `asyncio.TaskGroup` owns the named
tasks `http`, `mqtt-ingest`, `publisher`, `deadline-timer`, `watchdog`, `log-summaries`,
`reloader`, `snapshots`, `catch-up`, `slack-feed` (unless `[mqtt] feed_ms = 0`) and, with
`[http] agent_listen`, `agent`. Every message
is logged (write-ahead log), applied on the loop as it is read, and acknowledged once the log
has it on disk (`persistence`, `intake`). At the first CONNACK the last snapshot and the log
after it are restored, before any message is read; after a restart nothing is published until
the broker's backlog is in, then each device's throttle as of now, and the status says
`offline` until the broker has those (`edgemon.daemon.catchup`).
On SIGTERM/SIGINT intake stops (what was applied is made durable and acknowledged),
the timer stops, every throttled device gets `throttle: false`, the status goes `offline`,
the session is closed, a last snapshot is written, and `run()` returns 0, all within
`shutdown_timeout_s` (4 s: below the 5 s promised and far below systemd's stop timeout);
what is still running then is cancelled and named in the log. A second signal cancels at
once. SIGHUP reloads the config file into the running engine, keeping every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from edgemon import __version__
from edgemon.adapters.agent import serve_agent
from edgemon.adapters.capacity import agent_answer
from edgemon.adapters.clearance import clear_of_deadlines
from edgemon.adapters.connection_state import ConnectionState
from edgemon.adapters.http import (
    basic_auth_from_settings,
    create_app,
    serve,
    ssl_context_from_files,
)
from edgemon.adapters.metrics import CallbackCounter, DeadlineLatenessCollector, build_registry
from edgemon.daemon.catchup import CatchUp
from edgemon.daemon.deadline_timer import DeadlineTimer, StallGuard
from edgemon.daemon.digest import DeviceDigest
from edgemon.daemon.dispatch import Dispatcher
from edgemon.daemon.gcpacer import GcPacer
from edgemon.daemon.logs import LogBudget, RejectionLog
from edgemon.daemon.mqtt import LinkHooks, MqttLink, max_packet_size
from edgemon.daemon.persistence import open_persistence
from edgemon.daemon.publisher import SeqSource, ThrottlePublisher
from edgemon.daemon.recorder import TraceRecorder
from edgemon.daemon.slack_feed import SlackFeed
from edgemon.daemon.status import status_line, status_payload
from edgemon.daemon.systemd import Notifier
from edgemon.daemon.wall_clock import MonotonicWallClock
from edgemon.engine.outputs import Rejected, ThrottleChanged
from edgemon.errors import PublishError
from edgemon.monitor import Monitor
from edgemon.settings import ConfigError
from edgemon.trace import TraceMark, TraceRecord

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from edgemon.engine.outputs import Output
    from edgemon.settings import Settings

SHUTDOWN_TIMEOUT_S = 4.0
#: A periodic snapshot starts no closer than this to the next transition (ms).
SNAPSHOT_CLEARANCE_MS = 50.0
#: The interpreter's switch interval while the daemon runs (Python's default: 5 ms).
SWITCH_INTERVAL_S = 0.0005
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
        self._started_ms = self.clock.now_ms()
        #: Every line the daemon writes goes through the budget (`edgemon.daemon.logs`).
        self.log = LogBudget(
            log if log is not None else structlog.get_logger("edgemon"),
            now_ms=self.clock.now_ms,
            level=settings.log.level,
        )
        #: Per-stream transitions: at debug each, at info a summary per device.
        self._digest = DeviceDigest(self.log, now_ms=self.clock.now_ms)
        self._reload_settings = reload
        #: `--record`: every message and the marks where the run broke off or resumed.
        self.recorder = TraceRecorder(record, self.log)
        self._shutdown_timeout_s = shutdown_timeout_s
        self._install_signals = install_signal_handlers
        self.monitor = Monitor(settings.engine_config())
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
        #: Snapshots and the write-ahead log (None: no state directory, or `snapshots=False`).
        self.state = (
            open_persistence(
                settings.state, environ=environ, monitor=self.monitor, replay=self._replay,
                registry=self.registry, log=self.log,
            )
            if snapshots
            else None
        )  # fmt: skip
        self.link = MqttLink(
            settings.mqtt,
            topics=self.monitor.topics,
            connection=self.connection,
            hooks=LinkHooks(
                on_message=self._on_message,
                status_payload=self._status_payload,
                on_subscribed=self._on_subscribed,
                on_connected=self._on_connected,
                on_disconnected=self._on_disconnected,
                when_durable=self._when_durable,
                on_too_large=self._on_too_large,
            ),
            log=self.log,
            max_packet=max_packet_size(settings.limits.max_payload_bytes),
        )
        self.registry.register(
            CallbackCounter(
                "edgemon_mqtt_sessions_lost_total",
                "Reconnections whose CONNACK said the broker kept no session.",
                lambda: self.connection.sessions_lost,
            )
        )
        self.registry.register(
            CallbackCounter(
                "edgemon_mqtt_subscriptions_refused",
                "Topic filters the broker refused in a SUBACK (its ACL).",
                lambda: self.connection.subscriptions_refused,
            )
        )
        owned = settings.mqtt.devices
        self.publisher = ThrottlePublisher(
            self.link, seq=SeqSource(self.clock), topic=self.monitor.topics.throttle,
            devices=None if owned is None else frozenset(owned),
            owner=settings.mqtt.client_id,
        )  # fmt: skip
        #: The players' measured slack per device, out every `[mqtt] feed_ms` (0: none).
        self.slack_feed = (
            SlackFeed(
                self.link, self.monitor.engine, topic=self.monitor.topics.slack, clock=self.clock,
                period_ms=settings.mqtt.feed_ms, owned=None if owned is None else frozenset(owned),
                paused=lambda: self.catchup.active,
            )
            if settings.mqtt.feed_ms
            else None
        )  # fmt: skip
        if self.slack_feed is not None:
            feed = self.slack_feed
            self.registry.register(
                CallbackCounter(
                    "edgemon_slack_feeds_published_total",
                    "Slack feed objects published (P/{device}/slack, QoS 0).",
                    lambda: feed.published,
                )
            )
        #: Between a restore and the first publication: decisions are taken and logged, not
        #: published; then the state as of now is published once per device (`_end_resume`).
        self.catchup = CatchUp(self.clock, self._end_resume)
        #: Acts on the engine's outputs (`edgemon.daemon.dispatch`).
        self._dispatch = Dispatcher(
            digest=self._digest, rejections=self._rejections, publisher=self.publisher,
            catchup=self.catchup, log=self.log,
        )  # fmt: skip
        #: Notices that the process stood still (SIGSTOP, a VM pause): `_on_stall`.
        self.stalls = StallGuard(self.clock, self._on_stall)
        self.deadline_timer = DeadlineTimer(
            self.monitor, clock=self.clock, handle=self._dispatch, stalls=self.stalls
        )
        self.registry.register(DeadlineLatenessCollector(self.deadline_timer.lateness))
        self.gc = GcPacer(self._until_deadline, busy=lambda: self.publisher.busy)
        self._out: list[Output] = []
        self._restored = False
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._reload = asyncio.Event()
        self._http_up = asyncio.Event()
        #: The port the HTTP server listens on, once it does.
        self.http_port: int | None = None
        #: The port the agent check is answered on, once it is (`[http] agent_listen`).
        self.agent_port: int | None = None
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
        """Run until stopped; 0 after a clean stop, 1 when a task failed.

        While it runs, the interpreter's switch interval is `SWITCH_INTERVAL_S`: a worker
        thread (the state files' writes) hands the GIL back to the event loop
        within half a millisecond rather than five.
        """
        self._install()
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            return await self._run()
        finally:
            sys.setswitchinterval(switch)
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
                deadline_timer = group.create_task(self.deadline_timer.run(), name="deadline-timer")
                rest = [
                    http,
                    group.create_task(self.publisher.run(), name="publisher"),
                    group.create_task(self._watchdog(), name="watchdog"),
                    group.create_task(self._log_summaries(), name="log-summaries"),
                    group.create_task(self._reloader(), name="reloader"),
                    group.create_task(self._snapshots(), name="snapshots"),
                    group.create_task(self.gc.run(), name="gc"),
                ]
                if self.slack_feed is not None:
                    rest.append(group.create_task(self.slack_feed.run(), name="slack-feed"))
                if self.settings.http.agent_address is not None:
                    rest.append(group.create_task(self._serve_agent(), name="agent"))
                heartbeat = group.create_task(self._heartbeat(), name="heartbeat")
                rest.append(group.create_task(self.stalls.run(), name="stall-guard"))
                rest.append(group.create_task(self._catch_up(), name="catch-up"))
                await self._first(self._stop.wait(), ingest)
                self.log.info("shutdown_started")
                self.notifier.stopping()
                deadline_timer.cancel()  # no more transitions after the releases are computed
                heartbeat.cancel()  # no `online` after the farewell's `offline`
                await self._finish(ingest)
                for task in rest:
                    task.cancel()
                await asyncio.gather(*rest, return_exceptions=True)  # no snapshot under way
                await self._snapshot()  # after the releases: what a restart continues from
                if self.state is not None:
                    await self.state.close()
                self._digest.close()  # the last seconds' transitions, within the budget
                self.log.flush()
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
            publishing=lambda: self.publisher.busy,
            durability=lambda: None if self.state is None else self.state.failure,
        )
        async with serve(
            app, host=host, port=port, ssl_context=ssl_context, shutdown_timeout=1.0
        ) as bound:
            self.http_port = bound
            self.log.info("http_listening", host=host, port=bound)
            self._http_up.set()
            await asyncio.Future()  # until cancelled

    async def _serve_agent(self) -> None:
        """HAProxy's agent check on `[http] agent_listen` (docs/fleet.md), until cancelled."""
        http = self.settings.http
        address = http.agent_address
        assert address is not None
        host, port = address
        monitor, device, clock = self.monitor, http.agent_device, self.clock
        async with serve_agent(
            lambda: agent_answer(monitor.engine, device, clock.now_ms()), host=host, port=port
        ) as bound:
            self.agent_port = bound
            self.log.info("agent_listening", host=host, port=bound, device=device)
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

    async def _heartbeat(self) -> None:
        """Republish the retained `online` status every `heartbeat_s` while a session is up
        (docs/protocol.md): a gate counts an instance silent for 3 heartbeats as offline, so a
        stopped or paused edgemon, or a stale retained `online`, cannot hold engines for long."""
        every = self.settings.mqtt.heartbeat_s
        while True:
            await asyncio.sleep(every)
            await self.link.wait_connected()
            await self._publish_status("online")

    async def _publish_status(self, state: str) -> None:
        """Publish the retained status now; one that fails is left to the next heartbeat (or
        the next session, which begins with it)."""
        topic = self.monitor.topics.status(self.settings.mqtt.client_id)
        with contextlib.suppress(PublishError):
            await self.link.publish(topic, self._status_payload(state), qos=1, retain=True)

    async def _catch_up(self) -> None:
        """After a restart: once caught up, the state as of now is published (`_end_resume`);
        once the broker has acknowledged it, `online` (withheld until then: `CatchUp`)."""
        if not await self.catchup.run(self.ready):
            return  # stopped before: the farewell says `offline`
        await self.publisher.drain()
        self.catchup.announced()
        if self._stop.is_set():
            return
        await self.link.wait_connected()
        await self._publish_status("online")

    def _end_resume(self) -> None:
        """Bring every device up to now, decide, then publish one object per device: its
        throttle as of now, `t_ms` its clock now (docs/reliability.md, "After a restart")."""
        if not self.catchup.active:
            return
        now = self.clock.now_ms()
        self.monitor.advance(now, self._out)
        self._dispatch(self._out)  # logged and counted, not published: still catching up
        self._out.clear()
        self.catchup.end()
        self.recorder.mark(TraceMark(now, "resumed"))
        states = self.monitor.engine.throttle_states(now)
        for state in states:
            self.publisher.submit(state)
        self.deadline_timer.poke()
        self.log.info(
            "throttle_resumed",
            devices=len(states),
            throttled=sum(state.active for state in states),
            waited_ms=round(now - self.catchup.from_ms, 1),
        )

    async def _log_summaries(self) -> None:
        """Every second: the devices' summaries that are due, and the summary lines of the
        rejection log and of the budget, which come out even when the flood has stopped."""
        while True:
            await asyncio.sleep(1.0)
            now = self.clock.now_ms()
            self.log.flush(now)
            self._rejections.flush(now)
            self._digest.flush(now)

    async def _reloader(self) -> None:
        while True:
            await self._reload.wait()
            self._reload.clear()
            self.reload()

    # ------------------------------------------------------------------ state
    def _restore(self) -> bool:
        """Continue from the last snapshot and the log after it (a bad snapshot is set aside,
        with a log); then log every message from here on. Whether an earlier run left any."""
        if self.state is None:
            return False
        now = self.clock.now_ms()
        replayed = self.state.restore(now)
        self.link.intake.expect_redelivery(replayed)
        if self.state.resumed:
            self.recorder.mark(TraceMark(now, "restart", self.state.resumed_from_ms))
        return self.state.resumed

    def _replay(self, record: TraceRecord) -> None:
        """One logged message, through the live path at its own time; outputs were acted on
        by the process that logged it."""
        self._apply(record.topic, record.payload, record.recv_ms)
        self._out.clear()

    def _when_durable(self, callback: Callable[[], None]) -> None:
        if self.state is None:
            callback()
        else:
            self.state.when_durable(callback)

    def _until_deadline(self) -> float | None:
        """Milliseconds until the engine's next transition (None if none is due)."""
        return self.monitor.until_deadline(self.clock.now_ms())

    async def _snapshots(self) -> None:
        """Every `snapshot_interval_s`, at a moment when no transition is due within twice
        what the last capture took (at least 50 ms) and no throttle object is on its way
        out: the capture holds the loop."""
        while True:
            await asyncio.sleep(self.settings.state.snapshot_interval_s)
            if self.state is not None:
                clearance = max(SNAPSHOT_CLEARANCE_MS, 2.0 * self.state.capture_ms)
                await clear_of_deadlines(
                    self._until_deadline, clearance, 1.0, lambda: self.publisher.busy
                )
            await self._snapshot()

    async def _snapshot(self) -> None:
        """Take the state on the loop (it owns the engine); write it on the state worker.
        Never before the last snapshot was restored: an empty state must not overwrite it."""
        if self.state is None:
            return
        size = await self.state.snapshot(self.clock.now_ms())
        if size is not None:
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
        self.deadline_timer.poke()
        self.settings = new
        self.log.info("config_reloaded", needs_restart=restart)
        return True

    # ------------------------------------------------------------------ hot path
    def _on_message(self, topic: str, payload: bytes) -> None:
        """One MQTT message: log it, record it, apply it, act on what it changed."""
        now = self.clock.now_ms()
        self.stalls.check(now)  # before the message: a stall is cut out first
        self.catchup.last_ms = now  # when the last message came (`CatchUp`)
        if self.state is not None:
            self.state.append(now, topic, payload)
        if self.recorder.on:
            self.recorder.record(TraceRecord(now, topic, payload))
        applied_to = self._apply(topic, payload, now)
        out = self._out
        if out:
            self._dispatch(out)
            out.clear()
        self.deadline_timer.poke()
        if applied_to is not None and self.slack_feed is not None:
            self.slack_feed.changed(applied_to)

    def _on_too_large(self, topic: str, size: int) -> None:
        """A message too large to read, dropped unread by the link: `oversized`, as one the
        engine refuses for its payload."""
        self.monitor.results["oversized"] += 1
        parsed = self.monitor.topics.parse(topic)
        self._rejections(
            Rejected(
                self.clock.now_ms(), topic, None if parsed is None else parsed[0], "oversized",
                f"packet of {size} bytes, larger than edgemon reads: dropped unread",
            )
        )  # fmt: skip

    def _apply(self, topic: str, payload: bytes, now: float) -> str | None:
        """The engine path of every message, live or replayed from the log, in the order
        `Monitor.handle` owns (outputs in `self._out`); the device whose events it applied."""
        try:
            return self.monitor.handle(topic, payload, now, self._out)
        except Exception:  # no message may stop the daemon
            self.monitor.results["internal_error"] += 1
            self.log.exception("message_failed", topic=topic)
            return None

    # ------------------------------------------------------------------ edges
    def _on_connected(self) -> None:
        if not self._restored:
            # Restored at the first CONNACK, not at process start: the devices' clocks
            # resume when their queued messages can flow (a broker still down at start
            # costs no buffer), and before the first of them is read.
            self._restored = True
            if self._restore():
                # A restart: decide first, then publish as of now. Nothing goes out before
                # the log and the broker's backlog for the session are applied (`CatchUp`).
                self.catchup.begin(self.clock.now_ms())
        # Late chunks can flow again: each provisional underrun waits its whole
        # allowed_lateness_ms from now, for what the broker queued meanwhile (docs/semantics.md).
        self.monitor.engine.input_restored(self.clock.now_ms())
        self.deadline_timer.poke()

    def _on_disconnected(self) -> None:
        """No late chunk can arrive while the broker is away: nothing is confirmed for want of
        one (an outage would otherwise confirm every provisional underrun)."""
        self.monitor.engine.input_lost()

    def _on_stall(self, since_ms: float, now_ms: float) -> None:
        """The process stood still from `since_ms` to `now_ms` (SIGSTOP, a VM pause): treated
        as a broker outage and a restart are. The stall is cut out of the devices' timelines,
        so nothing expires or is confirmed for want of the messages that queued up meanwhile
        (they are applied at their own `t_ms` before the timers they delayed), and the waits
        for late chunks start afresh from now."""
        self.monitor.cut(since_ms, now_ms)
        self.recorder.mark(TraceMark(now_ms, "stall", since_ms))
        engine = self.monitor.engine
        if self.connection.connected:
            engine.input_restored(now_ms)
        else:
            engine.input_lost()
        self.deadline_timer.poke()
        self.log.warning("daemon_stalled", stalled_s=round((now_ms - since_ms) / 1000.0, 3))

    def _on_subscribed(self) -> None:
        if not self.ready.is_set():
            self.ready.set()
            self.notifier.ready(self.status_line())

    async def _farewell(self) -> None:
        """Release every throttled device, then announce `offline` (still connected)."""
        self._end_resume()  # a stop before the backlog was in: the state as of now first
        releases: list[Output] = []
        now = self.clock.now_ms()
        self.monitor.engine.release_all(now, releases)
        self.recorder.mark(TraceMark(now, "stop"))
        for release in releases:
            assert isinstance(release, ThrottleChanged)
            self.publisher.submit(release)
        released = len(releases)
        await self.publisher.drain()
        await self._publish_status("offline")
        self.log.info("farewell_published", throttles_released=released)

    def _status_payload(self, state: str) -> bytes:
        """The status object; `offline` for `online` while it is withheld after a restart (the
        broker still holds the run before's throttle objects: `CatchUp`)."""
        return status_payload(
            "offline" if self.catchup.withheld else state,
            now_ms=self.clock.now_ms(),
            heartbeat_s=self.settings.mqtt.heartbeat_s,
            started_ms=self._started_ms,
        )

    def status_line(self) -> str:
        """`STATUS=` text: devices, streams, throttled devices, broker state."""
        return status_line(self.monitor, self.connection)
