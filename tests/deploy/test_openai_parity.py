"""OpenAI API parity through the `openai` SDK against `netra launch --profile local` (2 embedded-engine
workers, tiny preset, CPU, nginx in front): logprobs against a reference log-softmax of each step's
logits, penalties against the reference formula with a fixed seed, json_schema output from the
random model, a tool-call round trip, models, defaults, echo.

The reference for "each step's logits" is the same seeded tiny model built in this process with the
profile's engine options: its scheduler runs the same request and every step's raw logits are
recorded as they reach the sampler. On a CPU the engine's numbers do not depend on the batch a request
shares (docs/engine.md, Determinism), so those are the logits the launched worker sampled from; the
log-softmax, the penalty formula and the seeded pick are then computed here, in float64 / plain Python.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field

from netra.bench import datasets
from netra.engine.engine import Engine, build_engine
from netra.engine.options import EngineOptions
from netra.engine.request import Output, Request, SamplingParams
from netra.ops import sampling
from netra.serve.tokenizer import ChatTemplate
from netra.tokenizers import BYTE_SPECIALS, ByteTokenizer
from tests.deploy.conftest import MODEL, Local, needs_nginx, netra
from tests.reference import penalized

pytestmark = [needs_nginx, pytest.mark.timeout(600)]
EOS = 257


@pytest.fixture(scope="module")
def reference() -> Engine:
    # launcher/local.yaml's engine section
    return build_engine(EngineOptions(preset="tiny", device="cpu", max_running_requests=16, context_length=4096,
                                      chunked_prefill_size=1024, kv_cache_dtype="auto", mamba_ssm_dtype="float32",
                                      seed=0))


def steps(engine: Engine, prompt: list[int], params: SamplingParams, seed: int) -> tuple[list[torch.Tensor], list[int]]:
    """Run one request in-process; every step's raw logits (as the sampler received them) and the tokens."""
    seen: list[torch.Tensor] = []
    real = engine.scheduler.sampler.step

    def spy(logits: torch.Tensor, slots: torch.Tensor, variant: Any) -> Any:
        seen.append(logits[0].clone())
        return real(logits, slots, variant)

    out: list[int] = []

    def sink(o: Output) -> None:
        out.extend(o.new_ids)

    engine.scheduler.sampler.step = spy  # type: ignore[method-assign]
    try:
        engine.scheduler.submit(Request(f"ref-{len(seen)}-{seed}", prompt, params, sink, seed=seed))
        engine.scheduler.run_until_idle()
    finally:
        engine.scheduler.sampler.step = real  # type: ignore[method-assign]
    return seen, out


def chat_prompt(messages: list[dict[str, str]]) -> list[int]:
    return ByteTokenizer().encode(ChatTemplate(None).render(messages))


def token_id(entry: Any) -> int:
    """A chat logprob entry's token id (the byte tokenizer: one byte, or a special token's name)."""
    if entry.token in BYTE_SPECIALS:
        return 256 + BYTE_SPECIALS.index(entry.token)
    assert len(entry.bytes) == 1, entry
    return int(entry.bytes[0])


MESSAGES = [{"role": "user", "content": "Tell me about Netra, briefly."}]


def test_logprobs_agree_with_a_reference_log_softmax_of_each_steps_logits(local: Local, reference: Engine) -> None:
    c = local.client()
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,  # type: ignore[arg-type]
                                  logprobs=True, top_logprobs=20, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 24
    logits, tokens = steps(reference, chat_prompt(MESSAGES),
                           SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True), 0)
    assert [token_id(e) for e in content] == tokens
    worst = 0.0
    for entry, row, tok in zip(content, logits, tokens, strict=True):
        ref = torch.log_softmax(row.double(), -1)
        top = torch.topk(ref, 20)
        assert {token_id(a) for a in entry.top_logprobs} == set(top.indices.tolist())
        for a in entry.top_logprobs:
            worst = max(worst, abs(a.logprob - float(ref[token_id(a)])))
        worst = max(worst, abs(entry.logprob - float(ref[tok])))
        assert [a.logprob for a in entry.top_logprobs] == sorted((a.logprob for a in entry.top_logprobs), reverse=True)
    assert worst < 1e-4, worst
    print(f"logprobs: 24 steps x top-20, max |logprob - reference| = {worst:.2e}")
    # completions (legacy shape) on the same prompt ids: the same numbers
    rc = c.completions.create(model=MODEL, prompt=chat_prompt(MESSAGES), max_tokens=24, temperature=0, logprobs=5,
                              extra_body={"ignore_eos": True})
    assert rc.choices[0].logprobs is not None
    assert rc.choices[0].logprobs.token_logprobs == [e.logprob for e in content]


