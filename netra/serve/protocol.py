"""Pydantic request models for the OpenAI endpoints and the native `/generate` passthrough.

Types are strict: `"16"` is not an integer and `"yes"` is not a boolean (the worker refuses both,
so coercing them here would only move the refusal; issue 24).

Keys fall in three groups, as vLLM and SGLang treat them:

- supported: OpenAI's fields, plus the SGLang/vLLM extensions clients send through ``extra_body``
  (`ignore_eos`, `top_k`, `min_p`, `min_tokens`, `repetition_penalty`, `stop_token_ids`,
  `skip_special_tokens`, `no_stop_trim`, `regex`, `ebnf`, `chat_template_kwargs`...);
- refused by name (`REFUSED`): options that would change the output and that Netra does not
  implement; a client gets a 400 that names the key rather than an answer that ignored it;
- anything else: ignored, with a warning in the log naming the keys.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netra.web.errors import OpenAIError

log = logging.getLogger("netra.serve")
MAX_N = 64
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20
# Top-level keys that would change the output and that Netra does not implement: refused by name.
REFUSED = {
    "suffix": "suffix (fill-in-the-middle) is not supported by this server",
    "functions": "functions is deprecated by OpenAI and not supported; use tools",
    "function_call": "function_call is deprecated by OpenAI and not supported; use tool_choice",
    "audio": "audio output is not supported by this server",
    "prediction": "predicted outputs are not supported by this server",
    "web_search_options": "web search is not supported by this server",
    "guided_grammar": "guided_grammar is not supported; use ebnf (a Lark or GBNF grammar)",
    "guided_choice": "guided_choice is not supported; use regex",
    "structural_tag": "structural_tag is not supported by this server; use ebnf",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Lenient(BaseModel):
    """Top-level request bodies: unknown keys are logged and ignored, `REFUSED` ones refused."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="after")
    def _extra_keys(self) -> _Lenient:
        extra = sorted(self.model_extra or {})
        for key in extra:
            if key in REFUSED:
                raise OpenAIError(400, REFUSED[key], param=key)
        if extra:
            log.warning("%s: ignoring unknown keys %s", type(self).__name__, extra)
        return self


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Lenient):
    """Fields common to both OpenAI endpoints."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    min_tokens: int = Field(0, ge=0)  # vLLM's and SGLang's extension: stop tokens banned until then
    logit_bias: dict[str, float] | None = None
    regex: str | None = None  # SGLang's extensions: constrain the output to a regex ...
    ebnf: str | None = None  # ... or to a Lark / GBNF grammar (llguidance's reading)
    user: str | None = None
    # Accepted for compatibility with OpenAI SDK defaults; they carry no generation semantics here.
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be -1 (disabled) or >= 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must be non-empty")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(t < 0 for t in v):
            raise ValueError("stop_token_ids must be non-negative token IDs")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (v or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys must be token IDs, got {key!r}")
            if not -100 <= value <= 100:
                raise ValueError(f"logit_bias[{key}] = {value} must be in [-100, 100]")
        return v

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def refuse_unsupported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options is only allowed when stream is true", param="stream_options")
        if self.regex is not None and self.ebnf is not None:
            raise OpenAIError(400, "regex and ebnf are exclusive", param="regex")

    def grammar(self) -> tuple[str, str] | None:
        """The structured-output constraint as (worker-contract key, text), or None."""
        if self.regex is not None:
            return "regex", self.regex
        if self.ebnf is not None:
            return "ebnf", self.ebnf
        return None

    def sampling_params(self, max_new_tokens: int | None,
                        defaults: Mapping[str, float | int] | None = None) -> dict[str, Any]:
        """The worker contract's `sampling_params` for this request (SGLang 0.5.23's names); a value the
        request leaves out comes from ``defaults`` (the checkpoint's generation_config.json), as in
        SGLang's OpenAI layer, else the neutral one."""
        params: dict[str, Any] = {}
        d = defaults or {}
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        params["temperature"] = self.temperature if self.temperature is not None else d.get("temperature", 1.0)
        for name in ("top_p", "top_k", "min_p"):
            value = getattr(self, name)
            value = value if value is not None else d.get(name)
            if value is not None:
                params[name] = value
        if self.ignore_eos:
            params["ignore_eos"] = True
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        if self.no_stop_trim:
            params["no_stop_trim"] = True
        params["skip_special_tokens"] = self.skip_special_tokens
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                params[name] = getattr(self, name)
        repetition = self.repetition_penalty if self.repetition_penalty is not None else d.get("repetition_penalty")
        if repetition not in (None, 1.0):
            params["repetition_penalty"] = repetition
        if self.min_tokens:
            params["min_new_tokens"] = self.min_tokens
        if self.logit_bias:
            params["logit_bias"] = dict(self.logit_bias)
        grammar = self.grammar()
        if grammar is not None:
            params[grammar[0]] = grammar[1]
        return params


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's, vLLM's and SGLang's default for completions
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s) as a list: each is a string or a list of token IDs."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise OpenAIError(400, "prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        out: list[str | list[int]] = []
        for item in p:
            if isinstance(item, list) and not item:
                raise OpenAIError(400, "a token-ID prompt must not be empty", param="prompt")
            out.append(item)  # type: ignore[arg-type]
        return out

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo and self.logprobs is not None:
            raise OpenAIError(400, "echo with logprobs (prompt-token logprobs) is not supported by this server",
                              param="echo")
        if self.best_of not in (None, self.n):
            raise OpenAIError(400, "best_of other than n is not supported by this server", param="best_of")
        for item in self.prompts():
            if isinstance(item, list) and any(t < 0 for t in item):
                raise OpenAIError(400, "prompt token IDs must be non-negative", param="prompt")


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Extra keys (name, tool_call_id, ...) are passed to the chat template, which may use them.
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # description, strict: carried, not needed
    name: str = "schema"
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # SGLang's extension: extra variables for the chat template (e.g. enable_thinking).
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    # SGLang's extension: False returns the reasoning inline in content (no reasoning_content).
    separate_reasoning: bool = True

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs and not self.logprobs:
            raise OpenAIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise OpenAIError(400, f"tool_choice {self.tool_choice_name()!r} needs tools", param="tool_choice")
        named = self.named_tool()
        if named is not None and named not in {t.function.name for t in self.tools or []}:
            raise OpenAIError(400, f"tool_choice names {named!r}, which is not among the tools", param="tool_choice")
        constrained = [k for k, on in (("response_format", self.json_schema() is not None),
                                       ("regex", self.regex is not None), ("ebnf", self.ebnf is not None),
                                       ("tool_choice", self.tool_choice == "required" or named is not None)) if on]
        if len(constrained) > 1:
            raise OpenAIError(400, f"at most one output constraint per request, got {constrained}",
                              param=constrained[1])
        rf = self.response_format
        if rf is not None and rf.type == "json_schema" and (rf.json_schema is None or rf.json_schema.schema_ is None):
            raise OpenAIError(400, "response_format json_schema needs json_schema.schema", param="response_format")

    def tool_choice_name(self) -> str:
        tc = self.tool_choice
        return tc.function.name if isinstance(tc, NamedToolChoice) else str(tc)

    def named_tool(self) -> str | None:
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None

    def prompt_tools(self) -> list[dict[str, Any]] | None:
        """The tools the prompt lists: none for ``tool_choice: none``, only the named one for a named
        choice, else all (as the OpenAI dicts a chat template expects)."""
        if not self.tools_active():
            return None
        named = self.named_tool()
        return [t.model_dump(exclude_none=True, by_alias=True) for t in self.tools or []
                if named is None or t.function.name == named]

    def tools_active(self) -> bool:
        """Whether tools go into the prompt and tool calls are parsed out of the output."""
        return bool(self.tools) and self.tool_choice != "none"

    def json_schema(self) -> str | None:
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return '{"type": "object"}'
        assert rf.json_schema is not None
        return json.dumps(rf.json_schema.schema_)

    def grammar(self) -> tuple[str, str] | None:
        schema = self.json_schema()
        if schema is not None:
            return "json_schema", schema
        return super().grammar()


