"""On the GPU: acceptance of a drafted block (netra.engine.spec.accept) inside a captured CUDA graph gives
the same (count, tokens) as the same call run eagerly, and the eager call agrees with the CPU.

`pytest -q -s -m gpu tests/engine/test_spec_accept_gpu.py` prints one summary line per shape.
"""

from __future__ import annotations

import time

import pytest
import torch

from netra.engine.sampler import SlotSampler
from netra.engine.spec.accept import RowSampling, verify_accept

try:
    from netra.engine.request import SamplingParams
except ImportError:  # before SamplingParams moved out of the scheduler
    from netra.engine.scheduler import SamplingParams  # type: ignore[no-redef]

pytestmark = pytest.mark.gpu

PARAMS = [SamplingParams(temperature=0.0),
          SamplingParams(temperature=0.8, top_p=0.9, frequency_penalty=0.4, repetition_penalty=1.1),
          SamplingParams(temperature=1.0, top_k=40, presence_penalty=0.5, min_new_tokens=3,
                         logit_bias=((7, 2.0),)),
          SamplingParams(temperature=0.0, repetition_penalty=1.3)]


def _rows(b: int, v: int, device: torch.device) -> tuple[SlotSampler, torch.Tensor]:
    s = SlotSampler(b + 1, v, device, (v - 1,))
    for r in range(b):
        s.admit(r + 1, PARAMS[r % len(PARAMS)], 7 * r + 1, None)
    s.counts[:, 3] = 1
    s.out_len[:] = 2
    return s, torch.arange(1, b + 1, device=device)


@pytest.mark.parametrize(("b", "t", "v"), [(8, 4, 1000), (32, 16, 248320)])
def test_captured_verify_equals_eager_and_cpu(b: int, t: int, v: int) -> None:
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    logits_cpu = torch.randn(b, t, v, generator=gen) * 3
    drafts_cpu = torch.argmax(logits_cpu[:, :-1], -1)
    drafts_cpu[1::2, t // 2] = 5  # some rows reject mid-block
    t_eff_cpu = torch.full((b,), t)
    t_eff_cpu[::5] = 1  # rows at T = 1 in the mixed batch
    limit_cpu = torch.full((b,), t + 1)
    limit_cpu[3::7] = 2

    s, slots = _rows(b, v, dev)
    logits, drafts = logits_cpu.to(dev), drafts_cpu.to(dev)
    t_eff, limit = t_eff_cpu.to(dev), limit_cpu.to(dev)
    rows = RowSampling.gather(s, slots)
    eager = verify_accept(logits, drafts, rows, limit, t_eff, greedy=False, processed=True)

    static_logits = logits.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture
        verify_accept(static_logits, drafts, RowSampling.gather(s, slots), limit, t_eff, greedy=False,
                      processed=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = verify_accept(static_logits, drafts, RowSampling.gather(s, slots), limit, t_eff, greedy=False,
                                 processed=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.count, eager.count) and torch.equal(captured.tokens, eager.tokens)

    # the CPU gives the same result (fp32 rounding of the reductions may differ across devices, so a
    # near-tie could flip a draw: allow at most one differing row); the small shape only, for time
    differing = -1
    if v <= 1000:
        s_cpu, slots_cpu = _rows(b, v, torch.device("cpu"))
        cpu = verify_accept(logits_cpu, drafts_cpu, RowSampling.gather(s_cpu, slots_cpu), limit_cpu, t_eff_cpu,
                            greedy=False, processed=True)
        differing = int((~((cpu.count == eager.count.cpu()) & (cpu.tokens == eager.tokens.cpu()).all(-1))).sum())
        assert differing <= 1

    reps = 20
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / reps * 1e3
    print(f"B={b} T={t} V={v}: captured verify_accept {ms:.2f} ms, mean count "
          f"{float(eager.count.float().mean()):.2f}, CPU rows differing {differing} (-1: not compared)")
