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
class MetricsSnapshot:
    metrics: dict[str, Metric] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        return self.metrics[name].value

    def __contains__(self, name: str) -> bool:
        return name in self.metrics

    def get(self, name: str, default: float = 0.0) -> float:
        m = self.metrics.get(name)
        return m.value if m is not None else default


def parse_prometheus(text: str, prefix: str = "llamacpp:") -> MetricsSnapshot:
    """Parse the unlabeled llamacpp:* series with their HELP and TYPE lines.

    Raises MetricsFormatError when a series has no TYPE or HELP line, which Prometheus needs.
    Labeled series (name{...}) are skipped.
    """
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, desc = line[len("# HELP "):].partition(" ")
            helps[name] = desc
        elif line.startswith("# TYPE "):
            name, _, typ = line[len("# TYPE "):].partition(" ")
            types[name] = typ.strip()
        elif line and not line.startswith("#"):
            name, _, val = line.partition(" ")
            if "{" in name:
                continue
            try:
                values[name] = float(val)
            except ValueError as e:
                raise MetricsFormatError(f"bad value in metrics line {line!r}") from e
    snap = MetricsSnapshot()
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
    return PreemptStats.from_series({name: m.value for name, m in snap.metrics.items()}, slots)