class GenerateRequest(_Strict):
    """The worker contract's `/generate` body, forwarded as it is (token IDs in, token IDs out).

    A batch (a list of prompts, as SGLang takes it) is sent as one upstream request per prompt and
    answered as a list, in order; a batch does not stream."""

    input_ids: list[int] | list[list[int]] | None = None
    text: str | list[str] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    logprob_start_len: int | None = None
    return_text_in_logprobs: bool | None = None

    def check(self) -> None:
        if (self.input_ids is None) == (self.text is None):
            raise OpenAIError(400, "exactly one of input_ids and text is required", param="input_ids")
        ids = self.input_ids or []
        rows = ids if ids and isinstance(ids[0], list) else [ids]
        if any(t < 0 for row in rows for t in row):  # type: ignore[union-attr]
            raise OpenAIError(400, "input_ids must be non-negative token IDs", param="input_ids")
        if self.is_batch() and self.stream:
            raise OpenAIError(400, "a batch /generate (a list of prompts) cannot stream", param="stream")
        if isinstance(self.rid, list) and not self.is_batch():
            raise OpenAIError(400, "rid is a list only for a batch", param="rid")

    def is_batch(self) -> bool:
        return isinstance(self.text, list) or bool(self.input_ids and isinstance(self.input_ids[0], list))

    def split(self) -> list[dict[str, Any]]:
        """One worker body per prompt of a batch."""
        body = self.model_dump(exclude_none=True)
        prompts = body.pop("text", None) or body.pop("input_ids")
        key = "text" if self.text is not None else "input_ids"
        rids = body.pop("rid", None)
        if rids is not None and (not isinstance(rids, list) or len(rids) != len(prompts)):
            raise OpenAIError(400, "rid must be a list as long as the batch", param="rid")
        return [{**body, key: p, **({"rid": rids[i]} if rids else {})} for i, p in enumerate(prompts)]
