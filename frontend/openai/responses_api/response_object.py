"""The Response object (`"object": "response"`) and its output items, built from the one choice of a
chat call: a `message` item with one `output_text` part, then one `function_call` item per call.
The same items become the assistant turn of the stored conversation that `previous_response_id`
continues (`items_as_messages`).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from kvserve.frontend.openai.responses import ChoiceState, Usage


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class ResponseMeta:
    """What every Response object of one call repeats."""

    id: str
    created_at: int
    model: str
    echo: dict[str, Any] = field(default_factory=dict)  # request fields (responses_request._echo)
    store: bool = True

    def body(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
             *, incomplete: bool = False, error: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model, "output": output, "usage": usage, "store": self.store,
            "truncation": "disabled", "reasoning": None, **self.echo,  # the echo's truncation wins
        }


def message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [output_text(text, logprobs)] if status != "in_progress" else []}


def output_text(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`logprobs`: the chat route's entries ({token, logprob, bytes, top_logprobs}), OpenAI's shape here too."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def usage_body(usage: Usage, choices: list[ChoiceState]) -> dict[str, Any]:
    counts = usage.body(choices)
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"],
                                 "cache_write_tokens": 0},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }


def output_items(state: ChoiceState) -> list[dict[str, Any]]:
    """A whole choice's items (its tool calls already read out of the text by `collect`)."""
    status = "incomplete" if state.finish_reason == "length" else "completed"
    items = []
    text = "".join(state.text)
    if text or not state.tool_calls:
        items.append(message_item(new_id("msg"), text, status, state.chat_lp))
    for call in state.tool_calls or []:
        fn = call["function"]
        items.append(function_call_item(new_id("fc"), call["id"], fn["name"], fn["arguments"], status))
    return items


def items_as_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output as the chat assistant turn it continues from next time."""
    text = "".join(part["text"] for item in items if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in items if item["type"] == "function_call"]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return [message]


def response_status(state: ChoiceState) -> tuple[str, bool]:
    """(status, incomplete): "incomplete" when max_output_tokens cut it off."""
    return ("incomplete", True) if state.finish_reason == "length" else ("completed", False)
