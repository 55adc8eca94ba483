"""On the H200: penalties, logit bias, min-tokens and grammar masks sampled inside a captured CUDA
graph give the same tokens (and logprobs) as the same step run eagerly.

Self-contained, well under a minute: `pytest -q -s -m gpu tests/engine/test_sampler_gpu.py` prints
one summary line per test.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from netra.engine.cache import PAD_SLOT
from netra.engine.grammar import Grammar, grammar_tokenizer
from netra.engine.request import Output, Request, SamplingParams
from netra.engine.sampler import SlotSampler, StepVariant
from netra.tokenizers import ByteTokenizer

pytestmark = pytest.mark.gpu

V = 264  # the byte tokenizer's vocabulary (tiny preset), so the grammar library drives real masks
EOS = 257
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "name": {"type": "string", "maxLength": 12}},
          "required": ["n", "name"], "additionalProperties": False}


def _params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, frequency_penalty=0.8, presence_penalty=0.3, repetition_penalty=1.4,
                           min_new_tokens=6, logit_bias=((65, 3.0), (66, -100.0)), return_logprob=True,
                           top_logprobs_num=5),
            SamplingParams(temperature=0.8, top_p=0.9, frequency_penalty=-0.4, repetition_penalty=0.9),
            SamplingParams(temperature=0.0),  # grammar row (json_schema)
            SamplingParams(temperature=1.0, top_k=40, presence_penalty=1.5)]  # grammar row (regex)


def _grammars() -> list[Grammar | None]:
    tok = grammar_tokenizer(ByteTokenizer(), V, (EOS,))
    return [None, None, Grammar(tok, "json_schema", json.dumps(SCHEMA)), Grammar(tok, "regex", "[a-f]{3,40}")]


def _admit(s: SlotSampler) -> list[Grammar | None]:
    grammars = _grammars()
    for i, (p, g) in enumerate(zip(_params(), grammars, strict=True)):
        s.admit(i + 1, p, 1000 + i, g)
    return grammars


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sampler_step_in_a_captured_graph_matches_eager() -> None:
    t0 = time.perf_counter()
    dev = torch.device("cuda")
    bucket, steps = 8, 48  # 4 live rows + 4 pad rows
    eager, graphed = SlotSampler(6, V, dev, (EOS,)), SlotSampler(6, V, dev, (EOS,))
    g_eager, g_graph = _admit(eager), _admit(graphed)
    slots = torch.tensor([1, 2, 3, 4] + [PAD_SLOT] * 4, device=dev)
    logits = torch.zeros(bucket, V, device=dev)
    variant = StepVariant(greedy=False, processed=True, logprobs=True)
    # Warm up on a side stream on the pad rows only (no live state moves), then capture.
    pad_slots = torch.full((bucket,), PAD_SLOT, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            graphed.step(logits, pad_slots, variant)
    torch.cuda.current_stream().wait_stream(side)
    graphed.counts[PAD_SLOT].zero_()
    graphed.out_len[PAD_SLOT] = 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = graphed.step(logits, slots, variant)
    gen = torch.Generator(device=dev).manual_seed(7)
    done = [False] * 4
    mismatches = tokens_seen = 0
    for _ in range(steps):
        fresh = torch.randn(bucket, V, device=dev, generator=gen) * 3
        live = [i + 1 for i in range(4) if not done[i]]
        eager.prepare(live)
        graphed.prepare(live)
        ref = eager.step(fresh, slots, variant)
        logits.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        a, b = ref.tokens[:4].tolist(), out.tokens[:4].tolist()
        mismatches += sum(x != y for x, y in zip(a, b, strict=True))
        assert torch.equal(ref.logprob, out.logprob) and torch.equal(ref.top_ids, out.top_ids)  # type: ignore[arg-type]
        for i, (g1, g2) in enumerate(zip(g_eager, g_graph, strict=True)):
            if g1 is None or g2 is None or done[i]:
                continue
            assert g1.accept(a[i]) and g2.accept(b[i]), f"row {i}: the mask let through a token the grammar refuses"
            done[i] = g1.done or a[i] == EOS
        tokens_seen += 4
    assert mismatches == 0
    assert torch.equal(eager.counts, graphed.counts) and torch.equal(eager.out_len, graphed.out_len)
    assert int(graphed.counts[PAD_SLOT].sum()) == 0, "padded rows moved the pad slot's counts"
    print(f"sampler graph vs eager: {tokens_seen} tokens, {mismatches} mismatches, bucket {bucket}, "
          f"{time.perf_counter() - t0:.1f} s")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_engine_with_decode_graphs_matches_eager_on_penalised_and_constrained_requests() -> None:
    from netra.engine.engine import build_engine
    from netra.engine.options import EngineOptions

    t0 = time.perf_counter()
    prompts = [[(i * 37 + j * 11) % 256 for j in range(9 + 5 * i)] for i in range(4)]
    runs, graphs = [], 0
    for disable in (False, True):
        e = build_engine(EngineOptions(preset="tiny", device="cuda", context_length=256, max_running_requests=4,
                                       disable_cuda_graph=disable))
        got: dict[str, list[int]] = {}

        def sink(o: Output, got: dict[str, list[int]] = got) -> None:
            got.setdefault(o.rid, []).extend(o.new_ids)

        for i, (p, g) in enumerate(zip(_params(), _grammars(), strict=True)):
            p2 = SamplingParams(**{**p.__dict__, "max_new_tokens": 128})
            e.scheduler.submit(Request(str(i), prompts[i], p2, sink, seed=100 + i, grammar=g))
        e.scheduler.run_until_idle()
        runs.append([got[str(i)] for i in range(4)])
        graphs = max(graphs, len(e.scheduler.runner.graphs))
    assert runs[0] == runs[1]
    json.loads(bytes(runs[0][2]).decode())  # the constrained row is valid JSON
    print(f"engine graphs vs eager: {sum(map(len, runs[0]))} tokens equal, {graphs} decode graphs captured, "
          f"{time.perf_counter() - t0:.1f} s")
