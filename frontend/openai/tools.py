"""OpenAI tool calling on the request side: `tools`, `tool_choice`, `parallel_tool_calls`, and
the conversation's tool messages rendered for the model.

The call format is the Hermes / Qwen convention, one block per call:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`required` and a named function are enforced: the engine gets an xgrammar structural tag whose
tags are exactly these blocks with each function's parameter schema inside, so the arguments
always validate. `auto` is free text read back by the tool-call parser (`--tool-call-parser`,
allowed with `--enable-auto-tool-choice`, as in vLLM). `none` leaves the tools out of the prompt.

A chat template that renders tools itself (it mentions `tools`) gets them, HF style. One that
does not (SmolLM2's) gets the default below: the tools are described in the system message,
earlier calls are written back as `<tool_call>` blocks and tool results become user turns
wrapped in `<tool_response>`, which every template can render.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kvserve.frontend.openai.api_errors import bad_request, not_supported

MAX_TOOLS = 128
MAX_JSON_WHITESPACE = 16  # as the engine bounds it for JSON schemas (backend/structured/compiler.py)
TOOL_PARSERS = ("hermes",)
CALL_BEGIN = '<tool_call>\n{"name": "'
ARGS_PREFIX = '", "arguments": '
CALL_END = "}\n</tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolRequest:
    tools: list[dict[str, Any]]  # {"type": "function", "function": {"name", "description"?, "parameters"}}
    choice: str  # "none" | "auto" | "required" | "named"
    named: str | None = None
    parallel: bool = True

    @property
    def parses_calls(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """`required` or a named function: the constraint allows calls only, no free text."""
        return self.choice in ("required", "named")

    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """The server's flags: --enable-auto-tool-choice and --tool-call-parser."""
    auto: bool = False
    parser: str | None = None


def parse_tools(body: dict[str, Any], settings: ToolSettings) -> ToolRequest | None:
    if body.get("functions") or body.get("function_call") is not None:
        raise not_supported("functions", "the deprecated 'functions' / 'function_call' (use 'tools')")
    raw_tools = body.get("tools")
    choice_raw = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    if raw_tools is None or raw_tools == []:
        if choice_raw not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    tools = [_tool(t, i) for i, t in enumerate(checked_tool_list(raw_tools))]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("'tools' has two functions with the same name", param="tools")
    choice, named = _choice(choice_raw, names)
    if choice == "auto" and not (settings.auto and settings.parser):
        raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                          "to be set on the server", param="tool_choice")
    return ToolRequest(tools, choice, named, True if parallel is None else parallel)


def checked_tool_list(raw: Any) -> list[Any]:
    """`tools` as every API takes it (chat, Responses, Messages): a list of at most MAX_TOOLS."""
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of at most {MAX_TOOLS} tools", param="tools")
    return raw


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise bad_request(f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}", param="tools")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(f"'{where}.function.name' must be 1 to 64 letters, digits, '_', '.' or '-'",
                          param="tools")
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"'{where}.function.description' must be a string", param="tools")
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        # Read by no one here (a tool call's arguments are parsed against `parameters` either way),
        # but OpenAI refuses a non-boolean, and a client that sends one has a bug it should hear of.
        raise bad_request(f"'{where}.function.strict' must be a boolean", param="tools")
    parameters = fn.get("parameters", _EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise bad_request(f"'{where}.function.parameters' must be a JSON schema object", param="tools")
    out: dict[str, Any] = {"name": name, "parameters": parameters}
    if description:
        out["description"] = description
    return {"type": "function", "function": out}


def _choice(value: Any, names: list[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("none", "auto", "required"):
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if name not in names:
            raise bad_request("'tool_choice' names a function that is not in 'tools'", param="tool_choice")
        return "named", name
    raise bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")


def tool_constraint(req: ToolRequest) -> dict[str, Any] | None:
    """The structural tag that enforces `required` / a named function; None for auto and none."""
    if not req.forced:
        return None

    def tag(tool: dict[str, Any]) -> dict[str, Any]:
        fn = tool["function"]
        return {"type": "tag", "begin": CALL_BEGIN + fn["name"] + ARGS_PREFIX,
                "content": {"type": "json_schema", "json_schema": fn["parameters"],
                            "max_whitespace_cnt": MAX_JSON_WHITESPACE},
                "end": CALL_END}
    if req.choice == "named":
        fmt = tag(next(t for t in req.tools if t["function"]["name"] == req.named))
    else:
        # Calls only, one per line, at least one: no free text before, between or after them.
        fmt = {"type": "tags_with_separator", "tags": [tag(t) for t in req.tools], "separator": "\n",
               "at_least_one": True, "stop_after_first": not req.parallel}
    return {"structural_tag": {"type": "structural_tag", "format": fmt}}


# ---- the conversation ----------------------------------------------------------------------------
def template_renders_tools(template: str) -> bool:
    return "tools" in template


def call_block(name: str, arguments: Any) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{CALL_BEGIN}{name}{ARGS_PREFIX}{args}{CALL_END}'


def default_tools_prompt(tools: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nThese functions are available. To call one, answer with one block per call "
            "(nothing else in the block), each like:\n"
            '<tool_call>\n{"name": "function_name", "arguments": {"argument": "value"}}\n</tool_call>\n'
            "The arguments must be a JSON object that follows the function's parameter schema.\n"
            f"<tools>\n{listing}\n</tools>")


def render_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    template: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for the chat template."""
    if template_renders_tools(template):
        extra = {"tools": tools} if tools else {}
        return [_hf_message(m) for m in messages], extra
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + text  # one user turn for consecutive results
            else:
                out.append({"role": "user", "content": text, "_tool": True})
        elif m.get("tool_calls"):
            blocks = [call_block(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            content = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
            out.append({"role": m["role"], "content": content})
        else:
            out.append(dict(m))
    for m in out:
        m.pop("_tool", None)
    if tools:
        section = default_tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out, {}


def _hf_message(m: dict[str, Any]) -> dict[str, Any]:
    """Transformers' convention for templates with tools: arguments as objects, not JSON text."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        args = c["function"]["arguments"]
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        calls.append({**c, "function": {**c["function"], "arguments": args}})
    return {**m, "tool_calls": calls}

