"""Tokenizers: a byte-level one for presets without a checkpoint, a checkpoint's ``tokenizer.json`` otherwise.

Both expose `encode`, `decode` and `stable_prefix`: streaming text must never take back what it sent,
so an event's text covers only tokens whose bytes decode completely (an incomplete UTF-8 sequence
at the end waits for the next token; the final event decodes everything).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

# Byte tokenizer layout: ids 0..255 are bytes; specials follow.
BYTE_SPECIALS = ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                 "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>", "<|reserved_3|>")
BYTE_EOS = 257


class IncrementalDecoder(Protocol):
    text: str  # everything emitted so far

    def push(self, ids: list[int], final: bool) -> str:
        """Append tokens; returns the newly stable text (everything left when ``final``)."""
        ...


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True, final: bool = True) -> str: ...

    def incremental(self, skip_special_tokens: bool = True) -> IncrementalDecoder: ...


class _ByteIncremental:
    """Linear-time streaming decode: only the not-yet-complete UTF-8 tail is kept between pushes."""

    def __init__(self, skip_special_tokens: bool) -> None:
        self.skip = skip_special_tokens
        self.buf = bytearray()
        self.text = ""

    def push(self, ids: list[int], final: bool) -> str:
        parts: list[str] = []
        for i in ids:
            if 0 <= i < 256:
                self.buf.append(i)
                continue
            parts.append(self.buf.decode("utf-8", errors="replace"))
            self.buf.clear()
            if not self.skip and 256 <= i < ByteTokenizer.vocab_size:
                parts.append(BYTE_SPECIALS[i - 256])
        cut = len(self.buf) if final else _complete_utf8_length(bytes(self.buf))
        parts.append(self.buf[:cut].decode("utf-8", errors="replace"))
        del self.buf[:cut]
        new = "".join(parts)
        self.text += new
        return new


class _FullIncremental:
    """Generic streaming decode for tokenizers whose output is not prefix-stable token by token:
    decode everything, emit the extension of what was sent (quadratic, done in the Rust library)."""

    def __init__(self, tok: Tokenizer, skip_special_tokens: bool) -> None:
        self.tok, self.skip = tok, skip_special_tokens
        self.ids: list[int] = []
        self.text = ""

    def push(self, ids: list[int], final: bool) -> str:
        self.ids.extend(ids)
        full = self.tok.decode(self.ids, skip_special_tokens=self.skip, final=final)
        new = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += new
        return new


class ByteTokenizer:
    name = "byte"
    vocab_size = 256 + len(BYTE_SPECIALS)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def incremental(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return _ByteIncremental(skip_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True, final: bool = True) -> str:
        """Text of ``ids``; with ``final=False`` a trailing incomplete UTF-8 sequence is held back."""
        parts: list[str] = []
        buf = bytearray()
        for i in ids:
            if 0 <= i < 256:
                buf.append(i)
                continue
            parts.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if not skip_special_tokens and 256 <= i < self.vocab_size:
                parts.append(BYTE_SPECIALS[i - 256])
        if not final:
            buf = buf[:_complete_utf8_length(bytes(buf))]
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)


def _complete_utf8_length(b: bytes) -> int:
    """Length of the longest prefix of ``b`` that does not end inside a (still completable) UTF-8 sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return n - back if need > back else n
    return n


class HFTokenizer:
    """A checkpoint's ``tokenizer.json`` through the `tokenizers` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.name = str(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True, final: bool = True) -> str:
        text: str = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        if not final:
            text = text.rstrip("\ufffd")  # an incomplete multi-byte character decodes as U+FFFD
        return text


    def incremental(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return _FullIncremental(self, skip_special_tokens)


def load_tokenizer(checkpoint: Path | None) -> Tokenizer:
    if checkpoint is not None and (checkpoint / "tokenizer.json").is_file():
        return HFTokenizer(checkpoint / "tokenizer.json")
    return ByteTokenizer()
