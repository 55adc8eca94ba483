"""PNG plot of a sweep: output throughput and TPOT against concurrency (matplotlib, Agg backend)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def plot_sweep(rows: list[dict[str, Any]], path: Path, title: str, split_by_clients: bool = True) -> Path:
    """One line per client count (or one line for all points when ``split_by_clients`` is off, as
    when a single client count was clamped to small concurrencies): mean output tok/s (left) and
    TPOT p50/p99 (right) per concurrency; individual repeats are drawn as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_k: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_k[int(r["clients"]) if split_by_clients else 0][int(r["concurrency"])].append(r)
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k in sorted(by_k):
        cs = sorted(by_k[k])
        mean_t = [sum(r["output_tok_s"] for r in by_k[k][c]) / len(by_k[k][c]) for c in cs]
        name = f"K={k}" if split_by_clients else "K=min(clients, C)"
        line = ax_t.plot(cs, mean_t, marker="o", label=f"{name} clients")[0]
        for c in cs:
            ax_t.scatter([c] * len(by_k[k][c]), [r["output_tok_s"] for r in by_k[k][c]], s=10,
                         color=line.get_color(), alpha=0.5)
        p50 = [sum(r["tpot_ms_p50"] for r in by_k[k][c]) / len(by_k[k][c]) for c in cs]
        p99 = [sum(r["tpot_ms_p99"] for r in by_k[k][c]) / len(by_k[k][c]) for c in cs]
        ax_l.plot(cs, p50, marker="o", color=line.get_color(), label=f"TPOT p50, {name}")
        ax_l.plot(cs, p99, marker="x", linestyle="--", color=line.get_color(), label=f"TPOT p99, {name}")
        ideal = [r.get("ideal_output_tok_s") for c in cs for r in by_k[k][c][:1]]
        if all(v is not None for v in ideal) and k == min(by_k):
            ax_t.plot(cs, ideal, linestyle=":", color="gray", label="synthetic ideal")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_ylabel("output tokens/s (global window)")
    ax_l.set_ylabel("TPOT (ms)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
