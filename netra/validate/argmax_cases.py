"""Argmax oracle support: a plain-PyTorch emulation of the kernel's key reduction, and adversarial inputs.

`emulate_two_stage` reproduces what kernels/sm90/argmax/argmax.cu computes, in PyTorch on any
device: the same 64-bit key per element (order-preserving value image high, ~index low), the same
chunk boundaries, a max per chunk, then a max over chunks. Comparing it with ``torch.argmax`` on the
CPU checks the key design in CI, with no GPU; the CUDA kernel must then match it bitwise.

`adversarial_cases` lists the GPU test set: random rows, ties across chunk boundaries, all-equal
rows, signed zeros, infinities, NaN first/middle/last and several NaNs, subnormals, monotone rows,
over every row count of the graph-bucket set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128, 256)
U32 = 1 << 32


def ordered_u32(x: Any) -> Any:
    """The kernel's order-preserving 32-bit image of each value, as int64 (0 .. 2**32-1).

    NaN -> 0xFFFFFFFF (above all); +0 and -0 -> 0x80000000; negatives: bits flipped; positives:
    sign bit set. bfloat16 is widened to float32 first (exact).
    """
    import torch

    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    neg = (bits & 0x80000000) != 0
    out = torch.where(neg, (~bits) & 0xFFFFFFFF, bits | 0x80000000)
    out = torch.where((bits & 0x7FFFFFFF) == 0, torch.full_like(out, 0x80000000), out)
    return torch.where(torch.isnan(x.to(torch.float32)), torch.full_like(out, 0xFFFFFFFF), out)


def keys(x: Any) -> Any:
    """Per-element signed 64-bit keys with the kernel's order: (ordered - 2**31) * 2**32 + ~index."""
    import torch

    idx = torch.arange(x.shape[-1], device=x.device, dtype=torch.int64)
    return ((ordered_u32(x) - (1 << 31)) << 32) | ((U32 - 1) - idx)


def decode(key: Any) -> Any:
    return (U32 - 1) - (key & (U32 - 1))


