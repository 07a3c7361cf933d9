"""Speculation under structured-output grammars: each proposal is checked against the request's
matcher (the mask of a position is the grammar's state after the drafts accepted before it) and
the matcher is rolled back past the drafts tried, so a constrained request emits exactly what it
emits without speculation, and the output obeys the grammar. The schema cases of
tests/backend/structured run with speculation on too (their `llm` fixture)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from kvserve.backend import LLM, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,3}$"},
                 "minItems": 1, "maxItems": 2},
    },
    "required": ["colour", "count", "tags"],
    "additionalProperties": False,
}
CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
              "load_policy": "off"},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8, "load_policy": "off"},
}
# The prompts hold JSON of the schema's shape, so prompt lookup has the keys to propose.
PROMPTS = [f'{{"colour": "red", "count": {i}, "tags": ["ab"]}} {{"colour": "blue", "count": 2, "tags": ["x"]}} '
           for i in range(6)]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(llama_dir, request):
    base = LLM(model=llama_dir, max_model_len=512, max_num_seqs=8)
    spec = LLM(model=llama_dir, max_model_len=512, max_num_seqs=8, speculative_config=CONFIGS[request.param])
    return base, spec


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_json_schema_with_speculation_equals_plain_decoding(pair, temperature):
    base, spec = pair
    counters = spec.engine.speculator.counters
    accepted = counters.num_accepted_tokens
    params = [SamplingParams(max_tokens=120, temperature=temperature, seed=i, logprobs=1,
                             structured_outputs={"json": SCHEMA}) for i in range(len(PROMPTS))]
    # Twice: the second round's suffix proposals come from the first round's outputs too.
    for _ in range(2):
        want, got = base.generate(PROMPTS, params), spec.generate(PROMPTS, params)
        for w, g in zip(want, got):
            w, g = w.outputs[0], g.outputs[0]
            assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason)
            assert all(abs(a.logprob - b.logprob) < 1e-5 for a, b in zip(w.logprobs, g.logprobs))
            assert g.finish_reason == "stop"
            jsonschema.validate(json.loads(g.text), SCHEMA)
    assert counters.num_accepted_tokens > accepted
    eng = spec.engine
    assert len(eng.matchers) == 0 and not eng.groups and eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_a_grammar_that_ends_inside_a_run_ends_the_request_there(pair):
    """A choice grammar ends after its word: drafts past that end are never emitted."""
    base, spec = pair
    prompt = "yes no maybe yes no maybe yes no maybe yes no"
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True,
                            structured_outputs={"choice": ["maybe yes no maybe", "no"]})
    for _ in range(3):
        want, got = base.generate(prompt, params)[0].outputs[0], spec.generate(prompt, params)[0].outputs[0]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, "stop")
    assert len(spec.engine.matchers) == 0
