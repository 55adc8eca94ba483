"""Tool calls in the Qwen3-Coder XML form, the one Qwen3.5/3.6 chat templates teach.

The model calls a tool with a block like

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

(several blocks in a row for parallel calls, after optional text). A value is the text between
``<parameter=NAME>`` and ``</parameter>`` less one newline at each end; the tool's JSON schema says
how to read it (`typed_value`). `XmlToolParser` streams such blocks out as OpenAI ``tool_calls``
deltas, each parameter's ``"name": value`` fragment as soon as its element closes; `xml_grammar` is
the Lark grammar (llguidance) that forces one or more well-formed calls.

SGLang 0.5.23's ``--tool-call-parser qwen3_coder`` (``Qwen3CoderDetector``) is the reference for how
values are typed and where a value ends; tests/serve/test_tools_xml.py compares the two on a corpus.
Where this parser differs, on purpose:

- Its whole and streamed results are the same (SGLang's whole mode drops text after the first call,
  its stream keeps it; here it is content either way), and it commits to a call when the call's
  ``<function=NAME>`` tag closes inside a ``<tool_call>`` block; a ``<function=`` outside a block is
  content, as is a block whose first non-blank text is not a ``<function=NAME>`` tag (SGLang's whole
  mode drops such a block). A name (function or parameter) runs to the ``>`` and holds no newline
  or ``<``, else the tag is text (SGLang takes anything up to the ``>``).
- Text inside a call that is not one of its elements is content (SGLang drops it); the whitespace
  between elements is the format's.
- A call still open at the end of the output (truncated) is closed with the parameters complete so
  far: its header was sent, so it stays a call whose arguments are valid JSON; the unfinished rest
  (``<parameter=x>\\npartial value``) is content. SGLang's stream never closes such a call's JSON.
- A value also ends at ``</tool_call>`` (SGLang: only ``</parameter>``, ``<parameter=`` or
  ``</function>``), and ``</tool_call>``, ``<tool_call>`` or a new ``<function=`` inside an open call
  close it, so a block missing its closing tags does not swallow the next one.
- A boolean that is neither true nor false (any case, blanks around) stays the model's text (SGLang
  turns it into false); a number that is not finite stays text (JSON has no NaN or Infinity); an
  integer-looking number keeps all its digits (SGLang goes through a float); a value that Python's
  ``literal_eval`` reads into something JSON cannot hold (a set, bytes) stays text (SGLang fails
  the whole parse).
- A parameter's local ``$ref`` is followed (`param_schemas`): SGLang reads a referenced object as a
  string or a Python literal.

As SGLang does, a call naming a function that is not among the tools is still a call (its values
are strings, the client decides), a parameter not in the schema stays a string, ``null`` (any case)
is JSON null whatever the type, and a parameter written twice is written twice in the arguments
(JSON readers keep the last, as SGLang's whole mode does).
"""

from __future__ import annotations

import ast
import json
import math
import uuid
import warnings
from collections.abc import Collection
from typing import Any

from netra.serve.toolcall import HeldSpace, ToolCall, ToolParser, tag_grammar

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
FN_OPEN, FN_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
# Where a value ends: its closing tag, or (a closing tag missing) the next element or block end.
VALUE_ENDS = (PARAM_CLOSE, PARAM_OPEN, FN_CLOSE, TOOL_CLOSE)
_LONGEST_END = max(len(t) for t in VALUE_ENDS)
# The tags that mean something inside a call; any other "<" there is text.
_CALL_TAGS = (PARAM_OPEN, FN_CLOSE, TOOL_CLOSE, FN_OPEN, TOOL_OPEN)

_OUT, _OPENED, _CALL, _AFTER = "out", "opened", "call", "after"
_WAIT = object()  # a tag's name is not complete yet

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float")
_BOOLEAN_TYPES = ("boolean", "bool", "binary")
_JSON_TYPES = ("object", "array", "arr")
_JSON_PREFIXES = ("dict", "list")


# --- value typing -----------------------------------------------------------------------------


