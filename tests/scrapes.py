"""Reading samples out of a Prometheus text page (edgemon's `/metrics`), written once for the
tests and the benchmarks. Parsed with `prometheus_client`'s own parser, as Prometheus would."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

#: A sample's labels, sorted: a key that does not depend on the order they were written in.
Labels = tuple[tuple[str, str], ...]


def sample(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of the first sample `name` whose labels include `labels`; None if none."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                return float(s.value)
    return None


def samples(text: str, name: str) -> dict[Labels, float]:
    """Every sample `name`, keyed by its sorted labels."""
    return {
        tuple(sorted(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def total(text: str, name: str, **labels: str) -> float:
    """The sum of `name` over every series whose labels include `labels`."""
    return sum(
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def samples_by_label_text(text: str, name: str) -> dict[str, float]:
    """Every sample `name`, keyed by its labels as written (`device="d1",result="x"`; `""`
    if none)."""
    return {
        ",".join(f'{k}="{v}"' for k, v in s.labels.items()): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def series_names(text: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every sample on the page, in order."""
    return [
        (s.name, dict(s.labels))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
