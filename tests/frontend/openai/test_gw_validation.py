"""Request validation: types, ranges, normalisation into SamplingParams names."""
from __future__ import annotations

import pytest

from kvserve.frontend.openai.api_errors import ApiError
from kvserve.frontend.openai.api_requests import parse_chat, parse_completion
from kvserve.frontend.openai.tools import ToolSettings


def bad(fn, body, vocab=None) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(body, vocab)
    assert info.value.status == 400
    return info.value


def test_prompt_forms() -> None:
    assert parse_completion({"prompt": "hi"}, None).prompts == ["hi"]
    assert parse_completion({"prompt": ["a", "b"]}, None).prompts == ["a", "b"]
    assert parse_completion({"prompt": [1, 2]}, None).prompts == [[1, 2]]
    assert parse_completion({"prompt": [[1], [2, 3]]}, None).prompts == [[1], [2, 3]]
    for prompt in (None, "", [], [1, "a"], [[1], "a"], [[]], {"x": 1}, [True]):
        assert bad(parse_completion, {"prompt": prompt}).param == "prompt", prompt


def test_token_ids_are_checked_against_the_vocabulary() -> None:
    assert bad(parse_completion, {"prompt": [5, 300]}, 300).param == "prompt"
    assert bad(parse_completion, {"prompt": [-1]}).param == "prompt"
    assert bad(parse_completion, {"prompt": "x", "stop_token_ids": [300]}, 300).param == "stop_token_ids"
    assert bad(parse_completion, {"prompt": "x", "logit_bias": {"300": 1}}, 300).param == "logit_bias"


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", 2.5), ("temperature", "1"), ("temperature", float("nan")),
    ("temperature", 10**400), ("top_p", -(10**400)), ("timeout", 10**400),
    ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("top_k", 1.5), ("min_p", 1.1),
    ("n", 0), ("n", 17), ("n", True), ("max_tokens", 0), ("max_tokens", "5"), ("min_tokens", -1),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0), ("repetition_penalty", 2.5),
    ("seed", 1.5), ("seed", 2**64), ("seed", 2**63), ("top_k", 2**70), ("max_tokens", 2**63),
    ("logprobs", 21), ("logprobs", -1), ("echo", 1), ("ignore_eos", "yes"),
    ("stop", ""), ("stop", [""]), ("stop", ["x"] * 65), ("stop", "s" * 300), ("stream", "true"),
    ("user", 5), ("cache_salt", ""), ("logit_bias", {"1": 101}), ("logit_bias", []), ("best_of", 3),
])
def test_field_errors_name_the_field(field: str, value: object) -> None:
    err = bad(parse_completion, {"prompt": "x", field: value})
    assert err.param == field


def test_sampling_holds_only_what_was_set_plus_n() -> None:
    req = parse_completion({"prompt": "x"}, None)
    assert req.sampling == {"n": 1}
    req = parse_completion({"prompt": "x", "stop": "END", "top_k": 0, "logprobs": 0, "n": 3, "max_tokens": 5,
                            "min_tokens": 2, "seed": 0, "logit_bias": {"7": -100}}, None)
    assert req.sampling == {"n": 3, "stop": ["END"], "top_k": -1, "logprobs": 0, "max_tokens": 5,
                            "min_tokens": 2, "seed": 0, "logit_bias": {"7": -100.0}}
    assert req.logprobs == 0


def test_cross_field_rules() -> None:
    assert bad(parse_completion, {"prompt": "x", "min_tokens": 5, "max_tokens": 2}).param == "min_tokens"
    # echo with logprobs scores the prompt too; echo alone does not
    assert parse_completion({"prompt": "x", "echo": True, "logprobs": 1}, None).sampling["prompt_logprobs"] == 1
    assert "prompt_logprobs" not in parse_completion({"prompt": "x", "echo": True}, None).sampling
    assert bad(parse_completion, {"prompt": ["a"] * 100, "n": 16}).param == "n"
    assert bad(parse_chat, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}).param == "top_logprobs"
    ok = parse_completion({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}, None)
    assert ok.include_usage and ok.stream
    # as OpenAI and vLLM: the options of a stream that was not asked for are refused
    assert bad(parse_completion, {"prompt": "x", "stream_options": {"include_usage": True}}).param == "stream_options"
    assert bad(parse_chat, {"messages": [{"role": "user", "content": "x"}], "stream": False,
                            "stream_options": {}}).param == "stream_options"
    assert not parse_completion({"prompt": "x", "stream_options": None}, None).include_usage
    assert bad(parse_completion, {"prompt": "x", "stream": True,
                                  "stream_options": {"include_usage": "yes"}}).param == "stream_options"


