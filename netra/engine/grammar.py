"""Structured output through llguidance: JSON schema, regular expression and Lark/GBNF grammars.

Why llguidance (docs/engine.md, "Structured output"): its wheel has no Python dependencies and
installs on any CPU machine; it computes each step's token mask lazily from a token trie (its
authors' per-mask figure: results/serving/NOTES.md) with no per-grammar pass over the
vocabulary, so a new schema costs milliseconds; it takes JSON schema, regex and Lark (with embedded ``%json``) grammars; it
is one of SGLang 0.5.23's grammar backends (``--grammar-backend llguidance``), so the embedded
engine and an SGLang worker read the same grammar text the same way. xgrammar needs torch,
transformers and triton at install time; outlines-core builds an index over the whole vocabulary
for each regex before the first token.

A `Grammar` is compiled when the request arrives (an invalid one is refused with its error) and
lives with the request: the scheduler asks it for the next token mask (packed 32 tokens per int32
word, written into the slot's row of a host buffer) and tells it each sampled token.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import llguidance
import torch
from llguidance.torch import fill_next_token_bitmask

from netra.tokenizers import BYTE_SPECIALS, ByteTokenizer, HFTokenizer, Tokenizer

GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
# Compact JSON (no free whitespace between tokens): a model cannot pad the output with whitespace
# until max_tokens, and the separators are the ones json.dumps writes.
JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    pass


class _ByteVocabulary:
    """The byte tokenizer as llguidance's `TokenizerWrapper` expects it: ids 0..255 are bytes."""

    bos_token_id = None

    def __init__(self, eos: int) -> None:
        self.eos_token_id = eos
        self.tokens = [bytes([i]) for i in range(256)] + [s.encode() for s in BYTE_SPECIALS]
        self.special_token_ids = list(range(256, 256 + len(BYTE_SPECIALS)))

    def __call__(self, s: bytes) -> list[int]:
        return list(s)


_cache: dict[tuple[str, int, tuple[int, ...]], llguidance.LLTokenizer] = {}
_cache_lock = threading.Lock()


def grammar_tokenizer(tok: Tokenizer, vocab_size: int, eos_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
    """The llguidance view of the engine's tokenizer, built once (slow for a large vocabulary:
    results/serving/NOTES.md)."""
    key = (tok.name, vocab_size, eos_ids)
    with _cache_lock:
        if key not in _cache:
            if isinstance(tok, ByteTokenizer):
                wrapper = llguidance.TokenizerWrapper(_ByteVocabulary(eos_ids[0]))
                _cache[key] = llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos_ids))
            elif isinstance(tok, HFTokenizer):
                with open(tok.name, encoding="utf-8") as f:
                    text = f.read()
                _cache[key] = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos_ids))
            else:
                raise GrammarError(f"structured output needs a byte or tokenizer.json tokenizer, not {tok.name}")
        return _cache[key]


def grammar_text(kind: str, source: str) -> str:
    """llguidance's grammar for a request's ``json_schema`` / ``regex`` / ``ebnf`` (Lark or GBNF) text."""
    try:
        if kind == "json_schema":
            return str(llguidance.LLMatcher.grammar_from_json_schema(json.loads(source), defaults=JSON_OPTIONS))
        if kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(source))
        if kind == "ebnf":
            return str(llguidance.grammar_from("ebnf", source))
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"invalid {kind}: {exc}") from exc
    raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {GRAMMAR_KINDS}")


class Grammar:
    """One request's matcher: the next token mask, and each sampled token.

    With ``reasoning_end`` (the token ids of ``</think>``; SGLang's ``--reasoning-parser`` and a request's
    ``require_reasoning``), the output first runs free: every token is allowed until the model has written
    that sequence, and the grammar constrains only what follows it (the end sequence itself is not fed to
    the grammar), as SGLang's `ReasonerGrammarObject` does."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, kind: str, source: str,
                 reasoning_end: tuple[int, ...] = ()) -> None:
        self._end = reasoning_end
        self._matched = 0  # tokens of the end sequence matched so far (while reasoning)
        self.reasoning = bool(reasoning_end)
        text = grammar_text(kind, source)
        error = llguidance.LLMatcher.validate_grammar(text, tokenizer)
        if error:
            raise GrammarError(f"invalid {kind}: {error}")
        self.kind = kind
        self._m = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if self._m.is_error():
            raise GrammarError(f"invalid {kind}: {self._m.get_error()}")

    def fill_mask(self, bits: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bits[row]`` (host int32, 32 tokens per word)."""
        if self.reasoning:
            bits[row].fill_(-1)  # every bit set: nothing is constrained inside the reasoning
            return
        fill_next_token_bitmask(self._m, bits, row)

    def accept(self, token: int) -> bool:
        """Advance over a sampled token; False when the grammar cannot take it (an engine bug)."""
        if self.reasoning:
            self._advance_end(token)
            return True
        return bool(self._m.consume_token(token))

    def _advance_end(self, token: int) -> None:
        # The end sequence is short (one token in Qwen3.5/3.6's vocabulary): restart the match on a miss.
        end = self._end
        if token == end[self._matched]:
            self._matched += 1
        else:
            self._matched = 1 if token == end[0] else 0
        if self._matched == len(end):
            self.reasoning = False

    @property
    def done(self) -> bool:
        """Nothing but the end can follow (the output is complete)."""
        return not self.reasoning and bool(self._m.is_stopped())

    @property
    def error(self) -> str:
        return str(self._m.get_error()) if self._m.is_error() else ""
