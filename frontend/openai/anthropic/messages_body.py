"""The Message object Anthropic's API answers with, built from the one choice of a chat call: text
and `tool_use` content blocks, `stop_reason` / `stop_sequence`, and `usage`.

The engine ran with `include_stop_str_in_output` (messages_request.py says why), so a matched stop
sequence is the end of the text; `StopTail` takes it off, in a stream too, where it holds back
only the suffix that could still be the start of one.
"""
from __future__ import annotations

import json
from typing import Any

from kvserve.frontend.openai.responses import ChoiceState, Usage

# The engine's finish reasons (and "tool_calls", which the tool parser makes of "stop").
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    if stop_sequence is not None:
        return "stop_sequence"
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


def tool_use_id(call_id: str) -> str:
    """Anthropic's id style for the parser's call ids (`call_x` -> `toolu_x`)."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic sends; {} when cut off before they were whole."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class StopTail:
    """Text on its way to the client, less a stop sequence at its end."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = sorted(stops, key=len, reverse=True)
        self.held = ""

    def feed(self, text: str) -> str:
        """What may go out now: all but the longest suffix that begins (or is) a stop sequence."""
        if not self.stops:
            return text
        buf = self.held + text
        keep = max((_prefix_suffix(buf, s) for s in self.stops), default=0)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """Everything held: more output followed it (a tool call), so it was no stop sequence."""
        out, self.held = self.held, ""
        return out

    def finish(self, stopped: bool) -> tuple[str, str | None]:
        """(the rest of the text, the stop sequence it ended with) once the choice finished;
        `stopped`: the engine's finish reason was "stop" (a stop sequence or the end token)."""
        held = self.flush()
        if stopped:
            for stop in self.stops:
                if held.endswith(stop):
                    return held[:len(held) - len(stop)], stop
        return held, None


def _prefix_suffix(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a prefix of `stop` (the whole of it included)."""
    for n in range(min(len(stop), len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def usage_body(usage: Usage, choices: list[ChoiceState]) -> dict[str, int]:
    counts = usage.body(choices)
    return {"input_tokens": counts["prompt_tokens"], "output_tokens": counts["completion_tokens"]}


def message_body(rid: str, model: str, choices: list[ChoiceState], usage: Usage, stops: list[str]) -> dict[str, Any]:
    state = choices[0]
    text, stop_sequence = _cut("".join(state.text), stops, state.finish_reason == "stop")
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in state.tool_calls or []:
        fn = call["function"]
        content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": fn["name"],
                        "input": tool_input(fn["arguments"])})
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(state.finish_reason, stop_sequence),
        "stop_sequence": stop_sequence,
        "usage": usage_body(usage, choices),
    }


def _cut(text: str, stops: list[str], stopped: bool) -> tuple[str, str | None]:
    tail = StopTail(stops)
    head = tail.feed(text)
    rest, stop = tail.finish(stopped)
    return head + rest, stop
