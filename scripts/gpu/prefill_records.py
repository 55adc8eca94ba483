"""Result records (shared/design/RESULTS.md) from the raw output of scripts/gpu/prefill_ops.py and
scripts/gpu/prefill_profile.py: both scripts call it at the end of their runs, and it rebuilds the records of runs
whose raw JSON came back before it existed.

    python3 scripts/gpu/prefill_records.py RUN_DIR --sha SHA --command "..." [--date ISO] [--out DIR]

``RUN_DIR`` holds ``prefill_ops.json`` and/or ``prefill_profile.json``, and a launch's ``engine_stats.json`` +
``engine_metrics.txt``; the records are written beside them (``prefill_ops.record.json``: kind kernel;
``prefill_profile.record.json``: kind serving, the engine's prefill forward; ``engine_steps.record.json``: the
engine's step times by kind over the launch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from netra.records import utc_now, write_record

BANDWIDTH = 4.2e12  # bytes/s: the copy rate the floor fractions use (docs/kernels.md)


def ops_record(raw: list[dict[str, Any]], sha: str, command: str, date: str, device: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    speedups: dict[str, dict[str, float]] = {}
    for r in raw:
        shape = r.get("shape") or f"{r['rows']}x{r['width']}"
        key = f"{r['op']} {shape}"
        floor_us = r["bytes"] / BANDWIDTH * 1e6 if "bytes" in r else None
        for provider, field in (("netra", "netra_us"), ("reference", "reference_us"), ("sglang", "sglang_us")):
            if field not in r:
                continue
            rows.append({"op": r["op"], "shape": shape, "dtype": "bfloat16", "provider": provider, "mode": "eager",
                         "median_us": r[field], "p90_us": r.get(field.replace("_us", "_p90_us")),
                         "floor_us": floor_us, "floor_fraction": floor_us / r[field] if floor_us else None,
                         "selected": r.get("selected") if provider == "netra" else None})
        speedups[key] = {f"vs_{p}": r[f"{p}_us"] / r["netra_us"] for p in ("reference", "sglang") if f"{p}_us" in r}
    bad = [f"{r['op']} {r.get('shape', r.get('rows'))}" for r in raw if not r["ok"]]
    return {"kind": "kernel", "family": "prefill", "target": "sm90", "device": device, "git_sha": sha, "date": date,
            "command": command, "status": "measured", "rows": rows, "speedups": speedups,
            "checks": {"cases": len(raw), "mismatches": len(bad), "failed": bad,
                       "eager_equals_replay": None, "note": "eager-only ops (prefill is not captured); each case "
                       "against its FP32 reference under its contract's policy, the conv pool bitwise"},
            "verdict": "info", "raw": raw}


def profile_record(raw: list[dict[str, Any]], sha: str, command: str, date: str, device: str) -> dict[str, Any]:
    rows = []
    for r in raw:
        row = {"scenario": f"prefill {r['seqs']}x{r['len']}", "seqs": r["seqs"], "input_len": r["len"]}
        if "error" in r:
            row["error"] = r["error"]
        else:
            row.update({k: r.get(k) for k in ("tokens", "host_ms", "wall_ms", "device_ms", "tokens_per_s", "tflops",
                                              "first_call_s")})
            row["syncs"] = sum(r["syncs"].values())
            row["kernel_ms"] = round(sum(r["breakdown_us"].values()) / 1e3, 2)
            row["breakdown_us"] = r["breakdown_us"]
        rows.append(row)
    failed = [r["scenario"] for r in rows if "error" in r]
    return {"kind": "serving", "family": "prefill-forward", "target": "sm90", "device": device, "git_sha": sha,
            "date": date, "command": command, "status": "measured", "rows": rows,
            "checks": {"shapes": len(rows), "failed": failed}, "verdict": "info", "raw": raw}


def steps_record(stats: dict[str, Any], metrics: str, sha: str, command: str, date: str, device: str
                 ) -> dict[str, Any]:
    """The engine's step times by kind over one launch: its /metrics histograms (sum, count) and /engine_stats."""
    import re

    sums: dict[tuple[str, str], float] = {}
    for m in re.finditer(r'^netra_engine_step_(\w+)_seconds_(sum|count)\{kind="(\w+)"[^}]*\} (\S+)$', metrics, re.M):
        sums[(f"{m.group(1)}_{m.group(2)}", m.group(3))] = float(m.group(4))
    rows = []
    for kind in ("prefill", "mixed", "decode"):
        n = sums.get(("host_count", kind), 0.0)  # chained decode steps have no device time of their own
        if not n:
            continue
        rows.append({"step_kind": kind, "steps": int(n), "device_s": sums.get(("device_sum", kind)),
                     "host_s": sums.get(("host_sum", kind)), "gap_s": sums.get(("device_gap_sum", kind)),
                     "device_steps": int(sums.get(("device_count", kind), 0.0)),
                     "device_ms_per_step": (1e3 * sums[("device_sum", kind)] / sums[("device_count", kind)]
                                            if sums.get(("device_count", kind)) else None),
                     "host_ms_per_step": 1e3 * sums.get(("host_sum", kind), 0.0) / n,
                     "gap_ms_per_step": 1e3 * sums.get(("device_gap_sum", kind), 0.0) / n})
    return {"kind": "serving", "family": "engine-steps", "target": "sm90", "device": device, "git_sha": sha,
            "date": date, "command": command, "status": "measured", "rows": rows, "engine_stats": stats,
            "checks": {}, "verdict": "info",
            "note": "cumulative over the launch the files came from (every bench run it served)"}


def write(run_dir: Path, sha: str, command: str, date: str | None = None, device: str = "NVIDIA H200") -> list[Path]:
    out = []
    date = date or utc_now()
    for name, build in (("prefill_ops", ops_record), ("prefill_profile", profile_record)):
        src = run_dir / f"{name}.json"
        if src.is_file():
            out.append(write_record(build(json.loads(src.read_text()), sha, command, date, device), run_dir,
                                    f"{name}.record"))
    stats, metrics = run_dir / "engine_stats.json", run_dir / "engine_metrics.txt"
    if stats.is_file() and metrics.is_file():
        out.append(write_record(steps_record(json.loads(stats.read_text()), metrics.read_text(), sha, command, date,
                                             device), run_dir, "engine_steps.record"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--sha", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--date")
    args = ap.parse_args()
    for p in write(args.run_dir, args.sha, args.command, args.date):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
