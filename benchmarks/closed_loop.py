"""Does edgemon help? Goodput per policy, and the silence that explains it.

Each request is judged on the players' own clocks, never from edgemon, against two SLOs: its
start (request → playback start, prebuffer included) within `--start-slo-ms` (3000) and its
longest gap (one concealed stretch) within `--gap-slo-ms` (100). Its outcome is `good`,
`late`, `gappy`, `shed` (the box refused it; how long the refusal took is counted) or
`unfinished`; goodput is good over offered. Beside it, the silence figures: start silence
(request to playback start), gap silence (concealed time mid-stream) and their total. A box
near capacity cannot create time: holding new prefills moves silence from gaps to starts,
and only refusing what cannot be served in time raises goodput. See README "Does it help?".

Two modes, one contract:

- `--virtual`: the pure loop on a virtual clock (`edgemon.simulate.loop`: the simulated engine,
  its players, edgemon's `Monitor`, the gate's rule, real-time admission, the deadline policy;
  the same code the daemon and the schedulers run). Seconds per run; the project's own venv,
  no vLLM. The tables and plots are made from it.
- real time (default): vLLM's real V1 scheduler (`EdgemonScheduler`, step times from the
  profile), a real Mosquitto, a real `edgemon run`, the players' real `Reporter`s and a real
  `ThrottleGate`, one run per seed in wall time: the spot checks. Needs vLLM
  (`.venv-vllm`). The deadline policy is not carried there (virtual only).

Each run prints one JSON line (`--json`: nothing else), the row of
`edgemon.simulate.figures` (`policy`, `scenario`, `load`, `seed`, `requests`, `completed`,
the silence figures, `offered`, `good`, `late`, `gappy`, `shed`, `unfinished`, `goodput`,
`shed_p99_ms`, the SLOs, `chunks`, ...). `--dump FILE` writes one line per request
(`start_ms`, `longest_gap_ms`, `outcome`, its chunk arrivals) to recompute them.

    closed_loop.py --virtual --policy open --policy cap:11 --policy edgemon \\
        --scenario slowdown --slowdown 1.3:20:60 --seeds 1-10 --load 0.9 --duration 180
    closed_loop.py --virtual --targets --scenario steady --scenario slowdown \\
        --scenario burst --load 0.8,0.9,1.0,1.2 --seeds 301-310 --out rows.jsonl  # bench-goodput
    closed_loop.py --virtual --sweep --out benchmarks/out/loop.jsonl   # what make bench-loop runs

`--steps FILE` runs the virtual engine on the step shape `real_engine.py --shape --json`
measured (its fit and its co-tenant's slowdowns), loads a share of that box's capacity as
`real_engine.py` scales them: the same requests as a real run of the same seed, on the box as
it was that hour.

`--targets` runs the policies the goodput targets compare: open, `cap:N` for N from N*−3 to
N*+1 (N*: the largest batch whose decode step fits a frame), `realtime` and `edgemon`.
`--sweep` runs every baseline and policy of the silence report besides: `gate` over margin ×
max hold, and other settings. `--chunks` sets the engine's chunk schedule (`5,25`, or a ramp
`4,4,8,16,25`). `--report FILE…` prints the goodput targets and the tables from rows written
before, and `--plot DIR` draws goodput against load, one PNG per profile (matplotlib).

`--feed F` (repeatable) runs `edgemon` fed F of its players: `measured` (edgemon's slack
feed), `estimated` (the server's estimate), `none`, or the `oracle` bound; the scenarios
`pause`, `wifi`, `device` and `prebuffer` bring the listeners the server cannot see
(`edgemon.simulate.listeners`), and `--feed-report FILE…` compares the feeds (make bench-feed).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _slo_capacity import parse_bounds  # noqa: E402

from edgemon.policy.deadlines import GAP_SLO_MS, START_SLO_MS  # noqa: E402
from edgemon.simulate.figures import dump_lines, row  # noqa: E402
from edgemon.simulate.listeners import (  # noqa: E402
    DEFAULT_DEVICE,
    DEFAULT_PAUSE,
    DEFAULT_PREBUFFER,
    DEFAULT_WIFI,
    LISTENER_SCENARIOS,
)
from edgemon.simulate.parked import FEEDS  # noqa: E402
from edgemon.simulate.policies import EDGEMON, SHIPPED_GUARD_MS, policy  # noqa: E402
from edgemon.simulate.profiles import PROFILES, Profile, StepModel  # noqa: E402
from edgemon.simulate.scenarios import (  # noqa: E402
    DEFAULT_BURST,
    DEFAULT_CONTENTION,
    DEFAULT_NETWORK,
    DEFAULT_SLOWDOWN,
    SCENARIOS,
    Scenario,
    parse_contention,
    scenario,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import TextIO

    from edgemon.simulate.players import Player
    from edgemon.simulate.policies import Policy

SHIPPED = EDGEMON.format(guard=f"{SHIPPED_GUARD_MS:g}")
LENGTHS = ("eos", "known")
GATE_MARGINS_MS = (40.0, 80.0, 150.0)  # x86-gpu's own margin, 50 ms, is in between
GATE_HOLDS_MS = (500.0, 1000.0, 2000.0, 4000.0)
MINE = (
    "realtime",
    "realtime:1.2",
    "lasting:{m}:2000",
    "realtime+gate:{m}:2000",
    "realtime:1.2+gate:{m}:1000",
    "realtime:1.02+lasting:{m}:1100",  # edgemon's policy before deadlines
    "realtime:1.02+gate:{m}:1100",  # that with the one-step release
    "realtime+lasting:{m}:1000",  # edgemon's policy before its retune
    "edgemon+budget",  # budget-aware admission (edgemon.simulate.budget): measured, not shipped
    "edgemon+budget:0:120:fresh",  # its upper bound: the budget fresh at every step
)


def sweep_policies(profile: Profile) -> list[str]:
    """Every setting the report compares (see the module doc)."""
    n = profile.realtime_concurrency()
    caps = [f"cap:{c}" for c in range(max(1, n - 3), n + 2)]
    gates = [f"gate:{m:g}:{h:g}" for m in GATE_MARGINS_MS for h in GATE_HOLDS_MS]
    mine = [text.format(m=f"{profile.margin_ms:g}") for text in MINE]
    return ["open", *caps, *gates, *mine, "edgemon"]


def target_policies(profile: Profile) -> list[str]:
    """The policies the goodput targets compare: open, `cap:N` for N from N*−3 to N*+1,
    `realtime` and `edgemon`."""
    n = profile.realtime_concurrency()
    caps = [f"cap:{c}" for c in range(max(1, n - 3), n + 2)]
    return ["open", *caps, "realtime", "edgemon"]


def worth_policies(profile: Profile, path: Path) -> list[str]:
    """`--worth`: the comparison's policies for `profile`, from the tuning rows in `path`."""
    from _worth import comparison  # noqa: PLC0415

    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError) as exc:
        raise ValueError(f"--worth {path}: {exc}") from None
    tuned = [r for r in rows if r.get("kind") == "tuned" and r.get("profile") == profile.name]
    if not tuned:
        raise ValueError(f"--worth {path}: no --tune-static row for profile {profile.name}")
    return comparison(profile, [label for label, _ in tuned[-1]["ranking"]])


