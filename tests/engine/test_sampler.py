"""The per-slot sampler: penalties, logit bias, min-tokens, grammar masks and logprobs against plain
formulas written out here, padded rows inert, and the greedy path untouched."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from netra.engine.cache import PAD_SLOT
from netra.engine.grammar import Grammar, GrammarError, grammar_tokenizer
from netra.engine.request import SamplingParams
from netra.engine.sampler import TOP_LOGPROBS_MAX, SlotSampler, StepVariant
from netra.ops import sampling
from netra.tokenizers import ByteTokenizer
from tests.reference import penalized

V = 264
EOS = 257


def _sampler(slots: int = 4) -> SlotSampler:
    return SlotSampler(slots, V, torch.device("cpu"), (EOS,))


def test_penalties_follow_the_formula_step_by_step_and_pad_rows_stay_inert() -> None:
    gen = torch.Generator().manual_seed(0)
    s = _sampler()
    p1 = SamplingParams(temperature=0.0, frequency_penalty=0.7, presence_penalty=0.4, repetition_penalty=1.3,
                        min_new_tokens=3, logit_bias=((65, 2.5), (66, -100.0)), stop_token_ids=(10,))
    p2 = SamplingParams(temperature=0.9, frequency_penalty=-0.5, repetition_penalty=0.8, sampling_seed=5)
    s.admit(1, p1, 11, None)
    s.admit(3, p2, 5, None)
    slots = torch.tensor([1, 3, PAD_SLOT, PAD_SLOT])
    history: dict[int, list[int]] = {1: [], 3: []}
    variant = StepVariant(greedy=False, processed=True, logprobs=True)
    for step in range(12):
        logits = torch.randn(4, V, generator=gen) * 3
        # make the penalised tokens likely so the penalties decide something
        logits[:, 65] += 4
        logits[:, EOS] += 6 if step < 4 else 0
        res = s.step(logits, slots, variant)
        for row, slot, p in ((0, 1, p1), (1, 3, p2)):
            ref = penalized(logits[row].tolist(), history[slot], p, EOS)
            ref_t = torch.tensor(ref, dtype=torch.float32)
            if p.temperature == 0:
                want = int(torch.argmax(ref_t))
            else:
                want = int(sampling.sample_ref(ref_t[None], torch.tensor([p.temperature]), torch.tensor([-1]),
                                               torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([5]),
                                               torch.tensor([len(history[slot])]))[0])
            assert int(res.tokens[row]) == want, (step, slot)
            # logprobs: log-softmax of the same processed logits, in float64
            ref64 = torch.log_softmax(torch.tensor(ref, dtype=torch.float64), -1)
            assert abs(float(res.logprob[row]) - float(ref64[want])) < 1e-4  # type: ignore[index]
            top = torch.topk(ref64, TOP_LOGPROBS_MAX)
            assert set(res.top_ids[row].tolist()) == set(top.indices.tolist())  # type: ignore[index]
            assert torch.allclose(res.top_values[row].double(), top.values, atol=1e-4)  # type: ignore[index]
            if step < 3 and slot == 1:
                assert want not in (EOS, 10)  # min_new_tokens holds the stop tokens back
            assert want != 66 or slot != 1
            history[slot].append(want)
    for slot in (1, 3):
        counts = torch.bincount(torch.tensor(history[slot]), minlength=V).to(torch.int32)
        assert torch.equal(s.counts[slot], counts)
        assert int(s.out_len[slot]) == 12
    # the pad slot gathered neutral state and its counters never moved
    assert int(s.counts[PAD_SLOT].sum()) == 0 and int(s.out_len[PAD_SLOT]) == 0


def test_neutral_rows_are_unchanged_bit_for_bit_and_greedy_matches_argmax() -> None:
    s = _sampler()
    s.admit(2, SamplingParams(temperature=0.0), 0, None)
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    slots = torch.tensor([2, PAD_SLOT, PAD_SLOT])
    plain = s.step(logits, slots, StepVariant(greedy=True, processed=False, logprobs=False))
    processed = s.step(logits, slots, StepVariant(greedy=True, processed=True, logprobs=False))
    assert torch.equal(plain.tokens, logits.argmax(-1)) and torch.equal(processed.tokens, plain.tokens)
    x = sampling.process_logits_ref(logits, s.counts[[3, 3, 3]], torch.zeros(3), torch.zeros(3), torch.ones(3),
                                    torch.zeros(3, dtype=torch.bool), torch.ones(3, V, dtype=torch.bool),
                                    torch.full((3, 9), -1, dtype=torch.int32), torch.ones(3, dtype=torch.bool),
                                    torch.zeros(3, V))
    assert torch.equal(x, logits)


def test_readmitting_a_slot_forgets_the_previous_request() -> None:
    s = _sampler()
    s.admit(1, SamplingParams(temperature=0.0, frequency_penalty=2.0, logit_bias=((7, 50.0),)), 0, None)
    logits = torch.zeros(1, V)
    assert int(s.step(logits, torch.tensor([1]), StepVariant(True, True, False)).tokens[0]) == 7
    s.release(1)
    s.admit(1, SamplingParams(temperature=0.0), 0, None)
    assert int(s.counts[1].sum()) == 0 and float(s.bias[1].abs().sum()) == 0.0 and int(s.out_len[1]) == 0


def test_unpack_bitmask_matches_bits() -> None:
    bits = torch.randint(-(2**31), 2**31 - 1, (3, 9), dtype=torch.int32, generator=torch.Generator().manual_seed(2))
    got = sampling.unpack_bitmask_ref(bits, V)
    for r in range(3):
        for t in range(V):
            assert bool(got[r, t]) == bool((int(bits[r, t // 32]) >> (t % 32)) & 1)
    assert not bool(sampling.unpack_bitmask_ref(bits[:, :2], V)[:, 64:].any())  # past the words: banned


def _grammar(kind: str, text: str) -> Grammar:
    return Grammar(grammar_tokenizer(ByteTokenizer(), V, (EOS,)), kind, text)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grammar_mask_forces_schema_valid_json_from_random_logits(temperature: float) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"},
                                               "tag": {"enum": ["red", "green"]}},
              "required": ["n", "ok", "tag"], "additionalProperties": False}
    gen = torch.Generator().manual_seed(3)
    for trial in range(5):
        s = _sampler()
        g = _grammar("json_schema", json.dumps(schema))
        p = SamplingParams(temperature=temperature)
        s.admit(2, p, trial, g)
        out: list[int] = []
        for _ in range(200):
            s.prepare([2])
            tok = int(s.step(torch.randn(2, V, generator=gen) * 4, torch.tensor([2, PAD_SLOT]),
                             s.variant([p], [2])).tokens[0])
            assert g.accept(tok)
            if tok == EOS:
                break
            out.append(tok)
        obj = json.loads(bytes(out).decode())
        assert set(obj) == {"n", "ok", "tag"} and 0 <= obj["n"] <= 99 and obj["tag"] in ("red", "green")
        assert isinstance(obj["ok"], bool)


def test_invalid_grammars_are_refused_with_their_error() -> None:
    with pytest.raises(GrammarError, match="json_schema"):
        _grammar("json_schema", "{not json")
    with pytest.raises(GrammarError, match="regex"):
        _grammar("regex", "(unclosed")
    g = _grammar("regex", "[ab]{3}")
    assert g.accept(ord("a")) and not g.done and g.accept(ord("b")) and g.accept(ord("a"))
    assert not g.accept(ord("a"))  # a fourth letter is outside the language


def test_variant_is_plain_argmax_only_without_any_processing() -> None:
    s = _sampler()
    greedy = SamplingParams(temperature=0.0)
    assert s.variant([greedy], [1]) == StepVariant(True, False, False)
    assert s.variant([replace(greedy, presence_penalty=0.1)], [1]).processed
    assert s.variant([replace(greedy, return_logprob=True)], [1]) == StepVariant(True, False, True)
    s.admit(1, greedy, 0, _grammar("regex", "a+"))
    assert s.variant([greedy], [1]).processed


def test_grammar_after_reasoning_allows_everything_until_the_close_tag() -> None:
    """SGLang's --reasoning-parser semantics: with the end sequence given, the mask is all-allowed and
    tokens are not fed to the grammar until the model wrote it; then the grammar constrains."""
    end = tuple(b"</think>")  # the byte vocabulary spells it in 8 tokens
    g = Grammar(grammar_tokenizer(ByteTokenizer(), V, (EOS,)), "regex", "[0-9]{2}", end)
    bits = torch.zeros(1, (V + 31) // 32, dtype=torch.int32)
    for tok in b"free text, </thin </ and digits 12 ":
        g.fill_mask(bits, 0)
        assert bool(sampling.unpack_bitmask_ref(bits, V).all())  # nothing is constrained in the reasoning
        assert g.accept(tok) and not g.done
    for tok in end:
        assert g.accept(tok)
    assert not g.reasoning
    g.fill_mask(bits, 0)
    allowed = sampling.unpack_bitmask_ref(bits, V)[0]
    assert {int(t) for t in allowed.nonzero()} == set(b"0123456789")
    assert g.accept(ord("4")) and g.accept(ord("2")) and g.done
    plain = _grammar("regex", "[0-9]{2}")  # without the end sequence: constrained from the first token
    assert not plain.accept(ord("f"))
