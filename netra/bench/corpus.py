"""Deterministic token-ID corpus with exact prompt lengths, balanced for round-robin routing.

The article's DP8 benchmark repeated one per-worker corpus W times and interleaved the copies, so
that a round-robin front delivers the same prompts to every worker: request ``j`` carries prompt
``j // W`` of the per-worker corpus, and arrivals ``p*W .. p*W+W-1`` are the W copies of prompt
``p``. With random content and fixed I/O lengths every request is the same work anyway; the
interleaving also removes content skew. With ``workers == 1`` every prompt is distinct.

Token IDs are drawn uniformly from ``[low, high)`` minus the IDs to avoid (EOS and other special
tokens), so the prompt is valid for the target's vocabulary and never contains a stop token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class CorpusError(ValueError):
    pass


@dataclass(frozen=True)
class CorpusSpec:
    requests: int
    input_len: int
    vocab_size: int
    workers: int = 1
    seed: int = 0
    low: int = 0  # smallest token ID drawn
    high: int | None = None  # one past the largest token ID drawn (default vocab_size)
    avoid_ids: tuple[int, ...] = ()

    def validate(self) -> None:
        if self.requests < 1:
            raise CorpusError(f"requests must be >= 1, got {self.requests}")
        if self.input_len < 1:
            raise CorpusError(f"input_len must be >= 1, got {self.input_len}")
        if self.workers < 1:
            raise CorpusError(f"workers must be >= 1, got {self.workers}")
        if self.requests % self.workers:
            raise CorpusError(f"requests ({self.requests}) must be a multiple of workers ({self.workers}) "
                              "so that round robin gives every worker the same work")
        if self.vocab_size < 2:
            raise CorpusError(f"vocab_size must be >= 2, got {self.vocab_size}")
        high = self.vocab_size if self.high is None else self.high
        if not 0 <= self.low < high <= self.vocab_size:
            raise CorpusError(f"token range [{self.low}, {high}) must lie inside the vocabulary [0, {self.vocab_size})")


def allowed_ids(spec: CorpusSpec) -> np.ndarray:
    high = spec.vocab_size if spec.high is None else spec.high
    ids = np.arange(spec.low, high, dtype=np.int64)
    if spec.avoid_ids:
        ids = ids[~np.isin(ids, np.asarray(spec.avoid_ids, dtype=np.int64))]
    if ids.size == 0:
        raise CorpusError("no token IDs left to draw from after removing the avoided IDs")
    return ids


def build_corpus(spec: CorpusSpec) -> list[list[int]]:
    """``requests`` prompts of exactly ``input_len`` IDs; request j is per-worker prompt j // workers."""
    spec.validate()
    pool = allowed_ids(spec)
    per_worker = spec.requests // spec.workers
    rng = np.random.default_rng(spec.seed)
    # One draw for the whole per-worker corpus: the same seed gives the same corpus on every machine
    # (numpy's PCG64 stream is stable across platforms and versions).
    draws = pool[rng.integers(0, pool.size, size=(per_worker, spec.input_len))]
    prompts = [row.tolist() for row in draws]
    return [prompts[j // spec.workers] for j in range(spec.requests)]


def split(count: int, parts: int) -> list[int]:
    """Split ``count`` into ``parts`` near-equal non-negative integers (the first ones get the remainder)."""
    if parts < 1:
        raise CorpusError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(count, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def assign_clients(requests: int, clients: int) -> list[list[int]]:
    """Request indices per client: client k takes j = k, k+K, k+2K, ... so that, with all clients
    released together and sending in index order, arrivals at the front follow the corpus order."""
    return [list(range(k, requests, clients)) for k in range(clients)]