def measured_steps(profile: Profile, path: Path) -> Profile:
    """`profile` with the steps of a shape `real_engine.py --shape --json` measured (its last
    JSON line): the fitted step model and the co-tenant's slowdowns; ValueError otherwise."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        shape = json.loads([line for line in lines if line.startswith("{")][-1])
        fit = shape["fit"]
        step = StepModel(
            base_ms=float(fit["base_ms"]),
            per_prefill_token_ms=float(fit["per_prefill_token_ms"]),
            per_decode_seq_ms=float(fit["per_decode_seq_ms"]),
        )
        slowdowns = shape.get("contention", {}).items()
        contention = tuple(sorted((float(share), float(ratio)) for share, ratio in slowdowns))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(
            f"--steps {path}: not a shape from real_engine.py --shape ({exc})"
        ) from exc
    measured = replace(profile, step=step, contention=contention or profile.contention)
    if measured.capacity_rps() <= 0:
        raise ValueError(
            f"--steps {path}: a step of that box takes at least {step.base_ms:g} ms, so no "
            f"stream keeps up with {profile.frame_ms:g} ms frames"
        )
    return measured


def framed(profile: Profile, frame_ms: float | None) -> Profile:
    """`profile` with frames of `frame_ms` (None: its own); ValueError if the box cannot keep
    one stream in real time at that frame."""
    if frame_ms is None:
        return profile
    if not (math.isfinite(frame_ms) and frame_ms > 0):
        raise ValueError("--frame-ms must be a number of milliseconds > 0")
    made = replace(profile, frame_ms=frame_ms)
    if made.capacity_rps() <= 0:
        raise ValueError(
            f"--frame-ms {frame_ms:g}: a step of {profile.name} takes at least "
            f"{profile.step.base_ms:g} ms, so no stream keeps up with such frames"
        )
    return made


def chunk_schedule(text: str) -> tuple[int, ...]:
    """`5,25` or `4,4,8,16,25`: frames of each chunk, the last size repeating."""
    parts = text.split(",")
    if not all(part.strip().isdigit() and int(part) >= 1 for part in parts):
        raise ValueError(f"--chunks takes whole numbers ≥ 1 separated by ',', not {text!r}")
    return tuple(int(part) for part in parts)


def seeds(text: str) -> list[int]:
    """`1-10` or `3,7,9` (or both: `1-3,7`)."""
    out: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"--seeds: {part!r} is not a seed or a range like 1-10") from None
        if last < first:
            raise ValueError(f"--seeds: the range {part!r} is empty")
        out.extend(range(first, last + 1))
    return out


def shares(text: str) -> list[float]:
    """`0.95` or `0.95,0.99`: shares of offered requests, each in (0, 1]."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(0 < v <= 1 for v in values):
        raise ValueError(f"--slo-capacity takes shares in (0, 1] separated by ',', not {text!r}")
    return values


