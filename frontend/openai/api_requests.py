"""Parse and validate `/v1/completions` and `/v1/chat/completions` bodies into
plain dataclasses. Unknown fields are ignored, as OpenAI does; known fields are
checked for type and range here so the engine sees only sane values.

`sampling` holds only what the client set (plus `n`), keyed by SamplingParams
field names, so the engine's own defaults apply to everything else.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import bad_request, not_supported
from kvserve.frontend.openai.beam.beam_request import beam_length_penalty
# The engine's limits: the gateway checks them first, to answer in the client's field names.
from kvserve.frontend.openai.structured_request import FIELD as CONSTRAINT_FIELD
from kvserve.frontend.openai.structured_request import parse_constraint
from kvserve.frontend.openai.tools import ToolRequest, ToolSettings, parse_tools, tool_constraint
from kvserve.seam.limits import (MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_N, MAX_PREDICTION_CHARS,
                                 MAX_STOP, MAX_STOP_CHARS, MAX_TIMEOUT_S)

MAX_PROMPTS = 256
MAX_CHOICES = 1024
MAX_MESSAGES = 4096
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(slots=True)
class CommonRequest:
    model: str | None
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool  # vLLM's stream_options.continuous_usage_stats: every chunk has the usage so far
    sampling: dict[str, Any]
    user: str | None
    constraint_param: str | None  # the field a structured-output constraint came from
    prompt_logprobs: int | None  # vLLM's extension: the prompt's logprobs in the response, top k each
    return_token_ids: bool  # vLLM's: the prompt's and each choice's token ids beside the text
    tokens_as_ids: bool  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
    # vLLM's add_special_tokens: None is the route's default (completions add BOS and the like;
    # chat does not, its template writes them)
    add_special_tokens: bool | None
    # vLLM's: the response's id (after "chatcmpl-"/"cmpl-") unless X-Request-Id names one
    request_id: str | None = None
    beam_length_penalty: float | None = None  # vLLM's use_beam_search (with its length_penalty); None: off


@dataclass(slots=True)
class CompletionRequest(CommonRequest):
    prompts: list[str | list[int]] = field(default_factory=list)
    echo: bool = False
    echo_only: bool = False  # echo with max_tokens 0: the prompt alone comes back (scored, with logprobs)
    logprobs: int | None = None


@dataclass(slots=True)
class ChatRequest(CommonRequest):
    messages: list[dict[str, Any]] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    add_generation_prompt: bool = True
    tools: ToolRequest | None = None
    # vLLM's: the final message is left open and the model continues it (a "prefilled" reply)
    continue_final_message: bool = False
    # vLLM's: a final assistant message heads the reply (with continue_final_message, the whole message)
    echo: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # vLLM's chat_template_kwargs


def _common(body: dict[str, Any], vocab_size: int | None, *, chat: bool) -> dict[str, Any]:
    model = F.opt_str(body, "model", max_len=512)
    n = F.opt_int(body, "n", 1, MAX_N) or 1
    stream = bool(F.opt_bool(body, "stream"))
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    if options is not None and not stream:
        # As OpenAI and vLLM answer it: the options of a stream that was not asked for.
        raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include_usage = (options or {}).get("include_usage")
    continuous = (options or {}).get("continuous_usage_stats")  # vLLM's: usage so far in every chunk
    for value, name in ((include_usage, "include_usage"), (continuous, "continuous_usage_stats")):
        if value is not None and not isinstance(value, bool):
            raise bad_request(f"'stream_options.{name}' must be a boolean", param="stream_options")
    _check_unimplemented_extensions(body, chat=chat)
    constraint = parse_constraint(body)
    if not chat and (body.get("tools") or body.get("functions")):
        raise not_supported("tools", "tool calling in completions")
    if "suffix" in body and body["suffix"] not in (None, ""):
        raise not_supported("suffix", "'suffix'")
    best_of = F.opt_int(body, "best_of", 1, MAX_N)
    if best_of is not None and best_of != n:
        raise not_supported("best_of", "'best_of' different from 'n'")
    sampling = _sampling(body, vocab_size, n, chat=chat)
    if constraint is not None:
        sampling[CONSTRAINT_FIELD] = constraint.value
    prompt_logprobs = F.opt_int(body, "prompt_logprobs", 0, MAX_LOGPROBS)
    if prompt_logprobs is not None:
        if stream:  # as vLLM: its responses carry them, its chunks do not
            raise bad_request("'prompt_logprobs' is not available when 'stream' is true", param="prompt_logprobs")
        sampling["prompt_logprobs"] = prompt_logprobs
    return {
        "model": model,
        "n": n,
        "stream": stream,
        "include_usage": bool(include_usage),
        "continuous_usage": bool(include_usage and continuous),  # as vLLM: only with include_usage
        "sampling": sampling,
        "user": F.opt_str(body, "user", max_len=256),
        "constraint_param": constraint.param if constraint is not None else None,
        "prompt_logprobs": prompt_logprobs,
        "return_token_ids": bool(F.opt_bool(body, "return_token_ids")),
        "tokens_as_ids": bool(F.opt_bool(body, "return_tokens_as_token_ids")),
        "add_special_tokens": F.opt_bool(body, "add_special_tokens"),
        "request_id": F.opt_str(body, "request_id", max_len=256, allow_empty=False),
        "beam_length_penalty": beam_length_penalty(body, sampling, constraint is not None),
    }


# vLLM's request extensions this server does not implement. Ignoring one would hand back
# ordinary output where the client asked for constrained or differently decoded output, so
# each is refused when set to anything but its default (None, false, empty).
_VLLM_UNSUPPORTED = {
    "logits_processors": "custom logits processors",
    "kv_transfer_params": "KV transfer between instances (disaggregated prefill)",
    "prompt_embeds": "prompt embeddings",
    "mm_processor_kwargs": "multimodal processing",
    "vllm_xargs": "'vllm_xargs'",
}
_VLLM_UNSUPPORTED_IN_CHAT = {
    # vLLM takes one only with --trust-request-chat-template; here the model's (or --chat-template's)
    # template renders every conversation
    "chat_template": "a chat template sent with the request",
}


def _check_unimplemented_extensions(body: dict[str, Any], *, chat: bool) -> None:
    for name, what in {**_VLLM_UNSUPPORTED, **(_VLLM_UNSUPPORTED_IN_CHAT if chat else {})}.items():
        value = body.get(name)
        unset = value is None or value is False or (isinstance(value, (str, list, dict)) and not value)
        if not unset:  # 0 is a setting here (prompt_logprobs: 0 asks for the prompt's logprobs)
            raise not_supported(name, what)


def _sampling(body: dict[str, Any], vocab_size: int | None, n: int, *, chat: bool) -> dict[str, Any]:
    s: dict[str, Any] = {"n": n}
    max_tokens = F.opt_int(body, "max_completion_tokens", 1) if chat else None
    if max_tokens is None:
        max_tokens = F.opt_int(body, "max_tokens", 1)
    values: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": F.opt_int(body, "min_tokens", 0),
        "temperature": F.opt_number(body, "temperature", 0.0, 2.0),
        "top_p": F.opt_number(body, "top_p", 0.0, 1.0, lo_open=True),
        "top_k": F.opt_int(body, "top_k", -1),
        "min_p": F.opt_number(body, "min_p", 0.0, 1.0),
        "seed": F.opt_int(body, "seed"),  # int64, as in vLLM
        "stop": F.opt_str_or_list(body, "stop", max_items=MAX_STOP, max_len=MAX_STOP_CHARS),
        "presence_penalty": F.opt_number(body, "presence_penalty", -2.0, 2.0),
        "frequency_penalty": F.opt_number(body, "frequency_penalty", -2.0, 2.0),
        "repetition_penalty": F.opt_number(body, "repetition_penalty", 0.0, 2.0, lo_open=True),
        "ignore_eos": F.opt_bool(body, "ignore_eos"),
        "logit_bias": F.opt_logit_bias(body, "logit_bias", vocab_size, max_items=MAX_LOGIT_BIAS),
        "include_stop_str_in_output": F.opt_bool(body, "include_stop_str_in_output"),
        "skip_special_tokens": F.opt_bool(body, "skip_special_tokens"),
        "cache_salt": F.opt_str(body, "cache_salt", max_len=256, allow_empty=False),
        # Extension (as vLLM's extra fields): seconds from arrival; past it the
        # engine ends the request with a "timeout" error and frees its blocks.
        "timeout": F.opt_number(body, "timeout", 0.0, MAX_TIMEOUT_S, lo_open=True),
        # vLLM's: lower runs first with --scheduling-policy priority; the engine refuses a nonzero
        # one under first come, first served, as vLLM does
        "priority": F.opt_int(body, "priority"),
    }
    values.update(_vocabulary_bans(body, vocab_size))
    values["truncate_prompt_tokens"] = F.opt_prompt_truncation(body, "as many as fit")
    if body.get("stop_token_ids") is not None:
        values["stop_token_ids"] = F.token_ids(body["stop_token_ids"], "stop_token_ids", vocab_size, allow_empty=True)
        if len(values["stop_token_ids"]) > MAX_STOP:
            raise bad_request(f"'stop_token_ids' has more than {MAX_STOP} entries", param="stop_token_ids")
    if values["top_k"] == 0:
        values["top_k"] = -1  # vLLM treats 0 and -1 alike: no top-k
    if max_tokens is not None and values["min_tokens"] is not None and values["min_tokens"] > max_tokens:
        raise bad_request("'min_tokens' must not exceed 'max_tokens'", param="min_tokens")
    s.update({k: v for k, v in values.items() if v is not None})
    return s


def _vocabulary_bans(body: dict[str, Any], vocab_size: int | None) -> dict[str, Any]:
    """vLLM's allowed_token_ids and bad_words, checked as the engine checks them."""
    out: dict[str, Any] = {}
    if body.get("allowed_token_ids") is not None:
        out["allowed_token_ids"] = F.token_ids(body["allowed_token_ids"], "allowed_token_ids", vocab_size)
        if len(out["allowed_token_ids"]) > MAX_ALLOWED_TOKEN_IDS:
            raise bad_request(f"'allowed_token_ids' has more than {MAX_ALLOWED_TOKEN_IDS} entries",
                              param="allowed_token_ids")
    bad_words = F.opt_str_or_list(body, "bad_words", max_items=MAX_STOP, max_len=MAX_STOP_CHARS)
    if bad_words is not None and any(not w.strip() for w in bad_words):
        raise bad_request("each 'bad_words' entry must hold more than spaces", param="bad_words")
    out["bad_words"] = bad_words
    return out


