"""Stream translation against plain-Python references: tokens once, text exact, stops exact."""

from __future__ import annotations

import random
from typing import Any

import pytest

from netra.serve.fakeworker import TEXT, write_tokenizer
from netra.serve.stream import IncrementalDetokenizer, StopMatcher, TokenTracker, UpstreamProtocolError
from netra.tokenizers import HFTokenizer


def native_events(out: list[int], counted: int, finish: dict[str, Any], chunks: list[int],
                  incremental: bool, trim: bool) -> list[dict[str, Any]]:
    """A worker's events for output `out` (the matched stop token, if any, is out[-1] and counted)."""
    events = []
    sent = 0
    step = 0
    for k, size in enumerate(chunks):
        step = min(counted, step + size)
        last = k == len(chunks) - 1
        shown_end = step - 1 if (last and trim) else step
        ids = out[sent:shown_end] if incremental else out[:shown_end]
        events.append({"output_ids": ids, "meta_info": {"completion_tokens": step,
                                                        "finish_reason": finish if last else None}})
        sent = step
    return events


def random_chunks(rng: random.Random, total: int) -> list[int]:
    chunks, left = [], total
    while left > 0:
        c = rng.randint(1, 5)
        chunks.append(min(c, left))
        left -= c
    return chunks or [0]


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("trim", [False, True])
def test_tracker_reconstructs_each_token_once(incremental: bool, trim: bool) -> None:
    rng = random.Random(1 + incremental + 2 * trim)
    for _ in range(200):
        n = rng.randint(1, 40)
        out = [rng.randrange(1000) for _ in range(n)]
        finish = {"type": "stop", "matched": out[-1]} if trim else {"type": "length", "length": n}
        events = native_events(out, n, finish, random_chunks(rng, n), incremental, trim)
        tracker = TokenTracker()
        got: list[int] = []
        for ev in events:
            got += tracker.feed(ev).new_ids
        expected = out[:-1] if trim else out
        assert got == expected
        assert tracker.completion_tokens == n
        assert tracker.finished
        if len(events) > 1 and not (trim and len(events) == 2 and events[0]["meta_info"]["completion_tokens"] == 1):
            # Two events tell the modes apart unless the only evidence is the shared first token.
            assert tracker.mode == ("incremental" if incremental else "cumulative") or events[0]["output_ids"] == []


def test_tracker_ambiguous_trimmed_stop_resolved_by_prefix() -> None:
    # After one token, a final trimmed stop event of 1 id fits both readings; the prefix decides.
    t = TokenTracker()
    t.feed({"output_ids": [5], "meta_info": {"completion_tokens": 1, "finish_reason": None}})
    p = t.feed({"output_ids": [5], "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "stop"}}})
    assert p.new_ids == [] and t.mode == "cumulative"  # cumulative [5] with the stop token trimmed
    t = TokenTracker()
    t.feed({"output_ids": [5], "meta_info": {"completion_tokens": 1, "finish_reason": None}})
    p = t.feed({"output_ids": [9], "meta_info": {"completion_tokens": 2, "finish_reason": {"type": "stop"}}})
    assert p.new_ids == [9] and t.mode == "incremental"


@pytest.mark.parametrize("events,needle", [
    ([{"output_ids": [1, 2], "meta_info": {"completion_tokens": 2, "finish_reason": None}},
      {"output_ids": [1], "meta_info": {"completion_tokens": 1, "finish_reason": None}}], "went back"),
    ([{"output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 2, "finish_reason": None}}], "fits neither"),
    ([{"output_ids": [1], "meta_info": {"completion_tokens": 1, "finish_reason": {"type": "length"}}},
      {"output_ids": [1], "meta_info": {"completion_tokens": 1, "finish_reason": None}}], "after the final"),
    ([{"output_ids": [1]}], "lacks"),
    # Cumulative, then an event that is neither the whole output nor just the suffix.
    ([{"output_ids": [1, 2], "meta_info": {"completion_tokens": 2, "finish_reason": None}},
      {"output_ids": [1, 2, 3, 4], "meta_info": {"completion_tokens": 4, "finish_reason": None}},
      {"output_ids": [5, 6], "meta_info": {"completion_tokens": 7, "finish_reason": None}}], "fits neither"),
])
def test_tracker_rejects_contract_breaks(events: list[dict[str, Any]], needle: str) -> None:
    t = TokenTracker()
    with pytest.raises(UpstreamProtocolError, match=needle):
        for ev in events:
            t.feed(ev)


def _byte_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", "replace")


@pytest.mark.parametrize("source", ["text", "random"])
def test_detokenizer_concatenation_equals_whole_decode(source: str) -> None:
    rng = random.Random(7)
    for _ in range(300):
        if source == "text":
            starts = [i for i, b in enumerate(TEXT) if b & 0xC0 != 0x80]  # character boundaries
            start = rng.choice(starts)
            ids = list((TEXT * 3)[start:start + rng.randint(1, 120)])
        else:
            ids = [rng.randrange(256) for _ in range(rng.randint(1, 60))]
        d = IncrementalDetokenizer(_byte_decode)
        parts = []
        i = 0
        while i < len(ids):
            k = rng.randint(1, 4)
            parts.append(d.push(ids[i:i + k]))
            i += k
        parts.append(d.flush())
        assert "".join(parts) == _byte_decode(ids)
        if source == "text":
            # Whole characters only: a delta never carries a replacement for a split character.
            assert all("\ufffd" not in p for p in parts[:-1])


def test_detokenizer_with_hf_byte_level_tokenizer(tmp_path: Any) -> None:
    tok = HFTokenizer(write_tokenizer(tmp_path) / "tokenizer.json")
    ids = list(TEXT)
    assert tok.decode(ids) == TEXT.decode()
    d = IncrementalDetokenizer(lambda x: tok.decode(x))
    parts = [d.push([t]) for t in ids] + [d.flush()]
    assert "".join(parts) == TEXT.decode()
    # '日' is 3 bytes: its first two tokens emit nothing, the third emits the character.
    j = TEXT.index("日".encode())
    d2 = IncrementalDetokenizer(lambda x: tok.decode(x))
    assert [d2.push([t]) for t in TEXT[j:j + 3]] == ["", "", "日"]


def _stop_reference(text: str, stops: list[str], keep: bool) -> tuple[str, str | None]:
    """Character by character: stop at the first position where a stop string ends (longest on ties)."""
    for end in range(1, len(text) + 1):
        for s in sorted(stops, key=len, reverse=True):
            if text[:end].endswith(s):
                return text[: end if keep else end - len(s)], s
    return text, None


@pytest.mark.parametrize("keep", [False, True])
def test_stop_matcher_against_reference(keep: bool) -> None:
    rng = random.Random(11)
    alphabet = "abcab日 "
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        m = StopMatcher(stops, keep_stop=keep)
        parts = []
        i = 0
        while i < len(text):
            k = rng.randint(1, 5)
            parts.append(m.push(text[i:i + k]))
            i += k
        parts.append(m.flush())
        expected, matched = _stop_reference(text, stops, keep)
        assert "".join(parts) == expected, (text, stops)
        assert m.matched == matched


def test_stop_matcher_holds_back_only_possible_prefixes() -> None:
    m = StopMatcher(["END"])
    assert m.push("abcE") == "abc"
    assert m.push("N") == ""
    assert m.push("x") == "ENx"
    assert m.push("yEND tail") == "y"
    assert m.matched == "END"
    assert m.push("more") == "" and m.flush() == ""
