from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from netra.engine.cache import PAD_SLOT
from netra.engine.engine import Engine, build_engine
from netra.engine.options import EngineOptions, OptionsError
from netra.engine.request import Output, Request, SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


class Collector:
    def __init__(self) -> None:
        self.events: dict[str, list[Output]] = {}

    def sink(self, out: Output) -> None:
        self.events.setdefault(out.rid, []).append(out)

    def ids(self, rid: str) -> list[int]:
        return [t for ev in self.events[rid] for t in ev.new_ids]

    def final(self, rid: str) -> Output:
        assert self.events[rid][-1].finish_reason is not None
        return self.events[rid][-1]


def _engine(**kw: object) -> Engine:
    return build_engine(EngineOptions(**{"context_length": 512, "max_running_requests": 4, **kw}))  # type: ignore[arg-type]


def _prompts(n: int) -> list[list[int]]:
    return [[(i * 31 + j * 7) % 256 for j in range(5 + 9 * i)] for i in range(n)]


def test_outputs_do_not_depend_on_concurrency_or_queueing() -> None:
    prompts = _prompts(7)
    alone = Collector()
    e1 = _engine(max_running_requests=1)
    for i, p in enumerate(prompts):
        e1.scheduler.submit(Request(f"r{i}", p, GREEDY, alone.sink))
    e1.scheduler.run_until_idle()
    # seven requests through three slots (an admission queue), chunked prefill of 16 tokens
    many = Collector()
    e3 = _engine(max_running_requests=3, chunked_prefill_size=16)
    for i, p in enumerate(prompts):
        e3.scheduler.submit(Request(f"r{i}", p, GREEDY, many.sink, stream=True))
    e3.scheduler.run_until_idle()
    for i in range(7):
        assert many.final(f"r{i}").finish_reason == {"type": "length", "length": 12}
        assert many.final(f"r{i}").completion_tokens == 12
        assert len(many.ids(f"r{i}")) == 12
    # chunking changes prefill arithmetic only for prompts longer than a chunk: compare the short ones
    # bitwise, and every request's first tokens
    for i, p in enumerate(prompts):
        if len(p) <= 16:
            assert many.ids(f"r{i}") == alone.ids(f"r{i}")
    assert e3.pools.free_slots == 3 and e3.scheduler.stats.padded_rows > 0


def test_same_requests_batched_match_one_at_a_time_bitwise() -> None:
    prompts = _prompts(5)
    runs = []
    for slots in (1, 5):
        c = Collector()
        e = _engine(max_running_requests=slots, chunked_prefill_size=64)
        for i, p in enumerate(prompts):
            e.scheduler.submit(Request(f"r{i}", p, GREEDY, c.sink))
        e.scheduler.run_until_idle()
        runs.append([c.ids(f"r{i}") for i in range(5)])
    assert runs[0] == runs[1]


def test_stop_tokens_eos_and_trim() -> None:
    e = _engine()
    c = Collector()
    e.scheduler.submit(Request("base", [1, 2, 3], GREEDY, c.sink))
    e.scheduler.run_until_idle()
    base = c.ids("base")
    stop = base[3]
    first = base.index(stop)
    for rid, params in (("stop", replace(GREEDY, stop_token_ids=(stop,))),
                        ("keep", replace(GREEDY, stop_token_ids=(stop,), no_stop_trim=True))):
        e.scheduler.submit(Request(rid, [1, 2, 3], params, c.sink, stream=True))
    e.scheduler.run_until_idle()
    assert c.final("stop").finish_reason == {"type": "stop", "matched": stop}
    assert c.ids("stop") == base[:first] and c.final("stop").completion_tokens == first + 1
    assert c.ids("keep") == base[:first + 1]
    # EOS ends a request unless ignore_eos: make EOS the stop by running with eos = that token
    e2 = _engine()
    e2.scheduler.eos = frozenset({stop})
    e2.scheduler.submit(Request("eos", [1, 2, 3], replace(GREEDY, ignore_eos=False), c.sink))
    e2.scheduler.submit(Request("ign", [1, 2, 3], GREEDY, c.sink))
    e2.scheduler.run_until_idle()
    assert c.final("eos").finish_reason == {"type": "stop", "matched": stop}
    assert c.ids("ign") == base