def test_penalties_change_the_sampled_tokens_exactly_as_the_formula_says(local: Local, reference: Engine) -> None:
    c = local.client()
    kw: dict[str, Any] = dict(model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0.8, seed=11,
                              logprobs=True)
    extra = {"repetition_penalty": 1.5, "min_tokens": 6}
    r = c.chat.completions.create(frequency_penalty=0.9, presence_penalty=0.6, logit_bias={"101": 5.0, "32": -100},
                                  extra_body=extra, **kw)
    got = [token_id(e) for e in r.choices[0].logprobs.content]  # type: ignore[union-attr]
    params = SamplingParams(max_new_tokens=40, temperature=0.8, frequency_penalty=0.9, presence_penalty=0.6,
                            repetition_penalty=1.5, min_new_tokens=6, logit_bias=((101, 5.0), (32, -100.0)),
                            sampling_seed=11)
    logits, _ = steps(reference, chat_prompt(MESSAGES), params, 11)
    history: list[int] = []
    for i, row in enumerate(logits[:len(got)]):
        processed = torch.tensor(penalized(row.tolist(), history, params, EOS), dtype=torch.float32)
        want = int(sampling.sample_ref(processed[None], torch.tensor([0.8]), torch.tensor([-1]), torch.tensor([1.0]),
                                       torch.tensor([0.0]), torch.tensor([11]), torch.tensor([i]))[0])
        assert got[i] == want, f"step {i}: served {got[i]}, formula {want}"
        history.append(want)
    assert 32 not in got and len(got) >= 6
    if r.choices[0].finish_reason == "stop":  # the EOS that ended it was sampled from the formula too
        processed = torch.tensor(penalized(logits[len(got)].tolist(), history, params, EOS), dtype=torch.float32)
        assert int(sampling.sample_ref(processed[None], torch.tensor([0.8]), torch.tensor([-1]), torch.tensor([1.0]),
                                       torch.tensor([0.0]), torch.tensor([11]), torch.tensor([len(got)]))[0]) == EOS
    plain = c.chat.completions.create(**kw)
    assert [token_id(e) for e in plain.choices[0].logprobs.content] != got  # type: ignore[union-attr]
    print(f"penalties: {len(got)} sampled tokens equal the formula's, finish {r.choices[0].finish_reason}")


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item: Literal["apple", "pear", "plum"]
    quantity: int = Field(ge=1, le=50)
    express: bool
    note: str = Field(max_length=8)
    tags: list[Literal["a", "b", "c"]] = Field(max_length=3)


def test_json_schema_output_parses_and_validates_on_50_seeded_requests(local: Local) -> None:
    c = local.client()

    def one(seed: int) -> Order | None:
        r = c.beta.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": f"order {seed}"}],
                                          response_format=Order, seed=seed, temperature=1.0, max_tokens=400)
        return r.choices[0].message.parsed

    with ThreadPoolExecutor(8) as pool:
        parsed = list(pool.map(one, range(50)))
    assert all(isinstance(p, Order) for p in parsed)
    assert len({(p.item, p.quantity, p.note) for p in parsed if p is not None}) > 10  # seeds differ
    print(f"json_schema: 50/50 parsed and validated, {len({p.item for p in parsed if p})} distinct items")


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]


TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {},
                                                                      "additionalProperties": False}}}]