def parse_completion(body: dict[str, Any], vocab_size: int | None) -> CompletionRequest:
    echo = bool(F.opt_bool(body, "echo"))
    max_tokens = body.get("max_tokens")
    echo_only = echo and F.is_int(max_tokens) and max_tokens == 0
    if echo_only:  # as OpenAI's legacy API and vLLM: the engine runs the one step that scores the prompt
        body = {**body, "max_tokens": 1}
    common = _common(body, vocab_size, chat=False)
    prompts = _prompts(body.get("prompt"), vocab_size)
    if len(prompts) * common["n"] > MAX_CHOICES:
        raise bad_request(f"prompts x n must not exceed {MAX_CHOICES}", param="n")
    logprobs = F.opt_int(body, "logprobs", 0, MAX_LOGPROBS)
    if echo and "truncate_prompt_tokens" in common["sampling"]:
        # the echo is the prompt as sent; the engine would have read only its end
        raise bad_request("'echo' cannot be combined with 'truncate_prompt_tokens'", param="echo")
    req = CompletionRequest(**common, prompts=prompts, echo=echo, echo_only=echo_only, logprobs=logprobs)
    if logprobs is not None:
        req.sampling["logprobs"] = logprobs
        if echo:  # the echoed prompt's tokens get logprobs too, as OpenAI's (and vLLM's) do
            req.sampling.setdefault("prompt_logprobs", logprobs)
    return req


