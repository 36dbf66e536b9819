"""The engine's samples written straight to exposition text: the fast path of `/metrics`.

`EdgemonCollector` fills its families through `add_metric` calls; prometheus_client's families
turn each call into a `Sample` object that an encoder later turns into a line. At 10,000
streams on 100 devices that is over 10,000 objects and as many encoder calls per scrape. The
families here take the same calls and write the line at once, from a label prefix computed
once per series (`{device="…",stream="…"}` does not change between scrapes) and a value
formatted as prometheus_client formats it. A histogram's lines are rewritten only when it has
new observations: most of a device's lines are its three histograms, and they change only
with chunks.

Lines are the same in both formats (the engine's families carry no timestamps, exemplars or
units; the formats differ only in their headers), and the same as prometheus_client's text:
`tests/test_http.py` compares the two renderings of a varied fleet byte for byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from collections.abc import Sequence

    from prometheus_client.samples import Sample

    from edgemon.engine.histogram import Histogram

__all__ = ["TextFamily", "TextHistogram", "TextMaker", "go_float", "sample_line"]

_INF: Final = float("inf")
_MS: Final = 1000.0
#: Below this, prometheus_client writes a float as Python's `repr` does.
_REPR_BELOW: Final = 1e6
#: Label prefixes kept per family before the cache starts afresh (streams come and go).
PREFIX_CACHE_LIMIT: Final = 20_000


def go_float(value: float) -> str:
    """`value` as prometheus_client writes it (Go's `%g`-like formatting).

    Below 1e6 that is Python's `repr` of the float; larger values, infinities and NaN take
    prometheus_client's own path.
    """
    if -_INF < value < _REPR_BELOW:  # False for NaN
        return repr(float(value))
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def escape(value: str) -> str:
    """A label value escaped for the text formats."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def sample_line(sample: Sample) -> str:
    """One sample as a line (no timestamp, no exemplar: the engine sets neither)."""
    value = go_float(sample.value)
    if not sample.labels:
        return f"{sample.name} {value}\n"
    labels = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}} {value}\n"


class TextFamily:
    """A gauge or counter family that writes `name{labels} value` lines into `lines`."""

    __slots__ = ("_names", "_order", "_prefixes", "_sample", "lines")

    def __init__(self, sample_name: str, labelnames: Sequence[str]) -> None:
        self._sample = sample_name
        self._names = tuple(labelnames)
        #: Label positions in name order (the formats sort labels by name).
        self._order = sorted(range(len(self._names)), key=lambda i: self._names[i])
        self._prefixes: dict[tuple[str, ...], str] = {}
        self.lines: list[str] = []

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        """One sample, as `GaugeMetricFamily.add_metric` / `CounterMetricFamily.add_metric`."""
        key = labels if type(labels) is tuple else tuple(labels)
        prefix = self._prefixes.get(key) or self._prefix(key)
        if -_INF < value < _REPR_BELOW:  # go_float's common case, inline: the hot line of a scrape
            self.lines.append(f"{prefix}{float(value)!r}\n")
        else:
            self.lines.append(f"{prefix}{go_float(value)}\n")

    def _prefix(self, key: tuple[str, ...]) -> str:
        if len(self._prefixes) >= PREFIX_CACHE_LIMIT:
            self._prefixes.clear()
        if key:
            pairs = ",".join(f'{self._names[i]}="{escape(key[i])}"' for i in self._order)
            prefix = f"{self._sample}{{{pairs}}} "
        else:
            prefix = f"{self._sample} "
        self._prefixes[key] = prefix
        return prefix


class TextHistogram:
    """A per-device histogram family whose text is rewritten only when it changed."""

    __slots__ = ("_cache", "_doc", "_name", "lines")

    def __init__(self, name: str, doc: str) -> None:
        self._name = name
        self._doc = doc
        #: Per device: (histogram, observations, sum) when its text was written, the text.
        self._cache: dict[str, tuple[Histogram, int, float, str]] = {}
        self.lines: list[str] = []

    def add_histogram(self, device: str, histogram: Histogram) -> None:
        """The device's histogram (engine milliseconds, exported in seconds)."""
        count, total = histogram.count, histogram.total
        cached = self._cache.get(device)
        if cached is not None and cached[0] is histogram and cached[1:3] == (count, total):
            self.lines.append(cached[3])
            return
        family = HistogramMetricFamily(self._name, self._doc, labels=("device",))
        add_histogram(family, device, histogram)
        text = "".join(sample_line(sample) for sample in family.samples)
        self._cache[device] = (histogram, count, total, text)
        self.lines.append(text)

    def forget(self, present: set[str]) -> None:
        """Drop the text of devices no longer tracked."""
        if self._cache.keys() - present:
            self._cache = {k: v for k, v in self._cache.items() if k in present}


def add_histogram(family: HistogramMetricFamily, device: str, histogram: Histogram) -> None:
    """Add one device's engine histogram to a prometheus_client family."""
    buckets = [
        ("+Inf" if le == _INF else repr(le / _MS), float(n)) for le, n in histogram.cumulative()
    ]
    family.add_metric([device], buckets, histogram.total / _MS)


class TextMaker:
    """Makes text families, and keeps them (with their caches) from one scrape to the next."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[str, TextFamily | TextHistogram] = {}

    def gauge(self, name: str, _doc: str, labels: Sequence[str]) -> TextFamily:
        """A gauge family."""
        return self._scalar(name, labels)

    def counter(self, name: str, _doc: str, labels: Sequence[str]) -> TextFamily:
        """A counter family (`name` ends in `_total`, as do its samples)."""
        return self._scalar(name, labels)

    def histogram(self, name: str, doc: str) -> TextHistogram:
        """A per-device histogram family."""
        made = self._made.get(name)
        if not isinstance(made, TextHistogram):
            made = self._made[name] = TextHistogram(name, doc)
        return made

    def _scalar(self, name: str, labels: Sequence[str]) -> TextFamily:
        made = self._made.get(name)
        if not isinstance(made, TextFamily):
            made = self._made[name] = TextFamily(name, labels)
        return made

    def clear(self) -> None:
        """Empty every family's lines (before the next device)."""
        for made in self._made.values():
            made.lines = []

    def forget(self, present: set[str]) -> None:
        """Devices no longer tracked leave no cached text."""
        for made in self._made.values():
            if isinstance(made, TextHistogram):
                made.forget(present)
