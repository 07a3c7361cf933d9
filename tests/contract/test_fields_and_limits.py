"""The names and limits the gateway sends are the ones the engine takes."""
from __future__ import annotations

import dataclasses

import pytest

from kvserve.backend.engine.config import KV_CACHE_DTYPES, EngineConfig
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.frontend.cli.engine_flags import ENGINE_FLAGS
from kvserve.frontend.openai.api_requests import parse_chat, parse_completion
from kvserve.seam import limits as L
from kvserve.seam import tensors as T
from tests.contract.import_graph import ROOT

# Every sampling field the OpenAI routes accept, set to a non-default value.
_FULL_BODY = {
    "n": 2, "max_tokens": 8, "min_tokens": 1, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
    "seed": 3, "stop": ["x"], "stop_token_ids": [2], "presence_penalty": 0.1, "frequency_penalty": 0.1,
    "repetition_penalty": 1.1, "ignore_eos": True, "logit_bias": {"5": 1.0}, "include_stop_str_in_output": True,
    "skip_special_tokens": False, "cache_salt": "s", "timeout": 5.0,
}
# Flags that travel to the backend process but configure the process, not the engine.
_PROCESS_SETTINGS = {"otlp_traces_endpoint": "backend/triton/triton_model.py", "log_format": "observability/logging.py",
                     "log_requests": "observability/logging.py"}


def test_the_seam_names_exactly_the_sampling_params_fields() -> None:
    assert T.SAMPLING_FIELDS == {f.name for f in dataclasses.fields(SamplingParams) if f.init}


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_the_gateway_sends_only_sampling_params_fields_and_the_engine_takes_them(route) -> None:
    if route == "chat":
        req = parse_chat({**_FULL_BODY, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                          "top_logprobs": 2}, vocab_size=100)
    else:
        req = parse_completion({**_FULL_BODY, "prompt": "hi", "logprobs": 2}, vocab_size=100)
    assert set(req.sampling) <= T.SAMPLING_FIELDS
    assert set(_FULL_BODY) | {"logprobs"} <= set(req.sampling)  # nothing dropped on the way
    SamplingParams.from_dict(req.sampling).check_vocab(100)


@pytest.mark.parametrize("field,limit", [("n", L.MAX_N), ("logprobs", L.MAX_LOGPROBS), ("timeout", L.MAX_TIMEOUT_S)])
def test_both_sides_draw_the_line_at_the_same_limit(field, limit) -> None:
    over = limit + 1
    body = {"prompt": "hi", field: limit}
    SamplingParams.from_dict(parse_completion(body, vocab_size=None).sampling)
    with pytest.raises(Exception):
        parse_completion({**body, field: over}, vocab_size=None)
    with pytest.raises(ValueError):
        SamplingParams.from_dict({field: over})


def test_stop_limits_agree() -> None:
    stops = ["s"] * L.MAX_STOP
    SamplingParams.from_dict(parse_completion({"prompt": "hi", "stop": stops}, vocab_size=None).sampling)
    with pytest.raises(Exception):
        parse_completion({"prompt": "hi", "stop": stops + ["t"]}, vocab_size=None)
    with pytest.raises(ValueError):
        SamplingParams(stop=stops + ["t"])
    with pytest.raises(ValueError):
        SamplingParams(stop=["x" * (L.MAX_STOP_CHARS + 1)])


def test_engine_flags_are_engine_config_fields() -> None:
    from kvserve.backend.triton.lora_adapters import MODEL_PARAMETERS  # the Triton model's own settings

    fields = set(EngineConfig.field_names())
    for flag in ENGINE_FLAGS:
        if not flag.export or flag.field in MODEL_PARAMETERS:  # (tests/backend/triton: read from the env)
            continue
        if flag.field in _PROCESS_SETTINGS:
            # ... and the backend process really reads it from the environment.
            assert flag.env in (ROOT / _PROCESS_SETTINGS[flag.field]).read_text(), flag.flag
        else:
            assert flag.field in fields, f"{flag.flag} is exported as {flag.env} but EngineConfig has no {flag.field}"


def test_kv_cache_dtype_choices_are_the_engines() -> None:
    """The gateway's --kv-cache-dtype choices (it may not import the engine) are EngineConfig's."""
    flag = next(f for f in ENGINE_FLAGS if f.flag == "--kv-cache-dtype")
    assert tuple(flag.choices) == KV_CACHE_DTYPES


def test_kept_prompt_tokens_is_the_rule_both_sides_cut_by() -> None:
    from kvserve.seam.limits import kept_prompt_tokens
    assert kept_prompt_tokens(100, None, 16, 64) == 100  # unset: all (the context check refuses it later)
    assert kept_prompt_tokens(100, 30, 16, 64) == 30 and kept_prompt_tokens(10, 30, 16, 64) == 10
    assert kept_prompt_tokens(100, -1, 16, 64) == 48  # as many as fit beside max_tokens
    assert kept_prompt_tokens(100, -1, None, 64) == 63  # beside one token when max_tokens is open
    assert kept_prompt_tokens(100, -1, 80, 64) == 1  # never none