def schema_properties(schema: Any) -> dict[str, Any]:
    """The top-level ``properties`` of a ``parameters`` schema, merged from its ``anyOf`` / ``oneOf`` /
    ``allOf`` branches when it declares none itself (first branch wins), as SGLang reads them."""
    if not isinstance(schema, dict):
        return {}
    props = schema.get("properties")
    if isinstance(props, dict):
        return props
    merged: dict[str, Any] = {}
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                for name, sub in schema_properties(branch).items():
                    merged.setdefault(name, sub)
    return merged


def _deref(schema: Any, root: Any) -> Any:
    for _ in range(8):  # a chain of references, not a cycle
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            break
        node = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return schema
            node = node[part]
        schema = node
    return schema


def param_schemas(parameters: Any) -> dict[str, Any]:
    """Each parameter's schema (`schema_properties`), a local ``$ref`` (``#/$defs/...``) resolved at
    its top and in its ``anyOf`` / ``oneOf`` / ``allOf`` branches, so that an object behind a
    reference (pydantic writes ``Optional[Model]`` as ``anyOf: [{$ref}, {type: null}]``) reads as an
    object. SGLang's detector resolves none and reads such a value as a string or a Python literal."""
    out = {}
    for name, sub in schema_properties(parameters).items():
        sub = _deref(sub, parameters)
        if isinstance(sub, dict):
            sub = {**sub, **{key: [_deref(b, parameters) for b in sub[key]]
                             for key in ("anyOf", "oneOf", "allOf") if isinstance(sub.get(key), list)}}
        out[name] = sub
    return out


def schema_type(schema: Any) -> str | None:
    """The one type a parameter's value is read as (SGLang's ``infer_type_from_json_schema``): the
    ``type`` (the first non-null one of a list), else the common type of ``anyOf`` / ``oneOf``
    branches (a nullable one's other type; mixed ones read as string), else the type of the ``enum``
    values (mixed: string), else the first non-string ``allOf`` branch type, else object for
    ``properties`` and array for ``items``; None when nothing says."""
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return t
    if isinstance(t, list) and t:
        rest = [x for x in t if x != "null"]
        return str(rest[0]) if rest else "string"
    branches = schema.get("anyOf") or schema.get("oneOf")
    if ("anyOf" in schema or "oneOf" in schema) and isinstance(branches, list):
        types = [x for x in (schema_type(b) for b in branches) if x]
        if types:
            distinct = set(types)
            if len(distinct) == 1:
                return types[0]
            if len(distinct) == 2 and "null" in distinct:
                return next(x for x in types if x != "null")
            return "string" if "string" in distinct else types[0]
    enum = schema.get("enum")
    if isinstance(enum, list):
        kinds = {_json_kind(v) for v in enum}
        return kinds.pop() if len(kinds) == 1 else "string"
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        for b in all_of:
            bt = schema_type(b)
            if bt and bt != "string":
                return bt
        return "string"
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def _json_kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "string"


def value_kind(schema: Any) -> str:
    """How a value of this schema is read: ``string``, ``integer``, ``number``, ``boolean``, ``json``
    (object or array: JSON, else a Python literal) or ``literal`` (anything else, ``null`` included:
    a Python literal). Type names are matched as SGLang's detector matches them (``int32``, ``float``,
    ``dict[...]``, ``varchar`` ...); no type at all reads as string."""
    t = schema_type(schema)
    name = "string" if t is None else str(t).strip().lower()
    if name in _STRING_TYPES:
        return "string"
    if name.startswith(_INTEGER_PREFIXES):
        return "integer"
    if name.startswith(_NUMBER_PREFIXES):
        return "number"
    if name in _BOOLEAN_TYPES:
        return "boolean"
    if name in _JSON_TYPES or name.startswith(_JSON_PREFIXES):
        return "json"
    return "literal"


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _literal(text: str) -> Any:
    # Invalid escapes ("\d") only warn and keep the backslash: the value is right, the warning noise.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.literal_eval(text)


