"""vLLM's beam search in the gateway: the search over a toy language model whose next-token
logprobs are known (so the best beams can be worked out by hand), and the request fields."""
from __future__ import annotations

import asyncio
import math

import pytest

from gw_fakes import FakeBackend, GatewayServer, post
from kvserve.frontend.backend_client import ChoiceDelta, GenerateRequest, TokenLogprob, TopLogprob
from kvserve.frontend.http.gateway_config import GatewayConfig
from kvserve.frontend.openai.beam.beam_search import BeamSearchBackend

EOS = 9
LN = math.log


class ToyModel(FakeBackend):
    """Next-token probabilities by the last token. From the prompt (last token 0): token 1 is the
    likelier (0.6) but leads on to a spread (0.3 each of 3, 4, 5), token 2 (0.4) to a near-sure 6 (0.9)."""

    NEXT = {0: {1: 0.6, 2: 0.4}, 1: {3: 0.3, 4: 0.3, 5: 0.3, EOS: 0.1}, 2: {6: 0.9, EOS: 0.1},
            3: {EOS: 1.0}, 4: {7: 1.0}, 5: {7: 1.0}, 6: {EOS: 0.8, 7: 0.2}, 7: {7: 1.0}}

    async def generate(self, request: GenerateRequest):
        self.requests.append(request)
        assert request.sampling["max_tokens"] == 1 and isinstance(request.prompt, list)
        probs = self.NEXT[request.prompt[-1]]
        top = sorted((TopLogprob(t, LN(p)) for t, p in probs.items()), key=lambda t: -t.logprob)
        top = top[:request.sampling["logprobs"]]
        yield ChoiceDelta(0, token_ids=[top[0].token_id], finish_reason="length", prompt_tokens=len(request.prompt),
                          completion_tokens=1, logprobs=[TokenLogprob(top[0].token_id, top[0].logprob, top)])


class Tokens:
    eos_token_ids = frozenset({EOS})

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"t{i}" for i in ids)


def _search(sampling: dict, length_penalty: float = 1.0, prompt=(0,)) -> list[ChoiceDelta]:
    backend = BeamSearchBackend(ToyModel(), Tokens(), length_penalty)

    async def run():
        return [d async for d in backend.generate(GenerateRequest("r", list(prompt), {"n": 2, **sampling}))]
    return asyncio.run(run())


def test_the_best_beams_beat_greedy() -> None:
    out = _search({"max_tokens": 2, "ignore_eos": True})
    # greedy takes 1 (0.6) then 0.3: 0.18; the beam through 2 then 6 has 0.36
    assert [c.token_ids for c in out] == [[2, 6], [1, 3]] and [c.index for c in out] == [0, 1]
    assert [c.finish_reason for c in out] == ["length", "length"]
    assert out[0].text == "t2 t6" and out[0].completion_tokens == 2 and out[0].prompt_tokens == 1


def test_a_beam_that_ends_is_set_aside_without_its_end_token() -> None:
    out = _search({"max_tokens": 3})
    # ended: 2 6 EOS (0.288 over 3 tokens, EOS not counted), 1 3 EOS (0.18); live: 2 6 7 (0.072 over 4)
    assert out[0].token_ids == [2, 6] and out[0].finish_reason == "stop"
    assert out[1].token_ids == [1, 3] and out[1].finish_reason == "stop"
    kept = _search({"max_tokens": 3, "include_stop_str_in_output": True})
    assert kept[0].token_ids == [2, 6, EOS] and kept[0].completion_tokens == 3


def test_length_penalty_divides_the_summed_logprob_by_the_length_to_its_power() -> None:
    assert _search({"max_tokens": 3}, length_penalty=0.0)[0].token_ids == [2, 6]  # the summed logprob alone
    # a steep penalty favours the longest: 2 6 7 (4 tokens with the prompt) over 2 6 EOS (3)
    steep = _search({"max_tokens": 3}, length_penalty=10.0)
    assert steep[0].token_ids == [2, 6, 7] and steep[0].finish_reason == "length"