def loads(text: str) -> list[float]:
    """`0.8` or `0.8,0.9`: shares of the profile's estimated capacity."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"--load takes numbers > 0 separated by ',', not {text!r}")
    return values


class OneLineParser(argparse.ArgumentParser):
    """Bad input: one clear line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def listener_flags(parser: argparse.ArgumentParser) -> None:
    """`--pause`, `--wifi`, `--device` and `--prebuffer`: the listeners' scenarios, as
    `edgemon.simulate.listeners` says (the real loop takes the same flags)."""
    listeners = (
        ("pause", DEFAULT_PAUSE),
        ("wifi", DEFAULT_WIFI),
        ("device", DEFAULT_DEVICE),
        ("prebuffer", DEFAULT_PREBUFFER),
    )
    for name, default in listeners:
        parser.add_argument(
            f"--{name}",
            default=default,
            help=f"the {name} scenario's listeners ({default}; see edgemon/simulate/listeners.py)",
        )


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module doc)."""
    parser = OneLineParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--virtual", action="store_true", help="the pure loop, virtual clock")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="jetson")
    parser.add_argument(
        "--steps",
        type=Path,
        help="virtual only: steps from this shape (`real_engine.py --shape --json`): its "
        "fit and co-tenant slowdowns; loads are shares of that box's capacity",
    )
    parser.add_argument(
        "--policy",
        action="append",
        help="open | cap:N | gate:MARGIN_MS:HOLD_MS | lasting:MARGIN_MS:HOLD_MS | realtime[:F] "
        "(steps up to F frames) | budget[:FRAMES[:ALLOW_MS[:MODE]]] (budget-aware admission: "
        "admit while the prefill plus FRAMES decodes (12) fit the spendable headroom of "
        "edgemon's last throttle object plus ALLOW_MS (0); MODE refill, stale or fresh; see "
        "edgemon/simulate/budget.py) | "
        "deadline[:ORDER[:SHED[:GUARD_MS[:BATCH]]]] (the deadline policy: ORDER fcfs or edf, "
        "SHED shed or queue, GUARD_MS off every start budget, BATCH amortized or decode; see "
        f"edgemon/simulate/policies.py) | edgemon (= {SHIPPED}); "
        "parts joined by '+' (edgemon+budget); repeatable (default edgemon)",
    )
    parser.add_argument("--sweep", action="store_true", help="every policy of the report")
    parser.add_argument(
        "--tune-static",
        action="store_true",
        help="virtual: choose the one static configuration of vLLM's flags (max-num-seqs with "
        "max-num-queued-reqs or -tokens, chunked prefill) with the best mean goodput over the "
        "scenarios, loads and --seeds (training seeds); print it as a policy",
    )
    parser.add_argument(
        "--worth",
        type=Path,
        help="the policies that say whether edgemon is worth it, given the rows of "
        "--tune-static in this file: open, the tuned static configuration and the next best "
        "of its grid, the peers' estimated-park and estimated-edf, edgemon, and edgemon "
        "without each part (benchmarks/_worth.py)",
    )
    parser.add_argument(
        "--slo-capacity",
        help="virtual: TARGET[,TARGET] (0.95): per policy, scenario and seed, the highest load "
        "at which that share of offered requests is good, by bisection over load",
    )
    parser.add_argument(
        "--slo-bounds", default="0.05:1.5", help="LOW:HIGH loads of the bisection (0.05:1.5)"
    )
    parser.add_argument(
        "--slo-tolerance", type=float, default=0.01, help="the bisection's width (0.01)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="virtual runs at once (processes; default 1)"
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="the policies the goodput targets compare: open, cap:N*-3..N*+1, realtime, edgemon",
    )
    parser.add_argument(
        "--start-slo-ms",
        type=float,
        default=START_SLO_MS,
        help="a request meets its start SLO when request → playback start (prebuffer "
        f"included) is at most this ({START_SLO_MS:g})",
    )
    parser.add_argument(
        "--gap-slo-ms",
        type=float,
        default=GAP_SLO_MS,
        help=f"a stream meets its continuity SLO when its longest gap is at most this "
        f"({GAP_SLO_MS:g})",
    )
    parser.add_argument(
        "--chunks",
        default="5,25",
        help="the engine's chunk schedule in frames, the last size repeating (5,25: a short "
        "first chunk, then 2 s chunks; vLLM-Omni's ramp: 4,4,8,16,25)",
    )
    parser.add_argument(
        "--frame-ms",
        type=float,
        help="audio of one frame (default the profile's, 80: Qwen3-TTS's 12.5 Hz); the "
        "capacity estimate and real-time admission follow it (as real_engine.py's flag)",
    )
    parser.add_argument(
        "--scenario", action="append", choices=SCENARIOS, help="repeatable (default steady)"
    )
    parser.add_argument(
        "--slowdown",
        default=DEFAULT_SLOWDOWN,
        help="F:W:P, step time × F for the last W s of every P s "
        f"(default {DEFAULT_SLOWDOWN}; see edgemon/simulate/scenarios.py for why)",
    )
    parser.add_argument(
        "--burst", default=DEFAULT_BURST, help=f"K:T, K requests every T s ({DEFAULT_BURST})"
    )
    parser.add_argument(
        "--network",
        default=DEFAULT_NETWORK,
        help=f"D:S:P, deliveries +D ms for the last S s of every P s ({DEFAULT_NETWORK})",
    )
    parser.add_argument(
        "--contention",
        default=DEFAULT_CONTENTION,
        help=f"W:P:SHARE, another job takes SHARE of the engine's compute for the last W s of "
        f"every P s: steps × the profile's measured factor for SHARE ({DEFAULT_CONTENTION}; "
        "benchmarks/real_engine.py runs the same flag on the real engine)",
    )
    listener_flags(parser)
    parser.add_argument(
        "--feed",
        action="append",
        choices=FEEDS,
        help="repeatable: run `edgemon` fed this of its players (edgemon+feed:FEED): measured "
        "(edgemon's slack feed: what the players reported), estimated (the server's estimate), "
        "none; without it, `edgemon` as shipped",
    )
    parser.add_argument(
        "--lengths",
        choices=LENGTHS,
        default="eos",
        help="eos (default): requests end at their end-of-speech and the schedulers predict "
        "lengths from prompts, as a real server must; known: the deadline policy is shown each "
        "request's length (an oracle, to see what knowing is worth)",
    )
    parser.add_argument(
        "--drain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="arrivals stop at --duration and the run goes on until every request has ended "
        "(default); --no-drain stops the run there and scores requests under way as they are",
    )
    parser.add_argument("--seeds", default="1-10", help="a list or a range: 1-10, 3,7,9")
    parser.add_argument(
        "--load",
        help="share(s) of estimated capacity: 0.8,0.9 (default 0.8; with --slo-capacity, "
        "these loads are run as well)",
    )
    parser.add_argument("--duration", type=float, default=180.0, help="seconds per run")
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--dump", type=Path, help="one JSON line per request to this file")
    parser.add_argument("--out", type=Path, help="also write the rows (JSON lines) here")
    parser.add_argument("--report", type=Path, nargs="+", help="tables from rows written before")
    parser.add_argument("--plot", type=Path, help="with --report: one PNG per scenario here")
    parser.add_argument(
        "--feed-report",
        type=Path,
        nargs="+",
        help="rows of make bench-feed: measured, estimated or no feed, and the peers; with "
        "--summary the documentation's figures",
    )
    parser.add_argument(
        "--real-report",
        type=Path,
        nargs="+",
        help="the real engine's rows and their virtual prediction (make bench-real): the "
        "tables, and with --summary the documentation's figures",
    )
    parser.add_argument(
        "--summary",
        type=Path,
        help="with --report: also write the figures the documentation shows here, as JSON "
        "lines (benchmarks/results/worth.jsonl; make docs renders them)",
    )
    parser.add_argument(
        "--spots",
        type=Path,
        nargs="+",
        help="wall-clock rows and virtual rows of the same points: each wall-clock figure "
        "beside the same seed's virtual one and the virtual seeds' spread",
    )
    args = parser.parse_args(argv)
    if args.steps is not None and not args.virtual:
        parser.error("--steps is for the virtual loop (--virtual)")
    if (args.tune_static or args.slo_capacity) and not args.virtual:
        parser.error("--tune-static and --slo-capacity are for the virtual loop (--virtual)")
    if args.jobs < 1:
        parser.error("--jobs must be a whole number ≥ 1")
    try:
        args.seed_list = seeds(args.seeds)
        args.load_list = loads(args.load or "0.8")
        args.profile_used = replace(
            framed(PROFILES[args.profile], args.frame_ms),
            chunk_schedule=chunk_schedule(args.chunks),
        )
        if args.steps is not None:
            # The box as measured: its steps, and loads as shares of its capacity (as
            # real_engine.py scales them), so a virtual seed runs a real run's requests.
            args.profile_used = measured_steps(args.profile_used, args.steps)
        profile = args.profile_used
        share = parse_contention(args.contention)[1]
        args.scenarios = [
            scenario(
                name,
                slowdown=args.slowdown,
                burst=args.burst,
                network=args.network,
                contention=args.contention,
                factor=profile.contention_factor(share),
                listeners={name: getattr(args, name) for name in LISTENER_SCENARIOS},
            )
            for name in (args.scenario or ["steady"])
        ]
        args.slo_targets = shares(args.slo_capacity) if args.slo_capacity else []
        args.slo_low, args.slo_high = parse_bounds(args.slo_bounds)
        texts = sweep_policies(profile) if args.sweep else []
        texts += target_policies(profile) if args.targets else []
        texts += worth_policies(profile, args.worth) if args.worth else []
        chosen = args.sweep or args.targets or args.worth
        texts += args.policy or ([] if chosen else ["edgemon"])
        if args.feed:
            fed = [f"edgemon+feed:{f}" for f in args.feed]
            texts = [t for text in texts for t in (fed if text == "edgemon" else [text])]
        args.policies = [policy(text, profile) for text in dict.fromkeys(texts)]
    except ValueError as exc:
        parser.error(str(exc))
    if not (math.isfinite(args.duration) and args.duration > 0):
        parser.error("--duration must be a number of seconds > 0")
    for flag in ("start_slo_ms", "gap_slo_ms"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value >= 0):
            parser.error(f"--{flag.replace('_', '-')} must be a number of milliseconds ≥ 0")
    return args


def points(args: argparse.Namespace) -> Iterator[tuple[Scenario, float, Policy, int]]:
    """Every run, in the order they are made."""
    for scene in args.scenarios:
        for load in args.load_list:
            for setting in args.policies:
                for seed in args.seed_list:
                    yield scene, load, setting, seed


def run_all(args: argparse.Namespace, say: TextIO) -> list[dict[str, Any]]:
    """Run every point of `args` in the chosen mode; print and return the rows."""
    if args.virtual:
        return run_virtual_points(args, say)
    profile = args.profile_used
    dump = args.dump.open("w", encoding="utf-8") if args.dump else None
    rows: list[dict[str, Any]] = []
    # Needs vLLM (and is not type-checked in the project's venv, which has none).
    realtime = importlib.import_module("_realtime_loop").RealtimeStack(profile).open()
    try:
        for scene, load, setting, seed in points(args):
            score, players, origin, end = realtime.run(
                setting,
                scene,
                load=load,
                seed=seed,
                duration_s=args.duration,
                start_slo_ms=args.start_slo_ms,
            )
            line = row(
                score,
                mode="realtime",
                profile=profile.name,
                policy=setting.label,
                scenario=scene.name,
                load=load,
                seed=seed,
                duration_s=round((end - origin) / 1000.0, 3),
            )
            line["scenario_params"] = scene.describe()
            line["chunks"] = ",".join(map(str, profile.chunk_schedule))
            line["frame_ms"] = profile.frame_ms
            line["lag_max_ms"] = round(realtime.lag_max_ms, 1)
            rows.append(line)
            print(json.dumps(line), file=say, flush=True)
            if dump is not None:
                _dump(dump, args, players, setting.label, scene.name, seed, origin, end)
    finally:
        if dump is not None:
            dump.close()
        realtime.close()
    return rows


def run_virtual_points(args: argparse.Namespace, say: TextIO) -> list[dict[str, Any]]:
    """The virtual runs, `--jobs` at a time; print and return the rows."""
    from _points import Runner, point_row, run_point  # noqa: PLC0415
    from _tuning import point_of  # noqa: PLC0415

    wanted = [point_of(args, p.label, scene, load, seed) for scene, load, p, seed in points(args)]
    rows: list[dict[str, Any]] = []
    if args.dump is None:
        with Runner(args.jobs) as runner:
            rows = runner.rows(wanted)
        for line in rows:
            print(json.dumps(line), file=say, flush=True)
        return rows
    with args.dump.open("w", encoding="utf-8") as dump:
        for point in wanted:
            result = run_point(point)
            rows.append(point_row(point, result))
            print(json.dumps(rows[-1]), file=say, flush=True)
            _dump(
                dump, args, result.players, point.policy, point.scenario.name, point.seed, 0.0,
                result.end_ms,
            )  # fmt: skip
    return rows


def _dump(
    dump: TextIO,
    args: argparse.Namespace,
    players: Iterable[Player],
    label: str,
    scenario: str,
    seed: int,
    origin: float,
    end: float,
) -> None:
    """One dump line per request of a run."""
    dump.writelines(
        json.dumps(item) + "\n"
        for item in dump_lines(
            players,
            policy=label,
            scenario=scenario,
            seed=seed,
            origin_ms=origin,
            end_ms=end,
            start_slo_ms=args.start_slo_ms,
            gap_slo_ms=args.gap_slo_ms,
        )
    )


def header(args: argparse.Namespace) -> str:
    """What is about to run, in one comment line."""
    profile = args.profile_used
    scenes = ", ".join(scene.describe() for scene in args.scenarios)
    chunks = ",".join(map(str, profile.chunk_schedule))
    return (
        f"# closed loop ({'virtual clock' if args.virtual else 'real time, vLLM'}), profile "
        f"{profile.name}: {profile.title}; capacity ≈ {profile.capacity_rps():.2f} req/s "
        f"(estimate), N* = {profile.realtime_concurrency()}; SLOs: start ≤ "
        f"{args.start_slo_ms:g} ms, longest gap ≤ {args.gap_slo_ms:g} ms; chunks {chunks} "
        f"frames of {profile.frame_ms:g} ms; scenarios {scenes}; load "
        f"{args.load}; seeds {args.seeds}; {args.duration:g} s per run; "
        f"{len(args.policies)} policies; {platform.node()}, {os.cpu_count()} cores, load "
        f"average {os.getloadavg()[0]:.1f}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def _read_rows(paths: list[Path]) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in paths
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("{")
    ]


def _today() -> str:
    return f"{datetime.now(UTC):%Y-%m-%d}"


def write_summary(path: Path, rows: list[dict[str, Any]]) -> None:
    """The documentation's figures from `rows` (both lengths modes), with what made them."""
    from _worth import summary  # noqa: PLC0415

    made = {
        "kind": "made",
        "command": "make bench-worth",
        "date": _today(),
        "seeds": sorted({str(r["seeds"]) for r in rows if r.get("kind") == "slo_capacity"}),
        "training_seeds": sorted({str(r["seeds"]) for r in rows if r.get("kind") == "tuned"}),
        "tuned": {r["profile"]: r["policy"] for r in rows if r.get("kind") == "tuned"},
    }
    lines = [made, *summary(rows, "eos"), *summary(rows, "known")]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run, or report on rows written before."""
    args = parse(argv)
    if args.real_report:
        from _real_worth import real_report, real_summary  # noqa: PLC0415

        read = _read_rows(args.real_report)
        print("\n".join(real_report(read)))
        if args.summary is not None:
            searched = [r for r in read if r.get("mode") == "real" and r.get("kind")]
            made = {
                "kind": "made",
                "command": "make bench-real",
                "date": _today(),
                "seeds": sorted({r["seed"] for r in searched}),
                "arrivals_s": sorted({r["arrivals_s"] for r in searched}),
            }
            lines = [made, *real_summary(read)]
            args.summary.write_text("".join(json.dumps(r) + "\n" for r in lines), "utf-8")
        return 0
    if args.feed_report:
        from _feed import report as feed_report  # noqa: PLC0415
        from _feed import summary as feed_summary  # noqa: PLC0415

        read = _read_rows(args.feed_report)
        print("\n".join(feed_report(read)))
        if args.summary is not None:
            seeds = sorted({str(r["seeds"]) for r in read if r.get("kind") == "slo_capacity"})
            made = {"kind": "made", "command": "make bench-feed", "date": _today(), "seeds": seeds}
            lines = [made, *feed_summary(read)]
            args.summary.write_text("".join(json.dumps(r) + "\n" for r in lines), "utf-8")
        return 0
    if args.report or args.spots:
        from _loop_report import report, spot_checks  # noqa: PLC0415

        read = _read_rows(args.report or args.spots)
        if args.report:
            from _worth import worth  # noqa: PLC0415

            plain = [row for row in read if row.get("kind") is None]
            against_tuned = worth(read)
            tables = report(plain, plot_dir=args.plot, targets_of_before=not against_tuned)
            print("\n".join([*against_tuned, "", tables]))
            if args.summary is not None:
                write_summary(args.summary, read)
        else:
            print(spot_checks(read))
        return 0
    if not args.json:
        print(header(args), flush=True)
    rows: list[dict[str, Any]] = []
    if args.tune_static or args.slo_targets:
        from _tuning import run_searches  # noqa: PLC0415

        rows += run_searches(args, sys.stdout)
    if not (args.tune_static or args.slo_targets) or (args.slo_targets and args.load):
        rows += run_all(args, sys.stdout)
    if args.out:
        from _loop_report import write_rows  # noqa: PLC0415

        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
