"""A Messages API body (Anthropic's `POST /v1/messages`) turned into the chat request every
generating route runs: `system` becomes the system message, content blocks become chat messages
(text, `tool_use` as an assistant's tool calls, `tool_result` as tool messages), `tools` with
`input_schema` become function tools, and `tool_choice` auto / any / tool / none become auto /
required / a named function / none. The chat parser then checks every value, as for
/v1/chat/completions, so the two routes accept and refuse the same sampling values. A final
assistant turn with text is a prefill: the model continues it (the chat route's
`continue_final_message`).

Stop sequences are sent with `include_stop_str_in_output`: the engine still does the matching,
and the gateway takes the matched text off the end to report it as `stop_sequence`
(messages_body.py), which Anthropic's API names and OpenAI's does not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import bad_request, not_supported
from kvserve.frontend.openai.api_requests import MAX_MESSAGES, ChatRequest, parse_chat
from kvserve.frontend.openai.tools import ToolSettings, checked_tool_list
from kvserve.seam.limits import MAX_STOP, MAX_STOP_CHARS

# Sampling fields both APIs name alike, and vLLM's extensions a client may add (extra_body).
_PASSED_THROUGH = ("temperature", "top_p", "top_k", "seed", "min_p", "min_tokens", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "ignore_eos", "timeout", "cache_salt",
                   "stop_token_ids", "skip_special_tokens")
# Anthropic features this server does not have: refused when set, never ignored.
_UNSUPPORTED = {"mcp_servers": "MCP servers", "container": "containers", "context_management": "context management"}
# Assistant history the model produced itself and that a chat template cannot show: left out,
# as Anthropic's API leaves earlier turns' thinking out of the prompt.
_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_REFUSED_BLOCKS = {"image": "image content", "document": "document content", "search_result": "search results",
                   "server_tool_use": "server tools", "web_search_tool_result": "server tools",
                   "container_upload": "containers"}


@dataclass(slots=True)
class MessagesRequest:
    chat: ChatRequest
    stream: bool
    stop_sequences: list[str] = field(default_factory=list)


def parse_messages_request(body: dict[str, Any], vocab_size: int | None,
                           tool_settings: ToolSettings | None = None) -> MessagesRequest:
    for name, what in _UNSUPPORTED.items():
        if body.get(name):
            raise not_supported(name, what)
    _check_thinking(body.get("thinking"))
    model = body.get("model")
    if model is None:
        raise bad_request("'model' is required", param="model")
    if body.get("max_tokens") is None:
        raise bad_request("'max_tokens' is required", param="max_tokens")
    F.opt_int(body, "max_tokens", 1)
    if body.get("stop_sequences") is not None and not isinstance(body["stop_sequences"], list):
        raise bad_request("'stop_sequences' must be a list of strings", param="stop_sequences")
    stops = F.opt_str_or_list(body, "stop_sequences", max_items=MAX_STOP, max_len=MAX_STOP_CHARS) or []
    stream = bool(F.opt_bool(body, "stream"))
    messages = _system(body.get("system")) + _messages(body.get("messages"))
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": body["max_tokens"]}
    if _prefilled(messages[-1]):
        chat["continue_final_message"] = True
    chat.update({name: body[name] for name in _PASSED_THROUGH if body.get(name) is not None})
    if stops:
        chat["stop"] = stops
        chat["include_stop_str_in_output"] = True
    chat.update(_tools(body.get("tools"), body.get("tool_choice")))
    return MessagesRequest(parse_chat(chat, vocab_size, tool_settings), stream, stops)


def _prefilled(final: dict[str, Any]) -> bool:
    """A final assistant turn with text is the start of the reply, which the model continues
    (Anthropic's prefill); the response holds only what follows it."""
    if final["role"] != "assistant" or final.get("tool_calls") or not final["content"]:
        return False
    if final["content"] != final["content"].rstrip():
        raise bad_request("final assistant content cannot end with trailing whitespace", param="messages")
    return True


def _check_thinking(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") not in ("enabled", "disabled", "adaptive"):
        raise bad_request("'thinking' must be an object with 'type' \"enabled\" or \"disabled\"", param="thinking")
    if value["type"] != "disabled":
        raise not_supported("thinking", "extended thinking")


def _text_blocks(value: Any, where: str) -> str:
    """A string, or a list of text blocks (joined with newlines)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"'{where}' must be a string or a list of text blocks", param=where.split("[")[0])
    texts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad_request(f"'{where}[{j}]' must be a text block ({{\"type\": \"text\", \"text\": ...}})",
                              param=where.split("[")[0])
        texts.append(block["text"])
    return "\n".join(texts)


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    text = _text_blocks(value, "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"at most {MAX_MESSAGES} messages", param="messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"'{where}' must be an object", param="messages")
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise bad_request(f"'{where}.role' must be \"user\" or \"assistant\"", param="messages")
        content = msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out.extend(_blocks(content, role, where))
        else:
            raise bad_request(f"'{where}.content' must be a string or a list of content blocks", param="messages")
    return out


def _blocks(blocks: list[Any], role: str, where: str) -> list[dict[str, Any]]:
    """One Anthropic message's blocks as chat messages: tool results first (they answer the calls of
    the turn before), then the text; an assistant's tool_use blocks are its tool calls."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise bad_request(f"'{at}' must be an object with a 'type'", param="messages")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise bad_request(f"'{at}.text' must be a string", param="messages")
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at))
        elif kind in _SKIPPED_BLOCKS and role == "assistant":
            continue
        elif kind in _REFUSED_BLOCKS:
            raise not_supported("messages", _REFUSED_BLOCKS[kind])
        elif kind in ("tool_use", "tool_result"):
            raise bad_request(f"'{at}': {kind} blocks belong in {'assistant' if kind == 'tool_use' else 'user'} "
                              "messages", param="messages")
        else:
            raise bad_request(f"'{at}.type' is not a content block type this server knows (text, tool_use, "
                              "tool_result)", param="messages")
    out = list(results)
    if calls:
        out.append({"role": "assistant", "content": "\n".join(texts), "tool_calls": calls})
    elif texts or not results:
        out.append({"role": role, "content": "\n".join(texts)})
    return out


