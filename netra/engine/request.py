"""A generation request as the scheduler holds it: its sampling parameters, its state, and its outputs.

Torch-free: the server, the protocol parser, the sampler and the benches build and read these without
the scheduler (which owns the request's slot and advances its state).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netra.engine.grammar import Grammar


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    sampling_seed: int | None = None
    no_stop_trim: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), added to the logits
    return_logprob: bool = False
    top_logprobs_num: int = 0


LOGPROB_FLOOR = -9999.0
# One generated token's logprob entry: (logprob, token id), and its top alternatives, best first.
TokenLogprob = tuple[float, int]


@dataclass
class Output:
    rid: str
    new_ids: list[int]  # tokens since the previous emission (a trimmed stop token excluded)
    completion_tokens: int  # every generated token so far, a matched stop token included
    finish_reason: dict[str, Any] | None
    # With return_logprob: entries for the tokens since the previous emission, a matched stop token
    # included (one per completion token, as SGLang counts them).
    logprobs: list[TokenLogprob] = field(default_factory=list)
    top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    # Speculative decoding (SGLang's meta_info names): verify forwards the request rode in so far, and its
    # completion tokens over them (0 where none ran).
    spec_verify_ct: int = 0
    spec_accept_length: float = 0.0


@dataclass(eq=False)  # identity semantics: list membership and removal must not compare fields
class Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    sink: Callable[[Output], None]
    stream: bool = False
    seed: int = 0
    output: list[int] = field(default_factory=list)
    slot: int = -1
    cached: int = 0  # tokens whose KV / state are in the slot
    emitted: int = 0  # output tokens already sent to the sink
    trimmed: bool = False  # last output token is a stop token kept out of the visible output
    finish_reason: dict[str, Any] | None = None
    admitted: float | None = None  # perf_counter when it got a slot
    grammar: Grammar | None = None  # structured output: the request's matcher (host side)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    emitted_logprobs: int = 0
    spec_verify_ct: int = 0  # speculative verify forwards this request rode in
