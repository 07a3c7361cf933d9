"""Structured outputs in the engine on the tiny model: a random model's output still obeys the
grammar, matchers live exactly as long as their sequences, compiles are cached, bounded and off
the engine thread, and bad constraints fail naming the field."""
from __future__ import annotations

import json
import re
import threading
import time

import pytest

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine.async_engine import AsyncEngine
from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.structured import compiler as compiler_mod
from kvserve.backend.structured.spec import parse_spec
from kvserve.seam.error_wire import ErrorKind

# Short outputs even from random weights: every string is bounded, so max_tokens always suffices.
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


# Every case runs plainly and with each speculative method: a proposal is checked against the
# matcher, and the constrained output must obey the grammar all the same (issue 32).
SPECULATION = {
    "plain": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
              "load_policy": "off"},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8, "load_policy": "off"},
}


@pytest.fixture(scope="module", params=sorted(SPECULATION))
def speculative_config(request):
    return SPECULATION[request.param]


@pytest.fixture(scope="module")
def llm(llama_dir, speculative_config):
    return LLM(model=llama_dir, max_num_seqs=8, max_model_len=512, speculative_config=speculative_config)


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=kw.pop("max_tokens", 200), temperature=kw.pop("temperature", 1.0),
                          seed=kw.pop("seed", 3), **kw)


def test_json_schema_output_validates_for_every_sample(llm):
    outs = llm.generate("Describe a thing:", _params(n=3, structured_outputs={"json": SCHEMA}))[0].outputs
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert len(llm.engine.matchers) == 0 and not llm.engine.groups


def test_unconstrained_rows_beside_a_constrained_one_are_untouched(llm):
    free = _params(max_tokens=12, temperature=0, ignore_eos=True)
    alone = llm.generate("Once upon a time", free)[0].outputs[0].token_ids
    both = llm.generate(["Once upon a time", "Pick:"],
                        [free, _params(structured_outputs={"choice": ["yes", "no"]})])
    assert both[0].outputs[0].token_ids == alone  # same tokens with a masked row in the batch
    assert both[1].outputs[0].text in ("yes", "no")


def test_regex_choice_grammar_and_json_object(llm):
    out = llm.generate("Code:", _params(structured_outputs={"regex": r"[A-Z]{2}-[0-9]{3}"}))[0].outputs[0]
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", out.text), out.text
    out = llm.generate("Say:", _params(structured_outputs={"grammar": 'root ::= "a" [0-9] | "bc"'}))[0].outputs[0]
    assert re.fullmatch(r"a[0-9]|bc", out.text), out.text
    out = llm.generate("Obj:", _params(max_tokens=400, seed=1, structured_outputs={"json_object": True}))[0].outputs[0]
    assert out.text.lstrip().startswith("{"), out.text  # an object, not any JSON value
    if out.finish_reason == "stop":  # a random model may ramble on inside a string until max_tokens
        assert isinstance(json.loads(out.text), dict)
    assert len(llm.engine.matchers) == 0


def test_ignore_eos_ends_when_the_grammar_does(llm):
    out = llm.generate("Pick:", _params(ignore_eos=True, structured_outputs={"choice": ["alpha", "beta"]}))[0]
    assert out.outputs[0].text in ("alpha", "beta") and out.outputs[0].finish_reason == "stop"


def test_abort_and_length_free_matchers(llm):
    eng = llm.engine
    eng.add_request("ab", "Hi", _params(n=2, structured_outputs={"json": SCHEMA}))
    eng.step()
    assert len(eng.matchers) == 2
    eng.abort("ab")
    assert len(eng.matchers) == 0
    out = llm.generate("Hi", _params(max_tokens=2, structured_outputs={"json": SCHEMA}))[0].outputs[0]
    assert out.finish_reason == "length" and len(eng.matchers) == 0
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_preempted_constrained_request_still_validates(llama_dir, speculative_config):
    # 8 usable blocks of 16 tokens for 4 requests of ~60 tokens each: preemption by recompute must happen.
    small = LLM(model=llama_dir, max_num_seqs=4, max_model_len=128, num_kv_blocks=9,
                speculative_config=speculative_config)
    prompts = ["x " * 8 + str(i) for i in range(4)]
    outs = small.generate(prompts, [_params(seed=i, max_tokens=100, structured_outputs={"json": SCHEMA})
                                    for i in range(4)])
    assert small.engine.scheduler.num_preemptions_total > 0
    for o in outs:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
    assert len(small.engine.matchers) == 0


def test_compiles_are_cached_with_a_bound(llm):
    grammars = llm.engine.grammars
    spec = parse_spec({"regex": "[0-9]{4}"})
    grammars.compile(spec)
    before = grammars.compiles
    grammars.compile(parse_spec({"regex": "[0-9]{4}"}))
    assert grammars.compiles == before  # equal specs compile once
    old_bound = grammars.max_cached
    grammars.max_cached = 3
    try:
        for i in range(6):
            grammars.compile(parse_spec({"regex": f"[0-9]{{{i + 1}}}x"}))
        assert grammars.cache_size() == 3
    finally:
        grammars.max_cached = old_bound


