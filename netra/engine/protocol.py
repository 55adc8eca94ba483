"""Request validation for `POST /generate` (docs/worker-contract.md): strict types, unknown keys rejected.

Every failure is a `RequestError` whose message names the offending field; the server turns it into
HTTP 400 with SGLang's error shape.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from netra.engine.request import SamplingParams
from netra.engine.sampler import TOP_LOGPROBS_MAX


class RequestError(ValueError):
    pass


Number = StrictFloat | StrictInt


class SamplingParamsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_new_tokens: StrictInt = 128
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    min_p: Number = 0.0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    sampling_seed: StrictInt | None = None
    no_stop_trim: StrictBool = False
    # SGLang 0.5.23's names for penalties, bias and structured output.
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    min_new_tokens: StrictInt = 0
    logit_bias: dict[StrictStr, Number] | None = None
    json_schema: StrictStr | None = None
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None


class GenerateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_ids: list[StrictInt] | None = None
    text: StrictStr | None = None
    sampling_params: SamplingParamsIn = Field(default_factory=SamplingParamsIn)
    stream: StrictBool = False
    rid: StrictStr | None = None
    # SGLang's logprob fields: output-token logprobs only (logprob_start_len -1), up to 20 alternatives.
    return_logprob: StrictBool = False
    top_logprobs_num: StrictInt = 0
    logprob_start_len: StrictInt = -1
    return_text_in_logprobs: StrictBool = False
    # SGLang's: the prompt opened a reasoning block, so a grammar starts after it (--reasoning-parser).
    require_reasoning: StrictBool = False

    def grammar(self) -> tuple[str, str] | None:
        """The one structured-output constraint, as (kind, text), or None."""
        sp = self.sampling_params
        given = [(k, v) for k, v in (("json_schema", sp.json_schema), ("regex", sp.regex), ("ebnf", sp.ebnf))
                 if v is not None]
        if len(given) > 1:
            raise RequestError(f"sampling_params: at most one of json_schema, regex and ebnf, got {[k for k, _ in given]}")
        return given[0] if given else None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"invalid JSON body: {exc}") from exc


def parse_generate(body: bytes) -> GenerateIn:
    data = parse_json(body)
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    if isinstance(data.get("sampling_params"), dict) is False and data.get("sampling_params") is not None:
        raise RequestError("sampling_params must be an object")
    try:
        return GenerateIn.model_validate(data)
    except ValidationError as exc:
        raise RequestError(_describe(exc)) from exc


def check_request(req: GenerateIn, prompt: list[int], vocab_size: int, context_length: int,
                  max_new_tokens_limit: int) -> SamplingParams:
    """Semantic checks once the prompt is known; returns the scheduler's sampling parameters."""
    sp = req.sampling_params
    if not prompt:
        raise RequestError("the prompt is empty")
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(f"input_ids contains {bad}, outside the vocabulary [0, {vocab_size})")
    if len(prompt) >= context_length:
        raise RequestError(f"the prompt has {len(prompt)} tokens; the context length is {context_length}")
    if sp.max_new_tokens < 0:
        raise RequestError(f"sampling_params.max_new_tokens {sp.max_new_tokens} is negative")
    if sp.max_new_tokens > max_new_tokens_limit:
        raise RequestError(f"sampling_params.max_new_tokens {sp.max_new_tokens} exceeds the limit "
                           f"{max_new_tokens_limit}")
    if len(prompt) + sp.max_new_tokens > context_length:
        raise RequestError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({sp.max_new_tokens}) exceeds the "
                           f"context length {context_length}")
    if not 0 <= sp.temperature <= 100:
        raise RequestError(f"sampling_params.temperature {sp.temperature} must be in [0, 100]")
    if not 0 < sp.top_p <= 1:
        raise RequestError(f"sampling_params.top_p {sp.top_p} must be in (0, 1]")
    if sp.top_k == 0 or sp.top_k < -1:
        raise RequestError(f"sampling_params.top_k {sp.top_k} must be -1 or >= 1")
    if not 0 <= sp.min_p <= 1:
        raise RequestError(f"sampling_params.min_p {sp.min_p} must be in [0, 1]")
    stops = tuple(sp.stop_token_ids or ())
    bad = next((t for t in stops if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(f"stop_token_ids contains {bad}, outside the vocabulary")
    if sp.sampling_seed is not None and not -(2**63) <= sp.sampling_seed < 2**63:
        raise RequestError("sampling_params.sampling_seed must fit in 64 bits")
    # SGLang's ranges (SamplingParams.verify): the same request is valid on both engines.
    if not -2 <= sp.frequency_penalty <= 2:
        raise RequestError(f"sampling_params.frequency_penalty {sp.frequency_penalty} must be in [-2, 2]")
    if not -2 <= sp.presence_penalty <= 2:
        raise RequestError(f"sampling_params.presence_penalty {sp.presence_penalty} must be in [-2, 2]")
    if not 0 < sp.repetition_penalty <= 2:
        raise RequestError(f"sampling_params.repetition_penalty {sp.repetition_penalty} must be in (0, 2]")
    if not 0 <= sp.min_new_tokens <= sp.max_new_tokens:
        raise RequestError(f"sampling_params.min_new_tokens {sp.min_new_tokens} must be in [0, max_new_tokens "
                           f"{sp.max_new_tokens}]")
    bias: list[tuple[int, float]] = []
    for key, value in (sp.logit_bias or {}).items():
        if not key.isdigit() or not 0 <= int(key) < vocab_size:
            raise RequestError(f"sampling_params.logit_bias key {key!r} is not a token id in [0, {vocab_size})")
        if not -100 <= value <= 100:
            raise RequestError(f"sampling_params.logit_bias[{key}] = {value} must be in [-100, 100]")
        bias.append((int(key), float(value)))
    if req.logprob_start_len != -1:
        raise RequestError("logprob_start_len other than -1 (prompt logprobs) is not supported by this engine")
    if not 0 <= req.top_logprobs_num <= TOP_LOGPROBS_MAX:
        raise RequestError(f"top_logprobs_num {req.top_logprobs_num} must be in [0, {TOP_LOGPROBS_MAX}]")
    return SamplingParams(max_new_tokens=sp.max_new_tokens, temperature=float(sp.temperature),
                          top_p=float(sp.top_p), top_k=sp.top_k, min_p=float(sp.min_p), ignore_eos=sp.ignore_eos,
                          stop_token_ids=stops, skip_special_tokens=sp.skip_special_tokens,
                          sampling_seed=sp.sampling_seed, no_stop_trim=sp.no_stop_trim,
                          frequency_penalty=float(sp.frequency_penalty), presence_penalty=float(sp.presence_penalty),
                          repetition_penalty=float(sp.repetition_penalty), min_new_tokens=sp.min_new_tokens,
                          logit_bias=tuple(bias), return_logprob=req.return_logprob,
                          top_logprobs_num=req.top_logprobs_num if req.return_logprob else 0)
