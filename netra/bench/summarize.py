"""Exact checks and the one-global-window summary over all clients' per-request records.

The window runs from the earliest request start to the latest request end across every client
file; throughput is total tokens over that one window. Summing per-client rates would use K
different windows and overstate the service (the article's point); an early stop, an error or a
truncated response fails the exact checks instead of looking like speed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

PCTS = (50, 90, 95, 99)


@dataclass(frozen=True)
class Expect:
    requests: int
    input_len: int
    output_len: int
    stream_interval: int | None = None
    # The native API always reports cached_tokens; an OpenAI server may omit it (then it is counted
    # as unreported instead of failing, and the record says how many were unreported).
    cached_required: bool = True
    # Zero cached tokens (prefix cache off); a shared-prefix load may hit a prefix cache by design.
    cached_zero: bool = True


def load_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_bytes().splitlines():
            if line.strip():
                recs.append(orjson.loads(line))
    recs.sort(key=lambda r: r["idx"])
    return recs


def check_records(recs: list[dict[str, Any]], expect: Expect) -> tuple[dict[str, Any], list[str]]:
    """The exact checks. Returns (checks object for the record, failures naming each request)."""
    failures: list[str] = []
    seen = [r["idx"] for r in recs]
    dup = sorted({i for i in seen if seen.count(i) > 1}) if len(set(seen)) != len(seen) else []
    missing = sorted(set(range(expect.requests)) - set(seen))
    if len(recs) != expect.requests or missing or dup:
        failures.append(f"completed {len(recs)} of {expect.requests} requests"
                        + (f"; missing requests {missing[:20]}" if missing else "")
                        + (f"; duplicated requests {dup[:20]}" if dup else ""))
    n_err = 0
    for r in recs:
        name = f"request {r['idx']} (rid {r['rid']}, client {r['client']})"
        problems: list[str] = []
        if r.get("error"):
            problems.append(f"error: {r['error']}")
        else:
            # Each request's own expectations when the load set them (datasets of varying lengths).
            want_in = r.get("expect_prompt", expect.input_len)
            want_out = r.get("expect_output", expect.output_len)
            if r.get("prompt_tokens") != want_in:
                problems.append(f"prompt_tokens={r.get('prompt_tokens')} != input_len {want_in}")
            if r.get("completion_tokens") != want_out:
                problems.append(f"completion_tokens={r.get('completion_tokens')} != output_len {want_out}")
            if r.get("output_count") != want_out:
                problems.append(f"received {r.get('output_count')} output tokens != output_len {want_out}")
            if r.get("cached_tokens") is None and not expect.cached_required:
                pass
            elif expect.cached_zero and r.get("cached_tokens") != 0:
                problems.append(f"cached_tokens={r.get('cached_tokens')} != 0 (prefix cache must be off)")
            if r.get("finish_reason") != "length":
                problems.append(f"finish_reason={r.get('finish_reason')!r} != 'length'")
            if r.get("t_first") is None:
                problems.append("no token-bearing event")
            if expect.stream_interval:
                big = max((n for _, n in r["events"]), default=0)
                # The first event carries the prefill token alone; later ones at most S tokens.
                if big > expect.stream_interval:
                    problems.append(f"an event carried {big} tokens > stream interval {expect.stream_interval}")
        if problems:
            n_err += 1
            failures.append(f"{name}: " + "; ".join(problems))
    checks = {
        "requests_expected": expect.requests,
        "requests_completed": sum(1 for r in recs if not r.get("error")),
        "requests_failed": n_err,
        "missing_requests": len(missing),
        "prompt_tokens_total": sum(int(r.get("prompt_tokens") or 0) for r in recs),
        "completion_tokens_total": sum(int(r.get("completion_tokens") or 0) for r in recs),
        "expected_prompt_tokens_total": sum(int(r.get("expect_prompt", expect.input_len)) for r in recs)
        if len(recs) == expect.requests else expect.requests * expect.input_len,
        "expected_completion_tokens_total": sum(int(r.get("expect_output", expect.output_len)) for r in recs)
        if len(recs) == expect.requests else expect.requests * expect.output_len,
        "cached_tokens_total": sum(int(r.get("cached_tokens") or 0) for r in recs),
        "cached_tokens_unreported": sum(1 for r in recs if r.get("cached_tokens") is None),
        "passed": not failures,
    }
    return checks, failures


def _dist(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "std": None, **{f"p{p}": None for p in PCTS}, "max": None}
    arr = np.asarray(values, dtype=np.float64) * scale
    return {"mean": float(arr.mean()), "std": float(arr.std()), **{f"p{p}": float(np.percentile(arr, p)) for p in PCTS},
            "max": float(arr.max())}


def _goodput(per_request: list[dict[str, float | None]], slo: dict[str, float], window: float) -> dict[str, Any]:
    """Requests that met every objective (TTFT, TPOT, the request's largest ITL, E2E; milliseconds),
    per second of the window, as vLLM's and SGLang's goodput."""
    # A one-token request has no TPOT or ITL: nothing of it can miss those objectives.
    good = sum(1 for m in per_request if all((m.get(k) or 0.0) <= v for k, v in slo.items()))
    return {"slo": slo, "good_requests": good, "good_fraction": good / len(per_request) if per_request else None,
            "goodput_req_s": good / window if window > 0 else None}


def summarize(recs: list[dict[str, Any]], slo: dict[str, float] | None = None) -> dict[str, Any]:
    """Throughput over the global window and latency distributions (milliseconds).

    TTFT: request start to the first token-bearing event. TPOT: (end - first token) / (tokens - 1)
    per request. ITL: gap between successive token-bearing events, spread evenly over the tokens the
    later event carried (so coalesced events do not shrink the token count). E2E: start to end.
    """
    ok = [r for r in recs if not r.get("error")]
    if not ok:
        raise ValueError("no successful request to summarize")
    t0 = min(r["t_start"] for r in recs)
    t1 = max(r["t_end"] for r in recs)
    window = t1 - t0
    out_tokens = sum(int(r["completion_tokens"]) for r in ok)
    in_tokens = sum(int(r["prompt_tokens"]) for r in ok)
    body_bytes = sum(int(r["bytes"]) for r in ok)
    ttft, tpot, itl, e2e = [], [], [], []
    per_request: list[dict[str, float | None]] = []
    for r in ok:
        ttft.append(r["t_first"] - r["t_start"])
        e2e.append(r["t_end"] - r["t_start"])
        n = int(r["completion_tokens"])
        last_t = None
        gaps: list[float] = []
        for t, new in r["events"]:
            if not new:
                continue
            if last_t is not None:
                gaps.extend([(t - last_t) / new] * new)
            last_t = t
        itl.extend(gaps)
        r_tpot = (last_t - r["t_first"]) / (n - 1) if n > 1 and last_t is not None else None
        if r_tpot is not None:
            tpot.append(r_tpot)
        per_request.append({"ttft_ms": 1e3 * ttft[-1], "tpot_ms": None if r_tpot is None else 1e3 * r_tpot,
                            "itl_ms": 1e3 * max(gaps) if gaps else None, "e2e_ms": 1e3 * e2e[-1]})
    events = sum(sum(1 for _, n in r["events"] if n) for r in ok)
    return {
        "window_s": window,
        "t_first_start": t0,
        "t_last_end": t1,
        "requests_ok": len(ok),
        "output_tokens": out_tokens,
        "input_tokens": in_tokens,
        "output_tok_s": out_tokens / window,
        "total_tok_s": (out_tokens + in_tokens) / window,
        "req_s": len(ok) / window,
        "bytes": body_bytes,
        "bytes_per_output_token": body_bytes / out_tokens if out_tokens else None,
        "tokens_per_event": out_tokens / events if events else None,
        "ttft_ms": _dist(ttft),
        "tpot_ms": _dist(tpot),
        "itl_ms": _dist(itl),
        "e2e_ms": _dist(e2e),
        "goodput": _goodput(per_request, slo, window) if slo else None,
        "queue_ms": _dist([r["t_start"] - r["t_arrive"] for r in ok if r.get("t_arrive") is not None]),
    }


def serving_row(summary: dict[str, Any], *, scenario: str, concurrency: int, requests: int, input_len: int,
                output_len: int, clients: int, workers: int) -> dict[str, Any]:
    """One RESULTS.md serving row, plus the remaining summary figures."""
    row: dict[str, Any] = {
        "scenario": scenario, "concurrency": concurrency, "requests": requests, "input_len": input_len,
        "output_len": output_len, "output_tok_s": summary["output_tok_s"],
        "ttft_ms_p50": summary["ttft_ms"]["p50"], "ttft_ms_p99": summary["ttft_ms"]["p99"],
        "tpot_ms_p50": summary["tpot_ms"]["p50"], "tpot_ms_p99": summary["tpot_ms"]["p99"],
        "bytes_per_output_token": summary["bytes_per_output_token"], "clients": clients, "workers": workers,
        "total_tok_s": summary["total_tok_s"], "req_s": summary["req_s"], "window_s": summary["window_s"],
        "tokens_per_event": summary["tokens_per_event"],
    }
    goodput = summary.get("goodput")
    if goodput:
        row["goodput_req_s"] = goodput["goodput_req_s"]
        row["good_fraction"] = goodput["good_fraction"]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for key, val in summary[name].items():
            row[f"{name.removesuffix('_ms')}_ms_{key}"] = val
    return row
