"""MkDocs hook: what the pages show that must never drift from the code or the data, written at
build time.

A page that holds a marker line `<!-- generated: NAME -->` gets it replaced by what the code
says now: `configuration` from the pydantic settings models (edgemon/settings/) with each key's
comment from deploy/edgemon.toml, `cli` from the argparse parsers (edgemon/cli/), the tables of
results from benchmarks/results/*.jsonl. The pages stay ordinary files in docs/ and in the
navigation, so `mkdocs build --strict` checks their links like any other page's; nothing is
written to the source tree. The site also serves Mermaid itself (`on_files`).
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import logging
import os
import re
import sys
import types
from contextlib import contextmanager, redirect_stdout, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from edgemon.cli.main import build_parser
from edgemon.settings import ENV_PREFIX, Settings

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator

    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parent
EXAMPLE_CONFIG = ROOT / "deploy" / "edgemon.toml"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
#: The width argparse wraps its help to, whatever the terminal that builds the site.
HELP_COLUMNS = "82"
KEY_LINE = re.compile(r"^(#\s*)?([a-z_]+)\s*=")
SECTION_LINE = re.compile(r"^\[([a-z_]+)[.\]]")
CONSTRAINTS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "at least"}


#: Where `make docs` puts Mermaid (npm's package, in the venv that runs MkDocs), and where the
#: site serves it (mkdocs.yml's `extra_javascript`).
MERMAID = Path(sys.prefix) / "share" / "mermaid"
MERMAID_SITE = "javascripts/mermaid"
LOG = logging.getLogger("mkdocs.hooks.edgemon")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' hook: each marker replaced by its generated Markdown."""
    return MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """MkDocs' hook: Mermaid and its licence served from the site, so that a reader without a
    network sees the diagrams (Material loads Mermaid from a CDN only when none is loaded). A
    warning, which fails a strict build, when `make docs` has not fetched it."""
    from mkdocs.structure.files import File  # noqa: PLC0415 - MkDocs runs this hook

    script = MERMAID / "mermaid.min.js"
    if not script.is_file():
        LOG.warning("Mermaid is not at %s: `make docs` fetches it from the npm registry", script)
        return files
    for name, source in (("min.js", script), ("LICENSE.txt", MERMAID / "LICENSE")):
        src_uri = f"{MERMAID_SITE}.{name}"
        files.append(File.generated(config, src_uri, abs_src_path=str(source)))
    return files


# --- the configuration reference -------------------------------------------------------------


