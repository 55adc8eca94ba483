from __future__ import annotations

import torch

from netra.engine.cache import StatePools
from netra.engine.config import ModelConfig, preset
from netra.engine.model import ForwardBatch, Model, prefill_batch
from netra.engine.weights import seeded_weights

CPU = torch.device("cpu")


def _model(seed: int = 0, slots: int = 8, ctx: int = 256) -> Model:
    cfg = preset("tiny")
    return Model(cfg, seeded_weights(cfg, seed), StatePools(cfg, slots, ctx, CPU), CPU)


def _decode(m: Model, rows: list[tuple[int, int, int]], bucket: int | None = None) -> torch.Tensor:
    """rows: (slot, token, position); padded to ``bucket`` with pad-slot rows."""
    bucket = bucket or len(rows)
    pad = bucket - len(rows)
    slots = torch.tensor([r[0] for r in rows] + [0] * pad)
    lens = torch.tensor([r[2] + 1 for r in rows] + [1] * pad)
    fb = ForwardBatch(True, torch.tensor([r[1] for r in rows] + [0] * pad), lens - 1, slots, slots, lens,
                      int(lens.max()), torch.arange(bucket), [], [], [])
    return m.forward(fb)[:len(rows)]


def test_presets_and_hf_config_roundtrip() -> None:
    tiny = preset("tiny")
    assert tiny.attention_layers == [2] and tiny.gdn_layers == [0, 1]
    big = preset("qwen36-35b-a3b")
    assert big.attention_layers == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]
    assert (big.hidden_size, big.vocab_size, big.eos_token_id, big.rotary_dim) == (2048, 248320, (248044,), 64)
    assert big.conv_dim == 2 * 16 * 128 + 32 * 128
    for cfg in (tiny, big):
        assert ModelConfig.from_hf(cfg.to_hf()) == cfg


def test_seeded_weights_are_deterministic() -> None:
    cfg = preset("tiny")
    a, b, c = seeded_weights(cfg, 7), seeded_weights(cfg, 7), seeded_weights(cfg, 8)
    wa, wb, wc = a.layers[0].moe.w13, b.layers[0].moe.w13, c.layers[0].moe.w13
    assert torch.equal(wa.data.view(torch.uint8), wb.data.view(torch.uint8))
    assert torch.equal(a.embed, b.embed) and torch.equal(wa.scale_inv, wb.scale_inv)
    assert not torch.equal(wa.data.view(torch.uint8), wc.data.view(torch.uint8))
    assert not torch.equal(a.embed, c.embed)


def test_decode_continues_prefill() -> None:
    m = _model()
    prompt = list(range(40, 75))
    # prefill the whole prompt, then decode 6 tokens greedily
    logits = m.forward(prefill_batch(CPU, [(1, prompt, 0, True)]))
    toks = [int(logits.argmax())]
    decode_logits = []
    for i in range(6):
        lg = _decode(m, [(1, toks[-1], len(prompt) + i)])
        decode_logits.append(lg[0])
        toks.append(int(lg.argmax()))
    # the same sequence prefilled in one go (slot 2) gives (nearly) the same logits at every position
    full = m.forward(prefill_batch(CPU, [(2, prompt + toks[:-1], 0, True)]))
    assert torch.allclose(full[0], decode_logits[-1], atol=0.05, rtol=0.05)
    assert int(full.argmax()) == toks[-1]


def test_rows_do_not_depend_on_the_batch() -> None:
    m = _model()
    prompts = [list(range(10, 30)), list(range(100, 107)), list(range(200, 260))]
    joint = m.forward(prefill_batch(CPU, [(s + 1, p, 0, True) for s, p in enumerate(prompts)]))
    ref = _model()
    for s, p in enumerate(prompts):
        alone = ref.forward(prefill_batch(CPU, [(s + 1, p, 0, True)]))
        assert torch.equal(alone[0], joint[s])
    # decode: three rows padded to a bucket of 4 vs each row alone (bucket 1)
    rows = [(s + 1, 65 + s, len(p)) for s, p in enumerate(prompts)]
    batch = _decode(m, rows, bucket=4)
    for s, row in enumerate(rows):
        assert torch.equal(_decode(ref, [row])[0], batch[s])


def test_chunked_prefill_matches_one_shot() -> None:
    m = _model()
    prompt = [(i * 37) % 250 for i in range(90)]
    one = m.forward(prefill_batch(CPU, [(1, prompt, 0, True)]))
    for lo, hi in ((0, 32), (32, 64)):
        m.forward(prefill_batch(CPU, [(2, prompt[lo:hi], lo, False)]))
    last = m.forward(prefill_batch(CPU, [(2, prompt[64:], 64, True)]))
    assert torch.allclose(one, last, atol=0.05, rtol=0.05)
    assert int(one.argmax()) == int(last.argmax())


def test_mixed_batch_rows_equal_the_decode_and_prefill_paths_bitwise() -> None:
    """A mixed forward (decode rows, then prompt chunks) gives each decode row the decode path's logits and
    each chunk the prefill path's, bitwise, and leaves the same state in the pools."""
    prompts = [list(range(10, 30)), list(range(100, 107))]
    new = [(3, list(range(50, 83)), 0, True), (4, list(range(7, 19)), 0, False)]
    models = [_model(), _model()]
    for m in models:  # two running requests, prefilled
        m.forward(prefill_batch(CPU, [(s + 1, p, 0, True) for s, p in enumerate(prompts)]))
    rows = [(s + 1, 65 + s, len(p)) for s, p in enumerate(prompts)]
    ref, mix = models
    # The decode path at the mixed batch's own row count (bucket 2): the reference GDN decode is batched, and
    # a CPU's kernels may round a row differently at another batch size (seen on an AVX2 EPYC at bucket 4).
    want_d = _decode(ref, rows, bucket=2)
    want_p = ref.forward(prefill_batch(CPU, new))
    got = mix.forward(prefill_batch(CPU, new, decode=[(s, t, p + 1) for s, t, p in rows]))
    assert got.shape[0] == len(rows) + 1
    assert torch.equal(got[:2], want_d) and torch.equal(got[2:], want_p)
    for pool in ("k", "v", "ssm", "conv"):
        a, b = getattr(ref.pools, pool), getattr(mix.pools, pool)
        assert torch.equal(a[:, 1:].float(), b[:, 1:].float()), pool  # slot 0 (pad rows) excluded
    # and the next decode step continues both identically
    nxt = [(s, t + 1, p + 1) for s, t, p in rows] + [(3, int(want_p[0].argmax()), 33)]
    assert torch.equal(_decode(ref, nxt), _decode(mix, nxt))