@pytest.mark.parametrize("bad, words", [
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": {"type": "objekt"}}, "not a valid JSON schema (a 'type' keyword"),
    ({"json": {"type": "array", "uniqueItems": True}}, "'uniqueItems'"),
    ({"json": {"type": "number", "multipleOf": 3}}, "'multipleOf'"),
    ({"json": {"type": "string", "format": "hostname"}}, "format"),
    ({"json": {"type": "string", "format": "email", "maxLength": 20}}, "cannot be combined"),
    ({"json": {"type": "object", "x-custom": 1}}, "not a JSON Schema keyword"),
    ({"json": {"$ref": "http://example.com/s.json"}}, "local $ref"),
    ({"json": {"type": "string", "description": "x" * 70000}}, "longer than"),
    ({"regex": "[a-"}, None),
    ({"grammar": "root ::= undefined_rule"}, None),
    ({"regex": "a", "choice": ["b"]}, "exactly one"),
    ({"choice": []}, "choice"),
    ({"regex": "\ud800"}, "lone surrogate"),  # what JSON's "\ud800" escape decodes to
    ({"json": {"type": "string", "pattern": "\udfff"}}, "lone surrogate"),
])
def test_bad_constraints_name_the_field(llm, bad, words):
    with pytest.raises(ValueError) as err:
        llm.generate("Hi", _params(structured_outputs=bad))
    assert str(err.value).startswith("structured_outputs: ")
    assert ".cc" not in str(err.value)  # xgrammar's C++ source locations stay in the server
    if words:
        assert words in str(err.value)


def test_async_engine_compiles_off_its_thread_and_bounds_the_time(llama_dir, monkeypatch):
    eng = AsyncEngine(EngineConfig(model=llama_dir, max_num_seqs=4, max_model_len=256))
    try:
        release = threading.Event()
        real = compiler_mod._compile

        def slow(compiler, spec):
            if spec.text == "slow":
                release.wait(10)
            return real(compiler, spec)
        monkeypatch.setattr(compiler_mod, "_compile", slow)
        eng.engine.grammars.timeout_s = 1.0
        got: dict[str, list] = {"slow": [], "free": []}
        done = {k: threading.Event() for k in got}

        def collect(key):
            def cb(out):
                got[key].append(out)
                if out.finished:
                    done[key].set()
            return cb
        t0 = time.monotonic()
        eng.add_request("slow", "Hi", _params(structured_outputs={"regex": "slow"}), collect("slow"))
        eng.add_request("free", "Hi", _params(max_tokens=8), collect("free"))
        assert done["free"].wait(30)  # the other request ran while the grammar compiled
        assert not done["slow"].is_set()
        assert done["slow"].wait(10)
        final = got["slow"][-1]
        assert final.error_kind is ErrorKind.INVALID and final.error.startswith("structured_outputs: ")
        assert "did not compile within 1 s" in final.error and time.monotonic() - t0 >= 1.0
        release.set()
        # A bad grammar is refused the same way, naming the field.
        bad: list = []
        eng.add_request("bad", "Hi", _params(structured_outputs={"regex": "(unclosed"}), bad.append)
        deadline = time.monotonic() + 10
        while not bad and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bad and bad[-1].error.startswith("structured_outputs: ") and bad[-1].error_kind is ErrorKind.INVALID
        assert eng.stats().num_grammar_matchers == 0
    finally:
        release.set()
        eng.shutdown()


def test_an_engine_without_constrained_requests_never_loads_xgrammar(llama_dir):
    import subprocess
    import sys
    code = ("import sys; from kvserve.backend import LLM, SamplingParams; "
            f"llm = LLM(model={llama_dir!r}, max_num_seqs=2, max_model_len=128); "
            "llm.generate('Hi', SamplingParams(max_tokens=3)); "
            "assert llm.engine.matchers.mask_for(['x']) is None; "
            "print('xgrammar' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_constraint_that_allows_no_token_fails_the_request_naming_the_field(llm):
    # After "a" the grammar allows only the end, which min_tokens bans: no token is left.
    eng = llm.engine
    eng.add_request("stuck", "Hi", _params(temperature=0, min_tokens=5, structured_outputs={"choice": ["a"]}))
    outs = []
    while eng.has_unfinished():
        outs.extend(eng.step())
    final = outs[-1]
    assert final.finished and final.error_param == "structured_outputs"
    assert final.error.startswith("structured_outputs: the constraint allowed no token")
    assert len(eng.matchers) == 0 and eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_a_length_bounded_string_admits_no_raw_control_character(llm):
    # xgrammar's own rule for minLength/maxLength let a raw \x04 or tab into the string (not JSON).
    import xgrammar as xgr
    from kvserve.backend.structured.string_bounds import bounded_strings_as_patterns

    word = {"type": "string", "minLength": 2, "maxLength": 4}
    schema = {"type": "object", "properties": {"w": word, "const": word, "e": {"enum": [word]}},
              "required": ["w"], "additionalProperties": False}
    rewritten = bounded_strings_as_patterns(schema)
    assert rewritten["properties"]["w"] == rewritten["properties"]["const"] != word
    assert rewritten["properties"]["e"] == {"enum": [word]}  # data is left alone
    compiled = llm.engine.grammars.compile(parse_spec({"json": schema}))
    for text, ok in [('{"w": "ab"}', True), ('{"w": "a\x04b"}', False), ('{"w": "a\tb"}', False),
                     ('{"w": "a"}', False), ('{"w": "abcde"}', False), ('{"w": "\u00e9t\u00e9"}', True)]:
        matcher = xgr.GrammarMatcher(compiled)
        assert (matcher.accept_string(text) and matcher.is_completed()) == ok, (text, ok)
