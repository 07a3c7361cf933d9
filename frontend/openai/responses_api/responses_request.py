"""A Responses API body (`POST /v1/responses`) turned into the chat request every generating route
runs: `input` (a string, or items: messages with input_text parts, function_call and
function_call_output items) becomes chat messages after the stored conversation of
`previous_response_id`, `instructions` the system message (not carried over to the next turn, as
OpenAI documents), `max_output_tokens` max_tokens, function `tools` and `tool_choice` their chat
forms, and `text.format` the `response_format` of the structured-output machinery. The chat
parser then checks every value, as for /v1/chat/completions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import ApiError, bad_request, not_supported
from kvserve.frontend.openai.api_requests import MAX_MESSAGES, ChatRequest, parse_chat
from kvserve.seam.limits import MAX_LOGPROBS
from kvserve.frontend.openai.tools import ToolSettings, checked_tool_list

# vLLM's sampling extensions a client may add (extra_body), passed on to the chat parser.
_PASSED_THROUGH = ("temperature", "top_p", "top_k", "seed", "min_p", "min_tokens", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "ignore_eos", "timeout", "cache_salt",
                   "stop", "stop_token_ids", "skip_special_tokens", "parallel_tool_calls", "user")
# Responses features this server does not have: refused when set, never ignored.
_UNSUPPORTED = {"conversation": "conversations (use previous_response_id)", "prompt": "prompt templates",
                "max_tool_calls": "'max_tool_calls'"}
# `include` values: the output text's logprobs; the rest name built-in tools, images and reasoning
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
MAX_METADATA = 16

History = Callable[[str], "list[dict[str, Any]] | None"]  # previous_response_id -> its stored conversation


@dataclass(slots=True)
class ResponsesRequest:
    chat: ChatRequest
    stream: bool
    store: bool
    input_messages: list[dict[str, Any]]  # the conversation before the answer, instructions left out
    echo: dict[str, Any] = field(default_factory=dict)  # the request fields a Response object repeats


def previous_not_found() -> ApiError:
    return ApiError(404, "no stored response has this previous_response_id (responses are kept per API key, "
                    "for a bounded time, unless the server runs with --disable-response-store)",
                    param="previous_response_id", code="previous_response_not_found")


def parse_responses_request(body: dict[str, Any], vocab_size: int | None, tool_settings: ToolSettings | None,
                            history: History) -> ResponsesRequest:
    for name, what in _UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value != [] and value != {}:
            raise not_supported(name, what)
    if F.opt_bool(body, "background"):
        raise not_supported("background", "background responses (background: true)")
    _check_reasoning(body.get("reasoning"))
    if body.get("truncation") not in (None, "disabled", "auto"):
        raise bad_request("'truncation' must be \"disabled\" or \"auto\"", param="truncation")
    if body.get("input") is None:
        raise bad_request("'input' is required", param="input")
    previous = F.opt_str(body, "previous_response_id", max_len=128, allow_empty=False)
    prior: list[dict[str, Any]] = []
    if previous is not None:
        found = history(previous)
        if found is None:
            raise previous_not_found()
        prior = found
    turn = _input(body["input"])
    conversation = prior + turn
    if len(conversation) > MAX_MESSAGES:
        raise bad_request(f"the conversation holds more than {MAX_MESSAGES} messages", param="input")
    instructions = F.opt_str(body, "instructions", max_len=1 << 20)
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = F.opt_int(body, "max_output_tokens", 1)
    chat.update({name: body[name] for name in _PASSED_THROUGH if body.get(name) is not None})
    chat.update(_tools(body.get("tools"), body.get("tool_choice")))
    chat.update(_logprobs(body))
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    req = parse_chat(chat, vocab_size, tool_settings)
    if req.logprobs and req.tools is not None and req.tools.parses_calls:
        # a token's logprob would have to be split between the text and the calls read out of it
        raise not_supported("include", "output text logprobs with tools whose calls are read from the text")
    if req.constraint_param == "response_format":
        req.constraint_param = "text.format"
    store = F.opt_bool(body, "store")
    return ResponsesRequest(req, bool(F.opt_bool(body, "stream")), True if store is None else store,
                            conversation, _echo(body, instructions, previous))


def _logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """`include: ["message.output_text.logprobs"]` and `top_logprobs` (0-20): the chat route's
    logprobs, which the output_text parts and their deltas carry in the same shape."""
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(v, str) for v in include)):
        raise bad_request("'include' must be a list of strings", param="include")
    other = [v for v in include or [] if v != LOGPROBS_INCLUDE]
    if other:
        raise not_supported("include", f"'include' values other than {LOGPROBS_INCLUDE!r}")
    top = F.opt_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if not include and top is None:
        return {}
    return {"logprobs": True, "top_logprobs": top or 0}


def _check_reasoning(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise bad_request("'reasoning' must be an object", param="reasoning")
    if any(v is not None for v in value.values()):
        raise not_supported("reasoning", "reasoning settings (this model does not reason)")


def _echo(body: dict[str, Any], instructions: str | None, previous: str | None) -> dict[str, Any]:
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= MAX_METADATA and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in metadata.items())):
        raise bad_request(f"'metadata' must map at most {MAX_METADATA} keys (64 characters) to strings "
                          "(512 characters)", param="metadata")
    return {
        "instructions": instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": metadata or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,  # null: the default, a bool
        "previous_response_id": previous,
        "truncation": body.get("truncation") or "disabled",
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "text": {"format": body["text"]["format"]} if isinstance(body.get("text"), dict)
        and isinstance(body["text"].get("format"), dict) else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "user": body.get("user"),
    }


def _input(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        if not value:
            raise bad_request("'input' must not be empty", param="input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty list of items", param="input")
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"'input' holds more than {MAX_MESSAGES} items", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"'{where}' must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            _function_call(out, item, where)
        elif kind == "function_call_output":
            out.append(_function_output(item, where))
        elif kind == "reasoning":
            continue  # a reasoning model's own notes: nothing a chat template shows
        else:
            raise bad_request(f"'{where}.type' is not an input item type this server knows (message, "
                              "function_call, function_call_output)", param="input")
    return out


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise bad_request(f"'{where}.role' must be one of {sorted(_ROLES)}", param="input")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or a list of content parts", param="input")
    texts = []
    for j, part in enumerate(content):
        kind = _part_type(part)
        if kind in _TEXT_PARTS or kind == "refusal":
            text = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(text, str):
                raise bad_request(f"'{where}.content[{j}]' needs a string '{'refusal' if kind == 'refusal' else 'text'}'",
                                  param="input")
            texts.append(text)
        elif kind in ("input_image", "input_file", "input_audio"):
            raise not_supported("input", "image, file and audio input")
        else:
            raise bad_request(f"'{where}.content[{j}].type' is not a content part type this server knows "
                              "(input_text, output_text)", param="input")
    return {"role": _ROLES[role], "content": "\n".join(texts)}


def _part_type(part: Any) -> str | None:
    """A content part's `type` if it is a string: a list or an object there is not hashable, and
    looking it up in _TEXT_PARTS would raise TypeError (a 500) instead of the 400 it deserves."""
    kind = part.get("type") if isinstance(part, dict) else None
    return kind if isinstance(kind, str) else None


def _function_call(out: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """An earlier call of the model's: consecutive calls are one assistant turn."""
    if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
        raise bad_request(f"'{where}' (function_call) needs string 'call_id', 'name' and 'arguments'", param="input")
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str):
        raise bad_request(f"'{where}.call_id' must be a string", param="input")
    output = item.get("output")
    if isinstance(output, list):
        parts = [p.get("text") if _part_type(p) in _TEXT_PARTS else None for p in output]
        if any(not isinstance(p, str) for p in parts):
            raise bad_request(f"'{where}.output' must be a string or a list of input_text parts", param="input")
        output = "\n".join(parts)
    if not isinstance(output, str):
        raise bad_request(f"'{where}.output' must be a string", param="input")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _tools(tools: Any, choice: Any) -> dict[str, Any]:
    """`tools` and `tool_choice` in chat form (parse_chat checks them again)."""
    out: dict[str, Any] = {}
    if tools is not None:
        out["tools"] = [_tool(t, i) for i, t in enumerate(checked_tool_list(tools))]
    if choice is None:
        return out
    if isinstance(choice, str):
        out["tool_choice"] = choice  # none / auto / required, or refused by parse_chat
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif isinstance(choice, dict) and isinstance(choice.get("type"), str) and choice["type"] != "function":
        raise not_supported("tool_choice", "tool choices other than none, auto, required and a function")
    else:
        raise bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                          "{\"type\": \"function\", \"name\": ...}", param="tool_choice")
    return out


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
        raise bad_request(f"'{where}' must be an object with a 'type'", param="tools")
    if tool["type"] != "function":
        raise not_supported("tools", "built-in tools (web search, file search, code interpreter, ...); "
                                     "function tools are")
    fn: dict[str, Any] = {"name": tool.get("name")}
    for key in ("description", "parameters", "strict"):  # checked by the chat tools' parser
        if tool.get(key) is not None:
            fn[key] = tool[key]
    return {"type": "function", "function": fn}


def _text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as the chat `response_format` (structured_request.py checks the rest)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_request("'text' must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad_request("'text.format' must be an object with a 'type'", param="text.format")
    if fmt.get("schema") is not None and not isinstance(fmt["schema"], dict):
        raise bad_request("'text.format.schema' must be a JSON schema object", param="text.format")
    name = fmt.get("name")
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= 64):
        raise bad_request("'text.format.name' must be a string of 1 to 64 characters", param="text.format")
    if fmt.get("strict") is not None and not isinstance(fmt["strict"], bool):
        raise bad_request("'text.format.strict' must be a boolean", param="text.format")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    if fmt.get("schema") is None:
        raise bad_request("'text.format.schema' is required with type json_schema", param="text.format")
    spec = {"schema": fmt["schema"], "name": name or "response"}
    if fmt.get("strict") is not None:
        spec["strict"] = fmt["strict"]
    return {"type": "json_schema", "json_schema": spec}
