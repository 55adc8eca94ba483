"""Tokenizers, one module for the engine and the response layer: a byte-level one for presets without a
checkpoint, a checkpoint's ``tokenizer.json`` otherwise.

Both expose `encode`, `decode` and `incremental`: streaming text must never take back what it sent,
so an event's text covers only tokens whose bytes decode completely (an incomplete UTF-8 sequence
at the end waits for the next token; the final event decodes everything). The response layer also
reads a byte-level BPE token's exact bytes (`HFTokenizer.token_bytes`, for logprobs) and the added
tokens' spellings (`HFTokenizer.added_tokens`, which llguidance treats as special).
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


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for bytes, as byte-level BPE vocabularies spell their tokens."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


class HFTokenizer:
    """A checkpoint's ``tokenizer.json`` through the `tokenizers` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.name = str(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # The longest token's spelling bounds the characters one token decodes to (byte-level
        # spellings use one character per byte; SentencePiece ones one per character).
        self.max_token_chars = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)
        # The added tokens' spellings: llguidance reads each as a special token, which a quoted string in a
        # grammar never matches (a forced tool call's <tool_call> must name the token: netra/serve/tools.py).
        self.added_tokens = frozenset(t.content for t in self._tok.get_added_tokens_decoder().values())

    def encode(self, text: str) -> list[int]:
        # Chat templates write their special tokens themselves: add none here.
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True, final: bool = True) -> str:
        text: str = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if not final:
            text = text.rstrip("\ufffd")  # an incomplete multi-byte character decodes as U+FFFD
        return text

    def incremental(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return _FullIncremental(self, skip_special_tokens)

    def token_bytes(self, tid: int) -> bytes | None:
        """A byte-level BPE token's exact bytes (a token may hold part of a UTF-8 character), or None
        when the token is not spelled in the byte-level alphabet (a special token, another scheme)."""
        piece = self._tok.id_to_token(tid)
        if piece is None or any(ch not in _UNICODE_TO_BYTE for ch in piece):
            return None
        return bytes(_UNICODE_TO_BYTE[ch] for ch in piece)


def load_tokenizer(checkpoint: Path | None) -> Tokenizer:
    if checkpoint is not None and (checkpoint / "tokenizer.json").is_file():
        return HFTokenizer(checkpoint / "tokenizer.json")
    return ByteTokenizer()
