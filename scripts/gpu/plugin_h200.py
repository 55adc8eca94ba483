#!/usr/bin/env python3
"""Netra's SGLang plugin on an H200 (issue 21): SGLang 0.5.23's own ``fused_experts`` and
``Sampler.forward``, imported from the pinned wheel's files, with Netra's hooks applied through
``HookRegistry.apply_hooks()``.

SGLang is loaded the way the bench peers load it (``netra.bench.peers.sglang_loader``; the plugin's
extra modules are ``netra.bench.peers.sglang_plugin``'s manifest): its real files, its JIT CUDA
modules prebuilt for sm_90a with SGLang's own ``load_jit`` and loaded through apache-tvm-ffi. Stage
the folder here (git-ignored; nvcc, no GPU), the same one the peers use:

    make sglang-peer            # -> .sglang_peer/

On the H200 (one call, ~1-2 minutes; carry .sglang_peer and build/ for the code objects):

    python3 scripts/gpu/plugin_h200.py --sglang-root .sglang_peer --git-sha SHA [RECORD.json]

Dispatch selects contracts at NETRA_TACTIC_MIN_MATURITY or above (default accepted). The record goes
to $OUT/plugin_h200.json when $OUT is set, else to RECORD.json (default plugin_h200.json). The table
prints last. Exit status 0 when every check passes.

What runs (each section on its own: a failing one is recorded and the others still run):

* moe: seeded FP8 experts at the model's shape (E 256, H 2048, I 512, top-8). At 1, 8 and 128
  tokens: the hooked ``fused_experts`` (in place and out of place) equals Netra's
  ``moe_routed`` bitwise, inside a CUDA graph too; SGLang's original (the function the hook wraps)
  equals a hooked call that misses (``NETRA_DISABLE_TACTICS``) bitwise; non-matching calls
  (routed scaling 2.5, 129 tokens) reach the original, equal it bitwise, and are
  counted with their reasons. Timing at 1, 8 and 128 tokens: graph replay, interleaved, rotated
  routings (netra.bench.timing), original vs hooked vs Netra's op called directly.
* argmax: ``Sampler.forward`` on float32 logits [B, 248320]: a greedy batch's ids equal
  ``torch.argmax`` and the original's, hit counted; a non-greedy batch (temperature 0.7) reaches the
  original and equals it (same seed), miss counted. Timing at B 1, 8 and 128, graph replay.

The original is SGLang's pipeline as production runs it on sm90 (JIT per-token-group quant, JIT
``silu_and_mul``, ``moe_align_small_numel`` / JIT ``moe_align_block_size``, the TMA down GEMM,
``moe_sum_reduce_triton`` up to 32 tokens), except what cannot load on the H200's torch 2.11: the AOT
``sgl_kernel`` ops (sglang-kernel 0.4.10 is built for torch 2.14.1). Where SGLang would call one, the
loader's ref runs SGLang's own replacement and notes it; the record's ``substitutes`` lists exactly
those that ran (the align above 64 routes: the JIT backend of the same op; the sum above 32 tokens:
SGLang's Triton ``moe_sum_reduce_triton``). ``loader_notes`` has every JIT module loaded and stub touched.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

FUSED_MOE = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"
E, H, INTER, K, VOCAB = 256, 2048, 512, 8, 248320
# Each token count compiles its own tuned Triton configs for the original: kept to the three timed ones.
MOE_TOKENS = TIMED = (1, 8, 128)
# SGLang's StandardTopKOutput is a NamedTuple of these three (fused_experts unpacks it).
TopK = collections.namedtuple("TopK", ["topk_weights", "topk_ids", "router_logits"])


def load(root: Path) -> dict[str, Any]:
    """Import SGLang's fused_experts, Sampler and HookRegistry through the peers' loader."""
    from netra.bench.peers import sglang_loader

    sglang_loader.install(root)
    base = importlib.import_module("sglang.srt.layers.moe.moe_runner.base")
    # The MoE peer stubs the runner package; fused_experts' default config is the real class, as in SGLang.
    sys.modules["sglang.srt.layers.moe.moe_runner"].MoeRunnerConfig = base.MoeRunnerConfig  # type: ignore[attr-defined]
    fused = importlib.import_module(FUSED_MOE)
    sampler = importlib.import_module("sglang.srt.layers.sampler")
    hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
    return {"fused": fused, "base": base, "sampler": sampler, "hooks": hooks}


# --- Netra's plugin, applied as SGLang applies it -----------------------------------------------------


def apply_plugin(sg: dict[str, Any]) -> dict[str, Any]:
    from netra.plugins import sglang as plugin

    hooks = sg["hooks"]
    originals = {"fused_experts": sg["fused"].fused_experts, "forward": sg["sampler"].Sampler.forward}
    os.environ[plugin.TACTICS_ENV] = "moe,argmax"
    token = hooks._current_plugin_source.set(hooks.HookSource(plugin_name="netra", dist_name="netra"))
    try:
        plugin.register()
    finally:
        hooks._current_plugin_source.reset(token)
    hooks.HookRegistry.apply_hooks()
    applied = {d: plugin.installed(plugin.DOMAINS[d].target, plugin.DOMAINS[d].hook()) for d in plugin.DOMAINS}
    return {"originals": originals, "applied": applied, "patched": sorted(hooks.HookRegistry._patched)}


# --- moe ------------------------------------------------------------------------------------------------


def moe_weights(seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    fp8 = torch.float8_e4m3fn

    def w(*shape: int) -> Any:
        return (torch.randn(shape, generator=g, device="cuda") * 0.5).to(fp8)

    def s(*shape: int) -> Any:
        return torch.rand(shape, generator=g, device="cuda") * 2e-3 + 5e-4

    return {"w1": w(E, 2 * INTER, H), "w2": w(E, H, INTER), "w1_scale": s(E, 2 * INTER // 128, H // 128),
            "w2_scale": s(E, H // 128, INTER // 128)}


def routing(tokens: int, seed: int) -> tuple[Any, Any, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(1000 + seed)
    x = torch.randn((tokens, H), generator=g, device="cuda").to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g, device="cuda")[:K] for _ in range(tokens)]).to(torch.int32)
    w = torch.rand((tokens, K), generator=g, device="cuda")
    return x, ids, w / w.sum(-1, keepdim=True)


def moe_section(sg: dict[str, Any], rec: dict[str, Any], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import torch

    from netra import dispatch
    from netra.ops import moe as moe_op
    from netra.plugins import sglang as plugin

    fused = sg["fused"]
    hooked, original = fused.fused_experts, rec["originals"]["fused_experts"]
    cfg_cls = sg["base"].MoeRunnerConfig
    wts = moe_weights()

    def call(fn: Any, x: Any, ids: Any, w: Any, *, inplace: bool = False, **cfg: Any) -> Any:
        c = cfg_cls(num_experts=E, num_local_experts=E, hidden_size=H, intermediate_size_per_partition=INTER,
                    top_k=K, inplace=inplace, **cfg)
        return fn(x, wts["w1"], wts["w2"], TopK(w, ids, None), c, use_fp8_w8a8=True, w1_scale=wts["w1_scale"],
                  w2_scale=wts["w2_scale"], block_shape=[128, 128])

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append({"section": "moe", "check": name, "pass": bool(ok), "detail": detail})

    counts = plugin.recorder().counts.setdefault("moe", {"hits": 0, "misses": 0, "miss_reasons": {}})
    for t in MOE_TOKENS:
        x, ids, w = routing(t, t)
        want = moe_op.moe_routed(x, wts["w1"], wts["w1_scale"], wts["w2"], wts["w2_scale"], ids, w).clone()
        hits = counts["hits"]
        got = call(hooked, x.clone(), ids, w)
        xi = x.clone()
        got_in = call(hooked, xi, ids, w, inplace=True)
        check(f"hooked == netra moe_routed bitwise, {t} tokens", torch.equal(got, want) and got_in is xi
              and torch.equal(xi, want) and counts["hits"] == hits + 2, f"hits +{counts['hits'] - hits}")
        sglang_out = call(original, x.clone(), ids, w)
        dispatch.reset(dispatch.Dispatcher(disabled=True))
        try:
            misses = counts["misses"]
            off = call(hooked, x.clone(), ids, w)
        finally:
            dispatch.reset(None)
        check(f"hooked with tactics off == SGLang's original bitwise, {t} tokens",
              torch.equal(off, sglang_out) and counts["misses"] == misses + 1)
        if t in TIMED:  # inside a CUDA graph: the capture-time decision, replayed
            xs = x.clone()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = call(hooked, xs, ids, w)
            xs.copy_(x)
            g.replay()
            torch.cuda.synchronize()
            check(f"hooked in a CUDA graph == netra bitwise, {t} tokens", torch.equal(out, want))
    for label, kw in (("routed scaling 2.5", {"routed_scaling_factor": 2.5}),):
        x, ids, w = routing(8, 99)
        before = dict(counts["miss_reasons"])
        a, b = call(hooked, x.clone(), ids, w, **kw), call(original, x.clone(), ids, w, **kw)
        new = {k: v - before.get(k, 0) for k, v in counts["miss_reasons"].items() if v != before.get(k, 0)}
        check(f"non-matching call ({label}) reaches the original, bitwise, miss counted", torch.equal(a, b) and
              len(new) == 1, json.dumps(new))
    x, ids, w = routing(129, 129)
    before = dict(counts["miss_reasons"])
    a, b = call(hooked, x.clone(), ids, w), call(original, x.clone(), ids, w)
    new = {k: v - before.get(k, 0) for k, v in counts["miss_reasons"].items() if v != before.get(k, 0)}
    check("non-matching call (129 tokens) reaches the original, bitwise, miss counted",
          torch.equal(a, b) and len(new) == 1 and "tokens=129" in next(iter(new), ""), json.dumps(new))
    return time_moe(hooked, original, call, wts)


def time_moe(hooked: Any, original: Any, call: Any, wts: dict[str, Any]) -> list[dict[str, Any]]:
    from netra.bench.timing import Provider, interleave
    from netra.ops import moe as moe_op

    rows = []
    for t in TIMED:
        n = max(4, 64 // t)  # rotated routings: together far more expert bytes than the 50 MB L2
        sets = [routing(t, 500 + t * 100 + i) for i in range(n)]
        ins = [(x.clone(), ids, w) for x, ids, w in sets]
        providers = [
            Provider("sglang", lambda i, s=ins: call(original, s[i][0], s[i][1], s[i][2]), n),
            Provider("hooked", lambda i, s=ins: call(hooked, s[i][0], s[i][1], s[i][2]), n),
            Provider("netra-op", lambda i, s=ins: moe_op.moe_routed(s[i][0], wts["w1"], wts["w1_scale"], wts["w2"],
                                                                    wts["w2_scale"], s[i][1], s[i][2]), n),
        ]
        stats = interleave(providers, samples=30, deadline_s=15)
        sg, hk = stats["sglang"]["median_us"], stats["hooked"]["median_us"]
        rows.append({"section": "moe", "tokens": t, **{f"{k}_us": v["median_us"] for k, v in stats.items()},
                     "ratio_sglang_over_hooked": round(float(sg) / float(hk), 3), "stats": stats})
    return rows


# --- argmax (Sampler.forward) -----------------------------------------------------------------------------


def sampler_section(sg: dict[str, Any], rec: dict[str, Any], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import torch
    from torch import nn

    from netra.bench.timing import Provider, interleave
    from netra.plugins import sglang as plugin

    cls = sg["sampler"].Sampler
    original, hooked = rec["originals"]["forward"], cls.forward  # both unbound: fn(sampler, ...)

    def make() -> Any:
        # Sampler.__init__'s fields for a TP1 server with the default arguments (its __init__ reads
        # the process's TP group, which a single process without torch.distributed does not have).
        s = cls.__new__(cls)
        nn.Module.__init__(s)
        s.tp_sync_group = s.cp_sync_group = None
        s.rl_on_policy_target = None
        s.enable_deterministic = False  # plain sampling: SGLang's softmax facade (torch.softmax on sm90)
        s.use_log_softmax_logprob = s.use_ascend_backend = False
        s.sampling_mask_max_tokens = 0
        s.output_logprob_processor = None
        return s

    def info(b: int, greedy: bool) -> Any:
        return types.SimpleNamespace(
            is_all_greedy=greedy, has_custom_logit_processor=False, sampling_mask_batch_indices=None,
            sampling_support_logprobs_capture_indices=None, temperatures=torch.full((b, 1), 0.7, device="cuda"),
            need_top_p_sampling=False, need_top_k_sampling=False, need_min_p_sampling=False, sampling_seed=None,
            grammars=None)

    def logits(b: int, seed: int) -> Any:
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn((b, VOCAB), generator=g, device="cuda")
        x[:, 7] = x.max(-1).values  # ties: the lowest index wins, as torch.argmax
        return x

    def fwd(fn: Any, s: Any, lg: Any, inf: Any) -> Any:
        out = types.SimpleNamespace(next_token_logits=lg)
        return fn(s, out, inf, False, [], [], torch.arange(lg.shape[0], device="cuda"))

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append({"section": "argmax", "check": name, "pass": bool(ok), "detail": detail})

    counts = plugin.recorder().counts.setdefault("argmax", {"hits": 0, "misses": 0, "miss_reasons": {}})
    greedy = make()
    for b in (1, 8, 128):
        lg = logits(b, b)
        hits = counts["hits"]
        ids = fwd(hooked, greedy, lg.clone(), info(b, True))
        ref = fwd(original, greedy, lg.clone(), info(b, True))
        check(f"greedy batch {b}: hooked == torch.argmax == original, hit counted",
              ids.dtype == ref.dtype and torch.equal(ids, torch.argmax(lg, -1)) and torch.equal(ids, ref)
              and counts["hits"] == hits + 1)
    sampled = greedy
    for b in (1, 8):
        lg = logits(b, 10 + b)
        misses = counts["misses"]
        torch.manual_seed(5)
        ids = fwd(hooked, sampled, lg.clone(), info(b, False))
        torch.manual_seed(5)
        ref = fwd(original, sampled, lg.clone(), info(b, False))
        check(f"non-greedy batch {b} reaches the original (same seed, equal), miss counted",
              torch.equal(ids, ref) and counts["misses"] == misses + 1
              and counts["miss_reasons"].get("not every request is greedy", 0) >= 1)
    rows = []
    for b in TIMED:
        sets = [(logits(b, 700 + i), info(b, True)) for i in range(4)]
        providers = [Provider("sglang", lambda i, s=sets: fwd(original, greedy, s[i][0], s[i][1]), len(sets)),
                     Provider("hooked", lambda i, s=sets: fwd(hooked, greedy, s[i][0], s[i][1]), len(sets))]
        stats = interleave(providers, samples=30, deadline_s=10)
        rows.append({"section": "argmax", "tokens": b, "sglang_us": stats["sglang"]["median_us"],
                     "hooked_us": stats["hooked"]["median_us"],
                     "ratio_sglang_over_hooked": round(float(stats["sglang"]["median_us"]) /
                                                       float(stats["hooked"]["median_us"]), 3), "stats": stats})
    return rows


# --- the run ----------------------------------------------------------------------------------------------


def substitutes() -> list[str]:
    """What ran in place of SGLang's own code: the loader notes each ref the first time it is called."""
    from netra.bench.peers import sglang_loader

    return [n for n in sglang_loader.NOTES if n.startswith("ran ")]


