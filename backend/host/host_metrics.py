"""The host's metric registry: model MetricFamily metrics and tritonserver's nv_* metrics.

Values live in one lock-protected store; a prometheus_client Collector exposes
them on a CollectorRegistry. Text is rendered here rather than with
prometheus_client.generate_latest because that function renames counters to
`<name>_total`, while tritonserver prints a family under exactly the name given
(`nv_inference_request_success`, or a model's `kvserve:prompt_tokens_total`).
"""
from __future__ import annotations

import bisect
import enum
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from prometheus_client.core import CollectorRegistry, Metric

_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelKey = tuple[tuple[str, str], ...]


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_TYPE_NAMES = {MetricKind.COUNTER: "counter", MetricKind.GAUGE: "gauge", MetricKind.HISTOGRAM: "histogram"}


@dataclass(slots=True)
class Series:
    value: float = 0.0
    bounds: list[float] | None = None  # histogram upper bounds, sorted, without +Inf
    bucket_counts: list[int] | None = None  # per bound, plus one for +Inf; not cumulative
    total: float = 0.0
    count: int = 0


@dataclass(slots=True)
class Family:
    name: str
    description: str
    kind: MetricKind
    series: dict[LabelKey, Series] = field(default_factory=dict)


class MetricStore:
    """Thread-safe: models update metrics from any thread, scrapes read on the loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}

    def family(self, name: str, description: str, kind: MetricKind) -> Family:
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid metric family name '{name}'")
        with self._lock:
            fam = self._families.get(name)
            if fam is None:
                fam = self._families[name] = Family(name, description, MetricKind(kind))
            elif fam.kind != kind:
                raise ValueError(f"metric family '{name}' already exists with a different kind")
            return fam

    def series(self, fam: Family, labels: dict[str, str], buckets: list[float] | None = None) -> Series:
        for key, value in labels.items():
            if not isinstance(key, str) or not _LABEL_RE.match(key) or not isinstance(value, str):
                raise ValueError(f"invalid metric label {key!r}={value!r}: labels map str to str")
        key: LabelKey = tuple(sorted(labels.items()))
        with self._lock:
            existing = fam.series.get(key)
            if existing is not None:
                return existing
            s = Series()
            if fam.kind == MetricKind.HISTOGRAM:
                bounds = sorted(float(b) for b in (buckets or []))
                s.bounds, s.bucket_counts = bounds, [0] * (len(bounds) + 1)
            fam.series[key] = s
            return s

    def drop_series(self, fam: Family, labels: dict[str, str]) -> None:
        """Remove every series of `fam` whose labels include all of `labels` (a model's series when
        it unloads, whatever other labels, such as a failure reason, they carry)."""
        wanted = set(labels.items())
        with self._lock:
            for key in [k for k in fam.series if wanted <= set(k)]:
                del fam.series[key]

    def increment(self, fam: Family, s: Series, value: float) -> None:
        if fam.kind == MetricKind.HISTOGRAM:
            raise ValueError("histogram metrics support only observe()")
        if fam.kind == MetricKind.COUNTER and value < 0:
            raise ValueError("counter metrics can only be incremented by a non-negative value")
        with self._lock:
            s.value += value

    def set(self, fam: Family, s: Series, value: float) -> None:
        if fam.kind != MetricKind.GAUGE:
            raise ValueError("only gauge metrics support set()")
        with self._lock:
            s.value = float(value)

    def observe(self, fam: Family, s: Series, value: float) -> None:
        if fam.kind != MetricKind.HISTOGRAM or s.bounds is None or s.bucket_counts is None:
            raise ValueError("only histogram metrics support observe()")
        with self._lock:
            s.bucket_counts[bisect.bisect_left(s.bounds, value)] += 1
            s.total += value
            s.count += 1

    def value(self, fam: Family, s: Series) -> float:
        if fam.kind == MetricKind.HISTOGRAM:
            raise ValueError("histogram metrics do not support value()")
        with self._lock:
            return s.value

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = [(f.name, f.description, f.kind, [(k, _copy(s)) for k, s in f.series.items()])
                        for f in self._families.values()]
        for name, description, kind, series in families:
            metric = Metric(name, description, _TYPE_NAMES[kind])
            for key, s in series:
                labels = dict(key)
                if kind != MetricKind.HISTOGRAM:
                    metric.add_sample(name, labels, s.value)
                    continue
                cumulative = 0
                for bound, n in zip([*(s.bounds or []), math.inf], s.bucket_counts or []):
                    cumulative += n
                    metric.add_sample(f"{name}_bucket", {**labels, "le": _fmt(bound)}, cumulative)
                metric.add_sample(f"{name}_sum", labels, s.total)
                metric.add_sample(f"{name}_count", labels, s.count)
            yield metric


def _copy(s: Series) -> Series:
    return Series(s.value, list(s.bounds) if s.bounds else s.bounds,
                  list(s.bucket_counts) if s.bucket_counts else s.bucket_counts, s.total, s.count)


def _fmt(value: float) -> str:
    # prometheus-cpp prints whole numbers without a decimal point, as tritonserver does.
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_text(registry: CollectorRegistry) -> bytes:
    """Prometheus text format 0.0.4, family names exactly as registered."""
    out: list[str] = []
    for metric in registry.collect():
        out.append(f"# HELP {metric.name} {metric.documentation.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}\n")
        out.append(f"# TYPE {metric.name} {metric.type}\n")
        for sample in metric.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
            out.append(f"{sample.name}{{{labels}}} {_fmt(sample.value)}\n" if labels
                       else f"{sample.name} {_fmt(sample.value)}\n")
    return "".join(out).encode("utf-8")


class _StoreCollector:
    def __init__(self, store: MetricStore) -> None:
        self._store = store

    def collect(self) -> Iterable[Metric]:
        return self._store.collect()


# One store per process: pb_utils is one module shared by every model in the
# process, so its MetricFamily objects cannot be bound to a particular host.
STORE = MetricStore()
REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(_StoreCollector(STORE))  # type: ignore[arg-type]


# tritonserver's nv_inference_request_failure reasons.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


class HostMetrics:
    """tritonserver's per-model inference metrics (names and labels as tritonserver's)."""

    def __init__(self, store: MetricStore = STORE) -> None:
        c, g = MetricKind.COUNTER, MetricKind.GAUGE
        self._store = store
        self.success = store.family(
            "nv_inference_request_success", "Number of successful inference requests, all batch sizes", c)
        self.failure = store.family(
            "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", c)
        self.count = store.family(
            "nv_inference_count", "Number of inferences performed (does not include cached requests)", c)
        self.exec_count = store.family(
            "nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", c)
        self.duration = store.family(
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds (includes cached requests)", c)
        self.queue = store.family(
            "nv_inference_queue_duration_us",
            "Cumulative inference queuing duration in microseconds (includes cached requests)", c)
        self.pending = store.family(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.", g)

    def _add(self, fam: Family, labels: dict[str, str], value: float) -> None:
        self._store.increment(fam, self._store.series(fam, labels), value)

    def request_done(self, model: str, version: str, failure_reason: str | None, duration_us: float,
                     queue_us: float) -> None:
        """As tritonserver: a failed (or cancelled) request moves only the failure counter; the
        inference count and the duration counters are those of successful requests, so that
        duration / success is the mean latency of a request that succeeded."""
        labels = {"model": model, "version": version}
        if failure_reason is not None:
            self._add(self.failure, {**labels, "reason": failure_reason}, 1)
            return
        self._add(self.success, labels, 1)
        self._add(self.count, labels, 1)
        self._add(self.duration, labels, max(0, int(duration_us)))  # whole us, like tritonserver
        self._add(self.queue, labels, max(0, int(queue_us)))

    def model_loaded(self, model: str, version: str) -> None:
        """Every per-model series at 0 once the model is ready, as tritonserver exports them,
        so rate() and absent() work before the first request."""
        labels = {"model": model, "version": version}
        for fam in (self.success, self.count, self.exec_count, self.duration, self.queue, self.pending):
            self._store.series(fam, labels)
        for reason in FAILURE_REASONS:
            self._store.series(self.failure, {**labels, "reason": reason})

    def model_unloaded(self, model: str, version: str) -> None:
        """As tritonserver drops a model's metric reporter with the model: its series leave
        /metrics, and a later load of the same version starts them again at 0 (model_loaded)."""
        labels = {"model": model, "version": version}
        for fam in (self.success, self.failure, self.count, self.exec_count, self.duration, self.queue, self.pending):
            self._store.drop_series(fam, labels)

    def executed(self, model: str, version: str) -> None:
        """One call of the model's execute() (with a batch of one or more requests)."""
        self._add(self.exec_count, {"model": model, "version": version}, 1)

    def pending_delta(self, model: str, version: str, delta: int) -> None:
        self._add(self.pending, {"model": model, "version": version}, delta)
