"""Tool calls in the Qwen3-Coder XML form (netra/serve/tools_xml.py) and the `ToolParser` interface:
whole and streamed parsing at any chunking, the deltas, typing by schema, agreement with SGLang
0.5.23's ``qwen3_coder`` detector on a corpus, and the ``tool_choice`` grammar run by llguidance."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import llguidance
import pytest

from netra.engine.grammar import grammar_text, grammar_tokenizer
from netra.serve.tools import (
    JsonToolParser,
    ToolCallParser,
    ToolParser,
    call_text,
    parser_for,
    required_grammar,
)
from netra.serve.tools_xml import XmlToolParser, typed_value, xml_grammar
from netra.tokenizers import ByteTokenizer

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (ROOT / "models/qwen3_6/chat_template.jinja").read_text()


def fn(name: str, properties: dict[str, Any] | None = None, required: list[str] | None = None,
       **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": properties or {}, **extra}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


KITCHEN = {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"},
    "o": {"type": "object"}, "a": {"type": "array", "items": {"type": "integer"}},
    "u": {"anyOf": [{"type": "string"}, {"type": "integer"}]}, "ni": {"type": ["integer", "null"]},
    "e": {"enum": ["x", "y"]}, "ei": {"enum": [1, 2]}, "nt": {"description": "no type"},
    "i32": {"type": "int32"}, "f": {"type": "float"}, "nul": {"type": "null"}, "any": {"type": "any"},
    "oo": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "ao": {"allOf": [{"type": "object"}]},
    "po": {"properties": {"x": {}}}, "it": {"items": {}}, "città": {"type": "integer"},
}
TOOLS = [
    fn("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, ["city"]),
    fn("kitchen", KITCHEN),
    fn("noparams"),
    {"type": "function", "function": {"name": "union", "parameters": {
        "anyOf": [{"properties": {"x": {"type": "integer"}}}, {"properties": {"y": {"type": "boolean"}}}]}}},
    fn("refs", {"m": {"anyOf": [{"$ref": "#/$defs/M"}, {"type": "null"}]}, "k": {"$ref": "#/$defs/K"}},
       **{"$defs": {"M": {"type": "object", "properties": {"a": {"type": "boolean"}}}, "K": {"type": "integer"}}}),
]


def call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


WEATHER = call("get_weather", ("city", "Paris"), ("days", "2"))
OPEN_W = "<tool_call>\n<function=get_weather>\n"

# Model outputs on which this parser and SGLang's detector (whole and streamed) agree.
AGREE = [
    "Hello there, no tools needed.",
    "Let me check.\n\n" + WEATHER,
    WEATHER + "\n" + call("get_weather", ("city", "Oslo")) + "\n",
    "I'll call two.\n" + call("noparams") + "\n" + call("get_weather", ("city", "Rome"), ("days", "-3")),
    call("kitchen", ("s", "hello"), ("i", "5"), ("n", "5"), ("b", "true"), ("o", '{"k": [1, {"z": null}]}'),
         ("a", "[1, 2]"), ("u", "5"), ("ni", "7"), ("e", "x"), ("ei", "2"), ("nt", "5"), ("i32", "5"),
         ("f", "2"), ("nul", "None"), ("any", "[1]"), ("oo", "3"), ("ao", '{"q": 1}'), ("po", '{"x": 1}'),
         ("it", "[true]"), ("città", "9")),
    call("kitchen", ("s", "  spaced  "), ("i", " 7 "), ("n", "5.0"), ("b", "False"), ("o", "{'k': 1}"),
         ("a", "(1, 2)"), ("ni", "null"), ("f", "1e3"), ("any", "hi"), ("nul", "null")),
    call("kitchen", ("s", "123"), ("i", "abc"), ("n", "-2.5"), ("b", "TRUE"), ("o", "not json"),
         ("i32", "1.5"), ("f", "x"), ("any", "True"), ("s", "NULL")),
    call("kitchen", ("s", "def f():\n    return 1\n\n\nprint(f())"), ("i", "1_000")),
    call("kitchen", ("s", "a < b && c > d <br> </p> <parameter <function"), ("n", "1E5")),
    call("kitchen", ("s", "日本語 ✓ \"quoted\" \\ back"), ("zz", "5"), ("o", '{"é": "ü"}')),
    call("nope", ("x", "1"), ("y", "[1]"), ("z", "null")),
    call("union", ("x", "4"), ("y", "true")),
    call("kitchen", ("s", ""), ("s", "\nx\n")),
    OPEN_W + "<parameter=city>\nParis\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
    OPEN_W + "<parameter=city>Paris</parameter><parameter=days>4</parameter></function></tool_call>",
    "<tool_call>\n\n<function=get_weather>\n\n<parameter=city>\nParis\n</parameter>\n\n\n"
    "</function>\n\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n"
    "<function=noparams>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
]

# Outputs where the two differ on purpose (tools_xml's notes): what this parser gives.
DIFFER: list[tuple[str, str, list[tuple[str, dict[str, Any]]]]] = [
    (WEATHER + "\nDone. 42\n", "\nDone. 42", [("get_weather", {"city": "Paris", "days": 2})]),
    ("Sure.\n" + WEATHER + "\n\nAnd <tool_call>\nnot xml\n</tool_call> ok",
     "Sure.\n\n\nAnd <tool_call>\nnot xml\n</tool_call> ok", [("get_weather", {"city": "Paris", "days": 2})]),
    ("A\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
     "A\n<parameter=city>\nPar", [("get_weather", {})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=da",
     "\n<parameter=da", [("get_weather", {"city": "Paris"})]),
    ("x <tool_call>\n<function=get_wea", "x <tool_call>\n<function=get_wea", []),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', []),
    ("<function=get_weather>\n</function>", "<function=get_weather>\n</function>", []),
    ("<tool_call>\n<function=get\nweather>\n</function>\n</tool_call>",
     "<tool_call>\n<function=get\nweather>\n</function>\n</tool_call>", []),
    (OPEN_W + "I think Paris.\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "\nI think Paris.", [("get_weather", {"city": "Paris"})]),
    (call("kitchen", ("b", "yes"), ("b", " true "), ("n", "nan"), ("n", "12345678901234567890"),
          ("o", "{1, 2}")),
     "", [("kitchen", {"b": True, "n": 12345678901234567890, "o": "{1, 2}"})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>\n" + call("noparams"),
     "", [("get_weather", {"city": "Paris"}), ("noparams", {})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" + call("noparams"),
     "", [("get_weather", {"city": "Paris"}), ("noparams", {})]),
    ("<tool_call>\n<function=get_weather>\n</function>\ntrailing </tool_call>", "\ntrailing </tool_call>",
     [("get_weather", {})]),
    (call("refs", ("m", '{"a": true}'), ("k", "3")), "", [("refs", {"m": {"a": True}, "k": 3})]),
]


def run(parser: ToolParser, chunks: list[str]) -> tuple[str, list[tuple[int, str, str, str]]]:
    """Content and calls (index, name, arguments, id), checking the deltas on the way: one header per
    call (first, in index order) with the call's id, at most one delta per call per push, and the
    argument fragments concatenating to the call's arguments."""
    content, args, ids = "", dict[int, str](), dict[int, str]()
    results = [parser.push(c) for c in chunks] + [parser.flush()]
    for text, deltas in results:
        content += text
        assert len({d["index"] for d in deltas}) == len(deltas)
        for d in deltas:
            i = d["index"]
            if "id" in d:
                assert i not in ids and i == len(ids) and d["type"] == "function"
                ids[i] = d["id"]
                assert set(d["function"]) == {"name", "arguments"}
            else:
                assert i in ids and set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
            args[i] = args.get(i, "") + d["function"]["arguments"]
    calls = [(c.index, c.name, c.arguments, c.id) for c in parser.calls]
    assert [c[0] for c in calls] == list(range(len(calls)))
    assert {c[0]: c[2] for c in calls} == args and {c[0]: c[3] for c in calls} == ids
    return content, calls