def typed_value(text: str, schema: Any | None) -> Any:
    """A parameter's value from its text: ``schema`` is the parameter's JSON schema, None when the
    parameter is not in the tool's ``properties`` (then the text stays a string). ``null`` in any case
    is null whatever the type. A value that does not read as its type stays the text."""
    if text.lower() == "null":
        return None
    if schema is None:
        return text
    kind = value_kind(schema)
    if kind == "string":
        return text
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return text
    if kind == "number":
        try:
            f = float(text)
        except ValueError:
            return text
        if not math.isfinite(f):
            return text
        if "." not in text and "e" not in text.lower() and f.is_integer():
            try:
                return int(text)  # all the digits, not the float's
            except ValueError:
                return int(f)
        return f
    if kind == "boolean":
        word = text.strip().lower()
        return word == "true" if word in ("true", "false") else text
    if kind == "json":
        try:
            v = json.loads(text)
        except (ValueError, RecursionError):
            pass
        else:
            if _jsonable(v):
                return v
    try:
        v = _literal(text)
    except Exception:  # literal_eval raises whatever the parser raises (SyntaxError, ValueError, ...)
        return text
    return v if _jsonable(v) else text


# --- the parser -------------------------------------------------------------------------------


def _partial_suffix(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _tag_name(buf: str, start: int) -> tuple[str, int] | object | None:
    """The name of the tag whose name starts at ``buf[start]``, up to ``>``: (name, index after ``>``),
    `_WAIT` while no ``>`` came yet, None when it is no name (empty, or a newline or ``<`` first)."""
    end = buf.find(">", start)
    stop = len(buf) if end < 0 else end
    if "\n" in buf[start:stop] or "<" in buf[start:stop]:
        return None
    if end < 0:
        return _WAIT
    return (buf[start:end], end + 1) if end > start else None


class _Open:
    """The call being streamed: its header is sent, its parameters are sent as they complete."""

    def __init__(self, index: int, name: str, props: dict[str, Any]) -> None:
        self.index = index
        self.name = name
        self.props = props
        self.id = f"call_{uuid.uuid4().hex[:24]}"
        self.arguments = ""


class XmlToolParser(ToolParser):
    """The Qwen3-Coder XML form behind the `ToolParser` interface.

    States: outside a block; after ``<tool_call>`` (waiting for ``<function=NAME>``); inside a call;
    after ``</function>`` (waiting for ``</tool_call>`` or another ``<function=`` of the same block).
    A call is committed (its header delta sent) when its ``<function=NAME>`` tag closes; each
    parameter is sent when its value ends, as ``{"name": value`` (the first) or ``, "name": value``;
    ``}`` (``{}`` for no parameters) closes it at ``</function>``. Anything that is not the format
    goes back to content as written (see the module's notes for the cases)."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.calls: list[ToolCall] = []
        self._props: dict[str, dict[str, Any]] = {}
        for t in tools:
            fn = t.get("function") or {}
            if isinstance(fn.get("name"), str) and fn["name"] not in self._props:
                self._props[fn["name"]] = param_schemas(fn.get("parameters"))
        self._buf = ""
        self._state = _OUT
        self._text = HeldSpace()
        self._open: _Open | None = None
        # While a value waits for its end, the text comes in pieces (joined when an end came: one
        # copy of a long value, not one per push) and only the new text is searched, with the
        # last few characters before it (where an end may begin).
        self._parts: list[str] | None = None
        self._tail = ""

    def grammar(self, tools: list[dict[str, Any]], only: str | None, parallel: bool,
                added_tokens: Collection[str] = ()) -> str:
        return xml_grammar(tools, only, parallel, added_tokens)

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self._parts is not None:
            window = self._tail + text
            self._parts.append(text)
            if not any(t in window for t in VALUE_ENDS):
                self._tail = window[-(_LONGEST_END - 1):]
                return "", []
            self._buf, self._parts = "".join(self._parts), None
        else:
            self._buf += text
        content: list[str] = []
        deltas: list[dict[str, Any]] = []
        while self._step(content, deltas):
            pass
        return "".join(content), _merge(deltas)

    def flush(self) -> tuple[str, list[dict[str, Any]]]:
        """End of output: a block not yet committed to a call is content as written; an open call is
        closed with the parameters complete so far, its unfinished rest content."""
        content: list[str] = []
        deltas: list[dict[str, Any]] = []
        if self._parts is not None:
            self._buf, self._parts = "".join(self._parts), None
        rest = (TOOL_OPEN if self._state == _OPENED else "") + self._buf
        content.append(self._text.add(rest))
        if self._state == _CALL:
            self._close(deltas)
        self._text.drop()
        self._buf, self._state = "", _OUT
        return "".join(content), _merge(deltas)

    # One step of progress from the current state; False when more text is needed to go on.
    def _step(self, content: list[str], deltas: list[dict[str, Any]]) -> bool:
        buf = self._buf
        if not buf:
            return False
        if self._state == _OUT:
            i = buf.find(TOOL_OPEN)
            if i < 0:
                k = len(buf) - _partial_suffix(buf, TOOL_OPEN)
                content.append(self._text.add(buf[:k]))
                self._buf = buf[k:]
                return False
            content.append(self._text.add(buf[:i]))  # whitespace before it stays held
            self._buf = buf[i + len(TOOL_OPEN):]
            self._state = _OPENED
            return True
        if self._state in (_OPENED, _AFTER):
            rest = buf.lstrip()
            if not rest:
                return False
            if rest.startswith(FN_OPEN):
                name = _tag_name(rest, len(FN_OPEN))
                if name is _WAIT:
                    return False
                if isinstance(name, tuple):
                    self._commit(name[0], deltas)
                    self._buf = rest[name[1]:]
                    return True
            elif self._state == _AFTER and rest.startswith(TOOL_CLOSE):
                self._buf = rest[len(TOOL_CLOSE):]
                self._state = _OUT
                return True
            elif FN_OPEN.startswith(rest) or (self._state == _AFTER and TOOL_CLOSE.startswith(rest)):
                return False
            # Not the format: an unconfirmed block is text as written; after a call's </function>,
            # the block ended without its </tool_call>.
            if self._state == _OPENED:
                content.append(self._text.add(TOOL_OPEN))
            self._state = _OUT
            return True
        return self._step_call(content, deltas)

    def _step_call(self, content: list[str], deltas: list[dict[str, Any]]) -> bool:
        buf = self._buf
        p = buf.find("<")
        if p < 0:
            content.append(self._text.add(buf))
            self._buf = ""
            return False
        if p > 0:
            content.append(self._text.add(buf[:p]))
            self._buf = buf = buf[p:]
        if buf.startswith(PARAM_OPEN):
            name = _tag_name(buf, len(PARAM_OPEN))
            if name is _WAIT:
                return False
            if isinstance(name, tuple):
                self._text.drop()  # an element: the whitespace before it is the format's
                return self._value(name[0], name[1], deltas)
        elif buf.startswith(FN_OPEN):
            name = _tag_name(buf, len(FN_OPEN))
            if name is _WAIT:
                return False
            if isinstance(name, tuple):  # the previous call's </function> is missing
                self._close(deltas)
                self._commit(name[0], deltas)
                self._buf = buf[name[1]:]
                return True
        elif buf.startswith((FN_CLOSE, TOOL_CLOSE, TOOL_OPEN)):
            self._close(deltas)
            if buf.startswith(FN_CLOSE):
                self._buf, self._state = buf[len(FN_CLOSE):], _AFTER
            elif buf.startswith(TOOL_CLOSE):
                self._buf, self._state = buf[len(TOOL_CLOSE):], _OUT
            else:
                self._buf, self._state = buf[len(TOOL_OPEN):], _OPENED
            return True
        elif any(tag.startswith(buf) for tag in _CALL_TAGS):
            return False
        content.append(self._text.add("<"))  # a "<" that starts no tag is text
        self._buf = buf[1:]
        return True

    def _value(self, name: str, start: int, deltas: list[dict[str, Any]]) -> bool:
        buf = self._buf
        ends = [(i, t) for t in VALUE_ENDS if (i := buf.find(t, start)) >= 0]
        if not ends:
            self._parts, self._tail = [buf], buf[-(_LONGEST_END - 1):]
            return False
        end, tag = min(ends)
        value = buf[start:end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        call = self._open
        assert call is not None
        typed = typed_value(value, call.props.get(name))
        pair = f"{json.dumps(name, ensure_ascii=False)}: {json.dumps(typed, ensure_ascii=False)}"
        self._send(call, (", " if call.arguments else "{") + pair, deltas)
        self._buf = buf[end + (len(PARAM_CLOSE) if tag == PARAM_CLOSE else 0):]
        return True

    def _commit(self, name: str, deltas: list[dict[str, Any]]) -> None:
        self._text.drop()  # the whitespace before the block is the format's
        self._text.active = True
        call = _Open(len(self.calls), name, self._props.get(name, {}))
        self._open, self._state = call, _CALL
        deltas.append({"index": call.index, "id": call.id, "type": "function",
                       "function": {"name": name, "arguments": ""}})

    def _close(self, deltas: list[dict[str, Any]]) -> None:
        call = self._open
        assert call is not None
        self._text.drop()
        self._send(call, "}" if call.arguments else "{}", deltas)
        self.calls.append(ToolCall(call.index, call.name, call.arguments, call.id))
        self._open = None

    @staticmethod
    def _send(call: _Open, fragment: str, deltas: list[dict[str, Any]]) -> None:
        call.arguments += fragment
        deltas.append({"index": call.index, "function": {"arguments": fragment}})


def _merge(deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One delta per call: a call's later fragments join the first delta of this push (so a header
    carries the arguments already known)."""
    out: list[dict[str, Any]] = []
    for d in deltas:
        if out and out[-1]["index"] == d["index"]:
            out[-1]["function"]["arguments"] += d["function"]["arguments"]
        else:
            out.append(d)
    return out


# --- the grammar ------------------------------------------------------------------------------

# A string value, as one lexeme with its closing "\n</parameter>" (the lexeme then has one end: a
# lexer that ended the text at the first byte that cannot go on would have eaten "\n</parameter"):
# any text that holds none of the tags a value ends at, so that the parser reads back exactly it.
_GRAMMAR_TERMINALS = r"""
STR_TEXT: /(?s:.*)/ & ~/(?s:.*)(<\/parameter>|<parameter=|<\/function>|<\/tool_call>)(?s:.*)/
STR_ITEM: STR_TEXT "\n</parameter>"
STR_NOT_NULL: STR_TEXT & ~/[nN][uU][lL][lL]/
STR_NOT_NULL_ITEM: STR_NOT_NULL "\n</parameter>"
INT_VALUE: /-?(0|[1-9][0-9]{0,99})/
NUM_VALUE: /-?(0|[1-9][0-9]{0,99})(\.[0-9]+)?([eE][+-]?[0-9]{1,2})?/
"""
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NL = "\n"
_CHOICE_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "number": (int, float),
                                                    "boolean": bool}