def test_abort_zero_tokens_and_sampling_seed() -> None:
    e = _engine(max_running_requests=1)
    c = Collector()
    long = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)
    e.scheduler.submit(Request("a", [5] * 20, long, c.sink, stream=True))
    e.scheduler.submit(Request("queued", [6] * 5, long, c.sink))
    e.scheduler.submit(Request("zero", [7], replace(long, max_new_tokens=0), c.sink))
    for _ in range(5):
        e.scheduler._drain(block=False)
        e.scheduler.step()
    assert e.pools.free_slots == 0
    e.scheduler.abort("a", "test abort")
    e.scheduler.abort("queued", "test abort")
    e.scheduler.run_until_idle()
    assert c.final("a").finish_reason == {"type": "abort", "message": "test abort"}
    assert c.final("queued").finish_reason["type"] == "abort"  # type: ignore[index]
    assert c.final("zero").finish_reason == {"type": "length", "length": 0} and c.ids("zero") == []
    assert e.pools.free_slots == 1 and not e.scheduler.by_rid
    # random sampling: the same seed gives the same tokens, a different one (almost surely) not
    hot = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, ignore_eos=True)
    for rid, seed in (("s1", 11), ("s2", 11), ("s3", 12)):
        e.scheduler.submit(Request(rid, [9, 8, 7], hot, c.sink, seed=seed))
    e.scheduler.run_until_idle()
    assert c.ids("s1") == c.ids("s2") != c.ids("s3")


def test_bad_options_are_named() -> None:
    with pytest.raises(OptionsError, match="cuda-graph-bs"):
        EngineOptions(cuda_graph_bs=(4, 2))
    with pytest.raises(OptionsError, match="max-running-requests"):
        EngineOptions(max_running_requests=0)
    with pytest.raises(OptionsError, match="kv-cache-dtype"):
        EngineOptions(kv_cache_dtype="int4")


def test_a_failing_step_fails_its_requests_and_the_thread_keeps_serving() -> None:
    import threading

    e = _engine()
    real = e.model.forward
    calls = {"n": 0}

    def flaky(fb):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")
        return real(fb)

    e.model.forward = flaky  # type: ignore[method-assign]
    done = threading.Event()
    c = Collector()

    def sink(out: Output) -> None:
        c.sink(out)
        if out.finish_reason is not None and out.rid == "b":
            done.set()

    e.scheduler.start()
    try:
        e.scheduler.submit(Request("a", [1, 2, 3], GREEDY, sink))
        for _ in range(200):
            if "a" in c.events:
                break
            threading.Event().wait(0.05)
        e.scheduler.submit(Request("b", [1, 2, 3], GREEDY, sink))
        assert done.wait(60)
    finally:
        e.scheduler.stop()
    assert c.final("a").finish_reason == {"type": "abort", "message": "engine error: injected failure"}
    assert c.final("b").finish_reason == {"type": "length", "length": 12}
    assert e.pools.free_slots == 4


def test_bf16_state_and_kv_cache_options() -> None:
    outs = {}
    for kv, ssm in (("fp8_e4m3", "float32"), ("bfloat16", "bfloat16")):
        e = _engine(kv_cache_dtype=kv, mamba_ssm_dtype=ssm)
        assert e.pools.k.dtype == (torch.float8_e4m3fn if kv == "fp8_e4m3" else torch.bfloat16)
        assert e.pools.ssm.dtype == (torch.float32 if ssm == "float32" else torch.bfloat16)
        c = Collector()
        e.scheduler.submit(Request("r", list(range(40, 80)), GREEDY, c.sink))
        e.scheduler.run_until_idle()
        outs[kv] = c.ids("r")
        assert len(outs[kv]) == 12
    # different storage precisions: the first greedy token (from the prefill) agrees; later ones may
    # not (a one-ulp change flips E4M3 roundings downstream in a random model)
    assert outs["fp8_e4m3"][0] == outs["bfloat16"][0]


