"""Request sets and arrival schedules for `netra bench serve`, in the terms of `sglang.bench_serving`
and `vllm bench serve`.

Datasets (each item carries its own exact expectations: prompt tokens and output tokens):

- ``random``: token-ID prompts (`netra.bench.corpus`). ``--range-ratio r`` < 1 draws each request's
  input and output lengths uniformly from ``[int(I·r), I]`` and ``[int(O·r), O]`` (SGLang's
  ``--random-range-ratio``); r = 1 is the fixed-length corpus.
- ``shared-prefix``: ``--num-prefixes G`` random prefixes of ``--prefix-len P`` tokens; request j is
  prefix ``j mod G`` followed by its own I random tokens (SGLang's generated-shared-prefix). A prefix
  cache may then report cached tokens, so the zero-cached check is off for this dataset.
- ``sharegpt``: a ShareGPT-format JSON file (``--dataset-path``: a list of ``{"conversations":
  [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``); each conversation's
  first human turn is the prompt and the length of the reply that follows, in the model's tokens, is
  the output length; pairs with fewer than 4 tokens on either side or more than 1024 prompt / 2048
  total tokens are skipped (SGLang's filter); the file is shuffled with ``--seed``.

With ``--api chat`` a prompt is text: random and shared-prefix token IDs are decoded with the
model's tokenizer, and the expected prompt tokens are those of the chat template's rendering, which
the response layer computes the same way (`netra.serve.tokenizer`, loaded from the worker's
``/model_info``).

Arrivals: ``--request-rate R`` (requests/s, ``inf`` = all at once, the closed loop of
``--concurrency`` streams) with gamma-distributed gaps of shape ``--burstiness B`` and mean 1/R
(B = 1: Poisson; B < 1 burstier; B > 1 more regular), as vLLM and SGLang draw them; ``--concurrency``
stays the cap on requests in flight.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and the corpus load when a run starts, not for `--help`
    import numpy as np

    from netra.bench import corpus

DATASETS = ("random", "shared-prefix", "sharegpt")
MIN_TOKENS, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048  # SGLang's ShareGPT filter


class DatasetError(ValueError):
    pass


@dataclass(frozen=True)
class LoadSpec:
    dataset: str = "random"
    range_ratio: float = 1.0
    prefix_len: int = 0
    num_prefixes: int = 1
    dataset_path: str | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0

    def validate(self) -> None:
        if self.dataset not in DATASETS:
            raise DatasetError(f"--dataset {self.dataset!r}: expected one of {DATASETS}")
        if not 0 < self.range_ratio <= 1:
            raise DatasetError(f"--range-ratio {self.range_ratio}: expected 0 < r <= 1")
        if self.dataset == "shared-prefix" and (self.prefix_len < 1 or self.num_prefixes < 1):
            raise DatasetError("--dataset shared-prefix needs --prefix-len >= 1 and --num-prefixes >= 1")
        if self.dataset == "sharegpt" and not self.dataset_path:
            raise DatasetError("--dataset sharegpt needs --dataset-path FILE")
        if not self.request_rate > 0:
            raise DatasetError(f"--request-rate {self.request_rate}: expected > 0 (inf: all at once)")
        if not self.burstiness > 0:
            raise DatasetError(f"--burstiness {self.burstiness}: expected > 0")


def arrivals(n: int, rate: float, burstiness: float, seed: int) -> list[float] | None:
    """Send offsets (s) of n requests from the common start, or None for the closed loop."""
    if math.isinf(rate):
        return None
    import numpy as np

    rng = np.random.default_rng(seed + 1)  # its own stream: the corpus draw stays the same
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return [0.0, *np.cumsum(gaps[:-1]).tolist()] if n else []


def _lengths(n: int, length: int, ratio: float, rng: np.random.Generator) -> list[int]:
    if ratio >= 1:
        return [length] * n
    return rng.integers(max(1, int(length * ratio)), length + 1, size=n).tolist()


def build(spec: LoadSpec, cspec: corpus.CorpusSpec, output_len: int, chat: Any | None,
          tokenizer: Any | None) -> list[dict[str, Any]]:
    """The request items, in arrival order: ``input_ids`` or ``text``, ``prompt_len`` (exact expected
    prompt tokens, or None when the server's count cannot be known here) and ``output_len``.

    ``chat``: a callable rendering a user message to the chat prompt's token IDs (``--api chat``);
    ``tokenizer``: the model's (encode / decode), needed for chat prompts and ShareGPT."""
    import numpy as np

    from netra.bench import corpus

    spec.validate()
    cspec.validate()
    per_worker = cspec.requests // cspec.workers
    rng = np.random.default_rng(cspec.seed)
    pool = corpus.allowed_ids(cspec)
    if spec.dataset == "sharegpt":
        if tokenizer is None:
            raise DatasetError("--dataset sharegpt needs the model's tokenizer (the worker's /model_info)")
        items = _sharegpt(Path(str(spec.dataset_path)), per_worker, cspec.seed, tokenizer)
    elif spec.dataset == "random" and spec.range_ratio >= 1:
        prompts = corpus.build_corpus(corpus.CorpusSpec(**{**cspec.__dict__, "requests": per_worker, "workers": 1}))
        items = [{"input_ids": p, "output_len": output_len} for p in prompts]
    else:
        ins = _lengths(per_worker, cspec.input_len, spec.range_ratio, rng)
        outs = _lengths(per_worker, output_len, spec.range_ratio, rng)
        prefixes = [pool[rng.integers(0, pool.size, size=spec.prefix_len)].tolist()
                    for _ in range(spec.num_prefixes)] if spec.dataset == "shared-prefix" else [[]]
        items = [{"input_ids": prefixes[j % len(prefixes)] + pool[rng.integers(0, pool.size, size=n)].tolist(),
                  "output_len": o} for j, (n, o) in enumerate(zip(ins, outs, strict=True))]
    for item in items:
        if "input_ids" in item:
            item["prompt_len"] = len(item["input_ids"])
        if chat is not None:
            if "text" not in item:
                if tokenizer is None:
                    raise DatasetError("--api chat needs the model's tokenizer (the worker's /model_info)")
                item["text"] = tokenizer.decode(item.pop("input_ids"), skip_special_tokens=True)
            item["prompt_len"] = len(chat(item["text"]))
        elif "input_ids" not in item:
            item["input_ids"] = tokenizer.encode(item.pop("text"))  # type: ignore[union-attr]
            item["prompt_len"] = len(item["input_ids"])
    # Round robin: copies j*W .. j*W+W-1 of item j (each its own dict: arrivals differ per copy).
    return [dict(items[j // cspec.workers]) for j in range(cspec.requests)]


def _sharegpt(path: Path, n: int, seed: int, tokenizer: Any) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"--dataset-path {path}: {exc}") from exc
    if not isinstance(data, list):
        raise DatasetError(f"--dataset-path {path}: expected a JSON list of conversations")
    pairs = []
    for conv in data:
        turns = (conv.get("conversations") or conv.get("conversation") or []) if isinstance(conv, dict) else []
        texts = [(t.get("from") or t.get("role"), t.get("value") or t.get("content")) for t in turns
                 if isinstance(t, dict)]
        for (who, prompt), (who2, reply) in itertools.pairwise(texts):
            if who in ("human", "user") and who2 in ("gpt", "assistant") and prompt and reply:
                pairs.append((str(prompt), str(reply)))
                break
    random.Random(seed).shuffle(pairs)
    items = []
    for prompt, reply in pairs:
        p, o = len(tokenizer.encode(prompt)), len(tokenizer.encode(reply))
        if p < MIN_TOKENS or o < MIN_TOKENS or p > MAX_PROMPT or p + o > MAX_TOTAL:
            continue
        items.append({"text": prompt, "output_len": o})
        if len(items) == n:
            return items
    raise DatasetError(f"--dataset-path {path}: {len(items)} usable conversations, {n} needed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LoadSpec()
    p.add_argument("--dataset", choices=DATASETS, default=d.dataset, help="request set (netra/bench/datasets.py)")
    p.add_argument("--range-ratio", type=float, default=d.range_ratio,
                   help="random/shared-prefix: lengths drawn from [int(L*r), L] (1: fixed)")
    p.add_argument("--prefix-len", type=int, default=d.prefix_len, help="shared-prefix: tokens per shared prefix")
    p.add_argument("--num-prefixes", type=int, default=d.num_prefixes, help="shared-prefix: distinct prefixes")
    p.add_argument("--dataset-path", default=None, help="sharegpt: a ShareGPT-format JSON file")
    p.add_argument("--request-rate", type=float, default=d.request_rate,
                   help="requests/s with gamma (Poisson at burstiness 1) gaps; inf: closed loop")
    p.add_argument("--burstiness", type=float, default=d.burstiness, help="gamma shape of the gaps (1: Poisson)")
    p.add_argument("--slo", default=None, metavar="ttft_ms=..,tpot_ms=..",
                   help="goodput: requests/s meeting every objective (ttft_ms, tpot_ms, itl_ms max, e2e_ms)")


def spec_from_args(args: argparse.Namespace) -> LoadSpec:
    return LoadSpec(dataset=args.dataset, range_ratio=args.range_ratio, prefix_len=args.prefix_len,
                    num_prefixes=args.num_prefixes, dataset_path=args.dataset_path, request_rate=args.request_rate,
                    burstiness=args.burstiness)


SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def parse_slo(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        try:
            out[key] = float(value)
        except ValueError:
            raise DatasetError(f"--slo {text!r}: {part!r} is not KEY=MILLISECONDS") from None
        if key not in SLO_KEYS or out[key] <= 0:
            raise DatasetError(f"--slo {text!r}: keys are {SLO_KEYS}, values > 0")
    return out
