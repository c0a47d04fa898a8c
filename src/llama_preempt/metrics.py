"""Parsing llama-server's Prometheus /metrics text into typed values."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .stats import PreemptStats


class MetricsFormatError(ValueError):
    pass


@dataclass
class Metric:
    name: str            # without the "llamacpp:" prefix
    type: str            # counter | gauge
    help: str
    value: float


@dataclass
class Histogram:
    name: str                  # without the "llamacpp:" prefix
    help: str
    buckets: dict[str, float]  # upper bound ("0", "1", ..., "+Inf") -> cumulative count
    sum: float
    count: float


@dataclass
class MetricsSnapshot:
    metrics: dict[str, Metric] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    # counters with one label: name -> label value -> value (preempt_parks_by_choice_total{choice=...},
    # preempt_parks_by_tier_total{tier=...}, ...)
    labeled: dict[str, dict[str, float]] = field(default_factory=dict)
    age_ms: float = 0.0  # how old: the Engine's metrics() are as of its last step boundary (0 over HTTP)

    def __getitem__(self, name: str) -> float:
        return self.metrics[name].value

    def __contains__(self, name: str) -> bool:
        return name in self.metrics

    def get(self, name: str, default: float = 0.0) -> float:
        m = self.metrics.get(name)
        return m.value if m is not None else default


def parse_prometheus(text: str, prefix: str = "llamacpp:") -> MetricsSnapshot:
    """Parse the unlabeled llamacpp:* series with their HELP and TYPE lines, and the histograms
    (NAME_bucket{le=...}, NAME_sum, NAME_count under one TYPE ... histogram line).

    Series with one label (name{key="value"}) of our own go to `labeled`, by label value.
    Raises MetricsFormatError when a series has no TYPE or HELP line, which Prometheus needs.
    """
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    values: dict[str, float] = {}
    buckets: dict[str, dict[str, float]] = {}
    labeled: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, desc = line[len("# HELP "):].partition(" ")
            helps[name] = desc
        elif line.startswith("# TYPE "):
            name, _, typ = line[len("# TYPE "):].partition(" ")
            types[name] = typ.strip()
        elif line and not line.startswith("#"):
            name, _, val = line.rpartition(" ")
            try:
                value = float(val)
            except ValueError as e:
                raise MetricsFormatError(f"bad value in metrics line {line!r}") from e
            if name.endswith("{}"):
                name = name[:-2]  # an empty label set (a histogram's _sum and _count)
            if "{" in name:
                base, _, labels = name.partition("{")
                if base.endswith("_bucket") and 'le="' in labels:
                    buckets.setdefault(base[: -len("_bucket")], {})[labels.split('le="', 1)[1].split('"', 1)[0]] = value
                elif base.startswith(prefix) and labels.count('="') == 1 and labels.endswith('"}'):
                    labeled.setdefault(base, {})[labels.split('="', 1)[1][:-2]] = value
                continue
            values[name] = value
    snap = MetricsSnapshot()
    hist_names = {n for n, t in types.items() if t == "histogram"}
    for name in hist_names:
        short = name[len(prefix):] if name.startswith(prefix) else name
        snap.histograms[short] = Histogram(short, helps.get(name, ""), buckets.get(name, {}),
                                           values.pop(name + "_sum", 0.0), values.pop(name + "_count", 0.0))
    for name, by_label in labeled.items():
        if name not in types or name not in helps:
            raise MetricsFormatError(f"metric {name} has no TYPE or HELP line")
        snap.labeled[name[len(prefix):]] = by_label
    for name, value in values.items():
        if name not in types or name not in helps:
            raise MetricsFormatError(f"metric {name} has no TYPE or HELP line")
        short = name[len(prefix):] if name.startswith(prefix) else name
        snap.metrics[short] = Metric(short, types[name], helps[name], value)
    return snap


def parse_preempt_stats(metrics_text: str, slots: list[dict[str, Any]]) -> PreemptStats:
    """The preemption counters and gauges of a /metrics text plus the /slots entries, as the same
    PreemptStats the in-process Engine returns. Raises KeyError when the server is not ours."""
    snap = parse_prometheus(metrics_text)
    return PreemptStats.from_series({name: m.value for name, m in snap.metrics.items()}, slots, snap.labeled)