def chunkings(text: str, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    out = [[text], list(text)] + [[text[i:i + n] for i in range(0, len(text), n)] for n in (2, 3, 7)]
    for _ in range(3):
        cuts = sorted(rng.sample(range(1, len(text)), min(6, len(text) - 1))) if len(text) > 1 else []
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


def parse(text: str, tools: list[dict[str, Any]] = TOOLS) -> tuple[str, list[tuple[str, Any]]]:
    """Whole and at every chunking (all the same); content and (name, arguments as objects)."""
    whole = run(XmlToolParser(tools), [text])
    for k, chunks in enumerate(chunkings(text, len(text))):
        got = run(XmlToolParser(tools), chunks)
        assert (got[0], [c[:3] for c in got[1]]) == (whole[0], [c[:3] for c in whole[1]]), (k, chunks)
    for _, _, arguments, _ in whole[1]:  # json.dumps' text, unless a parameter came twice
        top = json.loads(arguments, object_pairs_hook=list)
        if len({k for k, _ in top}) == len(top):
            assert json.dumps(json.loads(arguments), ensure_ascii=False) == arguments
    return whole[0], [(name, json.loads(arguments)) for _, name, arguments, _ in whole[1]]


# --- the parser -------------------------------------------------------------------------------


def test_parser_for_picks_the_template_format() -> None:
    assert isinstance(parser_for(TEMPLATE, TOOLS), XmlToolParser)
    assert isinstance(parser_for(None, TOOLS), JsonToolParser)
    qwen3 = "{{ tools | tojson }} <tool_call>{\"name\": ...}</tool_call>"
    assert isinstance(parser_for(qwen3, TOOLS), JsonToolParser)
    assert parser_for(TEMPLATE, TOOLS).grammar(TOOLS, None, False) == xml_grammar(TOOLS, None, False)
    assert parser_for(None, TOOLS).grammar(TOOLS, "noparams", True) == required_grammar(
        TOOLS, "noparams", True)


def test_streams_a_call_parameter_by_parameter() -> None:
    p = XmlToolParser(TOOLS)
    pieces = ("Let me check.\n\n<tool", "_call>\n<function=get_weather>\n<parameter=city>\nPa",
              "ris\n</parameter>\n<parameter=days>\n2\n</par", "ameter>\n</function>\n</tool_call>")
    steps = [p.push(s) for s in pieces]
    steps.append(p.flush())
    (c0, d0), (c1, d1), (c2, d2), (c3, d3), (c4, d4) = steps
    assert (c0, d0) == ("Let me check.\n\n", [])
    assert c1 == "" and d1 == [{"index": 0, "id": p.calls[0].id, "type": "function",
                                "function": {"name": "get_weather", "arguments": ""}}]
    assert (c2, d2) == ("", [{"index": 0, "function": {"arguments": '{"city": "Paris"'}}])
    assert (c3, d3) == ("", [{"index": 0, "function": {"arguments": ', "days": 2}'}}])
    assert (c4, d4) == ("", [])
    assert p.calls[0].arguments == '{"city": "Paris", "days": 2}' and p.calls[0].id.startswith("call_")
    # whole: one delta per call, the header carrying all of its arguments
    q = XmlToolParser(TOOLS)
    content, deltas = q.push(WEATHER + "\n" + call("noparams"))
    assert content == ""
    assert [d["function"]["arguments"] for d in deltas] == ['{"city": "Paris", "days": 2}', "{}"]
    assert [(d["index"], d["function"]["name"]) for d in deltas] == [(0, "get_weather"), (1, "noparams")]
    assert q.flush() == ("", [])


def test_text_that_may_start_a_tag_is_held_back() -> None:
    p = XmlToolParser(TOOLS)
    assert p.push("a <") == ("a ", [])
    assert p.push("b <tool_ca") == ("<b ", [])
    assert p.push("ll>\n") == ("", [])
    assert p.push("<func") == ("", [])
    assert p.push("x>") == ("<tool_call>\n<funcx>", [])
    assert p.flush() == ("", [])
    assert p.calls == []


@pytest.mark.parametrize("text", AGREE)
def test_corpus_whole_equals_streamed(text: str) -> None:
    parse(text)


@pytest.mark.parametrize(("text", "content", "calls"), DIFFER)
def test_where_sglang_differs(text: str, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    assert parse(text) == (content, calls)


def test_values_typed_by_schema() -> None:
    content, calls = parse(AGREE[4])
    assert content == "" and calls == [("kitchen", {
        "s": "hello", "i": 5, "n": 5, "b": True, "o": {"k": [1, {"z": None}]}, "a": [1, 2], "u": "5", "ni": 7,
        "e": "x", "ei": 2, "nt": "5", "i32": 5, "f": 2, "nul": None, "any": [1], "oo": 3, "ao": {"q": 1},
        "po": {"x": 1}, "it": [True], "città": 9})]
    assert parse(AGREE[5])[1] == [("kitchen", {
        "s": "  spaced  ", "i": 7, "n": 5.0, "b": False, "o": {"k": 1}, "a": [1, 2], "ni": None, "f": 1000.0,
        "any": "hi", "nul": None})]
    assert parse(AGREE[6])[1] == [("kitchen", {
        "s": None, "i": "abc", "n": -2.5, "b": True, "o": "not json", "i32": "1.5", "f": "x", "any": True})]
    assert parse(AGREE[10])[1] == [("nope", {"x": "1", "y": "[1]", "z": None})]  # unknown tool: all text
    assert parse(AGREE[9])[1][0][1]["zz"] == "5"  # a parameter outside the schema: text
    assert parse(AGREE[12])[1] == [("kitchen", {"s": "\nx\n"})]  # one newline less at each end; last wins
    text = AGREE[12]
    assert XmlToolParser(TOOLS).push(text)[1][0]["function"]["arguments"] == '{"s": "", "s": "\\nx\\n"}'
    assert typed_value("3", {"type": "number"}) == 3
    assert isinstance(typed_value("3.0", {"type": "number"}), float)
    assert typed_value("inf", {"type": "number"}) == "inf"
    assert typed_value("[1, {2}]", {"type": "array"}) == "[1, {2}]"
    assert typed_value("NaN", {"type": "object"}) == "NaN"
    assert typed_value("b'x'", {"type": "any"}) == "b'x'"


def test_parallel_calls_and_whitespace() -> None:
    text = "Two:\n\n" + WEATHER + "\n\n" + call("noparams") + "\n \n"
    content, calls = parse(text)
    assert content == "Two:\n\n" and [c[0] for c in calls] == ["get_weather", "noparams"]
    p = XmlToolParser(TOOLS)
    out = run(p, list(text))
    assert [c[0] for c in out[1]] == [0, 1]


def test_json_form_parser_interface() -> None:
    text = ("Let me check.\n" + call_text("get_weather", {"city": "Paris"}) + "\n\nB\n"
            + call_text("add", '{"a": 1}') + "\nok.\n")
    whole = run(JsonToolParser(), [text])
    assert whole[0] == "Let me check.\n\n\nB\nok."
    assert [(c[1], c[2]) for c in whole[1]] == [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1}')]
    for chunks in chunkings(text, 1):
        got = run(JsonToolParser(), chunks)
        assert (got[0], [c[:3] for c in got[1]]) == (whole[0], [c[:3] for c in whole[1]])
        p = ToolCallParser()
        parts = [p.push(c) for c in chunks]
        assert "".join(x[0] for x in parts) + p.flush() == whole[0]


# --- agreement with SGLang's detector ---------------------------------------------------------

_SGLANG = r"""
import importlib.util, json, sys, types
try:
    from netra.deploy.sglang import import_shims
    import_shims()
    def stub(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
    if importlib.util.find_spec("IPython") is None:  # sglang.utils' notebook helpers
        stub("IPython"); stub("IPython.display", HTML=object, display=object)
    if importlib.util.find_spec("partial_json_parser") is None:  # the JSON detectors' partial parser
        stub("partial_json_parser", loads=None); stub("partial_json_parser.core")
        stub("partial_json_parser.core.exceptions", MalformedJSON=ValueError)
        allow = type("Allow", (), {"ALL": 0, "STR": 0, "OBJ": 0, "ARR": 0})
        stub("partial_json_parser.core.options", Allow=allow)
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.qwen3_coder_detector import Qwen3CoderDetector
except Exception as exc:
    print(json.dumps({"unavailable": repr(exc)}))
    sys.exit(0)
req = json.load(sys.stdin)
tools = [Tool(**t) for t in req["tools"]]
out = []
for text in req["texts"]:
    whole = Qwen3CoderDetector().detect_and_parse(text, tools)
    d, names, args = Qwen3CoderDetector(), {}, {}
    for ch in text:
        for c in d.parse_streaming_increment(ch, tools).calls:
            names[c.tool_index] = c.name or names.get(c.tool_index)
            args[c.tool_index] = args.get(c.tool_index, "") + c.parameters
    out.append({"content": whole.normal_text, "calls": [[c.name, c.parameters] for c in whole.calls],
                "stream": [[names[i], args[i]] for i in sorted(args)]})
print(json.dumps({"results": out}))
"""


def test_agrees_with_sglang_qwen3_coder_detector() -> None:
    proc = subprocess.run([sys.executable, "-c", _SGLANG], input=json.dumps({"tools": TOOLS, "texts": AGREE}),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if "unavailable" in answer:
        pytest.skip(f"SGLang's detector does not load here: {answer['unavailable']}")
    for text, ref in zip(AGREE, answer["results"], strict=True):
        content, calls = parse(text)
        assert content == ref["content"], text
        assert calls == [(name, json.loads(args)) for name, args in ref["calls"]], text
        if text.count("</function>") == text.count("<function="):  # SGLang's stream closes no other
            assert calls == [(name, json.loads(args)) for name, args in ref["stream"]], text


# --- the grammar ------------------------------------------------------------------------------

GRAMMAR_TOOLS = [
    fn("get_weather", {
        "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "opts": {"type": "object", "properties": {"hourly": {"type": "boolean"}}, "required": ["hourly"],
                 "additionalProperties": False},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}, "ratio": {"type": "number"},
        "exact": {"type": "boolean"}, "note": {"type": ["string", "null"]},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "level": {"enum": [1, 2, 3]},
        "where": {"anyOf": [{"$ref": "#/$defs/place"}, {"type": "null"}]},
    }, ["city"], **{"$defs": {"tag": {"type": "string", "maxLength": 5},
                              "place": {"type": "object", "properties": {"lat": {"type": "number"}},
                                        "required": ["lat"], "additionalProperties": False}}}),
    fn("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
    fn("noparams"),
]
_TOK = grammar_tokenizer(ByteTokenizer(), 264, (257,))


def matcher(grammar: str) -> llguidance.LLMatcher:
    text = grammar_text("ebnf", grammar)
    assert not llguidance.LLMatcher.validate_grammar(text, _TOK)
    m = llguidance.LLMatcher(_TOK, text, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts(grammar: str, text: str) -> bool:
    m = matcher(grammar)
    data = list(text.encode())
    return m.validate_tokens(data) == len(data) and m.consume_tokens(data) and m.is_accepting()


def valid_arguments(params: dict[str, Any], arguments: str) -> bool:
    """Whether ``arguments`` (JSON text) satisfies the ``parameters`` schema (llguidance as validator)."""
    m = llguidance.LLMatcher(_TOK, llguidance.LLMatcher.grammar_from_json_schema(params), log_level=0)
    data = list(arguments.encode())
    return m.validate_tokens(data) == len(data) and m.consume_tokens(data) and m.is_accepting()


GOOD = [
    (call("get_weather", ("city", "Paris")), [("get_weather", {"city": "Paris"})]),
    (call("get_weather", ("city", "a\n</paramete\n<parameter\n\n"), ("days", "-12"), ("unit", "fahrenheit"),
          ("opts", '{"hourly": true}'), ("tags", '["a", "bc"]'), ("ratio", "2.5e-3"), ("exact", "false"),
          ("note", "null"), ("maybe", "null"), ("level", "3"), ("where", '{"lat": -1.5}')),
     [("get_weather", {"city": "a\n</paramete\n<parameter\n\n", "days": -12, "unit": "fahrenheit",
                       "opts": {"hourly": True}, "tags": ["a", "bc"], "ratio": 0.0025, "exact": False,
                       "note": None, "maybe": None, "level": 3, "where": {"lat": -1.5}})]),
    (call("get_weather", ("city", ""), ("ratio", "7"), ("note", "nullish"), ("maybe", "0")),
     [("get_weather", {"city": "", "ratio": 7, "note": "nullish", "maybe": 0})]),
    (call("add", ("a", "1"), ("b", "2")), [("add", {"a": 1, "b": 2})]),
    (call("noparams"), [("noparams", {})]),
]
BAD = [
    call("get_wether", ("city", "Paris")),  # no such tool
    call("get_weather", ("days", "2")),  # city is required
    call("add", ("a", "1")),  # b is required
    call("add", ("a", "one"), ("b", "2")),  # an integer with text
    call("add", ("b", "2"), ("a", "1")),  # out of the schema's order
    call("add", ("a", "1"), ("b", "2"), ("c", "3")),  # not in the schema
    call("add", ("a", "1.5"), ("b", "2")),
    call("get_weather", ("city", "null")),  # read back as null: not a string
    call("get_weather", ("city", "Paris</function>")),
    call("get_weather", ("city", "Paris"), ("unit", "kelvin")),
    call("get_weather", ("city", "Paris"), ("opts", '{"hourly": 1}')),
    call("get_weather", ("city", "Paris"), ("opts", '{ "hourly": true }')),  # not compact
    call("get_weather", ("city", "Paris"), ("exact", "True")),
    call("get_weather", ("city", "Paris"), ("tags", '["toolong"]')),
    call("get_weather", ("city", "Paris"), ("where", '{"lon": 1}')),
    call("get_weather", ("city", "Paris"))[:-1],  # unterminated
    "Sure. " + call("noparams"),  # text before the call
    call("noparams") + "\n",
]


def test_grammar_accepts_well_formed_calls_and_rejects_malformed_ones() -> None:
    g = xml_grammar(GRAMMAR_TOOLS, None, False)
    for text, calls in GOOD:
        assert accepts(g, text), text
        content, got = parse(text, GRAMMAR_TOOLS)
        assert (content, got) == ("", calls)
    for text in BAD:
        assert not accepts(g, text), text
    two = call("noparams") + "\n" + call("add", ("a", "1"), ("b", "2"))
    assert not accepts(g, two) and accepts(xml_grammar(GRAMMAR_TOOLS, None, True), two)
    named = xml_grammar(GRAMMAR_TOOLS, "add", True)
    assert accepts(named, call("add", ("a", "1"), ("b", "2"))) and not accepts(named, call("noparams"))
    with pytest.raises(ValueError, match="no tool named"):
        xml_grammar(GRAMMAR_TOOLS, "missing", False)
    with pytest.raises(ValueError, match="no tool named"):
        required_grammar(GRAMMAR_TOOLS, "missing", False)
    clash = fn("clash", {"t": {"$ref": "#/$defs/tag"}}, **{"$defs": {"tag": {"type": "integer"}}})
    with pytest.raises(ValueError, match="differently"):  # the JSON form's $defs share one root
        required_grammar([*GRAMMAR_TOOLS, clash], None, False)
    assert accepts(xml_grammar([*GRAMMAR_TOOLS, clash], "clash", False), call("clash", ("t", "5")))
    assert not accepts(xml_grammar([*GRAMMAR_TOOLS, clash], "clash", False), call("clash", ("t", "x")))


HINTS = ["\n</parameter>\n", "</function>\n", "</tool_call>", "\n", "<parameter=", "</parameter",
         "</function",
         "<tool_call>", "null", "NULL", "nul", "true", "false", "0", "-12", "3.25", "1e5", "{}", "[]",
         '{"hourly": false}', '["x"]', '"', "a", " ", "é", "<", ">", "日本"]


@pytest.mark.parametrize(("only", "parallel"), [(None, True), ("get_weather", False)])
def test_every_output_the_grammar_accepts_parses_to_valid_calls(only: str | None, parallel: bool) -> None:
    # Random walks through the grammar (a random hint that it takes whole, else a random allowed
    # byte) until it may end; what comes out must parse into calls whose arguments fit the schema.
    g = xml_grammar(GRAMMAR_TOOLS, only, parallel)
    rng = random.Random(7)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in GRAMMAR_TOOLS}
    done = 0
    for _ in range(40):
        m, out = matcher(g), bytearray()
        for _ in range(300):
            if m.is_accepting() and rng.random() < 0.5:
                break
            for h in rng.sample(HINTS, len(HINTS)) if rng.random() < 0.6 else []:
                data = list(h.encode())
                if m.validate_tokens(data) == len(data):
                    break
            else:
                mask = m.compute_bitmask()
                allowed = [t for t in range(256) if mask[t // 8] >> (t % 8) & 1]
                if not allowed:  # only the end
                    break
                data = [rng.choice(allowed)]
            assert m.consume_tokens(data)
            out += bytes(data)
        if not m.is_accepting():
            continue
        done += 1
        content, calls = parse(out.decode(), GRAMMAR_TOOLS)
        assert content == "" and calls and (parallel or len(calls) == 1), out
        for name, args in calls:
            assert only in (None, name)
            # (llguidance's JSON strings take no raw DEL, which RFC 8259 allows: escaped here)
            text = json.dumps(args, ensure_ascii=False).replace("\x7f", "\\u007f")
            assert valid_arguments(schemas[name], text), (out, args)
    assert done >= 20


def test_grammar_allows_the_block_tags_as_the_vocabulary_s_added_tokens() -> None:
    # Qwen3.5/3.6 vocabularies hold <tool_call> and </tool_call> as added tokens (not special to
    # Hugging Face); llguidance reads every added token as special, which a quoted string never matches.
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from netra.tokenizers import bytes_to_unicode

    tok = Tokenizer(models.BPE(vocab={ch: b for b, ch in bytes_to_unicode().items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    tok.add_tokens([AddedToken("<tool_call>", special=False), AddedToken("</tool_call>", special=False)])
    ll = llguidance.LLTokenizer(tok.to_str(), eos_token=256)
    added = {"<|im_end|>", "<tool_call>", "</tool_call>"}

    def takes(grammar: str, text: str) -> bool:
        ids = tok.encode(text).ids
        assert 257 in ids and 258 in ids  # the tags as their tokens
        m = llguidance.LLMatcher(ll, grammar_text("ebnf", grammar), log_level=0)
        assert not m.is_error(), m.get_error()
        return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()

    xml = call("add", ("a", "1"), ("b", "2"))
    assert takes(xml_grammar(GRAMMAR_TOOLS, None, False, added), xml)
    assert not takes(xml_grammar(GRAMMAR_TOOLS, None, False), xml)
    assert parser_for(TEMPLATE, GRAMMAR_TOOLS).grammar(GRAMMAR_TOOLS, None, False, added) == xml_grammar(
        GRAMMAR_TOOLS, None, False, added)
    js = call_text("add", {"a": 1, "b": 2})
    assert takes(required_grammar(GRAMMAR_TOOLS, None, False, added), js)
    assert not takes(required_grammar(GRAMMAR_TOOLS, None, False), js)
    # text the model spells out byte by byte still passes
    assert accepts(xml_grammar(GRAMMAR_TOOLS, None, False, ()), xml)
