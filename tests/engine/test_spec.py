"""Speculative decoding on the CPU (tiny preset): exact under greedy, against plain decoding of the same engine.

The replay oracle (`OracleDrafter`) proposes the recorded non-speculative greedy output with an error at a
scheduled position, so every verify's acceptance is known in advance: the tests sweep every rejection position
and full acceptance at each T, EOS / stop ids / max_tokens inside a block, aborts and failures in the middle of a
step, T = 1 rows (logprobs, grammar) in the same batch, and slots reused by later requests, and check the
output, the finish, the per-request accounting and the acceptance counters against the schedule.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from netra.engine.engine import Engine, build_engine
from netra.engine.grammar import Grammar, grammar_tokenizer
from netra.engine.options import EngineOptions
from netra.engine.request import Request, SamplingParams
from netra.engine.spec.oracle import OracleDrafter, Schedule
from netra.engine.spec.step import SpecStep
from netra.tokenizers import ByteTokenizer
from tests.engine.test_scheduler import Collector

GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
PROMPTS = [[(i * 31 + j * 7) % 256 for j in range(5 + 3 * i)] for i in range(5)]
Job = tuple[str, list[int], SamplingParams]


class Run(Collector):
    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine


def _engine(**kw: object) -> Engine:
    return build_engine(EngineOptions(**{"context_length": 256, "max_running_requests": 3, **kw}))  # type: ignore[arg-type]


def _run(jobs: list[Job], spec: tuple[int, Schedule, dict[str, list[int]]] | None = None, stream: bool = False,
         grammars: dict[str, Grammar] | None = None, **kw: object) -> Run:
    """``jobs`` through one engine (three slots: later requests reuse earlier ones' slots); ``spec``: (T,
    schedule, recording) speculates with the replay oracle."""
    e = _engine(**kw)
    if spec is not None:
        t, schedule, recorded = spec
        e.scheduler.speculate(SpecStep(e.scheduler.runner, OracleDrafter(recorded, schedule, e.config.vocab_size), t))
    run = Run(e)
    for i, (rid, prompt, params) in enumerate(jobs):
        e.scheduler.submit(Request(rid, prompt, params, run.sink, stream=stream, seed=100 + i,
                                   grammar=(grammars or {}).get(rid)))
    e.scheduler.run_until_idle()
    assert e.pools.free_slots == 3 and not e.scheduler.by_rid
    return run


@pytest.fixture(scope="module")
def plain() -> Run:
    """Plain greedy decoding of the five prompts: the recording and the reference."""
    return _run([(f"r{i}", p, GREEDY) for i, p in enumerate(PROMPTS)])


def _simulate(schedule: Schedule, rid: str, t: int, max_new: int) -> tuple[int, list[int]]:
    """Verifies of a request of ``max_new`` greedy tokens under ``schedule`` (the first token is the prefill's),
    and the drafts committed at each."""
    n, k, accepted = 1, 0, []
    while n < max_new:
        count = min(schedule(rid, k) + 1, t, max_new - n)
        accepted.append(count - 1)
        n, k = n + count, k + 1
    return k, accepted


@pytest.mark.parametrize("t", [2, 4, 8, 12, 16])
def test_greedy_output_is_exact_for_every_rejection_position(plain: Run, t: int) -> None:
    """Five requests through three slots, each verify rejecting at a scheduled position (0..T-2) or accepting all
    T-1 drafts, the positions spread over the requests so that all T outcomes occur: the output equals plain
    decoding bitwise, the verify count and the per-position acceptance counters equal the schedule's, and each
    request reports completion tokens / verifies as its accept length."""
    def schedule(rid: str, k: int) -> int:
        return (int(rid[1:]) * 3 + k * 5) % t

    n = 24 if t <= 8 else 40  # enough verifies for the schedule to reach every position
    rec = {rid: plain.ids(rid)[:n] for rid in plain.events}
    run = _run([(f"r{i}", p, replace(GREEDY, max_new_tokens=n)) for i, p in enumerate(PROMPTS)], (t, schedule, rec))
    per_pos: dict[int, int] = {}
    seen: set[int] = set()
    for rid in rec:
        assert run.ids(rid) == rec[rid], rid
        final = run.final(rid)
        assert final.finish_reason == {"type": "length", "length": n} and final.completion_tokens == n
        verifies, accepted = _simulate(schedule, rid, t, n)
        assert final.spec_verify_ct == verifies, rid
        assert final.spec_accept_length == n / verifies
        seen |= {schedule(rid, k) for k in range(verifies)}
        for a in accepted:
            for i in range(a):
                per_pos[i] = per_pos.get(i, 0) + 1
    assert seen == set(range(t)), "the schedule must cover every rejection position and full acceptance"
    st = run.engine.scheduler.stats
    assert st.accepted_per_pos == per_pos and st.accepted_tokens == sum(per_pos.values())
    assert st.verify_steps > 0 and st.drafts == sum(_simulate(schedule, r, t, n)[0] for r in rec)


def test_stop_ids_and_max_tokens_cut_inside_a_block(plain: Run) -> None:
    """A stop id and max_new_tokens falling inside blocks of T = 8 (full acceptance: a block commits 8 tokens):
    outputs, finish reasons, trimmed stop tokens and completion counts equal plain decoding's; streams carry the
    same tokens in fewer events."""
    rec = {rid: plain.ids(rid) for rid in plain.events}
    r0 = rec["r0"]
    stop = r0[13]
    first = r0.index(stop)
    assert 8 < first < 17, "the stop token must fall inside the second block"
    jobs = [("stop", PROMPTS[0], replace(GREEDY, stop_token_ids=(stop,))),
            ("keep", PROMPTS[0], replace(GREEDY, stop_token_ids=(stop,), no_stop_trim=True)),
            ("max", PROMPTS[2], replace(GREEDY, max_new_tokens=13)),
            ("one", PROMPTS[3], replace(GREEDY, max_new_tokens=2))]
    recorded = {"stop": r0, "keep": r0, "max": rec["r2"], "one": rec["r3"]}
    base, spec = (_run(jobs, s, stream=True) for s in (None, (8, lambda rid, k: 7, recorded)))
    for run in (base, spec):
        assert run.final("stop").finish_reason == {"type": "stop", "matched": stop}
        assert run.ids("stop") == r0[:first] and run.final("stop").completion_tokens == first + 1
        assert run.ids("keep") == r0[:first + 1]
        assert run.ids("max") == rec["r2"][:13] and run.final("max").finish_reason == {"type": "length", "length": 13}
        assert run.ids("one") == rec["r3"][:2]
    for rid, _, _ in jobs:
        assert spec.final(rid).completion_tokens == base.final(rid).completion_tokens, rid
        assert 1 <= len(spec.events[rid]) <= len(base.events[rid]), rid
        assert all(ev.new_ids for ev in spec.events[rid][:-1]), rid
    assert len(spec.events["max"]) < len(base.events["max"])  # several tokens per event
    # the prefill's token, then blocks of 8: the stop (index 13) and the 13th token both land in block two
    assert spec.final("stop").spec_verify_ct == 2 and spec.final("max").spec_verify_ct == 2
    assert spec.final("one").spec_verify_ct == 1


def test_the_context_end_inside_a_block() -> None:
    """Rows near the end of the context verify shorter blocks (their real rows stay inside it): requests running
    into the context's end get plain decoding's tokens and finish, at T = 8, with full acceptance and with
    rejections."""
    jobs = [("c", PROMPTS[4][:10], replace(GREEDY, max_new_tokens=200)),
            ("d", PROMPTS[2][:7], replace(GREEDY, max_new_tokens=200))]
    base = _run(jobs, context_length=40)
    rec = {rid: base.ids(rid) for rid in ("c", "d")}
    for schedule in (lambda rid, k: 7, lambda rid, k: k % 8):
        spec = _run(jobs, (8, schedule, rec), context_length=40)
        for rid, prompt, _ in jobs:
            assert spec.ids(rid) == rec[rid] and len(rec[rid]) == 40 - len(prompt), rid
            assert spec.final(rid).finish_reason == base.final(rid).finish_reason == {"type": "length",
                                                                                       "length": len(rec[rid])}


def test_eos_inside_a_block_ends_the_request(plain: Run) -> None:
    """EOS (not ignored) recorded mid-block ends the request there, as in plain decoding."""
    rec = plain.ids("r1")
    eos = rec[21]
    runs = []
    for spec in (None, (8, lambda rid, k: 7, {"e": rec})):
        e = _engine()
        e.scheduler.eos = frozenset({eos})
        if spec is not None:
            e.scheduler.speculate(SpecStep(e.scheduler.runner, OracleDrafter(spec[2], spec[1], e.config.vocab_size),
                                           spec[0]))
        run = Run(e)
        e.scheduler.submit(Request("e", PROMPTS[1], replace(GREEDY, ignore_eos=False), run.sink))
        e.scheduler.run_until_idle()
        runs.append(run)
    first = rec.index(eos)
    for run in runs:
        assert run.final("e").finish_reason == {"type": "stop", "matched": eos}
        assert run.ids("e") == rec[:first] and run.final("e").completion_tokens == first + 1


def _hook_propose(e: Engine, hook: Callable[[int], None]) -> None:
    """Call ``hook(verify index)`` inside every verify step, between drafting and the verify forward."""
    assert e.scheduler.spec is not None
    drafter = e.scheduler.spec.drafter
    real = drafter.propose
    calls = {"n": 0}

    def propose(slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        out = real(slots, pending, steps)
        hook(calls["n"])
        calls["n"] += 1
        return out

    drafter.propose = propose  # type: ignore[method-assign]


def test_abort_and_failure_in_the_middle_of_a_step(plain: Run) -> None:
    """An abort arriving while a verify step runs ends that request after the step; the others' outputs stay
    exact, and the freed slot serves a later request exactly. A failure between verify and commit moves no
    committed state (pools, sampler counts): the engine fails that step's requests and serves the next ones
    exactly on the same slots."""
    rec = {rid: plain.ids(rid) for rid in plain.events}
    e = _engine()
    e.scheduler.speculate(SpecStep(e.scheduler.runner, OracleDrafter(rec, lambda rid, k: (k * 3) % 4,
                                                                    e.config.vocab_size), 4))
    _hook_propose(e, lambda k: e.scheduler.abort("r1", "client went away") if k == 3 else None)
    run = Run(e)
    for i in range(3):
        e.scheduler.submit(Request(f"r{i}", PROMPTS[i], GREEDY, run.sink))
    for _ in range(8):
        e.scheduler._drain(block=False)
        e.scheduler.step()
    assert run.final("r1").finish_reason == {"type": "abort", "message": "client went away"}
    assert run.ids("r1") == rec["r1"][:len(run.ids("r1"))]
    e.scheduler.submit(Request("r3", PROMPTS[3], GREEDY, run.sink))  # takes r1's slot
    e.scheduler.run_until_idle()
    for rid in ("r0", "r2", "r3"):
        assert run.ids(rid) == rec[rid], rid

    # a failure after the verify forward, before the commit
    import netra.engine.spec.step as step_mod

    e2 = _engine()
    e2.scheduler.speculate(SpecStep(e2.scheduler.runner, OracleDrafter(rec, lambda rid, k: 2, e2.config.vocab_size), 4))
    run2 = Run(e2)
    for i in range(2):
        e2.scheduler.submit(Request(f"r{i}", PROMPTS[i], GREEDY, run2.sink))
    for _ in range(4):
        e2.scheduler._drain(block=False)
        e2.scheduler.step()
    p, s = e2.pools, e2.scheduler.sampler
    before = [t.clone() for t in (p.ssm, p.conv, s.counts, s.out_len)]
    real = step_mod.verify_accept

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("injected failure")

    step_mod.verify_accept = boom  # type: ignore[assignment]
    try:
        with pytest.raises(RuntimeError, match="injected"):
            e2.scheduler.step()
    finally:
        step_mod.verify_accept = real
    after = [t for t in (p.ssm, p.conv, s.counts, s.out_len)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)), "a failed step moved committed state"
    for rid in ("r0", "r1"):  # the serving loop's handling of a failed step
        e2.scheduler._finish(e2.scheduler.by_rid[rid], {"type": "abort", "message": "engine error"})
    for i in (2, 3, 4):
        e2.scheduler.submit(Request(f"r{i}", PROMPTS[i], GREEDY, run2.sink))
    e2.scheduler.run_until_idle()
    for rid in ("r2", "r3", "r4"):
        assert run2.ids(rid) == rec[rid], rid


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_logprob_grammar_and_penalised_rows_in_a_speculative_batch(plain: Run) -> None:
    """Requests with logprobs or a grammar ride in the verify batch at T = 1 (one token per verify, from the slot
    sampler as plain decoding draws it); a penalised greedy request speculates with the drafts counted in its
    penalties. All outputs and logprobs equal plain decoding's, bitwise."""
    rec = {rid: plain.ids(rid) for rid in plain.events}
    vocab = 256
    tok = grammar_tokenizer(ByteTokenizer(), vocab + 1, (vocab,))
    lp = replace(GREEDY, max_new_tokens=12, return_logprob=True, top_logprobs_num=3)
    pen = replace(GREEDY, max_new_tokens=16, repetition_penalty=1.3, frequency_penalty=0.5)
    jobs = [("r0", PROMPTS[0], GREEDY), ("lp", PROMPTS[1], lp), ("json", PROMPTS[2], replace(GREEDY, max_new_tokens=24)),
            ("pen", PROMPTS[3], pen), ("hot", PROMPTS[4], replace(lp, temperature=0.7))]
    runs = []
    for spec in (False, True):
        recorded = dict(rec)
        if spec:
            recorded.update({rid: runs[0].ids(rid) for rid in ("lp", "json", "pen", "hot")})
        run = _run(jobs, (4, lambda rid, k: k % 4, recorded) if spec else None,
                   grammars={"json": Grammar(tok, "json_schema", json.dumps(SCHEMA))})
        runs.append(run)
    base, sp = runs
    for rid, _, _ in jobs:
        assert sp.ids(rid) == base.ids(rid), rid
        assert sp.final(rid).finish_reason == base.final(rid).finish_reason, rid
    for rid in ("lp", "hot"):
        assert [(o.logprobs, o.top_logprobs) for o in sp.events[rid]] == \
            [(o.logprobs, o.top_logprobs) for o in base.events[rid]]
    json.loads(bytes(sp.ids("json")).decode())
    for rid in ("lp", "json", "hot"):  # one token per verify after the prefill's
        assert sp.final(rid).spec_verify_ct == sp.final(rid).completion_tokens - 1, rid
    assert sp.final("pen").spec_verify_ct < sp.final("pen").completion_tokens - 1
    assert base.final("r0").spec_verify_ct == 0 and base.final("r0").spec_accept_length == 0.0


def test_greedy_exact_on_the_real_vocabulary_checkpoint(qwen36_checkpoint: Path) -> None:
    """The synthesized Qwen3.6-format checkpoint (FP8 weights and KV cache, 248k vocabulary): speculative greedy
    output equals plain decoding's at T = 4, rejections at every position."""
    opts = {"checkpoint": str(qwen36_checkpoint), "context_length": 256, "max_running_requests": 2}
    prompts = [[248045, 846, 198, 9419, 248046], [248045, 846, 198, 100, 200, 300]]
    params = replace(GREEDY, max_new_tokens=14)
    outs = []
    rec: dict[str, list[int]] = {}
    for spec in (False, True):
        e = build_engine(EngineOptions(**opts))  # type: ignore[arg-type]
        if spec:
            e.scheduler.speculate(SpecStep(e.scheduler.runner, OracleDrafter(rec, lambda rid, k: k % 4,
                                                                            e.config.vocab_size), 4))
        run = Run(e)
        for i, p in enumerate(prompts):
            e.scheduler.submit(Request(f"q{i}", p, params, run.sink))
        e.scheduler.run_until_idle()
        outs.append({rid: run.ids(rid) for rid in run.events})
        rec = outs[0]
        if spec:
            assert all(run.final(rid).spec_verify_ct > 0 for rid in run.events)
    assert outs[0] == outs[1] and all(len(v) == 14 for v in outs[0].values())
