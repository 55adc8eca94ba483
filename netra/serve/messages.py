"""Chat messages normalised before the template renders them, as SGLang's and vLLM's OpenAI layers do.

- ``tool_calls[].function.arguments`` sent as a JSON string (the OpenAI wire form) are parsed into an
  object: Qwen3.5/3.6's template iterates them with ``|items``, which needs a mapping. A string that
  is not a JSON object is a 400 naming the message and field.
- ``role: developer`` becomes ``system``: merged into a leading system message (made when there is
  none), since the templates accept a system message only first.
- vLLM's ``reasoning`` key is read as ``reasoning_content`` (the key the templates read).
- A ``tool`` message must carry ``tool_call_id``; an assistant's ``tool_calls`` must be a list of
  ``{"type": "function", "function": {"name": str, "arguments": ...}}``.

For the plain template of the seeded presets (no tool syntax of its own) the calls are written into
the assistant's content as Qwen3's JSON blocks, and the tools' instructions into the system turn.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from netra.serve.tools import call_text, tools_preamble
from netra.web.errors import OpenAIError

if TYPE_CHECKING:
    from netra.serve.protocol import ChatCompletionRequest

# Arguments of the template's render call that a request's chat_template_kwargs may not replace.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                                      "documents", "continue_final_message", "raise_exception", "strftime_now"})


def _bad(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise _bad(f"{where} is not valid JSON ({exc.msg} at character {exc.pos})", where) from exc
    if not isinstance(value, dict):
        raise _bad(f"{where} must be a JSON object (a mapping of parameter names to values), got "
                   f"{type(value).__name__}", where)
    return value


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _bad(f"{where} must be a list", where)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.{j}"
        if not isinstance(call, dict):
            raise _bad(f"{at} must be an object", at)
        if call.get("type", "function") != "function":
            raise _bad(f"{at}.type must be 'function'", f"{at}.type")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{at}.function must be an object with name and arguments", f"{at}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{at}.function.name must be a non-empty string", f"{at}.function.name")
        args = _arguments(fn.get("arguments", {}), f"{at}.function.arguments")
        out.append({**call, "type": "function", "function": {**fn, "name": name, "arguments": args}})
    return out


def normalize(req: ChatCompletionRequest, plain: bool, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them (see the module docstring)."""
    system: list[str] = []
    leading_system = bool(req.messages) and req.messages[0].role == "system"
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        d: dict[str, Any] = {**m.model_dump(exclude_none=True), "content": m.text()}
        where = f"messages.{i}"
        if "reasoning" in d:
            reasoning = d.pop("reasoning")
            d.setdefault("reasoning_content", reasoning)
        if "reasoning_content" in d and not isinstance(d["reasoning_content"], str):
            raise _bad(f"{where}.reasoning_content must be a string", f"{where}.reasoning_content")
        if m.role == "developer" or (m.role == "system" and i == 0):
            system.append(d["content"])
            continue
        if m.role == "tool" and (not isinstance(d.get("tool_call_id"), str) or not d["tool_call_id"]):
            raise _bad(f"{where}: a tool message needs tool_call_id (the id of the call it answers)",
                       f"{where}.tool_call_id")
        if "tool_calls" in d:
            if m.role != "assistant":
                raise _bad(f"{where}: only assistant messages carry tool_calls", f"{where}.tool_calls")
            d["tool_calls"] = _tool_calls(d["tool_calls"], f"{where}.tool_calls")
            if plain:  # the plain template has no call syntax: write the calls as the model would
                calls = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in d.pop("tool_calls")]
                d["content"] = "\n".join(filter(None, [d["content"], *calls]))
        messages.append(d)
    if plain and tools:
        system.append(tools_preamble(tools))
    if system or leading_system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(s for s in system if s)})
    return messages


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """The request's chat_template_kwargs; a key that would replace a render argument is a 400."""
    kwargs = dict(req.chat_template_kwargs or {})
    clash = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if clash:
        raise _bad(f"chat_template_kwargs may not set {clash[0]!r}: the server sets it (reserved: "
                   f"{', '.join(sorted(RESERVED_TEMPLATE_KWARGS))})", f"chat_template_kwargs.{clash[0]}")
    return kwargs