def test_tool_call_round_trip_through_the_sdk(local: Local) -> None:
    c = local.client()
    question: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat.completions.create(model=MODEL, messages=question, tools=TOOLS, parallel_tool_calls=False,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                  seed=5, max_tokens=300)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = Weather.model_validate_json(call.function.arguments)
    # the round trip: the call and its result go back, and the server answers
    follow = [*question, msg.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21, "city": args.city})}]
    r2 = c.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=8, temperature=0)
    assert r2.choices[0].finish_reason in ("length", "stop", "tool_calls") and r2.usage is not None
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens  # type: ignore[union-attr]
    # required, streamed: the deltas assemble into calls whose arguments follow their schema
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in c.chat.completions.create(model=MODEL, messages=question, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, seed=9, max_tokens=400, stream=True):
        for d in chunk.choices[0].delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"name": "", "arguments": ""})
            slot["name"] += (d.function and d.function.name) or ""
            slot["arguments"] += (d.function and d.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert len(calls) == 1 and finish == "tool_calls"
    for slot in calls.values():
        if slot["name"] == "get_weather":
            Weather.model_validate_json(slot["arguments"])
        else:
            assert slot["name"] == "noop" and json.loads(slot["arguments"]) == {}
    print(f"tools: named call {call.function.name}({call.function.arguments}); required stream gave {len(calls)}")


def test_models_retrieve_echo_and_the_default_max_tokens(local: Local) -> None:
    c = local.client()
    card = c.models.retrieve(MODEL)
    assert card.id == MODEL and (card.model_extra or {}).get("max_model_len") == 4096
    text = c.completions.create(model=MODEL, prompt="Netra", max_tokens=4, temperature=0, echo=True).choices[0].text
    assert text.startswith("Netra") and len(text) > len("Netra")
    long = [{"role": "user", "content": "x" * 3950}]
    r = c.chat.completions.create(model=MODEL, messages=long, temperature=0,  # type: ignore[arg-type]
                                  extra_body={"ignore_eos": True})
    assert r.usage is not None and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 4096


def test_an_unknown_model_gets_404_in_openais_shape_through_the_front(local: Local) -> None:
    """Through nginx and the response layer, for every endpoint that names a model: the SDK raises its
    NotFoundError with OpenAI's error body, and the served model still answers afterwards."""
    c = local.client()
    calls = {
        "chat": lambda: c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2),
        "chat stream": lambda: list(c.chat.completions.create(model="nope", stream=True, max_tokens=2,
                                                              messages=[{"role": "user", "content": "hi"}])),
        "completions": lambda: c.completions.create(model="nope", prompt="hi", max_tokens=2),
        "models": lambda: c.models.retrieve("nope"),
    }
    for what, call in calls.items():
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.status_code == 404, what
        body = err.value.body
        assert isinstance(body, dict) and body.get("code") == "model_not_found" and body.get("param") == "model", \
            (what, body)
        assert "nope" in str(body.get("message")), (what, body)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].message is not None and r.usage is not None and r.usage.completion_tokens == 2


def test_bench_serve_request_rate_chat_writes_goodput_and_itl_percentiles(local: Local, tmp_path: Path) -> None:
    worker = local.record()["workers"][0]["engine_url"]
    work = tmp_path / "work"
    out = netra("bench", "serve", "--url", local.url, "--info-url", worker, "--request-rate", "4", "--dataset",
                "random", "--api", "chat", "-R", "8", "-C", "4", "-I", "24", "-O", "8", "--workers", "2",
                "--slo", "ttft_ms=20000,tpot_ms=5000", "--results-dir", str(tmp_path), "--work-dir", str(work),
                "--no-progress", timeout=400)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "exact checks passed" in out.stdout and "goodput" in out.stdout
    [path] = tmp_path.glob("bench-chat-*.json")
    rec = json.loads(path.read_text())
    row = rec["rows"][0]
    for key in ("itl_ms_p50", "itl_ms_p95", "itl_ms_p99", "itl_ms_max", "itl_ms_std", "ttft_ms_std",
                "tpot_ms_p95", "tpot_ms_max", "goodput_req_s", "good_fraction"):
        assert isinstance(row[key], float), key
    assert rec["summary"]["goodput"]["slo"] == {"ttft_ms": 20000.0, "tpot_ms": 5000.0}
    assert rec["load"]["request_rate"] == "4.0" and rec["checks"]["passed"]
    assert "--request-rate 4.0" in rec["command"] and "--api chat" in rec["command"]
    # every request was sent on the Poisson schedule (from the common start), never before it
    recs = [json.loads(line) for f in work.glob("client-*.jsonl") for line in f.read_text().splitlines()]
    recs.sort(key=lambda r: r["idx"])
    start = recs[0]["t_arrive"]
    assert [r["t_arrive"] - start for r in recs] == pytest.approx(datasets.arrivals(8, 4.0, 1.0, 0), abs=1e-6)
    assert all(r["t_start"] >= r["t_arrive"] - 1e-3 for r in recs)
    print(f"bench: goodput {row['goodput_req_s']:.2f} req/s, ITL p95 {row['itl_ms_p95']:.1f} ms, max "
          f"{row['itl_ms_max']:.1f} ms")