def _tool_use(block: dict[str, Any], at: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise bad_request(f"'{at}' (tool_use) needs a string 'id' and 'name'", param="messages")
    if not isinstance(block.get("input"), dict):
        raise bad_request(f"'{at}.input' must be an object", param="messages")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}}


def _tool_result(block: dict[str, Any], at: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise bad_request(f"'{at}.tool_use_id' must be a string", param="messages")
    content = block.get("content")
    text = "" if content is None else _text_blocks(content, f"{at}.content")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise bad_request(f"'{at}.is_error' must be a boolean", param="messages")
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _tools(tools: Any, choice: Any) -> dict[str, Any]:
    """`tools`, `tool_choice` and `parallel_tool_calls` in chat form (checked again by parse_chat)."""
    out: dict[str, Any] = {}
    if tools is not None:
        out["tools"] = [_tool(t, i) for i, t in enumerate(checked_tool_list(tools))]
    if choice is None:
        return out
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                          param="tool_choice")
    kind = choice["type"]
    if choice.get("name") is not None and not isinstance(choice["name"], str):
        raise bad_request("'tool_choice.name' must be a string", param="tool_choice")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad_request("'tool_choice' of type tool needs a 'name'", param="tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise bad_request("'tool_choice.disable_parallel_tool_use' must be a boolean", param="tool_choice")
        out["parallel_tool_calls"] = not disable
    return out


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"'{where}' must be an object", param="tools")
    if tool.get("type") not in (None, "custom"):
        raise not_supported("tools", "Anthropic's server and client tools (bash, web search, ...); "
                                     "give tools with a name and an input_schema")
    if not isinstance(tool.get("input_schema"), dict):
        raise bad_request(f"'{where}.input_schema' must be a JSON schema object", param="tools")
    fn: dict[str, Any] = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}
