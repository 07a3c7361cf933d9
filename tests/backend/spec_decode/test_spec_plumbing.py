"""--speculative-config on its way in (the `kvserve serve` flag, its environment variable,
config.pbtxt strings, EngineConfig, LLM) and the counters on their way out to the metrics."""
from __future__ import annotations

import json
from unittest import mock

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine import EngineConfig
from kvserve.backend.triton.telemetry import EngineTelemetry
from kvserve.backend.triton.triton_model import engine_config_from_triton
from kvserve.frontend.cli.engine_flags import engine_env
from kvserve.frontend.cli.serve_cmd import build_parser

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}


def test_serve_flag_travels_as_json_to_the_engine(llama_dir):
    args = build_parser().parse_args(["--speculative-config", json.dumps(NGRAM)])
    env = engine_env(args)
    assert json.loads(env["KVSERVE_SPECULATIVE_CONFIG"]) == NGRAM
    config = EngineConfig.from_strings({"model": llama_dir, "speculative_config": env["KVSERVE_SPECULATIVE_CONFIG"]})
    assert config.speculative_config == NGRAM
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--speculative-config", "[1, 2]"])  # not an object: argparse says so


def test_config_pbtxt_parameter_and_its_environment_override(llama_dir, monkeypatch):
    params = {"model": {"string_value": llama_dir}, "speculative_config": {"string_value": json.dumps(NGRAM)}}
    assert engine_config_from_triton({"parameters": params}).speculative_config == NGRAM
    monkeypatch.setenv("KVSERVE_SPECULATIVE_CONFIG", "")  # the environment turns it off again
    assert engine_config_from_triton({"parameters": params}).speculative_config is None


def test_off_by_default_and_when_empty(llama_dir):
    assert EngineConfig(model=llama_dir).speculative_config is None
    assert EngineConfig.from_strings({"model": llama_dir, "speculative_config": ""}).speculative_config is None
    llm = LLM(model=llama_dir, max_model_len=128)
    assert llm.engine.speculator is None
    llm.generate("a b a b a b", SamplingParams(max_tokens=4))
    assert llm.engine.stats().spec_decode_num_drafts_total == 0


@pytest.mark.parametrize("value, field", [
    ({"method": "suffix", "suffix_decoding_min_token_prob": 2}, "speculative_config.suffix_decoding_min_token_prob"),
    ({"method": "draft_model", "model": "x", "num_speculative_tokens": 2}, "speculative_config.model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup": 3}, "speculative_config.prompt_lookup"),
    ({"method": "ngram", "num_speculative_tokens": 17}, "speculative_config.num_speculative_tokens"),
    ('{"method": "ngram"', "speculative_config"),
])
def test_a_bad_config_is_refused_at_start_naming_the_field(llama_dir, value, field):
    with pytest.raises(ValueError) as err:
        LLM(model=llama_dir, speculative_config=value)
    assert str(err.value).startswith(field + ":"), err.value
    text = value if isinstance(value, str) else json.dumps(value)
    with pytest.raises(ValueError) as err:
        EngineConfig.from_strings({"model": llama_dir, "speculative_config": text})
    assert str(err.value).startswith("speculative_config"), err.value


def test_counters_reach_the_metrics_as_step_differences(llama_dir):
    llm = LLM(model=llama_dir, max_model_len=256, speculative_config=NGRAM)
    metrics = mock.Mock()
    telemetry = EngineTelemetry(metrics, "tiny")
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    llm.engine.add_request("r", "one two three one two three one two three one two", params)
    while llm.engine.has_unfinished():
        outs = llm.engine.step()
        telemetry(llm.engine.stats(), outs, 0.0)
    calls = metrics.on_spec_decode.call_args_list
    totals = [sum(call.args[i] for call in calls) for i in range(4)]
    c = llm.engine.speculator.counters
    assert totals == [c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, c.num_proposer_errors]
    per_position = [sum(call.args[4][j] for call in calls) for j in range(3)]
    assert per_position == c.accepted_per_position and sum(per_position) == c.num_accepted_tokens
    assert c.num_drafts > 0 and c.accepted_per_position[0] > 0