def configuration() -> str:
    """One table per section of the config file, from the models, and the example file."""
    comments = example_comments(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    out: list[str] = []
    for name, field in Settings.model_fields.items():
        model, heading = section_model(name, field)
        out += [f"## `{heading}`", "", clean(inspect.getdoc(model) or ""), ""]
        out += ["| key | type and default | meaning |", "|---|---|---|"]
        own = attribute_comments(model)
        for key, sub in model.model_fields.items():
            meaning = comments.get((name, key)) or own.get(key, "")
            if name != "devices":
                meaning += f" Environment: `{ENV_PREFIX}{name.upper()}__{key.upper()}`."
            kind = f"{type_text(sub)}; default {default_text(sub)}"
            cells = (f"`{key}`", kind, meaning.strip())
            out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        out.append("")
    out += [
        "## The example file",
        "",
        "`deploy/edgemon.toml`, as shipped (every key at its default):",
        "",
        "```toml",
        EXAMPLE_CONFIG.read_text(encoding="utf-8").rstrip(),
        "```",
    ]
    return "\n".join(out)


def section_model(name: str, field: FieldInfo) -> tuple[type[BaseModel], str]:
    """The model of section `name` and its TOML heading (`[devices.<id>]` for the table)."""
    annotation = field.annotation
    if get_origin(annotation) is dict:
        model = get_args(annotation)[1]
        heading = f"[{name}.<id>]"
    else:
        model = annotation
        heading = f"[{name}]"
    assert isinstance(model, type)
    assert issubclass(model, BaseModel)
    return model, heading


def type_text(field: FieldInfo) -> str:
    """A reader's name for the field's type, with its bounds."""
    text = type_name(field.annotation)
    if any(type(item).__name__ == "PathType" for item in field.metadata):
        text = "file path"
    if text == "string" and any(getattr(item, "min_length", 0) == 1 for item in field.metadata):
        return "non-empty string"
    bounds = [
        f"{sign} {getattr(item, attr)}"
        for item in field.metadata
        for attr, sign in CONSTRAINTS.items()
        if getattr(item, attr, None) is not None
    ]
    return ", ".join([text, *bounds])


def type_name(annotation: Any) -> str:
    """`float` → number, `Literal["a", "b"]` → "a" or "b", `X | None` → X, and so on."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return " or ".join(f'`"{arg}"`' for arg in args)
    if origin in {Union, types.UnionType}:
        return " or ".join(type_name(arg) for arg in args if arg is not type(None))
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if args and hasattr(annotation, "__metadata__"):  # Annotated[...], e.g. FilePath
        if any(type(item).__name__ == "PathType" for item in annotation.__metadata__):
            return "file path"
        return type_name(args[0])
    names: dict[Any, str] = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        Path: "path",
        SecretStr: "secret",
    }
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(field: FieldInfo) -> str:
    """The default as TOML would write it; a computed one says so."""
    if field.default_factory is not None:
        return "computed"
    value = field.default
    special = {PydanticUndefined: "required", None: "unset", True: "`true`", False: "`false`"}
    if value is PydanticUndefined or value is None or isinstance(value, bool):
        return special[value]
    if isinstance(value, str | Path):
        return f'`"{value}"`'
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def attribute_comments(model: type[BaseModel]) -> dict[str, str]:
    """The `#:` comments written above the model's fields, by field name."""
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"([a-z_]+)\s*:", stripped)
        if match and pending:
            found[match.group(1)] = clean(" ".join(pending))
        pending = []
    return found


def example_comments(text: str) -> dict[tuple[str, str], str]:
    """The comment block above each key of the example config, by (section, key). Keys on
    consecutive lines share the block above the first (`cert_file` and `key_file`)."""
    found: dict[tuple[str, str], str] = {}
    section = ""
    pending: list[str] = []
    shared = ""
    for raw in text.splitlines():
        line = raw.strip()
        if heading := SECTION_LINE.match(line):
            section, pending, shared = heading.group(1), [], ""
        elif key := KEY_LINE.match(line):
            shared = clean(" ".join(pending)) if pending else shared
            if shared and section:
                found[(section, key.group(2))] = shared
            pending = []
        elif line.startswith("#") and section:
            pending.append(line.lstrip("#").strip())
        else:
            pending, shared = [], ""
    return found