def _staged_version(root: Path) -> str:
    try:
        return str(json.loads((root / "MANIFEST.json").read_text())["sglang"])
    except (OSError, ValueError, KeyError):
        return "unknown"


def _git_sha(given: str | None) -> str:
    """The commit measured: given on the command line (a device copy's git metadata can be stale),
    else the checkout's HEAD, else $GIT_SHA."""
    if given:
        return given
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=False, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return sha or os.environ.get("GIT_SHA", "unknown")


def run(root: Path, git_sha: str | None = None) -> dict[str, Any]:
    import torch

    from netra.bench.peers import sglang_loader, sglang_moe
    from netra.plugins import sglang as plugin

    t0 = time.monotonic()
    record: dict[str, Any] = {
        "what": "Netra's SGLang plugin on SGLang 0.5.23's own fused_experts and Sampler.forward (issue 21)",
        "command": " ".join(["python3", "scripts/gpu/plugin_h200.py", *sys.argv[1:]]),
        "git_sha": _git_sha(git_sha),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "min_maturity": os.environ.get("NETRA_TACTIC_MIN_MATURITY", "accepted"),
        "sglang_files": _staged_version(root),
        "checks": [], "timing": [], "errors": {}}
    import triton

    record["triton"] = triton.__version__
    sg = load(root)
    rec = apply_plugin(sg)
    record["hooks"] = {"applied": rec["applied"], "patched": rec["patched"]}
    record["checks"].append({"section": "plugin", "check": "apply_hooks installed both AROUND hooks",
                             "pass": all(rec["applied"].values()), "detail": json.dumps(rec["applied"])})
    for name, section in (("moe", moe_section), ("argmax", sampler_section)):
        try:
            record["timing"] += section(sg, rec, record["checks"])
        except Exception as exc:  # a section that cannot run is a recorded failure, the others still run
            record["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
            record["checks"].append({"section": name, "check": "section ran", "pass": False,
                                     "detail": f"{type(exc).__name__}: {exc}"})
    for row in record["timing"]:
        if row["section"] == "moe":
            record["checks"].append({"section": "moe", "check": f"hooked faster than SGLang's original in graph "
                                     f"replay, {row['tokens']} tokens", "pass": row["ratio_sglang_over_hooked"] > 1.0,
                                     "detail": f"ratio {row['ratio_sglang_over_hooked']}"})
    record["evidence"] = plugin.recorder().snapshot()
    record["substitutes"] = substitutes()
    record["loader_notes"] = sorted(set(sglang_loader.NOTES))
    record["environment"] = [n for n in sglang_moe.RUN_NOTES if n.startswith("torch 2.11")]
    record["wall_s"] = round(time.monotonic() - t0, 1)
    record["pass"] = all(c["pass"] for c in record["checks"])
    return record


def table(record: dict[str, Any]) -> str:
    lines = [f"plugin_h200 on {record.get('gpu')} at {record.get('git_sha', '')[:12]}: "
             f"{'PASS' if record.get('pass') else 'FAIL'} ({record.get('wall_s')} s)"]
    failed = [c for c in record.get("checks", []) if not c["pass"]]
    lines += [f"  FAIL {c['section']}: {c['check']} {c['detail'][:160]}" for c in failed]
    n = len(record.get("checks", []))
    lines.append(f"  checks passed {n - len(failed)}/{n}; substitutes {len(record.get('substitutes', []))}")
    lines.append(f"  {'op':<7}{'tokens':>7}{'sglang us':>11}{'hooked us':>11}{'netra-op us':>13}{'sglang/hooked':>15}")
    for r in record.get("timing", []):
        netra = r.get("netra-op_us")
        lines.append(f"  {r['section']:<7}{r['tokens']:>7}{r['sglang_us']:>11.2f}{r['hooked_us']:>11.2f}"
                     f"{(f'{netra:.2f}' if netra is not None else '-'):>13}{r['ratio_sglang_over_hooked']:>15.3f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", nargs="?", type=Path, default=Path("plugin_h200.json"),
                    help="where the JSON record goes when $OUT is not set")
    ap.add_argument("--sglang-root", type=Path, default=REPO / ".sglang_peer",
                    help="the staged SGLang folder (make sglang-peer)")
    ap.add_argument("--git-sha", help="the commit measured (default: the checkout's HEAD)")
    args = ap.parse_args()
    out = Path(os.environ["OUT"]) / "plugin_h200.json" if os.environ.get("OUT") else args.record
    try:
        record = run(args.sglang_root, args.git_sha)
    except Exception as exc:
        record = {"pass": False, "checks": [], "timing": [], "errors": {"run": traceback.format_exc()[-4000:]},
                  "substitutes": substitutes()}
        print(f"plugin_h200: {type(exc).__name__}: {exc}", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    for name, err in record.get("errors", {}).items():
        print(f"--- {name} error ---\n{err}", file=sys.stderr)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    print(f"record: {out}")
    print(table(record))
    return 0 if record.get("pass") else 1


if __name__ == "__main__":
    sys.exit(main())
