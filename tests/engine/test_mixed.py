"""Mixed steps (--mixed-chunk): prompts arriving while requests decode never stall the running streams,
and every request's tokens equal those it gets served alone (the decode rows' arithmetic is the decode
path's, a prompt's chunks are cut at multiples of the chunk size of its own positions)."""

from __future__ import annotations

import pytest

from netra.engine.engine import Engine, build_engine
from netra.engine.options import EngineOptions, OptionsError
from netra.engine.request import Output, Request, SamplingParams

GREEDY = SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)
HOT = SamplingParams(max_new_tokens=30, temperature=1.0, top_p=0.9, ignore_eos=True)
SHORT = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
RUNNING = [("a", [3, 1, 4, 1, 5], GREEDY, 0), ("b", [9, 2, 6], HOT, 5)]
ARRIVING = [("p0", [(i * 13) % 251 for i in range(70)], SHORT, 0), ("p1", list(range(20, 65)), SHORT, 0),
            ("p2", [(i * 7) % 97 for i in range(33)], SHORT, 0)]


class Collector:
    def __init__(self) -> None:
        self.ids: dict[str, list[int]] = {}
        self.reasons: dict[str, object] = {}

    def sink(self, out: Output) -> None:
        self.ids.setdefault(out.rid, []).extend(out.new_ids)
        if out.finish_reason is not None:
            self.reasons[out.rid] = out.finish_reason


def _engine(**kw: object) -> Engine:
    opts = {"context_length": 256, "max_running_requests": 6, "chunked_prefill_size": 16, **kw}
    return build_engine(EngineOptions(**opts))  # type: ignore[arg-type]


def _alone() -> dict[str, list[int]]:
    e, c = _engine(max_running_requests=1), Collector()
    for rid, prompt, params, seed in RUNNING + ARRIVING:
        e.scheduler.submit(Request(rid, prompt, params, c.sink, seed=seed))
        e.scheduler.run_until_idle()
    return c.ids


@pytest.fixture(scope="module")
def alone() -> dict[str, list[int]]:
    return _alone()


def _under_load(mode: str) -> tuple[Engine, Collector, int]:
    """Two requests decoding, then three prompts (33-70 tokens, 16-token chunks) arrive; the number of
    steps in which a running request got no token while it was running."""
    e, c = _engine(mixed_chunk=mode), Collector()
    s = e.scheduler
    for rid, prompt, params, seed in RUNNING:
        s.submit(Request(rid, prompt, params, c.sink, seed=seed, stream=True))
    s._drain(block=False)
    s.step()  # both prompts in one prefill step; both decode from here
    assert len(s.decoding) == 2
    for rid, prompt, params, seed in ARRIVING:
        s.submit(Request(rid, prompt, params, c.sink, seed=seed, stream=True))
    s._drain(block=False)
    stalls = 0
    running = {r.rid: r for r in s.decoding}
    while s.waiting or s.prefilling or s.decoding:
        before = {rid: len(r.output) for rid, r in running.items() if r.finish_reason is None}
        s.step()
        stalls += sum(1 for rid, n in before.items() if len(running[rid].output) == n)
    return e, c, stalls


@pytest.mark.parametrize("mode", ["split", "fused"])
def test_mixed_steps_never_stall_running_requests_and_keep_their_tokens(mode: str, alone: dict[str, list[int]]
                                                                        ) -> None:
    e, c, stalls = _under_load(mode)
    assert stalls == 0
    st = e.scheduler.stats
    assert st.mixed_steps >= 5  # 148 prompt tokens in chunks of <= 16 while a and b decode
    assert st.prefill_tokens == sum(len(p) for _, p, _, _ in RUNNING + ARRIVING)
    for rid, *_ in RUNNING + ARRIVING:
        assert c.ids[rid] == alone[rid], rid
    assert e.pools.free_slots == 6 and not e.scheduler.by_rid


def test_without_mixing_a_prefill_step_stalls_the_running_requests(alone: dict[str, list[int]]) -> None:
    e, c, stalls = _under_load("off")
    # every prefill step (>= 148 / 16 of them) stalls both running requests
    assert stalls >= 2 * 9 and e.scheduler.stats.mixed_steps == 0
    for rid, *_ in RUNNING + ARRIVING:
        assert c.ids[rid] == alone[rid], rid


def test_mixed_chunk_option_is_checked() -> None:
    with pytest.raises(OptionsError, match="mixed-chunk"):
        EngineOptions(mixed_chunk="sometimes")
