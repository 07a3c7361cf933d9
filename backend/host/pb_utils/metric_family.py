"""pb_utils.MetricFamily / Metric, backed by the host metric store.

As in Triton, a family is identified by its name: creating the same family twice
(same kind) yields the same series, so two instances of a model that both
declare `kvserve:prompt_tokens_total` add into one counter.
"""
from __future__ import annotations

from ..host_metrics import STORE, Family, MetricKind, Series
from .triton_errors import TritonModelException


class Metric:
    __slots__ = ("_family", "_series")

    def __init__(self, family: Family, series: Series) -> None:
        self._family = family
        self._series = series

    def increment(self, value: float) -> None:
        try:
            STORE.increment(self._family, self._series, float(value))
        except ValueError as exc:
            raise TritonModelException(f"Failed to increment metric value: {exc}") from None

    def set(self, value: float) -> None:
        try:
            STORE.set(self._family, self._series, float(value))
        except ValueError as exc:
            raise TritonModelException(f"Failed to set metric value: {exc}") from None

    def observe(self, value: float) -> None:
        try:
            STORE.observe(self._family, self._series, float(value))
        except ValueError as exc:
            raise TritonModelException(f"Failed to observe metric value: {exc}") from None

    def value(self) -> float:
        try:
            return STORE.value(self._family, self._series)
        except ValueError as exc:
            raise TritonModelException(f"Failed to get metric value: {exc}") from None


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    __slots__ = ("_family",)

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily requires name, description and kind")
        try:
            self._family = STORE.family(str(name), str(description), MetricKind(kind))
        except ValueError as exc:
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        is_histogram = self._family.kind == MetricKind.HISTOGRAM
        if is_histogram and not buckets:
            raise TritonModelException("Error when creating Metric: histogram metrics require 'buckets'")
        if not is_histogram and buckets is not None:
            raise TritonModelException("Error when creating Metric: 'buckets' apply to histogram metrics only")
        try:
            series = STORE.series(self._family, dict(labels or {}), list(buckets) if buckets else None)
        except ValueError as exc:
            raise TritonModelException(f"Error when creating Metric: {exc}") from None
        return Metric(self._family, series)
