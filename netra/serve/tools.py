"""Tool calls in the Qwen3 (Hermes) format: the prompt, the grammar that enforces a call, the parser.

A Qwen3 chat template lists the tools in the system turn and the model answers a call with

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

possibly several blocks in a row. `ToolCallParser` turns the output text (whole or streamed) into
content text and OpenAI ``tool_calls``; text that only might start a block is held back until it is
known. `required_grammar` is the Lark grammar (llguidance's dialect, the worker contract's ``ebnf``)
that makes ``tool_choice`` ``required`` or a named function binding: the output is one or more such
blocks whose JSON follows the tool's parameter schema. The plain chat template of the seeded presets
has no tool syntax of its own, so `tools_preamble` writes Qwen3's instructions into it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def tool_dicts(tools: list[Any]) -> list[dict[str, Any]]:
    """The tools as a chat template expects them (``{"type": "function", "function": {...}}``)."""
    return [t.model_dump(exclude_none=True, by_alias=True) for t in tools]


def tools_preamble(tools: list[dict[str, Any]]) -> str:
    """Qwen3's tool instructions, for chat templates that have none."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it (for assistant turns replayed through a plain template)."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return f'{OPEN}\n{json.dumps({"name": name, "arguments": args}, ensure_ascii=False)}\n{CLOSE}'


def required_grammar(tools: list[dict[str, Any]], only: str | None, parallel: bool) -> str:
    """Lark grammar: one block (or several, with ``parallel``) calling ``only`` or any of ``tools``,
    the arguments following each function's ``parameters`` schema."""
    options = []
    for t in tools:
        fn = t["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    repeat = ' ("\\n" call)*' if parallel else ""
    return (f"start: call{repeat}\n"
            f'call: "{OPEN}\\n" %json {json.dumps(schema)} "\\n{CLOSE}"\n')


@dataclass
class ToolCall:
    index: int
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def body(self, with_index: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        return {"index": self.index, **d} if with_index else d


def _parse_block(text: str) -> tuple[str, str] | None:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


class ToolCallParser:
    """Feed output text as it arrives; get back content text and completed tool calls."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._ws = ""
        self._inside = False

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        content: list[str] = []
        new: list[ToolCall] = []
        while True:
            if not self._inside:
                i = self._buf.find(OPEN)
                if i < 0:
                    keep = _partial_suffix(self._buf, OPEN)
                    content.append(self._keep(self._buf[:len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                content.append(self._keep(self._buf[:i]))
                self._ws = ""
                self._buf = self._buf[i + len(OPEN):]
                self._inside = True
            j = self._buf.find(CLOSE)
            if j < 0:
                break
            block, self._buf = self._buf[:j], self._buf[j + len(CLOSE):]
            self._inside = False
            parsed = _parse_block(block)
            if parsed is None:  # not a call after all: give the text back as content
                content.append(OPEN + block + CLOSE)
                continue
            call = ToolCall(len(self.calls), *parsed)
            self.calls.append(call)
            new.append(call)
        return "".join(content), new

    def _keep(self, text: str) -> str:
        # Whitespace between and after calls is the format's, not content: held until text follows
        # it (then it is content), dropped when another call or the end follows.
        if not self.calls:
            return text
        if not text.strip():
            self._ws += text
            return ""
        out, self._ws = self._ws + text, ""
        return out

    def flush(self) -> str:
        """At the end of the output: an unfinished block is content, as the model wrote it."""
        rest = (OPEN if self._inside else "") + self._buf
        self._buf, self._inside = "", False
        return self._keep(rest)


def _partial_suffix(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