def _prompts(value: Any, vocab_size: int | None) -> list[str | list[int]]:
    if value is None:
        raise bad_request("'prompt' is required", param="prompt")
    if isinstance(value, str):
        prompts: list[str | list[int]] = [value]
    elif isinstance(value, list) and value and all(F.is_int(t) for t in value):
        prompts = [F.token_ids(value, "prompt", vocab_size)]
    elif isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        prompts = list(value)
    elif isinstance(value, list) and value and all(isinstance(p, list) for p in value):
        prompts = [F.token_ids(p, "prompt", vocab_size) for p in value]
    else:
        raise bad_request(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of token id lists",
            param="prompt",
        )
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    if any(p == "" for p in prompts):
        raise bad_request("'prompt' must not be empty", param="prompt")
    return prompts


def parse_chat(body: dict[str, Any], vocab_size: int | None,
               tool_settings: ToolSettings | None = None) -> ChatRequest:
    common = _common(body, vocab_size, chat=True)
    tools = parse_tools(body, tool_settings or ToolSettings())
    forced = tool_constraint(tools) if tools is not None else None
    if forced is not None:
        if common["constraint_param"] is not None:
            raise bad_request(f"'tool_choice' {tools.choice!r} cannot be combined with "
                              f"'{common['constraint_param']}'", param="tool_choice")
        if common["beam_length_penalty"] is not None:
            raise bad_request(f"'tool_choice' {tools.choice!r} cannot be combined with 'use_beam_search'",
                              param="tool_choice")
        common["sampling"][CONSTRAINT_FIELD] = forced
        common["constraint_param"] = "tools"
    messages = parse_messages(body.get("messages"))
    prediction = _prediction(body)
    if prediction is not None:
        if common["beam_length_penalty"] is not None:  # beam search proposes nothing
            raise bad_request("'prediction' cannot be combined with 'use_beam_search'", param="prediction")
        common["sampling"]["prediction"] = prediction
    logprobs = bool(F.opt_bool(body, "logprobs"))
    top_logprobs = F.opt_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
    add_generation_prompt = F.opt_bool(body, "add_generation_prompt")
    continue_final = bool(F.opt_bool(body, "continue_final_message"))
    if continue_final:
        check_continuable(messages, add_generation_prompt)
    echo = bool(F.opt_bool(body, "echo"))
    if echo and tools is not None and tools.parses_calls:
        # the echoed text would be read for tool calls that were made before this request
        raise bad_request("'echo' cannot be combined with tools the reply is parsed for", param="echo")
    req = ChatRequest(
        **common,
        messages=messages,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        # continuing a message, no new turn is opened unless asked (and asking is refused above)
        add_generation_prompt=not continue_final if add_generation_prompt is None else add_generation_prompt,
        tools=tools,
        continue_final_message=continue_final,
        echo=echo,
        template_kwargs={**template_kwargs(body), **_documents(body)},
    )
    if logprobs:
        req.sampling["logprobs"] = req.top_logprobs
    return req


