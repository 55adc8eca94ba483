from __future__ import annotations

import random

from netra.tokenizers import BYTE_EOS, ByteTokenizer


def test_byte_tokenizer_roundtrip_and_specials() -> None:
    t = ByteTokenizer()
    assert t.vocab_size == 264 and BYTE_EOS == 257
    assert t.encode("héllo €") == list("héllo €".encode())
    assert t.decode(t.encode("héllo €")) == "héllo €"
    assert t.decode([104, 257, 105]) == "hi"
    assert t.decode([104, 257, 105], skip_special_tokens=False) == "h<|endoftext|>i"
    euro = t.encode("€")
    assert t.decode(euro[:2], final=False) == "" and t.decode(euro[:2]) == "\ufffd"


def test_incremental_decode_equals_full_decode() -> None:
    t = ByteTokenizer()
    rng = random.Random(0)
    pool = [0xE2, 0x82, 0xAC, 0xC3, 0xA9, 0xF0, 0x9F, 0x80, 0xFF]
    for trial in range(1500):
        skip = trial % 2 == 0
        ids = [rng.choice([rng.randrange(256), rng.randrange(264), rng.choice(pool)]) for _ in range(rng.randrange(1, 30))]
        dec = t.incremental(skip_special_tokens=skip)
        parts, i = [], 0
        while i < len(ids):
            n = rng.randrange(1, 4)
            parts.append(dec.push(ids[i:i + n], final=i + n >= len(ids)))
            i += n
        full = t.decode(ids, skip_special_tokens=skip)
        assert "".join(parts) == full == dec.text, ids
        # before the end, the stable text is always a prefix of the final text
        dec2 = t.incremental(skip_special_tokens=skip)
        dec2.push(ids[:-1], final=False)
        assert full.startswith(dec2.text)
