"""The embed-model A/B harness's settings and ratios (the served rounds are embed_bench's client)."""
from __future__ import annotations

import pytest

from kvserve.loadtests.studies.embed_ab import ab_ratios, parse_settings


def test_settings_are_name_value_pairs():
    assert parse_settings(["KVSERVE_EMBED_NUM_WORKERS=1", "GOMP_SPINCOUNT="]) == {
        "KVSERVE_EMBED_NUM_WORKERS": "1", "GOMP_SPINCOUNT": ""}
    with pytest.raises(SystemExit):
        parse_settings(["KVSERVE_EMBED_NUM_WORKERS"])


def test_ratios_are_b_over_a_per_round():
    rounds = [{"a": 50.0, "b": 60.0}, {"a": 40.0, "b": 40.0}, {"a": 50.0, "b": 45.0}]
    assert ab_ratios(rounds) == {"median": 1.0, "min": 0.9, "max": 1.2}