def test_chat_messages() -> None:
    req = parse_chat({"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "bob"},
        {"role": "assistant", "content": None},
    ], "max_completion_tokens": 4, "max_tokens": 9, "logprobs": True}, None)
    assert req.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "a\nb", "name": "bob"},
                            {"role": "assistant", "content": ""}]
    assert req.sampling["max_tokens"] == 4  # max_completion_tokens wins
    assert req.sampling["logprobs"] == 0 and req.logprobs
    for messages in ([], None, [{"role": "robot", "content": "x"}], [{"role": {}, "content": "x"}], [{"role": "user"}], ["hi"],
                     [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": None}]):
        assert bad(parse_chat, {"messages": messages}).param == "messages", messages


def test_unsupported_chat_features() -> None:
    msgs = [{"role": "user", "content": "x"}]
    assert bad(parse_chat, {"messages": msgs, "response_format": {"type": "json_schema"}}).param == "response_format"
    assert bad(parse_chat, {"messages": msgs, "tools": [{"type": "function"}]}).param == "tools"
    strict = {"type": "function", "function": {"name": "f", "strict": "yes"}}
    assert "strict" in bad(parse_chat, {"messages": msgs, "tools": [strict]}).message
    assert parse_chat({"messages": msgs, "response_format": {"type": "text"}, "tools": []}, None).messages == msgs


@pytest.mark.parametrize("field, value", [
    ("guided_decoding_backend", "outlines"), ("guided_whitespace_pattern", " *"),
    ("logits_processors", ["my.Processor"]), ("kv_transfer_params", {"a": 1}),
    ("prompt_embeds", "AAAA"), ("vllm_xargs", {"k": 1}), ("mm_processor_kwargs", {"k": 1})])
def test_vllm_extensions_this_server_lacks_are_refused_not_ignored(field, value) -> None:
    # Ignored, they would return ordinary output where the client asked for constrained output.
    msgs = [{"role": "user", "content": "x"}]
    for parse, body in ((parse_completion, {"prompt": "x"}), (parse_chat, {"messages": msgs})):
        err = bad(parse, {**body, field: value})
        assert err.param == field and err.code == "unsupported_parameter"
        assert parse({**body, field: None}, None)  # the default value is accepted


def test_allowed_token_ids_bad_words_and_truncation_as_vllm_takes_them() -> None:
    msgs = [{"role": "user", "content": "x"}]
    for parse, body in ((parse_completion, {"prompt": "x"}), (parse_chat, {"messages": msgs})):
        req = parse({**body, "allowed_token_ids": [3, 5], "bad_words": ["foo", " bar baz"],
                     "truncate_prompt_tokens": 8}, 100)
        assert (req.sampling["allowed_token_ids"], req.sampling["bad_words"], req.sampling["truncate_prompt_tokens"]) \
            == ([3, 5], ["foo", " bar baz"], 8)
        assert parse({**body, "truncate_prompt_tokens": -1}, 100).sampling["truncate_prompt_tokens"] == -1
        for field, value in (("allowed_token_ids", []), ("allowed_token_ids", [100]), ("allowed_token_ids", ["1"]),
                             ("bad_words", ["  "]), ("bad_words", [""]), ("bad_words", [1]), ("bad_words", ["w"] * 65),
                             ("truncate_prompt_tokens", 0), ("truncate_prompt_tokens", -2),
                             ("truncate_prompt_tokens", 1.5)):
            assert bad(parse, {**body, field: value}, 100).param == field, (field, value)
        assert "bad_words" not in parse({**body, "bad_words": None}, 100).sampling
    # the echo is the prompt as sent, which a truncated request did not read whole
    assert bad(parse_completion, {"prompt": "x", "echo": True, "truncate_prompt_tokens": 4}).param == "echo"


def test_prompt_logprobs_as_vllm_takes_them() -> None:
    msgs = [{"role": "user", "content": "x"}]
    for parse, body in ((parse_completion, {"prompt": "x"}), (parse_chat, {"messages": msgs})):
        req = parse({**body, "prompt_logprobs": 0}, None)  # 0 is a setting: the prompt's own logprobs
        assert req.prompt_logprobs == 0 and req.sampling["prompt_logprobs"] == 0
        assert bad(parse, {**body, "prompt_logprobs": 2, "stream": True}).param == "prompt_logprobs"
        assert bad(parse, {**body, "prompt_logprobs": -1}).param == "prompt_logprobs"
        assert bad(parse, {**body, "prompt_logprobs": "3"}).param == "prompt_logprobs"
    # with echo and logprobs too, the explicit setting wins
    assert parse_completion({"prompt": "x", "echo": True, "logprobs": 1, "prompt_logprobs": 4},
                            None).sampling["prompt_logprobs"] == 4


def test_chat_echo_as_vllm_takes_it() -> None:
    msgs = [{"role": "user", "content": "x"}]
    assert parse_chat({"messages": msgs, "echo": True}, None).echo
    assert not parse_chat({"messages": msgs, "echo": False}, None).echo
    assert bad(parse_chat, {"messages": msgs, "echo": "yes"}).param == "echo"
    # echoed text would be read for tool calls: refused with tools that are parsed (not with "none")
    tools = [{"type": "function", "function": {"name": "f"}}]
    settings = ToolSettings(auto=True, parser="hermes")
    assert bad(lambda b, v: parse_chat(b, v, settings), {"messages": msgs, "echo": True, "tools": tools}).param == "echo"
    assert parse_chat({"messages": msgs, "echo": True, "tools": tools, "tool_choice": "none"}, None, settings).echo


def test_continue_final_message_as_vllm_takes_it() -> None:
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]
    req = parse_chat({"messages": msgs, "continue_final_message": True}, None)
    assert req.continue_final_message and not req.add_generation_prompt  # no new turn by default
    assert not parse_chat({"messages": msgs}, None).continue_final_message
    for body in ({"add_generation_prompt": True},  # vLLM refuses both
                 {"messages": msgs[:1] + [{"role": "assistant", "content": " "}]},  # nothing to continue
                 {"messages": msgs[:1] + [{"role": "assistant", "content": "a", "tool_calls": [
                     {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}):
        assert bad(parse_chat, {"messages": msgs, "continue_final_message": True, **body}).param == \
            "continue_final_message"
    assert bad(parse_chat, {"messages": msgs, "continue_final_message": "yes"}).param == "continue_final_message"


def test_priority_reaches_the_engine_and_a_chat_template_in_the_request_is_refused() -> None:
    msgs = [{"role": "user", "content": "x"}]
    assert parse_chat({"messages": msgs, "priority": -3}, None).sampling["priority"] == -3
    assert bad(parse_completion, {"prompt": "x", "priority": "high"}).param == "priority"
    assert bad(parse_chat, {"messages": msgs, "chat_template": "{{ messages }}"}).param == "chat_template"


def test_documents_and_add_special_tokens_as_vllm_takes_them() -> None:
    msgs = [{"role": "user", "content": "x"}]
    docs = [{"title": "Paris", "text": "Paris is the capital of France."}]
    req = parse_chat({"messages": msgs, "documents": docs, "chat_template_kwargs": {"enable_thinking": False}}, None)
    assert req.template_kwargs == {"enable_thinking": False, "documents": docs}
    for value in ("x", [1], [{"title": 1}]):
        assert bad(parse_chat, {"messages": msgs, "documents": value}).param == "documents"
    assert parse_chat({"messages": msgs}, None).add_special_tokens is None
    assert parse_completion({"prompt": "x", "add_special_tokens": False}, None).add_special_tokens is False
    assert bad(parse_completion, {"prompt": "x", "add_special_tokens": "no"}).param == "add_special_tokens"


def test_chat_template_kwargs_are_template_variables() -> None:
    msgs = [{"role": "user", "content": "x"}]
    kwargs = {"enable_thinking": False, "documents": [{"title": "t", "text": "d"}]}
    assert parse_chat({"messages": msgs, "chat_template_kwargs": kwargs}, None).template_kwargs == kwargs
    assert parse_chat({"messages": msgs}, None).template_kwargs == {}
    for value in ([1], "x", {"not a name": 1}, {"messages": []}, {"add_generation_prompt": False},
                  {"big": "x" * 20_000}):
        assert bad(parse_chat, {"messages": msgs, "chat_template_kwargs": value}).param == "chat_template_kwargs"


def test_unknown_fields_are_ignored() -> None:
    assert parse_completion({"prompt": "x", "frobnicate": 1, "metadata": {"a": 1}}, None).sampling == {"n": 1}


def test_messages_do_not_echo_long_values() -> None:
    err = bad(parse_completion, {"prompt": "x", "response_format": {"type": "z" * 5000}})
    assert len(err.message) < 200
