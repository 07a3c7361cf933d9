"""served_step: the engine's steps timed inside a served kvserve (through the study's sitecustomize
hook on the host's PYTHONPATH) beside the same steps offline."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvserve.kernels import cpu_native

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "loadtests" / "studies" / "serving"))
from served_step import DECODE_STEPS, main  # noqa: E402  (a study: run from the checkout, not installed)
from step_timers import FLUSH_STEPS  # noqa: E402  (served_step put its hook folder on the path)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not cpu_native.available(), reason="no native decode step")]


def test_served_steps_are_timed_in_the_host_and_split_the_share(llama_dir, tmp_path, capsys):
    out = tmp_path / "served_step.json"
    assert main(["--model", llama_dir, "--pairs", "1", "--prompts", "2", "--rounds", "1", "--json", str(out)]) == 0
    pair = json.loads(out.read_text())["pairs"][0]
    off, srv, share = pair["offline"], pair["served"], pair["share"]
    assert off["steps"] == DECODE_STEPS  # one round: the steps after the prompt's first token
    # The hook ran in the host child: the warm-up and the 2 requests' decode steps, less the unflushed tail.
    assert srv["steps"] >= 3 * (DECODE_STEPS - 1) - FLUSH_STEPS
    for side in (off, srv):
        assert side["native"] > 0 and side["step"] > side["native"] + side["logits"]
    parts = share["rest"] + share["native"] + share["logits"] + share["gap"] + share["client"]
    assert parts == pytest.approx(share["share"], abs=1e-6)
    assert srv["tpot"] > 0 and "between steps" in capsys.readouterr().out