def _prediction(body: dict[str, Any]) -> str | None:
    """OpenAI's predicted output: {"type": "content", "content": text or text parts}, as text."""
    value = body.get("prediction")
    if value is None:
        return None
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "content":
        raise bad_request("'prediction' must be {\"type\": \"content\", \"content\": ...}", param="prediction")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad_request("'prediction.content' must be a string or a list of text parts", param="prediction")
    if len(content) > MAX_PREDICTION_CHARS:
        raise bad_request(f"'prediction.content' must be at most {MAX_PREDICTION_CHARS} characters",
                          param="prediction")
    return content or None


def check_continuable(messages: list[dict[str, Any]], add_generation_prompt: bool | None) -> None:
    """`continue_final_message` needs a final message with text to continue, and no new turn."""
    if add_generation_prompt:
        raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                          param="continue_final_message")
    final = messages[-1]
    if not final["content"].strip() or final.get("tool_calls"):
        raise bad_request("'continue_final_message' needs a final message with text to continue (and no tool "
                          "calls)", param="continue_final_message")


# Variables the renderer sets itself: chat_template_kwargs may not replace them.
_TEMPLATE_OWN = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                           "raise_exception", "strftime_now"})
MAX_TEMPLATE_KWARGS_CHARS = 16_384


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `chat_template_kwargs`: more variables for the chat template (`enable_thinking`, ...)."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise bad_request("'chat_template_kwargs' must be an object whose keys are template variable names",
                          param="chat_template_kwargs")
    own = sorted(_TEMPLATE_OWN & value.keys())
    if own:
        raise bad_request(f"'chat_template_kwargs' cannot set {own[0]!r}, which the server sets (use the "
                          "request's own field)", param="chat_template_kwargs")
    if len(json.dumps(value)) > MAX_TEMPLATE_KWARGS_CHARS:
        raise bad_request(f"'chat_template_kwargs' is longer than {MAX_TEMPLATE_KWARGS_CHARS} characters of JSON",
                          param="chat_template_kwargs")
    return value


