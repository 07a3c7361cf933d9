"""Reads Hermes-style tool calls back out of generated text, incrementally.

Text outside `<tool_call>...</tool_call>` blocks is content. Inside a block, the call's name is
announced as soon as `{"name": "...", "arguments": ` is complete, then the arguments stream in
fragments. A fragment never runs past the block's last `}` seen so far (minus trailing spaces):
that brace may close the wrapper object rather than the arguments, which only `</tool_call>`
decides. So the fragments always join to exactly the final arguments text, however the text
was cut into deltas, and a whole response parsed in one feed gives the same calls as a stream.

A block that does not have that shape is read as JSON ({"name", "arguments"}) when it closes;
one that is not even that stays content. A block cut off by max_tokens keeps what it had.

Once a call was made, whitespace between blocks is their separator, not content (the
`required` constraint puts a newline between calls): it is given out only if more text follows
it. A tag or a block header that max_tokens cut off after a call is dropped, not given out as
content. With `calls_only` (tool_choice `required` or a named function, where the constraint
allows no free text) nothing outside the calls is content.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(slots=True)
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class Event:
    """One piece of output: content text, a new call (name), or an arguments fragment of call `index`."""
    kind: str  # "content" | "call" | "arguments"
    text: str = ""
    call: ToolCall | None = None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class HermesToolParser:
    max_calls: int | None = None  # parallel_tool_calls false: 1
    calls_only: bool = False  # the constraint allows calls only: no content
    calls: list[ToolCall] = field(default_factory=list)
    _space: str = ""  # whitespace after a call, given out only if content follows it
    _buf: str = ""  # text not yet given out (outside a block) or the open block's body
    _inside: bool = False
    _args_start: int = -1  # in _buf, once the header matched
    _sent: int = 0  # characters of arguments given out for the open call

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while True:
            if not self._inside:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _partial_suffix(self._buf, OPEN)
                    self._content(events, self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return events
                self._content(events, self._buf[:at])
                self._space = ""  # the separator before this call
                self._buf = self._buf[at + len(OPEN):]
                self._inside, self._args_start, self._sent = True, -1, 0
            end = self._buf.find(CLOSE)
            body = self._buf if end < 0 else self._buf[:end]
            self._advance(events, body)
            if end < 0:
                return events
            self._close(events, body)
            self._buf = self._buf[end + len(CLOSE):]
            self._inside = False

    def finish(self) -> list[Event]:
        """End of output: flush what is held back."""
        events: list[Event] = []
        if self._inside:
            if self._args_start >= 0:
                rest = self._buf[self._args_start:].rstrip()
                self._arguments(events, rest[self._sent:])
            elif not self._limit_reached() and not self.calls:
                self._content(events, OPEN + self._buf)
        elif not (self.calls and OPEN.startswith(self._buf.lstrip())):  # not a tag cut off after a call
            self._content(events, self._buf)
        self._buf, self._inside, self._space = "", False, ""
        return events

    # ---- internals ----------------------------------------------------------------------------
    def _limit_reached(self) -> bool:
        return self.max_calls is not None and len(self.calls) >= self.max_calls

    def _content(self, events: list[Event], text: str) -> None:
        if not text or self.calls_only or (self.calls and self._limit_reached()):
            return
        if self.calls:  # trailing whitespace waits: it may be the separator before the next call
            text = self._space + text
            kept = text.rstrip()
            self._space = text[len(kept):]
            if not kept:
                return
            text = kept
        events.append(Event("content", text))

    def _advance(self, events: list[Event], body: str) -> None:
        if self._args_start < 0:
            match = _HEADER.match(body)
            # Wait for the first character of the arguments: spaces before it are not theirs.
            if match is None or match.end() == len(body) or self._limit_reached():
                return
            self._start_call(events, json.loads(f'"{match.group(1)}"'))
            self._args_start = match.end()
        last = body.rfind("}")
        if last > self._args_start:
            self._arguments(events, body[self._args_start:last].rstrip()[self._sent:])

    def _close(self, events: list[Event], body: str) -> None:
        if self._args_start >= 0:
            last = body.rfind("}")
            final = body[self._args_start:last].strip() if last > self._args_start else ""
            self._arguments(events, final[self._sent:])
            return
        if self._limit_reached():
            return
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self._content(events, OPEN + body + CLOSE)
            return
        self._start_call(events, name)
        self._arguments(events, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))

    def _start_call(self, events: list[Event], name: str) -> None:
        call = ToolCall(len(self.calls), new_call_id(), name)
        self.calls.append(call)
        events.append(Event("call", call=call))

    def _arguments(self, events: list[Event], fragment: str) -> None:
        if fragment and self.calls:
            self.calls[-1].arguments += fragment
            self._sent += len(fragment)
            events.append(Event("arguments", fragment, self.calls[-1]))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
