"""Tool calls: the parser per format behind one interface, the prompt and grammar of the JSON form.

Two formats, chosen by what the chat template teaches (`parser_for`):

- Qwen3's (Hermes) JSON form, for Qwen3 templates and for the plain template of the seeded presets
  (which has no tool syntax of its own, so `tools_preamble` writes Qwen3's instructions into it)::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

- the Qwen3-Coder XML form that Qwen3.5/3.6 templates teach (``<function=NAME>`` and
  ``<parameter=NAME>`` elements inside the block; `netra.serve.tools_xml`).

Either way, possibly several blocks in a row. A `ToolParser` turns the output text (whole or
streamed, in any chunking) into content text and OpenAI ``tool_calls`` deltas; text that only might
start a block is held back until it is known. Its `ToolParser.grammar` is the Lark grammar
(llguidance's dialect, the worker contract's ``ebnf``) that makes ``tool_choice`` ``required`` or a
named function binding: the output is one or more blocks of the format whose arguments follow the
tool's parameter schema. `ToolCallParser` and `required_grammar` are the JSON form's parts.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from netra.serve.toolcall import HeldSpace, ToolCall, ToolParser, tag_grammar
from netra.serve.tools_xml import XmlToolParser

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


def required_grammar(tools: list[dict[str, Any]], only: str | None, parallel: bool,
                     added_tokens: Collection[str] = ()) -> str:
    """Lark grammar: one block (or several, with ``parallel``) calling ``only`` or any of ``tools``,
    the arguments following each function's ``parameters`` schema. ``added_tokens``: the strings of
    the vocabulary's added tokens (`tag_grammar`); the default suits a byte-level vocabulary."""
    options = []
    defs: dict[str, dict[str, Any]] = {}  # "#/$defs/..." points at the root: the parameters' go there
    for t in tools:
        fn = t["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        for key in ("$defs", "definitions"):
            for name, sub in (params.get(key) or {}).items():
                if defs.setdefault(key, {}).setdefault(name, sub) != sub:
                    raise ValueError(f"tools define {key}/{name} differently")
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not options:
        raise ValueError(f"no tool named {only!r}" if only is not None else "no tools")
    schema: dict[str, Any] = {**options[0], **defs} if len(options) == 1 else {"anyOf": options, **defs}
    schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    repeat = ' ("\\n" call)*' if parallel else ""
    if not added_tokens:  # the text this function always gave
        return (f"start: call{repeat}\n"
                f'call: "{OPEN}\\n" %json {json.dumps(schema)} "\\n{CLOSE}"\n')
    return (f"start: call{repeat}\n"
            f'call: {tag_grammar(OPEN, added_tokens)} "\\n" %json {json.dumps(schema)} "\\n" '
            f"{tag_grammar(CLOSE, added_tokens)}\n")


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
    """The JSON form: feed output text as it arrives; get back content text and completed tool calls."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._text = HeldSpace()
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
                    content.append(self._text.add(self._buf[:len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                content.append(self._text.add(self._buf[:i]))
                self._text.drop()
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
            self._text.active = True
            new.append(call)
        return "".join(content), new

    def flush(self) -> str:
        """At the end of the output: an unfinished block is content, as the model wrote it."""
        rest = (OPEN if self._inside else "") + self._buf
        self._buf, self._inside = "", False
        out = self._text.add(rest)
        self._text.drop()
        return out


class JsonToolParser(ToolParser):
    """The Qwen3 JSON form behind the `ToolParser` interface: each call's header delta comes when its
    block closes, with the whole arguments text (the block is parsed whole)."""

    def __init__(self) -> None:
        self._p = ToolCallParser()
        self.calls = self._p.calls  # the same list: the inner parser appends to it

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, new = self._p.push(text)
        return content, [c.body(with_index=True) for c in new]

    def flush(self) -> tuple[str, list[dict[str, Any]]]:
        return self._p.flush(), []

    def grammar(self, tools: list[dict[str, Any]], only: str | None, parallel: bool,
                added_tokens: Collection[str] = ()) -> str:
        return required_grammar(tools, only, parallel, added_tokens)


def parser_for(template_source: str | None, tools: list[dict[str, Any]]) -> ToolParser:
    """The parser for the format the chat template teaches: the Qwen3-Coder XML form when its source
    mentions ``<function=`` (Qwen3.5/3.6, Qwen3-Coder), else Qwen3's JSON form (also for the plain
    template, None, which gets `tools_preamble`). ``tools`` (OpenAI dicts) type the XML form's values."""
    if template_source is not None and "<function=" in template_source:

        return XmlToolParser(tools)
    return JsonToolParser()


def _partial_suffix(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