def test_a_dying_scheduler_thread_calls_on_fatal_and_health_reports_it() -> None:
    """An error outside a step (the thread's own setup, here) stops the thread: `on_fatal` gets the exception
    (the server ends the process with it, so the supervisor restarts the engine) and `alive` turns false."""
    import threading

    eng = _engine()
    sched = eng.scheduler
    seen: list[BaseException] = []
    called = threading.Event()

    def boom() -> None:
        raise ValueError("no device for this thread")

    def fatal(exc: BaseException) -> None:
        seen.append(exc)
        called.set()

    sched._serve = boom  # type: ignore[method-assign]
    sched.on_fatal = fatal
    sched.start()
    assert called.wait(10)
    sched._thread.join(10)  # type: ignore[union-attr]
    assert [type(e) for e in seen] == [ValueError] and str(seen[0]) == "no device for this thread"
    assert sched.started and not sched.alive


def test_warm_up_moves_no_request_state_and_changes_no_output() -> None:
    """The warm-up (run by the scheduler thread on CUDA; called directly here) prefills a chunk's width of prompts,
    each on a slot of its own (a prefill batch never repeats a slot), and mixed steps with decode rows on the pad
    slot; it zeroes and hands back the slots it borrowed, in their order, and the requests served after it get the
    tokens a cold engine gives, bitwise."""
    prompts = _prompts(3)
    cold, warm = Collector(), Collector()
    e_cold, e_warm = _engine(chunked_prefill_size=40), _engine(chunked_prefill_size=40)
    # prompts of at most 1024 tokens: 40 tokens is one piece, so a narrower context makes the warm-up borrow slots
    free_before = list(e_warm.pools._free)
    seen: list[tuple[list[int], int, int]] = []
    forward = e_warm.model.forward

    def spy(fb):  # type: ignore[no-untyped-def]
        seen.append((list(fb.seq_slots), fb.decode_rows, int(fb.input_ids.shape[0])))
        return forward(fb)

    e_warm.model.forward = spy  # type: ignore[method-assign]
    e_warm.scheduler.runner.warm_up()
    e_warm.model.forward = forward  # type: ignore[method-assign]
    assert seen and all(len(set(slots)) == len(slots) for slots, _, _ in seen), seen
    assert any(nd > 0 for _, nd, _ in seen) and all(t <= 40 for _, _, t in seen), seen
    assert e_warm.pools._free == free_before
    p = e_warm.pools
    for pool in (p.k, p.v, p.ssm, p.conv):
        assert not pool.float().abs().sum().item(), "warm-up left state in a pool"
    for e, col in ((e_cold, cold), (e_warm, warm)):
        for i, pr in enumerate(prompts):
            e.scheduler.submit(Request(f"r{i}", pr, GREEDY, col.sink))
        e.scheduler.run_until_idle()
    assert all(warm.ids(f"r{i}") == cold.ids(f"r{i}") and len(cold.ids(f"r{i}")) == 12 for i in range(3))


