"""The DFlash drafter in the engine (`--speculative-algorithm dflash`, seeded tiny drafter in z-lab's format):
greedy output exact, and the drafter's context is the target's hidden states of exactly the committed tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from netra.engine.config import preset
from netra.engine.engine import Engine, build_engine
from netra.engine.model import ForwardBatch, prefill_batch
from netra.engine.options import EngineOptions, OptionsError
from netra.engine.request import Request, SamplingParams
from netra.engine.spec.dflash import DFlashDrafter, dflash_preset, save_dflash, seeded_dflash_weights

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
PROMPTS = [[(i * 31 + j * 7) % 256 for j in range(5 + 4 * i)] for i in range(3)]


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = dflash_preset("tiny", preset("tiny"))
    return save_dflash(tmp_path_factory.mktemp("dflash") / "drafter", cfg, seeded_dflash_weights(cfg, 1))


def _engine(drafter: Path | None, **kw: object) -> Engine:
    spec = {"speculative_algorithm": "dflash", "speculative_draft_model_path": str(drafter),
            "speculative_num_draft_tokens": 4} if drafter else {}
    return build_engine(EngineOptions(context_length=128, max_running_requests=2, **spec, **kw))  # type: ignore[arg-type]


def _reference_context(e: Engine, prompt: list[int], committed: list[int], drafter_dir: Path) -> DFlashDrafter:
    """A fresh target and drafter fed by plain decoding: the prompt's prefill, then one decode step per committed
    output token, each forward's captured layers extended into slot 1."""
    ref = _engine(None)
    d = e.scheduler.spec.drafter  # type: ignore[union-attr]
    assert isinstance(d, DFlashDrafter)
    fresh = DFlashDrafter(d.cfg, d.w, ref.model.w.embed, ref.model.w.lm_head, d.num_slots, d.context_length)
    fresh.admit(1)
    out = ref.model.run(prefill_batch(ref.model.device, [(1, prompt, 0, True)]), fresh.capture_layers)
    assert out.features is not None
    fresh.extend(torch.tensor([1]), out.features[None], torch.tensor([len(prompt)]))
    for i, tok in enumerate(committed):
        pos = torch.tensor([len(prompt) + i])
        fb = ForwardBatch(True, torch.tensor([tok]), pos, torch.tensor([1]), torch.tensor([1]), pos + 1,
                          int(pos) + 1, torch.tensor([0]), [], [], [])
        out = ref.model.run(fb, fresh.capture_layers)
        assert out.features is not None
        fresh.extend(torch.tensor([1]), out.features[None], torch.tensor([1]))
    return fresh


def test_dflash_greedy_is_exact_and_its_context_is_the_committed_tokens(drafter_dir: Path) -> None:
    plain, spec = _engine(None), _engine(drafter_dir)
    assert spec.options.speculative_num_draft_tokens == 4
    outs = []
    for e in (plain, spec):
        got: dict[str, list[int]] = {}
        for i, p in enumerate(PROMPTS):  # three requests through two slots
            e.scheduler.submit(Request(f"r{i}", p, GREEDY, lambda o, got=got: got.setdefault(o.rid, []).extend(o.new_ids)))
        checked = 0
        while e.scheduler.waiting or e.scheduler.prefilling or e.scheduler.decoding or not e.scheduler.inbox.empty():
            e.scheduler._drain(block=False)
            e.scheduler.step()
            if e is spec:  # the context holds every committed token, no more
                d = e.scheduler.spec.drafter  # type: ignore[union-attr]
                assert isinstance(d, DFlashDrafter)
                for r in e.scheduler.decoding:
                    assert int(d.lengths[r.slot]) == r.cached, r.rid
                    checked += 1
                r0 = next((r for r in e.scheduler.decoding if r.rid == "r0" and len(r.output) > 5), None)
                if r0 is not None and checked < 100:  # once: the context K/V against plain decoding's
                    ref = _reference_context(e, r0.prompt, r0.output[:-1], drafter_dir)
                    n = r0.cached
                    for li in range(len(d.k)):
                        assert torch.equal(d.k[li][r0.slot, :n], ref.k[li][1, :n]), li
                        assert torch.equal(d.v[li][r0.slot, :n], ref.v[li][1, :n]), li
                    checked += 100
        outs.append(got)
        if e is spec:
            assert checked > 100 and e.scheduler.stats.verify_steps > 0
    assert outs[0] == outs[1] and all(len(v) == 10 for v in outs[0].values())


def test_dflash_block_size_bounds_t(drafter_dir: Path) -> None:
    with pytest.raises(OptionsError, match="at most 16"):
        build_engine(EngineOptions(context_length=64, max_running_requests=1, speculative_algorithm="dflash",
                                   speculative_draft_model_path=str(drafter_dir), speculative_num_draft_tokens=17))