def _documents(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `documents` (retrieved passages for a RAG template), a template variable."""
    documents = body.get("documents")
    if documents is None:
        return {}
    if not isinstance(documents, list) or not all(
            isinstance(d, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in d.items())
            for d in documents):
        raise bad_request("'documents' must be a list of objects whose values are strings (a title, a text...)",
                          param="documents")
    return {"documents": documents}


def parse_messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"at most {MAX_MESSAGES} messages", param="messages")
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"'{where}' must be an object", param="messages")
        role = msg.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise bad_request(f"'{where}.role' must be one of {sorted(CHAT_ROLES)}", param="messages")
        out.append({"role": role, "content": _content(msg.get("content"), where, role)})
        if msg.get("tool_calls") is not None:
            calls = _tool_calls(msg["tool_calls"], where)
            if calls and role != "assistant":
                raise bad_request(f"'{where}.tool_calls': only assistant messages carry tool calls", param="messages")
            if calls:
                out[-1]["tool_calls"] = calls
        call_id = msg.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_request(f"'{where}.tool_call_id' must be a string", param="messages")
        if call_id is not None and role == "tool":
            out[-1]["tool_call_id"] = call_id
        name = msg.get("name")
        if name is not None and not isinstance(name, str):
            raise bad_request(f"'{where}.name' must be a string", param="messages")
        if name is not None:
            out[-1]["name"] = name
    return out


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise bad_request(f"'{where}.tool_calls' must be a list", param="messages")
    calls = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments"), str) or call.get("type", "function") != "function"
                or not isinstance(call.get("id", ""), str)):
            raise bad_request(f"'{where}.tool_calls[{j}]' must be a function call with a 'name' and "
                              "'arguments' (a JSON string)", param="messages")
        item: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": fn["arguments"]}}
        if isinstance(call.get("id"), str):
            item["id"] = call["id"]
        calls.append(item)
    return calls


def _content(value: Any, where: str, role: str) -> str:
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":
        return ""
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request(f"'{where}.content' parts must be objects with a 'type'", param="messages")
            if part["type"] != "text":
                raise not_supported("messages", "content parts other than text")
            if not isinstance(part.get("text"), str):
                raise bad_request(f"'{where}.content' text parts need a string 'text'", param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(f"'{where}.content' must be a string or a list of text parts", param="messages")