def chunk_bounds(vocab: int, vec: int, chunks: int) -> list[tuple[int, int]]:
    """Element ranges of a row's chunks, exactly as the kernel splits them (in 16-byte loads)."""
    nvec = vocab // vec
    return [((c * nvec // chunks) * vec, ((c + 1) * nvec // chunks) * vec) for c in range(chunks)]


def emulate_two_stage(x: Any, chunks: int, vec: int) -> Any:
    """The kernel's answer for a 2-D ``x``: per-chunk key maxima, then their maximum, decoded."""
    import torch

    k = keys(x)
    parts = [k[:, lo:hi].amax(dim=1) for lo, hi in chunk_bounds(x.shape[-1], vec, chunks)]
    return decode(torch.stack(parts, dim=1).amax(dim=1))


def emulate_cluster_kernel(x: Any, cluster: int, piece_vecs: int = 1024, block: int = 256) -> Any:
    """What kernels/sm90/argmax/argmax_cluster.cu computes for a float32 ``x``, thread by thread:
    per CTA (1/``cluster`` row) and 16 KB piece, each thread's batch of 16-byte loads (lanes past
    the piece end read -inf; a thread with no element in the piece skips it), the NaN-propagating
    batch-max filter, the select-chain locate (lowest matching load, then lowest element), the key
    fold. CPU check of the kernel's index arithmetic and sequential rule (the GPU must match it)."""
    import torch

    rows, vocab = x.shape
    nvec = vocab // 4
    loads = piece_vecs // block
    none = -(1 << 63)  # below every real key (the kernel's 0ull in its unsigned order)
    t = torch.arange(block)
    out = []
    for r in range(rows):
        row = x[r].to(torch.float32)
        best_key = none
        for c in range(cluster):
            v0, v1 = c * nvec // cluster, (c + 1) * nvec // cluster
            n = v1 - v0
            val = torch.zeros(block)
            idx = torch.full((block,), -1, dtype=torch.int64)
            isnan = torch.zeros(block, dtype=torch.bool)
            for k in range(-(-n // piece_vecs)):
                cnt = min(piece_vecs, n - k * piece_vecs)
                vi = t[None, :] + block * torch.arange(loads)[:, None]  # [u, t]
                valid = vi < cnt
                elem = ((v0 + k * piece_vecs + vi) * 4)[..., None] + torch.arange(4)  # [u, t, j]
                vals = torch.where(valid[..., None], row[elem.clamp(max=vocab - 1)], float("-inf"))
                mv = vals.amax(dim=2)  # NaN-propagating, like max.NaN
                m = mv.amax(dim=0)
                m_nan = torch.isnan(m)
                upd = (t < cnt) & ~isnan & (m_nan | (idx < 0) | (m > val))
                mu = torch.where(m_nan[None, :], torch.isnan(mv), mv == m[None, :])  # [u, t]
                hit_u = torch.where(mu.any(0), mu.int().argmax(0), loads - 1)
                hv = vals[hit_u, t]  # [t, j]
                mj = torch.where(m_nan[:, None], torch.isnan(hv), hv == m[:, None])
                hit_j = torch.where(mj.any(1), mj.int().argmax(1), 3)
                new_idx = (v0 + k * piece_vecs + t + hit_u * block) * 4 + hit_j
                val = torch.where(upd, m, val)
                isnan = torch.where(upd, m_nan, isnan)
                idx = torch.where(upd, new_idx, idx)
            seen = idx >= 0
            if bool(seen.any()):
                k_all = keys(row[None, :])[0]
                cand = k_all[idx[seen]]
                # the thread's key is built from its (value, index): same as the element's key
                best_key = max(best_key, int(cand.max()))
        out.append(best_key)
    return decode(torch.tensor(out, dtype=torch.int64))


@dataclass(frozen=True)
class Case:
    scenario: str
    rows: int
    dtype: str  # "float32" | "bfloat16"
    seed: int

    @property
    def name(self) -> str:
        return f"{self.scenario}-r{self.rows}-{self.dtype}-s{self.seed}"


def _fill(rows: int, vocab: int, gen: Any, device: Any) -> Any:
    import torch

    return torch.randn((rows, vocab), generator=gen, device=device, dtype=torch.float32)


def _positions(rows: int, vocab: int, salt: int) -> list[int]:
    return [((r + 1) * 7919 * (salt + 3) + salt * 104729) % vocab for r in range(rows)]


def build(case: Case, vocab: int, device: Any, boundaries: list[tuple[int, int]]) -> Any:
    """The tensor of one case (float32 or bfloat16), deterministic in the case's seed.

    ``boundaries`` are the kernel's chunk ranges for this row count, so ties can straddle them.
    """
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    rows = case.rows
    x = _fill(rows, vocab, gen, device)
    pos = _positions(rows, vocab, case.seed % 97)
    big = 30.0  # above any N(0,1) draw
    tiny = 1.0e-40  # a float32 subnormal
    bf16_tiny = 1.0e-39  # a bfloat16 subnormal after rounding (bf16 keeps float32's exponent range)
    s = case.scenario
    inner = [lo for lo, _ in boundaries[1:]] or [vocab // 2]
    for r in range(rows):
        p = pos[r]
        q = (p + 1 + (r * 31) % (vocab - 1)) % vocab
        lo_i, hi_i = min(p, q), max(p, q)
        b = inner[r % len(inner)]
        row = x[r]
        if s == "random":
            pass
        elif s == "tie_boundary":  # equal maxima on both sides of a chunk boundary: the left one wins
            row[b - 1] = big
            row[b] = big
        elif s == "tie_boundary_far":  # the end of one chunk and deep in the next
            row[b - 1] = big
            row[min(vocab - 1, b + 4096 + r)] = big
        elif s == "tie_piece_boundary":  # the cluster kernel's 16 KB TMA pieces (4096 fp32) in a chunk
            e = min(vocab - 1, b + 4096)
            row[e - 1] = big
            row[e] = big
        elif s == "tie_far":
            row[lo_i] = big
            row[hi_i] = big
        elif s == "all_equal":
            row.fill_(1.25)
        elif s == "all_neg_inf":
            row.fill_(float("-inf"))
        elif s == "all_pos_inf":
            row.fill_(float("inf"))
        elif s == "all_nan":
            row.fill_(float("nan"))
        elif s == "all_zero_mixed_sign":
            row.fill_(0.0)
            row[::3] = -0.0
        elif s == "signed_zero_neg_first":  # every other value negative; -0 before +0
            row.copy_(-row.abs() - 1.0)
            row[lo_i] = -0.0
            row[hi_i] = 0.0
        elif s == "signed_zero_pos_first":
            row.copy_(-row.abs() - 1.0)
            row[lo_i] = 0.0
            row[hi_i] = -0.0
        elif s == "pos_inf":
            row[p] = float("inf")
        elif s == "two_pos_inf":
            row[lo_i] = float("inf")
            row[hi_i] = float("inf")
        elif s == "neg_inf_but_one":
            row.fill_(float("-inf"))
            row[p] = -1.0e30
        elif s == "nan_first":
            row[0] = float("nan")
        elif s == "nan_middle":
            row[p] = float("nan")
        elif s == "nan_last":
            row[vocab - 1] = float("nan")
        elif s == "several_nans":
            row[hi_i] = float("nan")
            row[lo_i] = float("nan")
            row[(hi_i + 17) % vocab] = float("nan")
            row[b - 1] = big
        elif s == "nan_and_inf":
            row[lo_i] = float("inf")
            row[hi_i] = float("nan")
        elif s == "subnormal_max":  # all negative but two subnormals; the larger one wins
            row.copy_(-row.abs() - 1.0)
            t = bf16_tiny if case.dtype == "bfloat16" else tiny
            row[lo_i] = t
            row[hi_i] = 2 * t
        elif s == "subnormal_vs_zero":  # a positive subnormal beats +0/-0; a negative one loses to them
            row.copy_(-row.abs() - 1.0)
            t = bf16_tiny if case.dtype == "bfloat16" else tiny
            row[lo_i] = 0.0
            row[(lo_i + 1) % vocab] = -t
            row[hi_i] = t
        elif s == "subnormal_tie":
            row.copy_(-row.abs() - 1.0)
            t = bf16_tiny if case.dtype == "bfloat16" else tiny
            row[lo_i] = t
            row[hi_i] = t
        elif s == "max_first":
            row[0] = big
        elif s == "max_last":
            row[vocab - 1] = big
        elif s == "increasing":  # every batch beats the last: the rescan path everywhere
            row.copy_(torch.linspace(-1000.0, 1000.0, vocab, device=device))
        elif s == "decreasing":
            row.copy_(torch.linspace(1000.0, -1000.0, vocab, device=device))
        elif s == "huge_ties":
            row.fill_(-3.0e38)
            row[hi_i] = 3.0e38
            row[lo_i] = 3.0e38
        else:
            raise ValueError(f"unknown argmax scenario {s!r}")
    return x.to(torch.bfloat16) if case.dtype == "bfloat16" else x


SCENARIOS = (
    "random", "tie_boundary", "tie_boundary_far", "tie_far", "all_equal", "all_neg_inf", "all_pos_inf",
    "all_nan", "all_zero_mixed_sign", "signed_zero_neg_first", "signed_zero_pos_first", "pos_inf",
    "two_pos_inf", "neg_inf_but_one", "nan_first", "nan_middle", "nan_last", "several_nans",
    "nan_and_inf", "subnormal_max", "subnormal_vs_zero", "subnormal_tie", "max_first", "max_last",
    "increasing", "decreasing", "huge_ties", "tie_piece_boundary",
)


def adversarial_cases(dtypes: tuple[str, ...] = ("float32", "bfloat16"),
                      rows_per_scenario: int = 4) -> list[Case]:
    """``random`` at every bucket row count; every other scenario at ``rows_per_scenario`` of them
    (rotating so each bucket is covered by many scenarios), for each dtype."""
    cases: list[Case] = []
    seed = 1
    for dtype in dtypes:
        for i, s in enumerate(SCENARIOS):
            rows_list = BUCKETS if s == "random" else tuple(
                BUCKETS[(i * rows_per_scenario + k) % len(BUCKETS)] for k in range(rows_per_scenario))
            for rows in rows_list:
                cases.append(Case(s, rows, dtype, seed))
                seed += 1
    return cases




def check_adversarial(device: Any, cases: list[Case] | None = None, vocab: int = 248320,
                      cpu_oracle_max_rows: int = 8) -> dict[str, Any]:
    """Run `netra.ops.argmax.argmax` on every case, output poisoned first, against the oracles.

    Oracles: ``argmax_ref`` on the same device, the key emulation (bitwise), and ``argmax_ref`` on the
    CPU for cases of at most ``cpu_oracle_max_rows`` rows. Returns counts and the failing case names.
    """
    import torch

    from netra.ops import argmax as op

    cases = adversarial_cases() if cases is None else cases
    failures: list[str] = []
    tactic_cases = 0
    for case in cases:
        vec = op.vec_elems(case.dtype)
        _, chunks = op.contract_launch_shape(case.rows, case.dtype)
        x = build(case, vocab, device, chunk_bounds(vocab, vec, chunks))
        out = torch.full((case.rows,), -7, dtype=torch.int64, device=device)
        decision = op.dispatch.select(op.signature(x))
        tactic_cases += decision.tactic is not None
        got = op.argmax(x, out=out)
        ref = op.argmax_ref(x)
        ok = torch.equal(got, ref)
        if decision.tactic is not None:
            tb = decision.tactic.binding["shapes"][case.rows][1]
            ok = ok and torch.equal(got, emulate_two_stage(x, tb, vec))
        if case.rows <= cpu_oracle_max_rows:
            ok = ok and torch.equal(got.cpu(), op.argmax_ref(x.cpu()))
        if not ok:
            bad = (got != ref).nonzero().flatten()[:4].tolist()
            failures.append(f"{case.name}: rows {bad} got {got[bad].tolist()} want {ref[bad].tolist()}")
    return {"adversarial_cases": len(cases), "tactic_cases": tactic_cases, "mismatches": len(failures),
            "failures": failures[:20]}


def check_eager_vs_replay(device: Any, vocab: int = 248320, rows_list: tuple[int, ...] = BUCKETS,
                          dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> dict[str, Any]:
    """Eager result == CUDA-graph replay result, bitwise, for every row count and dtype; replays run
    twice on new data written into the captured input (so the workspace resets between replays)."""
    import torch

    from netra.ops import argmax as op

    failures: list[str] = []
    for dtype in dtypes:
        for rows in rows_list:
            vec = op.vec_elems(dtype)
            _, chunks = op.contract_launch_shape(rows, dtype)
            bounds = chunk_bounds(vocab, vec, chunks)
            x = build(Case("tie_boundary", rows, dtype, 1000 + rows), vocab, device, bounds)
            out_g = torch.full((rows,), -7, dtype=torch.int64, device=device)
            op.argmax(x, out=out_g)  # eager warm-up: loads the tactic before capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                op.argmax(x, out=out_g)
            for scenario, seed in (("random", 2000 + rows), ("several_nans", 3000 + rows), ("tie_far", 4000 + rows)):
                x.copy_(build(Case(scenario, rows, dtype, seed), vocab, device, bounds))
                eager = torch.full((rows,), -5, dtype=torch.int64, device=device)
                op.argmax(x, out=eager)
                out_g.fill_(-7)
                graph.replay()
                torch.cuda.synchronize(device)
                if not (torch.equal(eager, out_g) and torch.equal(eager, op.argmax_ref(x))):
                    failures.append(f"{dtype} rows {rows} {scenario}")
    return {"eager_equals_replay": not failures, "replay_failures": failures}