def test_warm_up_borrows_a_slot_per_prompt_and_gives_them_back() -> None:
    """A chunk wider than a prompt piece (here: a 24-token context makes pieces of 23 tokens in a 64-token chunk)
    is warmed as several prompts on distinct borrowed slots; with no slot free, one prompt on the pad slot."""
    e = _engine(chunked_prefill_size=64, context_length=24)
    slots = [e.pools.alloc() for _ in range(3)]
    shapes = e.scheduler.runner.warm_shapes(64, 23, slots)
    wide = shapes[0][0]
    assert [c[0] for c in wide] == slots and [len(c[1]) for c in wide] == [23, 23, 18]
    for chunks, decode in shapes:
        assert len({c[0] for c in chunks}) == len(chunks) and sum(len(c[1]) for c in chunks) + len(decode) <= 64
    assert sorted({len(d) for _, d in shapes}) == [0, 1, 4]  # never more decode rows than max_running_requests (4)
    assert e.scheduler.runner.warm_shapes(64, 23, []) == [([(PAD_SLOT, [0] * 23, 0, True)], [])]


def test_health_waits_for_the_warm_up_only_where_one_runs() -> None:
    """On a CPU (or with warmup off) the scheduler is warm as soon as it starts; a CUDA engine with warmup on
    sets it only after `warm_up`, and /health answers 503 until then (netra/engine/server.py)."""
    e = _engine()
    assert not e.scheduler.warm.is_set()
    e.scheduler.start()
    try:
        assert e.scheduler.warm.wait(5)
    finally:
        e.scheduler.stop()
    assert EngineOptions().warmup is True and EngineOptions(warmup=False).warmup is False


def _run_mixed_workload(overlap: bool) -> tuple[Collector, Engine]:
    """Greedy requests finishing at different steps (lengths, a stop token, the context's end), one sampled
    request (ends chaining while it runs), arrivals while others decode, and an abort mid-stream."""
    col = Collector()
    e = _engine(max_running_requests=6, context_length=96, decode_overlap=overlap, stream_interval=3)
    s = e.scheduler
    prompts = _prompts(6)
    lens = [9, 23, 40, 17, 31, 200]  # the last one runs into the context's end
    for i in range(4):
        s.submit(Request(f"g{i}", prompts[i], SamplingParams(max_new_tokens=lens[i], temperature=0.0,
                                                             ignore_eos=True), col.sink, stream=True))
    for _ in range(12):
        s._drain(block=False)
        s.step()
    s.submit(Request("late", prompts[4], SamplingParams(max_new_tokens=lens[4], temperature=0.0, ignore_eos=True),
                     col.sink, stream=True))
    s.submit(Request("ctx", prompts[5][:20], SamplingParams(max_new_tokens=lens[5], temperature=0.0,
                                                            ignore_eos=True), col.sink, stream=True))
    for _ in range(6):
        s._drain(block=False)
        s.step()
    s.abort("g2", "client went away")
    s.submit(Request("sampled", prompts[1], SamplingParams(max_new_tokens=8, temperature=0.8, ignore_eos=True),
                     col.sink, seed=5))
    for _ in range(10):
        s._drain(block=False)
        s.step()
    stop_at = col.ids("g3")[-1] if col.events.get("g3") else 7
    s.submit(Request("stop", prompts[3], SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True,
                                                        stop_token_ids=[stop_at]), col.sink, stream=True))
    s.run_until_idle()
    return col, e


def test_decode_overlap_gives_the_tokens_and_finishes_of_plain_decode() -> None:
    """--decode-overlap chains greedy decode steps on the device; every request gets the same tokens, finish
    reason and stream of events as without it, and the chain did run (chained steps counted)."""
    plain, e0 = _run_mixed_workload(False)
    chained, e1 = _run_mixed_workload(True)
    assert set(plain.events) == set(chained.events)
    for rid in plain.events:
        assert chained.ids(rid) == plain.ids(rid), rid
        assert chained.final(rid).finish_reason == plain.final(rid).finish_reason, rid
        assert [len(ev.new_ids) for ev in chained.events[rid]] == [len(ev.new_ids) for ev in plain.events[rid]], rid
    assert e0.scheduler.stats.chained_steps == 0 < e1.scheduler.stats.chained_steps
    assert e1.scheduler._inflight is None or not e1.scheduler.decoding
    assert e1.pools.free_slots == e0.pools.free_slots == 6