_CLOSE = NL + PARAM_CLOSE + NL


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _nullable(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    t = schema.get("type")
    if t == "null" or (isinstance(t, list) and "null" in t):
        return True
    branches = [b for key in ("anyOf", "oneOf") if isinstance(schema.get(key), list) for b in schema[key]]
    if any(_nullable(b) for b in branches):
        return True
    enum = schema.get("enum")
    return (isinstance(enum, list) and None in enum) or ("const" in schema and schema["const"] is None)


def _choices(schema: dict[str, Any], kind: str) -> list[Any] | None:
    """The allowed values of an ``enum`` / ``const`` schema, those of the kind's type only."""
    values = schema["enum"] if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if values is None:
        return None
    want = _CHOICE_TYPES[kind]
    return [v for v in values if isinstance(v, want) and (kind == "boolean" or not isinstance(v, bool))]


def _json_schema(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    sub = dict(schema)
    t = sub.get("type")
    if isinstance(t, str) and t not in ("object", "array"):  # SGLang's aliases: dict..., list..., arr
        sub["type"] = "object" if t.strip().lower().startswith(("dict", "object")) else "array"
    sub.update(defs)
    sub["x-guidance"] = _JSON_OPTIONS
    return sub


def _param_body(schema: Any, defs: dict[str, Any]) -> str:
    """The grammar of one parameter's value with its closing tag, by how the parser reads it, so
    that every value the grammar lets through is read back as the schema's type."""
    kind = value_kind(schema)
    sch: dict[str, Any] = schema if isinstance(schema, dict) else {}
    null = _nullable(sch)
    if kind in ("string", "integer", "number", "boolean"):
        choices = _choices(sch, kind)
        if choices:
            words = [json.dumps(v) if kind != "string" else v for v in choices]
            if kind == "string":  # raw text: none that the parser would read otherwise
                words = [w for w in words if not any(t in w for t in VALUE_ENDS) and w.lower() != "null"]
            if words:
                alts = [_lit(w) for w in dict.fromkeys(words)] + (['"null"'] if null else [])
                return f"({' | '.join(alts)}) {_lit(_CLOSE)}"
    if kind == "string":
        return f"{'STR_ITEM' if null else 'STR_NOT_NULL_ITEM'} {_lit(NL)}"
    alts = []
    if kind == "integer":
        alts = ["INT_VALUE"]
    elif kind == "number":
        alts = ["NUM_VALUE"]
    elif kind == "boolean":
        alts = ['"true"', '"false"']
    elif kind == "json":
        alts = [f"%json {json.dumps(_json_schema(sch, defs), ensure_ascii=False)}"]
    elif schema_type(sch) == "null":
        alts = ['"null"']
    else:  # a type the parser reads as a Python literal, or else as the text itself
        return f"STR_ITEM {_lit(NL)}"
    if null and kind != "json":
        alts.append('"null"')
    return f"({' | '.join(alts)}) {_lit(_CLOSE)}"


def xml_grammar(tools: list[dict[str, Any]], only: str | None, parallel: bool,
                added_tokens: Collection[str] = ()) -> str:
    """Lark grammar (llguidance): one call (or several, with ``parallel``, newline-separated as the
    template writes them) of ``only`` or any of ``tools``, in the XML form exactly as the chat template
    renders a call. Parameters come in the schema's ``properties`` order, the ``required`` ones
    mandatory and the others optional, none outside ``properties``; each value as `_param_body`
    reads it: a string is any text holding none of the tags a value ends at (nor ``null``, unless
    the schema allows null), integer/number/boolean their JSON literal (numbers up to 100 integer
    digits and two exponent digits, so that they stay finite), an ``enum`` / ``const`` its values,
    an object or array ``%json`` of its schema (compact, with the parameters' ``$defs``).
    ``added_tokens``: the strings of the vocabulary's added tokens (`tag_grammar`: Qwen3.5/3.6's
    ``<tool_call>`` and ``</tool_call>`` are; a byte-level vocabulary has none)."""
    rules: list[str] = []
    fns: list[str] = []
    for k, t in enumerate(tools):
        fn = t["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
        defs = {key: params[key] for key in ("$defs", "definitions") if key in params}
        required = set(params.get("required") or [])
        parts = []
        for m, (pname, pschema) in enumerate(param_schemas(params).items()):
            rules.append(f"p_{k}_{m}: {_lit(PARAM_OPEN + pname + '>' + NL)} {_param_body(pschema, defs)}")
            parts.append(f"p_{k}_{m}" if pname in required else f"p_{k}_{m}?")
        head = _lit(FN_OPEN + fn["name"] + ">" + NL)
        rules.append(f"fn_{k}: {head} {' '.join(parts)} {_lit(FN_CLOSE + NL)}")
        fns.append(f"fn_{k}")
    if not fns:
        raise ValueError(f"no tool named {only!r}" if only is not None else "no tools")
    repeat = ' ("\\n" call)*' if parallel else ""
    open_tag, close_tag = tag_grammar(TOOL_OPEN, added_tokens), tag_grammar(TOOL_CLOSE, added_tokens)
    top = [f"start: call{repeat}", f"call: {open_tag} {_lit(NL)} ({' | '.join(fns)}) {close_tag}"]
    return NL.join(top + rules) + NL + _GRAMMAR_TERMINALS
