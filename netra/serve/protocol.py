"""Pydantic request models for the OpenAI endpoints and the native `/generate` passthrough.

Unknown keys are rejected (an OpenAI client gets a 400 naming the key rather than a silently
ignored option). SGLang's extensions that the load generator uses for exact-length runs are
accepted: `ignore_eos`, `top_k`, `min_p`, `stop_token_ids`, `skip_special_tokens`, `seed`,
`no_stop_trim`. Options that would change the output but that the worker contract cannot carry
(penalties, logit bias, logprobs, tools, echo...) are refused with an error that names them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from netra.serve.errors import OpenAIError

MAX_N = 64
MAX_STOP = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Strict):
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
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
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

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def refuse_unsupported(self) -> None:
        """Options the worker contract cannot carry: refuse rather than ignore them."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                raise OpenAIError(400, f"{name} is not supported by this server (the worker contract has no "
                                       "penalties)", param=name)
        if self.repetition_penalty not in (None, 1.0):
            raise OpenAIError(400, "repetition_penalty is not supported by this server", param="repetition_penalty")
        if self.logit_bias:
            raise OpenAIError(400, "logit_bias is not supported by this server", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options is only allowed when stream is true", param="stream_options")

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        """The worker contract's `sampling_params` for this request."""
        params: dict[str, Any] = {}
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        params["temperature"] = 1.0 if self.temperature is None else self.temperature
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if self.top_k is not None:
            params["top_k"] = self.top_k
        if self.min_p is not None:
            params["min_p"] = self.min_p
        if self.ignore_eos:
            params["ignore_eos"] = True
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        if self.no_stop_trim:
            params["no_stop_trim"] = True
        params["skip_special_tokens"] = self.skip_special_tokens
        return params


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

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
        if self.echo:
            raise OpenAIError(400, "echo is not supported by this server", param="echo")
        if self.logprobs is not None:
            raise OpenAIError(400, "logprobs is not supported by this server", param="logprobs")
        if self.best_of not in (None, self.n):
            raise OpenAIError(400, "best_of other than n is not supported by this server", param="best_of")
        if self.suffix:
            raise OpenAIError(400, "suffix is not supported by this server", param="suffix")
        for item in self.prompts():
            if isinstance(item, list) and any(t < 0 for t in item):
                raise OpenAIError(400, "prompt token IDs must be non-negative", param="prompt")


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Extra keys (name, tool_call_id, ...) are passed to the chat template, which may use them.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Strict):
    type: Literal["text"]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # SGLang's extension: extra variables for the chat template (e.g. enable_thinking).
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs:
            raise OpenAIError(400, "logprobs is not supported by this server", param="logprobs")
        if self.tools or self.tool_choice not in (None, "none"):
            raise OpenAIError(400, "tools are not supported by this server", param="tools")


class GenerateRequest(_Strict):
    """The worker contract's `/generate` body, forwarded as it is (token IDs in, token IDs out)."""

    input_ids: list[int] | None = None
    text: str | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    rid: str | None = None

    def check(self) -> None:
        if (self.input_ids is None) == (self.text is None):
            raise OpenAIError(400, "exactly one of input_ids and text is required", param="input_ids")
        if self.input_ids is not None and any(t < 0 for t in self.input_ids):
            raise OpenAIError(400, "input_ids must be non-negative token IDs", param="input_ids")