def clean(text: str) -> str:
    """One paragraph: the lines of a docstring or a comment block joined, with `<` and `>`
    outside code spans escaped (`<topic_prefix>/<device>` is text, not HTML)."""
    spans = " ".join(text.split()).split("`")
    for i in range(0, len(spans), 2):  # the even pieces are outside backticks
        spans[i] = spans[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(spans)


# --- the command-line reference --------------------------------------------------------------


def cli() -> str:
    """Each command's help, exactly as `edgemon <command> --help` prints it."""
    with help_width(HELP_COLUMNS):
        parser = build_parser()
        out = ["## `edgemon`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name in command_names(parser):
            text = printed_help(parser, name)
            out += [f"## `edgemon {name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


def command_names(parser: argparse.ArgumentParser) -> list[str]:
    """The commands, in the order the usage line lists them (`{run,demo,...}`)."""
    match = re.search(r"\{([a-z,-]+)\}", parser.format_usage())
    assert match is not None, parser.format_usage()
    return match.group(1).split(",")


def printed_help(parser: argparse.ArgumentParser, command: str) -> str:
    """What `edgemon <command> --help` prints (argparse's public path: it exits 0)."""
    out = io.StringIO()
    with redirect_stdout(out), suppress(SystemExit):
        parser.parse_args([command, "--help"])
    return out.getvalue()


@contextmanager
def help_width(columns: str) -> Iterator[None]:
    """argparse wraps help to $COLUMNS: fix it while the help is formatted."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = columns
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


# --- the results of the benchmarks ------------------------------------------------------------

RESULTS = ROOT / "benchmarks" / "results" / "worth.jsonl"
PERFORMANCE = ROOT / "benchmarks" / "results" / "performance.jsonl"
#: Tables of figures, one per benchmark: `<!-- generated: PREFIX-BENCH -->` renders BENCH's.
FIGURES = {
    "performance": PERFORMANCE,
    "hostile": ROOT / "benchmarks" / "results" / "hostile.jsonl",
}
SCENARIO_ORDER = ("steady", "slowdown", "contention", "burst", "network")


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a results file."""
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def results() -> list[dict[str, Any]]:
    """The figures `make bench-worth` wrote (benchmarks/results/worth.jsonl)."""
    return records(RESULTS)


def figures_table(path: Path, bench: str) -> str:
    """One benchmark's figures from a results file (benchmarks/results/performance.jsonl,
    hostile.jsonl): a table (with the targets, where it has any), then what made them."""
    rows = [row for row in records(path) if row.get("bench") == bench]
    [made] = [row for row in rows if row["kind"] == "made"]
    figures = [row for row in rows if row["kind"] == "figure"]
    targets = any("target" in row for row in figures)
    target = made.get("target", "target")
    out = ["| figure | measured |" + (f" {target} |" if targets else ""), "|---|---|"]
    out[1] += "---|" if targets else ""
    for row in figures:
        cells = [row["figure"], _measured(row)] + ([row.get("target", "–")] if targets else [])
        out.append("| " + " | ".join(cells) + " |")
    dates = made["date"] if isinstance(made["date"], list) else [made["date"]]
    how = f"Made by `{made['command']}`" if "command" in made else made["how"]
    line = f"{how} on {' and '.join(dates)}"
    if made.get("runs") == 1:
        line += ", one run"
    elif "runs" in made:
        line += f", {made['runs']} runs (a range: the least and the most)"
    out += ["", line + (f"; {made['note']}." if "note" in made else ".")]
    return "\n".join(out)


def _measured(row: dict[str, Any]) -> str:
    """`about 190,000 events/s`, `1.80–1.98×`, `≤ 0.25–0.5 ms (histogram bucket)`."""
    digits = row["digits"]
    low, high = (f"{row[k]:,.{digits}f}" for k in ("min", "max"))
    text = low if low == high else f"{low}–{high}"
    text = ("about " if row.get("about") else "") + text + row["unit"]
    if "bound" in row:
        text = f"{row['bound']} {text}"
    return text + (f" ({row['note']})" if "note" in row else "")


def _figures(kind: str, lengths: str = "eos") -> dict[tuple[str, str, float, str], dict[str, Any]]:
    """Rows of `kind` by (profile, scenario, target or load, role)."""
    out: dict[tuple[str, str, float, str], dict[str, Any]] = {}
    for row in results():
        if row.get("kind") == kind and row.get("lengths") == lengths:
            at = row["target"] if kind == "slo_capacity" else row["load"]
            out[(row["profile"], row["scenario"], float(at), row["role"])] = row
    return out


def _points(figures: dict[tuple[str, str, float, str], dict[str, Any]]) -> list[tuple[str, str]]:
    """The (profile, scenario) pairs, profiles as they come, scenarios in a fixed order."""
    pairs = dict.fromkeys((p, s) for p, s, _, _ in figures)
    profiles = list(dict.fromkeys(p for p, _ in pairs))
    return sorted(pairs, key=lambda ps: (profiles.index(ps[0]), SCENARIO_ORDER.index(ps[1])))


def _cell(row: dict[str, Any] | None, *, percent: bool = False) -> str:
    """`median [min–max]` of a figure, or a dash."""
    if row is None:
        return "–"
    scale, unit = (100, " %") if percent else (1, "")
    median, low, high = (scale * row[k] for k in ("median", "min", "max"))
    digits = 0 if percent else 2
    return f"{median:.{digits}f}{unit} [{low:.{digits}f}–{high:.{digits}f}]"


def worth_made() -> str:
    """What made the figures: the command, the date and the seeds."""
    made = next(row for row in results() if row.get("kind") == "made")
    tuned = ", ".join(f"`{p}`: `{label}`" for p, label in made["tuned"].items())
    return (
        f"Made by `{made['command']}` on {made['date']}: the static configuration tuned on "
        f"seeds {', '.join(made['training_seeds'])} ({tuned}), every figure on the held-out "
        f"seeds {', '.join(made['seeds'])}, median [least–most] over the seeds."
    )


def worth_headline() -> str:
    """SLO capacity at 95 % and goodput at load 1.0: open, the tuned configuration, edgemon."""
    slo, good = _figures("slo_capacity"), _figures("goodput")
    out = [
        (
            "| profile | scenario | SLO capacity: `open` | tuned static | `edgemon` | edgemon ÷ "
            "tuned | goodput at 1.0: tuned static | `edgemon` |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for profile, scenario in _points(slo):
        cap = {
            role: slo.get((profile, scenario, 0.95, role)) for role in ("open", "tuned", "edgemon")
        }
        mine, theirs = cap["edgemon"], cap["tuned"]
        ratio = (
            f"{mine['median'] / theirs['median']:.2f}"
            if mine and theirs and theirs["median"]
            else "–"
        )
        at_one = [good.get((profile, scenario, 1.0, role)) for role in ("tuned", "edgemon")]
        out.append(
            f"| {profile} | {scenario} | {_cell(cap['open'])} | {_cell(theirs)} | "
            f"{_cell(mine)} | {ratio} | {_cell(at_one[0], percent=True)} | "
            f"{_cell(at_one[1], percent=True)} |"
        )
    return "\n".join(out)


def worth_peers() -> str:
    """SLO capacity of the peers' estimated pacing and of the best static point."""
    slo = _figures("slo_capacity")
    roles = ("ceiling", "estimated-park", "estimated-edf", "edgemon")
    out = [
        (
            "| profile | scenario | best static point | `estimated-park` | `estimated-edf` | "
            "`edgemon` |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for profile, scenario in _points(slo):
        rows = [slo.get((profile, scenario, 0.95, role)) for role in roles]
        best = rows[0]
        first = "–" if best is None else f"{_cell(best)} (`{best['policy']}`)"
        out.append(
            f"| {profile} | {scenario} | {first} | " + " | ".join(_cell(r) for r in rows[1:]) + " |"
        )
    return "\n".join(out)


def worth_parts() -> str:
    """The shipped policy without each part: SLO capacity and goodput at 1.2, against it."""
    slo, good = _figures("slo_capacity"), _figures("goodput")
    parts = sorted({role for (_, _, _, role) in slo if role.startswith(("without", "with "))})
    out = [
        "| profile | scenario | " + " | ".join(parts) + " |",
        "|---|---|" + "---|" * len(parts),
    ]
    for profile, scenario in _points(slo):
        mine_c = slo.get((profile, scenario, 0.95, "edgemon"))
        mine_g = good.get((profile, scenario, 1.2, "edgemon"))
        cells = []
        for part in parts:
            c, g = (
                slo.get((profile, scenario, 0.95, part)),
                good.get((profile, scenario, 1.2, part)),
            )
            dc = "–" if c is None or mine_c is None else f"{c['median'] - mine_c['median']:+.2f}"
            dg = (
                "–"
                if g is None or mine_g is None
                else f"{100 * (g['median'] - mine_g['median']):+.0f}"
            )
            cells.append(f"{dc} / {dg}")
        out.append(f"| {profile} | {scenario} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def worth_lengths() -> str:
    """edgemon's SLO capacity and goodput at 1.2 with lengths predicted and known."""
    slo_e, slo_k = _figures("slo_capacity"), _figures("slo_capacity", "known")
    good_e, good_k = _figures("goodput"), _figures("goodput", "known")
    out = [
        (
            "| profile | scenario | SLO capacity, predicted | known | goodput at 1.2, predicted "
            "| known |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for profile, scenario in _points(slo_k):
        key, at = (profile, scenario), 1.2
        out.append(
            f"| {profile} | {scenario} | {_cell(slo_e.get((*key, 0.95, 'edgemon')))} | "
            f"{_cell(slo_k.get((*key, 0.95, 'edgemon')))} | "
            f"{_cell(good_e.get((*key, at, 'edgemon')), percent=True)} | "
            f"{_cell(good_k.get((*key, at, 'edgemon')), percent=True)} |"
        )
    return "\n".join(out)


def worth_home() -> str:
    """The home page's headline: the medians of SLO capacity and of goodput in overload, for
    vLLM's defaults, its flags tuned, and edgemon."""
    slo, good = _figures("slo_capacity"), _figures("goodput")
    made = next(row for row in results() if row.get("kind") == "made")
    roles = ("open", "tuned", "edgemon")
    out = [
        (
            "| profile | scenario | SLO capacity: vLLM's defaults | vLLM's flags, tuned | "
            "**edgemon** | goodput at load 1.2: vLLM's defaults | vLLM's flags, tuned | "
            "**edgemon** |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for profile, scenario in _points(slo):
        capacity = [slo.get((profile, scenario, 0.95, role)) for role in roles]
        overload = [good.get((profile, scenario, 1.2, role)) for role in roles]
        cells = [_median(row) for row in capacity]
        cells += [_median(row, percent=True) for row in overload]
        out.append(f"| {profile} | {scenario} | " + " | ".join(cells) + " |")
    out += [
        "",
        (
            f"Medians over the held-out seeds {', '.join(made['seeds'])}; made by "
            f"`{made['command']}` on {made['date']}."
        ),
    ]
    return "\n".join(out)


def _median(row: dict[str, Any] | None, *, percent: bool = False) -> str:
    """A figure's median alone, or a dash."""
    if row is None:
        return "–"
    return f"{100 * row['median']:.0f} %" if percent else f"{row['median']:.2f}"


REAL = ROOT / "benchmarks" / "results" / "real.jsonl"


def real_rows() -> list[dict[str, Any]]:
    """The figures `make bench-real` wrote (benchmarks/results/real.jsonl)."""
    return records(REAL)


def real_made() -> str:
    """What made the real engine's figures."""
    made = next(row for row in real_rows() if row.get("kind") == "made")
    seeds = ", ".join(str(seed) for seed in made["seeds"])
    arrivals = " and ".join(f"{s:g}" for s in made["arrivals_s"])
    return (
        f"Made by `{made['command']}` on {made['date']}: seeds {seeds} on the real engine, "
        f"{arrivals} s of arrivals per run, each beside the virtual loop's prediction for the "
        "same seeds on the shape measured first; median [least–most] over the seeds."
    )


def real_headline() -> str:
    """SLO capacity at 95 % and goodput at load 1.0, real and predicted, per policy."""
    rows = real_rows()
    index = {
        (r["kind"], r["scenario"], r["role"], r["mode"]): r for r in rows if r.get("kind") != "made"
    }
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows if "scenario" in r))
    roles = list(dict.fromkeys(r["role"] for r in rows if "role" in r))
    out = [
        (
            "| scenario | policy | SLO capacity, real | predicted | goodput at 1.0, real | "
            "predicted |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for role in roles:
            cells = [
                _cell(index.get((kind, scenario, role, mode)), percent=kind == "goodput")
                for kind in ("slo_capacity", "goodput")
                for mode in ("real", "virtual")
            ]
            policy = next(
                (r["policy"] for (_, s, o, _), r in index.items() if s == scenario and o == role),
                role,
            )
            out.append(f"| {scenario} | `{policy}` | " + " | ".join(cells) + " |")
    return "\n".join(out)


FEED = ROOT / "benchmarks" / "results" / "feed.jsonl"
FEED_ROLES = ("measured", "estimated", "none", "oracle", "estimated-park", "estimated-edf")
FEED_NAMES = [f"`{role}`" for role in FEED_ROLES]
FEED_LOADS = (0.8, 1.0, 1.2)


def _feed_figures() -> dict[tuple[str, str, str, float, str], dict[str, Any]]:
    """The rows of benchmarks/results/feed.jsonl by (kind, profile, scenario, point, role)."""
    return {
        (r["kind"], r["profile"], r["scenario"], float(r["at"]), r["role"]): r
        for r in records(FEED)
        if r["kind"] != "made"
    }


def _feed_points(kind: str) -> list[tuple[str, str]]:
    """The (profile, scenario) pairs of `kind`, in the order the results file has them."""
    rows = [r for r in records(FEED) if r["kind"] == kind]
    return list(dict.fromkeys((r["profile"], r["scenario"]) for r in rows))


def _difference(row: dict[str, Any] | None, scale: float, digits: int) -> str:
    """`+1.0 [-2.0 to +3.6], 7/10`: a seed-by-seed difference and the seeds it was ahead."""
    if row is None:
        return "–"
    # Rounded first, and + 0.0, so that a difference that rounds to zero never prints "-0.0".
    median, low, high = (round(scale * row[k], digits) + 0.0 for k in ("median", "min", "max"))
    return (
        f"{median:+.{digits}f} [{low:+.{digits}f} to {high:+.{digits}f}], "
        f"{row['ahead']}/{row['seeds']}"
    )


def feed_made() -> str:
    """What made the figures of measured against estimated."""
    made = next(row for row in records(FEED) if row["kind"] == "made")
    return (
        f"Made by `{made['command']}` on {made['date']}, on the held-out seeds "
        f"{', '.join(made['seeds'])}: median [least–most] over the seeds; a difference is taken "
        "seed by seed (the same requests and listeners), with the seeds it was ahead."
    )


def feed_capacity() -> str:
    """SLO capacity at 95 % of edgemon fed each, and of the peers."""
    figures = _feed_figures()
    out = [
        "| profile | scenario | " + " | ".join(FEED_NAMES) + " | measured − estimated |",
        "|---|---|" + "---|" * (len(FEED_NAMES) + 1),
    ]
    for profile, scenario in _feed_points("slo_capacity"):
        cells = [figures.get(("slo_capacity", profile, scenario, 0.95, r)) for r in FEED_ROLES]
        diff = figures.get(("slo_capacity", profile, scenario, 0.95, "measured - estimated"))
        out.append(
            f"| {profile} | {scenario} | "
            + " | ".join(_cell(c) for c in cells)
            + f" | {_difference(diff, 1.0, 2)} |"
        )
    return "\n".join(out)


def feed_goodput() -> str:
    """Goodput of edgemon fed what the players measured, less fed the estimate, in points."""
    figures = _feed_figures()
    out = [
        "| profile | scenario | "
        + " | ".join(f"measured − estimated, load {load:g}" for load in FEED_LOADS)
        + " | oracle − estimated, 1.0 | goodput, measured, 1.0 |",
        "|---|---|" + "---|" * (len(FEED_LOADS) + 2),
    ]
    for profile, scenario in _feed_points("goodput"):
        cells = [
            _difference(
                figures.get(("goodput", profile, scenario, load, "measured - estimated")), 100, 1
            )
            for load in FEED_LOADS
        ]
        bound = figures.get(("goodput", profile, scenario, 1.0, "oracle - estimated"))
        mine = figures.get(("goodput", profile, scenario, 1.0, "measured"))
        out.append(
            f"| {profile} | {scenario} | "
            + " | ".join([*cells, _difference(bound, 100, 1), _cell(mine, percent=True)])
            + " |"
        )
    return "\n".join(out)


def feed_prebuffer() -> str:
    """Start-SLO misses among admitted requests with prebuffering players, per feed."""
    figures = _feed_figures()
    out = [
        "| profile | load | " + " | ".join(FEED_NAMES) + " |",
        "|---|---|" + "---|" * len(FEED_NAMES),
    ]
    for profile, _ in [p for p in _feed_points("late_admitted") if p[1] == "prebuffer"]:
        for load in FEED_LOADS:
            cells = [
                figures.get(("late_admitted", profile, "prebuffer", load, r)) for r in FEED_ROLES
            ]
            shown = " | ".join(_cell(c, percent=True) for c in cells)
            out.append(f"| {profile} | {load:g} | {shown} |")
    return "\n".join(out)


REAL_FEED = ROOT / "benchmarks" / "results" / "real-feed.jsonl"
REAL_FEEDS = ("measured", "estimated", "none")


def real_feed() -> str:
    """Goodput of `edgemon` with parking fed each, on the real engine and on the virtual loop
    with its measured steps, the differences seed by seed, and the parks and preemptions."""
    rows = records(REAL_FEED)
    made = next(row for row in rows if row["kind"] == "made")
    index = {(r["mode"], r["scenario"], r["role"]): r for r in rows if r["kind"] == "goodput"}
    points = list(dict.fromkeys((r["scenario"], r["mode"]) for r in rows if "mode" in r))
    out = [
        (
            f"Made by `{made['command']}` on {made['date']}: seeds "
            f"{', '.join(str(s) for s in made['seeds'])}, load 1.0, "
            f"{' and '.join(f'{a:g}' for a in made['arrivals_s'])} s of arrivals per real run; "
            "goodput, median [least–most]; differences in points, seed by seed, with the seeds "
            "ahead."
        ),
        "",
        "| scenario | loop | "
        + " | ".join(f"`{role}`" for role in REAL_FEEDS)
        + " | measured − estimated | measured − none | parks, measured / estimated | "
        "preemptions |",
        "|---|---|" + "---|" * (len(REAL_FEEDS) + 4),
    ]
    for scenario, mode in sorted(points, key=lambda p: (p[0], p[1] != "real")):
        cells = [_cell(index.get((mode, scenario, r)), percent=True) for r in REAL_FEEDS]
        diffs = [
            _difference(index.get((mode, scenario, f"measured - {b}")), 100, 1)
            for b in ("estimated", "none")
        ]
        if mode == "real":
            parks = " / ".join(
                str(index.get((mode, scenario, r), {}).get("parks", "–"))
                for r in ("measured", "estimated")
            )
            preempted = sum(
                index.get((mode, scenario, r), {}).get("preemptions", 0) for r in REAL_FEEDS
            )
            counted = [parks, str(preempted)]
        else:
            counted = ["–", "–"]
        out.append(f"| {scenario} | {mode} | " + " | ".join([*cells, *diffs, *counted]) + " |")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "real-feed": real_feed,
    "real-made": real_made,
    "real-headline": real_headline,
    "configuration": configuration,
    "cli": cli,
    "worth-made": worth_made,
    "worth-headline": worth_headline,
    "worth-peers": worth_peers,
    "worth-parts": worth_parts,
    "worth-lengths": worth_lengths,
    "worth-home": worth_home,
    "feed-made": feed_made,
    "feed-capacity": feed_capacity,
    "feed-goodput": feed_goodput,
    "feed-prebuffer": feed_prebuffer,
}
GENERATORS |= {
    f"{prefix}-{bench}": functools.partial(figures_table, path, bench)
    for prefix, path in FIGURES.items()
    for bench in dict.fromkeys(row["bench"] for row in records(path))
}