def test_logprobs_are_each_tokens_with_the_steps_top() -> None:
    out = _search({"max_tokens": 2, "ignore_eos": True, "logprobs": 1})
    first = out[0].logprobs
    assert [e.token_id for e in first] == [2, 6]
    assert first[0].logprob == pytest.approx(LN(0.4)) and first[1].logprob == pytest.approx(LN(0.9))
    assert [t.token_id for t in first[0].top_logprobs] == [1]  # the step's best, as many as asked


def test_more_logprobs_than_the_search_needs_are_asked_for_and_listed() -> None:
    out = _search({"max_tokens": 1, "ignore_eos": True, "logprobs": 5})
    assert len(out[0].logprobs[0].top_logprobs) == 2  # all the toy model has after the prompt
    model = ToyModel()

    async def run():
        backend = BeamSearchBackend(model, Tokens(), 1.0)
        return [d async for d in backend.generate(GenerateRequest("r", [0], {"n": 1, "max_tokens": 1, "logprobs": 5}))]
    asyncio.run(run())
    assert model.requests[0].sampling["logprobs"] == 5


def test_each_step_asks_one_token_of_every_live_beam_with_twice_the_width_of_logprobs() -> None:
    model = ToyModel()
    backend = BeamSearchBackend(model, Tokens(), 1.0)

    async def run():
        return [d async for d in backend.generate(
            GenerateRequest("r", [0], {"n": 2, "max_tokens": 2, "ignore_eos": True, "temperature": 0.5,
                                       "cache_salt": "s", "presence_penalty": 0.0}))]
    asyncio.run(run())
    assert [r.prompt for r in model.requests] == [[0], [0, 1], [0, 2]]  # live beams, best first
    assert all(r.sampling == {"n": 1, "max_tokens": 1, "logprobs": 4, "ignore_eos": True, "temperature": 0.5,
                              "cache_salt": "s"} for r in model.requests)


@pytest.mark.parametrize("extra, param", [
    ({"stop": ["x"]}, "stop"), ({"top_p": 0.5}, "top_p"), ({"presence_penalty": 1.0}, "presence_penalty"),
    ({"logit_bias": {"5": 1}}, "logit_bias"), ({"n": 11}, "n"), ({"early_stopping": True}, "early_stopping"),
    ({"response_format": {"type": "json_object"}}, "structured outputs"), ({"min_tokens": 2}, "min_tokens"),
])
def test_fields_beam_search_would_ignore_are_refused(server, extra, param) -> None:
    reply = post(f"{server.url}/v1/completions", {"prompt": "x", "use_beam_search": True, "max_tokens": 2, **extra})
    assert reply.status == 400 and reply.json()["error"]["param"] == param


def test_beam_settings_without_beam_search_are_refused(server) -> None:
    reply = post(f"{server.url}/v1/completions", {"prompt": "x", "length_penalty": 0.5})
    assert reply.status == 400 and reply.json()["error"]["param"] == "length_penalty"
    assert post(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1, "length_penalty": 1.0}).status == 200


def test_served_beams_are_the_choices_streamed_or_whole(tokenizer_dir) -> None:
    with GatewayServer(ToyModel(), GatewayConfig(served_model_names=["tiny"]), tokenizer_dir) as srv:
        body = {"prompt": [0], "n": 2, "max_tokens": 2, "use_beam_search": True, "ignore_eos": True,
                "return_token_ids": True}
        whole = post(f"{srv.url}/v1/completions", body).json()
        assert [c["token_ids"] for c in whole["choices"]] == [[2, 6], [1, 3]]
        assert (whole["usage"]["prompt_tokens"], whole["usage"]["completion_tokens"]) == (1, 4)
        streamed = post(f"{srv.url}/v1/completions", {**body, "stream": True}).text
        assert streamed.count("data: ") >= 3 and streamed.rstrip().endswith("data: [DONE]")
