"""Exploration (issue 7, round 6): weight-stream rate of one persistent CTA per SM, by method (H200).

    python3 scripts/gpu/stream_probe.py --build             # here: nvcc -> build/explore/stream_probe.cubin
    PYTHONPATH=. python3 scripts/gpu/stream_probe.py --out "$OUT/probe"   # on the H200 (carry build)

Each entry point of scripts/gpu/stream_probe.cu streams the gate_up weights of D experts (2 MB each, the
item distribution of moe_ms) and only checksums them. Timed as CUDA-graph replays of ROT launches on
different expert sets (weights come from HBM), all variants interleaved; the floor is D x 2 MB at the
copy bandwidth measured in the same process. Prints one table; writes probe.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CUBIN = ROOT / "build" / "explore" / "stream_probe.cubin"
TIMED = ROOT / "build" / "explore" / "moe_ms_timed.cubin"  # kernels/sm90/moe/moe_ms.cu with -DMS_TIMING=1
# exploration variants of the timed build: h exchanged as FP32 (whole-sector writes); no down copy before the barrier
TIMED_VARIANTS = {"base": ([], TIMED)}  # round 6e also timed -DMS_HF32=1 / -DMS_HOLD=1 (no gain; removed)
STAMPS = ("entry", "metadata", "x quantized", "first gate_up stage in (w0)", "gate_up done", "barrier 1 passed",
          "h_q in shared memory", "warp0 down done", "all down done", "-", "producer last issue", "barrier 2 passed")
# round 7: kernels/sm90/moe/moe_ml.cu with -DML_TIMING=1 (stamps at y row 1024), timed at 16 / 64 / 128 tokens
ML_TIMED = ROOT / "build" / "explore" / "moe_ml_timed.cubin"
# exploration builds of moe_ml (timed): name -> (ML_STAGES, GCH, DCH); "base" = the contract's build
# round 7b measured (xq via global + barrier 1): base (4, 16, 64) 244.5 us at 128 tokens, g8 (4, 8, 64) 219.7,
# g8d8 215.3, s5g8d8 215.6, s5g8d32 217.9; round 7c: x quantized in the B buffer, GCH fixed at 8
# round 7h: "wx" (the weight stream waits for the first chunk's x quantization): rejected, removed
# round 8: "mb" the last grid barrier on a growing count, "eg" the producers go before the route-list tables, "nomma"
# no MMA work (timing only: the stream + synchronisation skeleton)
# (run17: base / mb / eg / mbeg / nomma at 8 tokens 57.9 / 56.8 / 56.3 / 55.6 / 52.2 us single launch: mb and eg
# adopted as the contract's defaults; "r7i" = the build before them)
# round 8b tried the MMAs as plain (non-volatile) asm: byte-identical code objects (ptxas schedules the SASS either
# way), dropped
# round 8c: "rev" = gate_up ranges run backwards (ML_GU_REVERSE=1; run17: no gain, rejected)
# round 9: "swz" conflict-free A / B fragment loads (ML_SWZ); "nommagu" / "nommadn" no MMA work in one GEMM only;
# "g4" 4-token chunks; "s5g4" 5 ring stages with 4-token chunks (the B buffers shrink by 32 KB); base and swz also log
# per-item events (-DML_TIMING=2: copy issued, landed as a consumer saw it, released) into p.hq
# run18 (8 / 128 tokens, single launch, last CTA): base 58.1 / 204.3, swz 63.7 / 208.9 (rejected), nommagu 56.1 / 199.7,
# nommadn 49.4 / 195.8 (the down MMAs cost ~8 us), g4 56.1 / -, s5g4 55.0 / - (a 5th stage: -1 us at 8 tokens);
# ring events: a stage is held 1.28 us per item (gate_up and down alike) against ~2 us copy latency
# "xs": the warp pair on two SM sub-partitions (ML_PAIR_XS)
# run18 b: xs holds a stage 0.77 us instead of 1.28, but the copy latency grows (down 2.3 -> 2.8 us): 57.1 / 203.3 (no gain);
# xss5g4 55.8 at 8 tokens
# run18 c (raw traces): every CTA's first 4 down items are held ~4.1 us at 8 tokens (later ones 1.28) and released at the
# same instant in all CTAs: the down-item code is fetched under the saturated stream (nommadn: no hold). "warm": one
# more warp runs that code dry right after the metadata (ML_WARM); "rot": ML_DN_ROT (a CTA's shared first chunk last)
# run18 d: warm 8 / 16 / 64 / 128 tokens 55.0 / 85.5 / 173.8 / 203.0 against base 57.6 / 89.1 / 174.1 / 202.2 (the first
# down items' hold 4.35 -> 1.54 us); rot no gain (128: first-down wait 4.6 -> 3.1 us median, end time unchanged)
# "warm2": the warm-up warp also runs the top-k sum's code; "s5warm2": 5 stages, 4-token chunks (M <= 8 only)
# (s5warm2 would be 13 warps: 4 on one sub-partition caps registers at 128 and spills)
# run18 e: warm2 8 / 16 / 64 / 128: 54.5 / 86.5 / 174.1 / 205.3 (base 58.1 / 88.6 / 175.1 / 203.8; warm 56.1 / 86.5 / 175.1 /
# 204.8); the traces show the start is cold code, region after region: slot tables 2.3 us, the B producer's first copy ~3.3,
# the weight producer's first copy 4.35 (median). "nb": no bstart wait (ML_NO_BSTART); "mc": rolled table loops (ML_META_COMPACT)
# run18 f (interleaved graph replay, --ml-ab): warm2 / nb / warm2nb 1.000-1.002 / 0.999-1.009 / 1.000-1.011 of base: in
# graph replay the code stays in the instruction caches from one launch to the next, so the single-launch timelines
# above measured cold code. From run18 g on, a timeline launch comes after ML_PRE launches of the same.
ML_PRE = 3
# run18 g (hot code): 8 tokens: metadata 2.56, first copy issued 3.20, first item released 5.89 us; 128: 3.58 / 4.22 / 7.94
# (after run18 the rejected flags ML_SWZ, ML_NO_BSTART, ML_POLL_SPIN and ML_META_COMPACT were removed from the kernel, and
# ML_META_PAR / ML_QSPREAD / ML_PAIR_XS / ML_REL_ATOM / ML_DN_ROT became its defaults)
ML_VARIANTS = {"base": (4, 8, 8), "nommadn": (4, 8, 8)}
ML_WARPS_EXTRA = {"warm": 1, "warm2": 1}  # the ML_WARM warp
ML_FLAGS = {"rev": ["-DML_GU_REVERSE=1"], "nomma": ["-DML_NOMMA=3"], "nommagu": ["-DML_NOMMA=1"],
            "nommadn": ["-DML_NOMMA=2"], "warm": ["-DML_WARM=1"], "warm2": ["-DML_WARM=2"], "norot": ["-DML_DN_ROT=0"]}
ML_EVENTS = ("base", "nommadn")  # built with -DML_TIMING=2
# round 9: untimed exploration builds of moe_ml, A/B in interleaved graph replay (--ml-ab): name -> (extra warps, flags);
# "base" is built from the same source with no flags (and checked against the contract's launch shape)
# run18 f: warm2 / nb / warm2nb: no gain in graph replay (above). run18 h: "mp" the tables from 256 threads (ML_META_PAR)
# run18 h: mp 0.982 / 0.988 / 0.991 / 0.992 / 0.996 of base at 8 / 16 / 32 / 64 / 128 tokens, bitwise equal (adopted)
# "qs": the in-place quantization's tasks spread over all consumer warps (ML_QSPREAD)
# run18 i: mp / mpqs / mpnb 0.983 / 0.966 / 0.991 at 8 tokens, 0.996 / 0.994 / 1.006 at 128 (mpqs adopted; nb rejected)
# run18 j, on top of mpqs: xs (ML_PAIR_XS), swz (ML_SWZ; both had been judged on cold-code timelines), s5g4 (5 stages,
# 4-token chunks); name -> (stages, gch, extra warps, flags)
_MQ = ["-DML_META_PAR=1", "-DML_QSPREAD=1"]
# run18 j: xs 0.956 / 0.991 (8 / 128 tokens) against mpqs 0.966 / 0.993 (adopted); swz 1.005 / 1.015 (rejected again);
# s5g4 0.965 at 8 (no gain over mpqs: the 5th stage is rejected), 1.29 at 128
# run18 k: "rel" (ML_REL_ATOM) on top of mpqs + xs
_MQ = [*_MQ, "-DML_PAIR_XS=1"]
# run18 k: rel 0.948 / 0.992 (8 / 128) against mpqsxs 0.953 / 0.994: adopted; the contract's defaults are now mp + qs + xs + rel
# run18 m, on top of the new defaults ("base"): "rot" (ML_DN_ROT), "spin" (ML_POLL_SPIN)
# run18 m: rot 1.008 / 1.002 / 0.997 / 0.993 / 0.996 at 8 / 16 / 32 / 64 / 128 tokens (adopted from 32 tokens on:
# ML_DN_ROT_MIN_M); spin 0.999-1.002 (rejected)
# round 10 (run19): "bal" (ML_BAL: the down split balances each CTA's gate_up + down item total), "fly" (ML_FLYSUM: per-(token,
# 64-row block) arrival counters and sums in the down epilogues instead of the last grid barrier + top-k phase), both
# run19 a: bal 1.000-1.002 (no gain: rejected); fly 1.037-1.055 (the per-item arrival atomics lengthen every consumer's item:
# rejected); balfly 1.038-1.056 and NOT bitwise at 32 / 64 / 128 tokens: a harness bug - this A/B still allocated the
# contract's 4 KB workspace, so the arrival counters (words 1024..) lay outside it; fixed below (ML_AB_WS). Both kept as
# kernels/sm90/moe/rejected/moe_ml_bal_flysum.patch.
# run19 b: "fq" (ML_FASTQ: the in-place quantization one warp per row, no barrier per round), "e1" / "e2" (ML_EARLYW: the
# weight producer's first 1 / 2 items go out before the x rows)
# run19 b: fq 1.043 / 1.025 / 1.021 / 1.009 / 1.006 at 8..128 tokens (a 1-2 row chunk on 1-2 warps: the quantization is on
# the critical path at every chunk; rejected); e1 0.995 / 0.997 / 0.997 / 1.002 / 1.003; fqe1, fqe2 worse than fq
# run19 c: "qr" (ML_QRCP: x / scale from one reciprocal + an FMA correction), "fq2" (ML_FASTQ=2: (row, window) tasks in
# one round), both, and e1 on top of the pair
# run19 c: qr 1.003 / 1.003 / 0.999 / 0.999 / 0.998, fq2 1.007 / 1.005 / 1.000 / 0.998 / 0.999, fq2qr 1.016 .. 1.002,
# fq2qre1 1.012 .. 1.003 at 8..128 tokens: a faster quantization gains nothing (it is off the critical path once spread over
# all warps; ML_FASTQ=1 lost because it was not). quant_exact: 65280 byte mismatches in 1.07e9 pairs, all the sign of a zero
# quotient (-0 / s); div_rcp now copies x's sign.
# run19 d: "ad1" / "ad2" (ML_ADAPT 1 / 2: splits weighted by the CTAs' speeds in the previous launch, measured to down done /
# gate_up done), "ad1e1" (+ ML_EARLYW=1); each adaptive build keeps its own weights
# run19 d: ad1 / ad2 / ad1e1 1.028 / 1.028 / 1.019 at 8 tokens, 1.009 / 1.013 / 1.013 at 128 (rejected): the slowest CTAs
# change from launch to launch and build to build (the weights chased noise); quant_exact with the sign fix: 0 of 1.07e9
# pairs differ (ML_QRCP is exact, but gains nothing)
# run19 e: "xst" (ML_XST: 6 ring slots in the down phase, the two extra ones in the freed x buffers, h in two small buffers),
# "e1" again, both
# run19 e: two launch failures: a parity wait aliased (6 slots consumed by 4 pairs in turn: a pair could wait for a slot's
# next use while the use before it was still in flight, and a parity wait cannot tell those apart); fixed by giving every
# slot one pair (slot s -> pair s % 4). run19 f: e1 0.994 / 0.997 / 0.998 / 1.001 / 1.002, xst 0.992 / 0.998 / 1.000 / 1.011 /
# 1.010, xste1 0.985 / 0.992 / 0.997 / 1.013 / 1.013 at 8..128 tokens, all bitwise (pairs 0 / 1 do a third more down items)
# run19 g: the extra slots only at the transition (ML_XST=2), or all along below 32 tokens; e1 below 64 tokens
_E1 = ["-DML_EARLYW=1", "-DML_EARLYW_MAX_M=64"]
# run19 g: e1s 0.994 / 0.999 / 0.999 / 1.000 / 0.999, x1s 0.993 / 0.999 / 1.002 / 1.000 / 0.999, x2 0.983 / 0.989 / 0.992 /
# 0.996 / 0.998, x1se1s 0.984 / 0.993 / 0.999 / 1.002 / 0.998, x2e1s 0.977 / 0.984 / 0.990 / 0.998 / 0.999 at 8..128 tokens
# run19 h: "og" (ML_OWNER_GO: the scan thread owning the CTA's first gate_up chunk issues its x rows and the first 4 weight
# items), on x2; og1: only 1 item
# run19 h: og 0.989 / 0.993 / 0.995 / 0.998 / 1.002, x2og 0.969 / 0.979 / 0.985 / 0.997 / 1.002, x2og1 0.968 / 0.977 / 0.984 /
# 0.994 / 1.001 (x2e1s 0.978 / 0.982 / 0.988 / 0.998 / 0.999) at 8..128 tokens
# run19 i: "c" = x2 + og1 below 128 tokens; "l2" / "l2f" (ML_L2HINT 1 / 2: evict_last on the weights of experts with more
# than 8 tokens, which stream once per 8-token chunk: 2% of the bytes at 128 tokens; 2: evict_first on the others)
_C = ["-DML_XST=2", "-DML_OWNER_GO=1", "-DML_PRE_ITEMS=1", "-DML_OWNER_MAX_M=128"]
# run19 i: c 0.970 / 0.980 / 0.983 / 0.994 / 1.002, cl2 0.973 .. 1.004, cl2f 0.934 / 0.940 / 0.951 / 0.961 / 0.969, x2l2
# 0.986 .. 1.003: evict_first on the streamed weights is the big one (it keeps x / h / y and the counters in L2)
# run19 j: "l2f" / "l2a" alone (ML_L2HINT 2 / 3: 3 = evict_first on every weight copy), and on c
# run19 j: l2f 0.970 / 0.974 / 0.982 / 0.976 / 0.967, l2a 0.992 / 0.992 / 0.993 / 0.978 / 0.976, cl2f 0.943 / 0.948 / 0.959 /
# 0.964 / 0.970, cl2a 0.936 / 0.940 / 0.954 / 0.962 / 0.975 at 8..128 tokens. cl2f (ML_XST=2, ML_OWNER_GO=1 with 1 item
# below 128 tokens, ML_L2HINT=2) became the contract's default at fe824cd; "base" below is that build. (l2f and l2a are the
# same code at 8 tokens, where no expert has more than 8 tokens: their 2% difference there is the A/B's own spread for
# cache-policy builds, which leave the L2 in different states for the build that follows.)
# round 11 (run20): PDL (ML_PDL / M1F_PDL: griddepcontrol.wait + launch_dependents at entry, launched with programmatic
# stream serialization) with and without the cooperative attribute; "basenc": the contract build launched without it
ML_AB = {"base": (4, 8, 0, []), "basenc": (4, 8, 0, []), "pdl": (4, 8, 0, ["-DML_PDL=1"]),
         "pdlnc": (4, 8, 0, ["-DML_PDL=1"])}
AB_LAUNCH = {"basenc": "plain", "pdl": "coop+pdl", "pdlnc": "pdl", "tagpdl": "coop+pdl"}  # A/B build name -> launch mode (default "coop")
ML_AB_WS = 20480  # workspace bytes of the A/B (ML_FLYSUM's arrival counters at words 1024 + 128 * 32)
ML_AB_TOKENS = (8, 16, 32, 64, 128)
# round 8: kernels/sm90/moe/moe_m1.cu with -DM1_TIMING=1 (stamps at byte 512 K of gu)
M1_TIMED = ROOT / "build" / "explore" / "moe_m1_timed.cubin"
# round 8: the same stamps in kernels/sm90/moe/moe_m1f.cu (-DM1F_TIMING=1): name -> (source, symbol, tune, cubin, flags);
# run17: m1f-w2e / -w2a1 / -w2a3 (the down share's copies at entry / after gate_up tile 1 / 3; the contract: after tile 2)
# took 12.80 / 10.24 / 10.50 us single launch against 10.24
# run20 c: m1f's timeline with hot code (M1_PRE launches first) and three more stamps (the down share's landing on its own;
# the last route), and the tagged-h build's
M1_KERNELS = {"m1f": ("moe_m1f.cu", "moe_m1f", "m1f", M1_TIMED.with_name("moe_m1f_timed.cubin"), ["-DM1F_TIMING=1"]),
              "m1ftag": ("moe_m1f.cu", "moe_m1f", "m1f", M1_TIMED.with_name("moe_m1f_tag_timed.cubin"),
                         ["-DM1F_TIMING=1", "-DM1F_HTAG=1", "-DM1F_POLL_GIVEUP=22"])}
M1_PRE = 3
# (run17 also: m1f with a grid barrier on a growing count, 10.24 us, against the contract's per-route counters 9.98)
# (the tagged-h build, kernels/sm90/moe/rejected/moe_m1f_tagged.cu.txt, failed at launch; its poll-debug twin ran clean)
M1_STAMPS = ("entry", "copies issued", "x quantized", "gate_up tile 0 in", "gate_up tile 1 in", "gate_up tile 2 in",
             "gate_up tile 3 in", "gate_up done", "barrier / route 0 complete", "h (route 0) in smem", "down share in",
             "out written", "down copies issued", "tile 3 h stored (chain)", "down share landed", "all routes' y in smem")


def ml_launch_shape(stages: int, gch: int, dch: int, extra_warps: int = 0, xst: bool = True) -> tuple[int, int]:
    """(threads, dynamic smem bytes) of a moe_ml build (the kernel's layout macros; extra_warps: ML_WARM; xst: ML_XST != 0,
    the contract's default from round 10: the down chunks' h buffers and the barriers past the exchange area)."""
    bws = gch * 4096 + gch * 64 + 512
    bws2 = dch * 1024 + dch * 16 + 256
    bbuf = (max(bws, bws2) + 127) // 128 * 128
    if xst:
        return 32 * (2 * stages + 2 + extra_warps), stages * 32768 + 2 * bbuf + 2 * bws2 + 256  # bws2 = HBUF
    return 32 * (2 * stages + 2 + extra_warps), stages * 32768 + 2 * bbuf + 2 * stages * 4 * 32 * 4 + 128


def ml_cubin(name: str) -> Path:
    return ML_TIMED if name == "base" else ML_TIMED.with_name(f"moe_ml_timed_{name}.cubin")
ML_STAMPS = ("entry", "metadata", "first chunk's x quantized", "token masks", "first gate_up B in", "gate_up done",
             "warp 0: counts", "first down chunk's h quantized", "slot tables", "first down B in", "down done", "barrier 3 passed",
             "top-k sum done", "producer: first down copy", "producer: last copy", "warp 0: scans")
ML_TOKENS = (8, 16, 64, 128)
SRC = ROOT / "scripts" / "gpu" / "stream_probe.cu"
ROT = 8
# name -> (threads, dynamic smem bytes, grid)
TMA = {(5, 32, 5), (6, 32, 6), (7, 32, 7), (12, 16, 6), (14, 16, 7), (24, 8, 8), (6, 32, 3), (4, 32, 4), (3, 32, 3)}
VARIANTS: dict[str, tuple[int, int, int]] = {
    f"probe_tma_s{s}_c{c}_w{w}": (32 * (w + 1), s * c * 1024 + 2 * s * 8, 128) for s, c, w in sorted(TMA)}
VARIANTS.update({f"probe_ldg_u{u}_t{t}": (t, 0, 128) for u, t in ((8, 256), (16, 256), (8, 512), (16, 512), (32, 256))})
EXTRA = {"probe_ldg_u16_t512@264": ("probe_ldg_u16_t512", 512, 0, 264),
         "probe_ldg_u8_t256@264": ("probe_ldg_u8_t256", 256, 0, 264)}
DS = (8, 57, 253)  # distinct experts at 1 / 8 / 128 tokens


class _Params(ctypes.Structure):
    _fields_ = [("w13", ctypes.c_void_p), ("experts", ctypes.c_void_p), ("sink", ctypes.c_void_p),
                ("D", ctypes.c_int32), ("_pad", ctypes.c_int32)]


def build() -> None:
    CUBIN.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", "-I", str(ROOT / "kernels" / "sm90" / "moe"),
           "-o", str(CUBIN), str(SRC)]
    subprocess.run(cmd, check=True)
    print("built", CUBIN)
    for flags, path in TIMED_VARIANTS.values():
        cmd = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", "-DMS_TIMING=1", *flags, "-o", str(path),
               str(ROOT / "kernels" / "sm90" / "moe" / "moe_ms.cu")]
        subprocess.run(cmd, check=True)
        print("built", path)
    for name, (st, gch, dch) in ML_VARIANTS.items():
        timing = 2 if name in ML_EVENTS else 1
        cmd = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", f"-DML_TIMING={timing}", f"-DML_STAGES={st}",
               f"-DGCH={gch}", f"-DDCH={dch}", *ML_FLAGS.get(name, []), "-o", str(ml_cubin(name)),
               str(ROOT / "kernels" / "sm90" / "moe" / "moe_ml.cu")]
        subprocess.run(cmd, check=True)
        print("built", ml_cubin(name))
    for name, (st, gch, _w, flags) in ML_AB.items():
        path = ML_TIMED.with_name(f"moe_ml_ab_{name}.cubin")
        cmd = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", *flags, f"-DML_STAGES={st}", f"-DGCH={gch}",
               f"-DDCH={gch}", "-o", str(path),
               str(ROOT / "kernels" / "sm90" / "moe" / "moe_ml.cu")]
        subprocess.run(cmd, check=True)
        print("built", path)
    for name, flags in M1_AB.items():
        path = ML_TIMED.with_name(f"moe_m1f_ab_{name}.cubin")
        cmd = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", *flags, "-o", str(path),
               str(ROOT / "kernels" / "sm90" / "moe" / "moe_m1f.cu")]
        subprocess.run(cmd, check=True)
        print("built", path)
    cmd = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", "-I", str(ROOT / "kernels" / "sm90" / "moe"), "-o",
           str(QUANT_EXACT), str(ROOT / "scripts" / "gpu" / "quant_exact.cu")]
    subprocess.run(cmd, check=True)
    print("built", QUANT_EXACT)
    for src, _sym, _tune, path, flags in M1_KERNELS.values():
        cmd = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", *flags, "-o", str(path),
               str(ROOT / "kernels" / "sm90" / "moe" / src)]
        subprocess.run(cmd, check=True)
        print("built", path)


def _stamp_rows(stamps: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """stamps [runs, CTAs, 16] ns -> per name: median over CTAs / min / max (µs from the first CTA's entry)."""
    t0 = stamps[:, :, 0].min(dim=1, keepdim=True).values
    rel = (stamps - t0.unsqueeze(-1)) / 1000.0
    rows = {}
    for k, name in enumerate(names):
        if name == "-":
            continue
        v = rel[:, :, k]
        rows[name] = {"median_us": float(v.median()), "max_us": float(v.max(dim=1).values.median()),
                      "min_us": float(v.min(dim=1).values.median())}
    return rows


def _capture(run: Any) -> Any:
    """A CUDA graph of run() (run once eagerly first), replayed once."""
    import torch

    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    g.replay()
    return g


def _ml_item_counts(ids: Any, gch: int, dch: int) -> list[tuple[int, int]]:
    """Per CTA (gate_up items, down items) of moe_ml's static split for these routes."""
    counts = [int(v) for v in (ids.flatten().cpu().bincount(minlength=256))]
    ngc = sum((c + gch - 1) // gch for c in counts)
    ndc = sum((c + dch - 1) // dch for c in counts)
    return [(ngc * 64 * (c + 1) // 128 - ngc * 64 * c // 128, ndc * 32 * (c + 1) // 128 - ndc * 32 * c // 128)
            for c in range(128)]


def _ml_events(ev: Any, t0: float, items: list[tuple[int, int]], stages: int) -> dict[str, Any]:
    """Per-item ring events [128, 3, 192] ns (issue / seen landed / released) -> medians per phase (µs): copy latency
    (issue -> landed as the consumer saw it), hold (landed -> released), refill (release -> the stage's next issue),
    interval (issue -> next issue)."""
    import statistics

    acc: dict[str, list[float]] = {}
    for c in range(128):
        ng, nd = items[c]
        n = min(ng + nd, 192)
        e = (ev[c] - t0) / 1000.0
        for j in range(n):
            ph = "gu" if j < ng else "dn"
            acc.setdefault(f"{ph} latency", []).append(float(e[1, j] - e[0, j]))
            acc.setdefault(f"{ph} hold", []).append(float(e[2, j] - e[1, j]))
            if j + stages < n:
                acc.setdefault(f"{ph} refill", []).append(float(e[0, j + stages] - e[2, j]))
            if j + 1 < n:
                acc.setdefault(f"{ph} interval", []).append(float(e[0, j + 1] - e[0, j]))
        if ng < n:
            acc.setdefault("dn first seen - issue", []).append(float(e[1, ng] - e[0, ng]))
        if n > 0:
            acc.setdefault("first copy issued", []).append(float(e[0, 0]))
            acc.setdefault("first item released", []).append(float(e[2, 0]))
    return {k: statistics.median(v) for k, v in acc.items()}


def _ml_stragglers(st: Any, ids: Any, m: int) -> None:
    """The 3 CTAs that finish gate_up / down last in one launch, with what their static item ranges hold."""
    counts = [int(v) for v in (ids.flatten().cpu().bincount(minlength=256))]
    slots = [(e, c) for e, c in enumerate(counts) if c > 0]
    gch = [(e, c, u) for e, c in slots for u in range((c + 7) // 8)]  # gate_up chunks (expert, T, chunk)
    dch = [(e, c, u) for e, c in slots for u in range((c + 7) // 8)]
    rel = (st - st[:, 0].min()) / 1000.0
    for k, per_chunk, chunks, label in ((5, 64, gch, "gate_up"), (10, 32, dch, "down")):
        n = len(chunks) * per_chunk
        order = sorted(range(128), key=lambda c: -float(rel[c, k]))[:3]
        desc = []
        for c in order:
            lo, hi = n * c // 128, n * (c + 1) // 128
            held = sorted({chunks[i // per_chunk][:2] for i in range(lo, hi)})
            desc.append(f"CTA {c} {float(rel[c, k]):.1f} us (items {hi - lo}, expert:T {held})")
        print(f"    m={m} last {label}: " + "; ".join(desc) + f"; median {float(rel[:, k].median()):.1f}")


def _timed_fn(cubin: Path, sym: str, threads: int, smem: int, launch: str = "coop") -> tuple[Any, Any]:
    """(function, launch config) of an exploration (timed) code object; launch: "coop" (cooperative, the contracts'),
    "coop+pdl" (also programmatic stream serialization), "pdl" (PDL only), "plain" (neither; AB_LAUNCH)."""
    from netra import runtime as rt

    cu = rt.driver()
    module = rt.check(cu.cuModuleLoadData(cubin.read_bytes()), f"cuModuleLoadData {cubin.name}")
    fn = rt.check(cu.cuModuleGetFunction(module, sym.encode()), f"{sym} (timed)")
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    rt.check(cu.cuFuncSetAttribute(fn, attr, smem), f"smem {sym} (timed)")
    if launch not in ("coop", "coop+pdl", "pdl", "plain"):
        raise SystemExit(f"launch mode {launch!r}")
    return fn, rt._launch_config(threads, smem, cooperative=launch.startswith("coop"), pdl=launch.endswith("pdl"))


def _param_list(cls: Any, sets: list[Any], w: dict[str, Any], fill: Any) -> list[Any]:
    """(params, arg pointer) per rotated routing: cls's layer inputs from the routing and weights, then fill(p)."""
    from netra.ops.moe_fp8 import _fill_layer_inputs

    out = []
    for (x, ids, wts, _sw) in sets:
        p = cls()
        _fill_layer_inputs(p, (x, ids, wts), w["w13"], w["s13"], w["w2"], w["s2"])
        fill(p)
        out.append((p, (ctypes.c_void_p * 1)(ctypes.addressof(p))))
    return out


def _coop_runner(fn_cfg: tuple[Any, Any], plist: list[Any], name: str) -> Any:
    """run(k=None): launch the 128-CTA cooperative kernel on every (params, arg pointer) of plist, or only the k-th."""
    import torch

    from netra import runtime as rt

    fn, cfg = fn_cfg

    def run(k: int | None = None) -> None:
        for i, (_p, ptr) in enumerate(plist):
            if k is not None and i != k:
                continue
            cfg.gridDimX, cfg.hStream = 128, torch.cuda.current_stream().cuda_stream
            rt.check(rt.driver().cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptr), 0), f"launch {name}")
    return run


def _launch_stamps(fn: Any, cfg: Any, params: Any, flat: Any, base: int, pre: int = 0, pre_params: Any = None) -> Any:
    """One launch of a timed build on 128 CTAs, after `pre` launches of the same (so that its code is in the SMs'
    instruction caches, as in graph replay; on pre_params when given, so that the timed launch's weights are not the
    ones the pre launches left in L2); its stamps [128, 16] (ns, float64) from flat[base:]."""
    import torch

    from netra import runtime as rt
    from netra.ops.moe_fp8 import M1_CTAS

    ptr = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    flat[base: base + 128 * 16 * 8].zero_()
    cfg.gridDimX, cfg.hStream = M1_CTAS, torch.cuda.current_stream().cuda_stream
    torch.cuda.synchronize()
    pre_ptr = (ctypes.c_void_p * 1)(ctypes.addressof(pre_params if pre_params is not None else params))
    for i in range(pre + 1):
        rt.check(rt.driver().cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptr if i == pre else pre_ptr), 0), "launch (timed)")
    torch.cuda.synchronize()
    return flat[base: base + 128 * 16 * 8].view(torch.int64).view(128, 16).cpu().double()


def ml_timeline(out: Path) -> dict[str, Any]:
    """Per-phase %globaltimer stamps of moe_ml (timed builds), per CTA, at ML_TOKENS, per ML_VARIANTS build."""
    res = {name: ml_timeline_one(name, out) for name in ML_VARIANTS}
    print("moe_ml exploration builds: top-k sum done (µs from the first entry; median over CTAs / the last CTA) by tokens")
    for name, r in res.items():
        print(f"  {name:10s} " + "  ".join(f"{m}: {r[str(m)]['top-k sum done']['median_us']:7.2f} / "
                                           f"{r[str(m)]['top-k sum done']['max_us']:7.2f}" for m in ML_TOKENS))
    (out / "ml_timeline.json").write_text(json.dumps(res, indent=1))
    return res


def ml_timeline_one(variant: str, out: Path) -> dict[str, Any]:
    import torch

    from netra.bench.kernels_moe import make_routing, make_weights
    from netra.ops.moe_fp8 import HIDDEN, MoeSm90, _fill_layer_inputs, _MlParams

    ours = MoeSm90(0, variant="v3", tune="ml")
    t = ours.t["ml"]
    cubin = ml_cubin(variant)
    threads, smem = ml_launch_shape(*ML_VARIANTS[variant], ML_WARPS_EXTRA.get(variant, 0))
    if variant == "base" and (threads, smem) != (t.block, t.smem_bytes):
        raise SystemExit(f"ml_launch_shape {threads, smem} != the contract's {t.block, t.smem_bytes}")
    fn, cfg = _timed_fn(cubin, "moe_ml", threads, smem)
    ws = torch.zeros(t.workspace.numel(), dtype=torch.uint8, device="cuda")  # the contract's workspace size
    w = make_weights()
    res: dict[str, Any] = {}
    base = 1024 * HIDDEN * 2  # bytes into y
    for m in ML_TOKENS:
        per: list[Any] = []
        evs: list[dict[str, float]] = []
        traces: list[dict[str, Any]] = []
        for i in range(10):
            x, ids, wts, _sw = make_routing(m, seed=900 + 31 * i + m)
            p = _MlParams()
            _fill_layer_inputs(p, (x, ids, wts), w["w13"], w["s13"], w["w2"], w["s2"])
            p.hbuf, p.y = ours.gu.data_ptr(), ours.y.data_ptr()
            p.hq, p.hs = ours.aq_q.data_ptr(), ours.aq_s.data_ptr()
            p.out, p.bar, p.M = ours.out.data_ptr(), ws.data_ptr(), m
            if variant in ML_EVENTS:
                ours.aq_q.view(torch.uint8).zero_()
                ours.aq_s.view(torch.uint8).zero_()
            st = _launch_stamps(fn, cfg, p, ours.y.view(torch.uint8).view(-1), base, pre=ML_PRE)
            if i >= 2:
                per.append(st)
                _ml_stragglers(per[-1], ids, m)
                if variant in ML_EVENTS:
                    ev = ours.aq_q.view(torch.uint8).view(-1)[:128 * 3 * 192 * 8].view(torch.int64).view(128, 3, 192)
                    _st, gch, dch = ML_VARIANTS[variant]
                    t0 = float(st[:, 0].min())
                    evs.append(_ml_events(ev.cpu().double(), t0, _ml_item_counts(ids, gch, dch), _st))
                    if m in (8, 128) and len(traces) < 3:  # raw per-CTA traces, µs from the first entry
                        evb = ours.aq_s.view(torch.uint8).view(-1)[:128 * 2 * 8 * 8].view(torch.int64).view(128, 2, 8)
                        traces.append({"stamps": ((st - t0) / 1e3).float(), "ev": ((ev.cpu().double() - t0) / 1e3).float(),
                                       "evb": ((evb.cpu().double() - t0) / 1e3).float(),
                                       "items": torch.tensor(_ml_item_counts(ids, gch, dch)), "ids": ids.cpu()})
        rows = _stamp_rows(torch.stack(per), ML_STAMPS)
        res[str(m)] = rows
        print(f"[{variant}] moe_ml timeline at {m} tokens: µs from the first CTA's entry (median over CTAs / min / max, "
              f"median of {len(per)} launches)")
        for name, r in rows.items():
            print(f"  {name:26s} {r['median_us']:7.2f} {r['min_us']:7.2f} {r['max_us']:7.2f}")
        if traces:
            torch.save(traces, out / f"ml_trace_{variant}_{m}.pt")
        if evs:
            import statistics

            agg = {k: statistics.median(e[k] for e in evs if k in e) for k in evs[0]}
            res[str(m)]["events"] = agg
            print(f"  [{variant}] ring items at {m} tokens, µs (median over items, CTAs, launches): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in agg.items()))
    return res


def ml_ab(out: Path, reps: int) -> dict[str, Any]:
    """ML_AB builds side by side: one CUDA graph per build and batch of ROT launches on rotated routings, replayed
    interleaved; each build's output compared bit for bit with base's on the first routing."""
    import statistics

    import torch

    from netra.bench.kernels_moe import interleaved_replay_us, make_routing, make_weights
    from netra.ops.moe_fp8 import MoeSm90, _MlParams

    ours = MoeSm90(0, variant="v3", tune="ml")
    t = ours.t["ml"]
    fns = {}
    for name, (st, gch, extra, _flags) in ML_AB.items():
        threads, smem = ml_launch_shape(st, gch, gch, extra, xst="-DML_XST=0" not in _flags)
        if name == "base" and (threads, smem) != (t.block, t.smem_bytes):
            raise SystemExit(f"ml_launch_shape {threads, smem} != the contract's {t.block, t.smem_bytes}")
        fns[name] = _timed_fn(ML_TIMED.with_name(f"moe_ml_ab_{name}.cubin"), "moe_ml", threads, smem,
                              AB_LAUNCH.get(name, "coop"))
    ws = torch.zeros(max(t.workspace.numel(), ML_AB_WS), dtype=torch.uint8, device="cuda")
    w = make_weights()
    outs = {name: torch.zeros_like(ours.out) for name in ML_AB}
    res: dict[str, Any] = {}
    stream = torch.cuda.current_stream().cuda_stream
    for m in ML_AB_TOKENS:
        sets = [make_routing(m, seed=700 + 17 * i + m) for i in range(ROT)]
        def fill_ml(p: Any, name: str, m: int = m) -> None:
            p.hbuf, p.y, p.hq, p.hs = ours.gu.data_ptr(), ours.y.data_ptr(), ours.aq_q.data_ptr(), ours.aq_s.data_ptr()
            p.out, p.bar, p.M = outs[name].data_ptr(), ws.data_ptr(), m

        params = {name: _param_list(_MlParams, sets, w, lambda p, name=name: fill_ml(p, name)) for name in ML_AB}

        def launcher(name: str, params: dict[str, list[Any]] = params) -> Any:
            return _coop_runner(fns[name], params[name], name)

        same = {name: True for name in ML_AB}
        for ri in range(ROT):  # every rotated routing, outputs poisoned first; the builds interleaved (shared workspace)
            for name in ML_AB:
                outs[name].fill_(float("nan"))
                launcher(name)(ri)
            torch.cuda.synchronize()
            for name in ML_AB:
                same[name] &= bool(torch.equal(outs[name][:m].view(torch.int16), outs["base"][:m].view(torch.int16)))
        graphs = {name: _capture(launcher(name)) for name in ML_AB}
        torch.cuda.synchronize()
        times = interleaved_replay_us(graphs, reps, ROT)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        res[str(m)] = {name: {"us": med[name], "vs_base": med[name] / med["base"], "bitwise_base": same[name]}
                       for name in ML_AB}
        print(f"m={m:3d} " + "  ".join(f"{name} {med[name]:7.2f}{'' if same[name] else ' (DIFFERS)'}" for name in ML_AB))
        wts = ws.view(torch.float32)[2048:2048 + 3 * 256].view(3, 256)[:, :128].cpu()
        for row, wname in zip(wts, ("ad1", "ad2", "ad1e1"), strict=True):
            if float(row.min()) > 0:
                order = torch.argsort(row)[:6].tolist()
                res.setdefault("weights", {}).setdefault(str(m), {})[wname] = row.tolist()
                print(f"  weights {wname}: max/min {float(row.max() / row.min()):.3f}, slowest CTAs {order}")
    (out / "ml_ab.json").write_text(json.dumps(res, indent=1))
    print("moe_ml A/B (interleaved graph replay, µs per launch; ratio to base)")
    print(f"{'tokens':>6s} " + " ".join(f"{name:>14s}" for name in ML_AB))
    for m in ML_AB_TOKENS:
        r = res[str(m)]
        print(f"{m:6d} " + " ".join(f"{r[n]['us']:7.2f} {r[n]['vs_base']:5.3f}" + ("" if r[n]["bitwise_base"] else "!")
                                    for n in ML_AB))
    _ = stream
    return res


# round 10: untimed builds of moe_m1f (1 token), A/B in interleaved graph replay (--m1-ab): name -> flags
# run19 k: l2 0.994 (11.90 vs 11.96 us), bitwise. run19 l: + "rel" (M1F_REL: the route count as red.release)
# run19 l: l2 0.996, rel 0.999, l2rel 0.988 (12.03 vs 12.17 us), all bitwise: l2rel became moe_m1f's default; "r9" = before
# run19 o: when the down share is requested (M1F_W2_AFTER: after gate_up tile 1 / 3, or -1 at entry) under the L2 hints:
# w1 0.997, w3 1.025, we 1.217 (base 11.60 us): the contract's tile 2 stays
# run20 a: base 11.54, basenc 11.55 (1.000), pdl 11.28 (0.977), pdlnc 11.36 (0.984), all bitwise; ml: pdl 0.988 / 0.994 /
# 1.001 / 1.004 / 0.998 at 8..128 tokens, pdlnc 0.988 .. 1.001
# run20 b: "tag" (M1F_HTAG: h as self-validating tagged words, no fence / counter; polls give up after 2^22 rounds in these
# builds and count it in workspace word 9 instead of trapping), on its own and with PDL. Every build has its own workspace.
_GIVEUP = ["-DM1F_POLL_GIVEUP=22"]
M1_AB = {"base": [], "pdl": ["-DM1F_PDL=1"], "tag": ["-DM1F_HTAG=1", *_GIVEUP],
         "tagpdl": ["-DM1F_HTAG=1", "-DM1F_PDL=1", *_GIVEUP]}  # launch modes: AB_LAUNCH
M1_AB_WS = 20480  # workspace bytes per A/B build (M1F_HTAG: 17408)


def m1_ab(out: Path, reps: int) -> dict[str, Any]:
    """M1_AB builds of moe_m1f side by side at 1 token, as ml_ab: one graph of ROT launches on rotated routings per build,
    replayed interleaved; outputs poisoned and compared bit for bit with base's on every routing."""
    import statistics

    import torch

    from netra.bench.kernels_moe import interleaved_replay_us, make_routing, make_weights
    from netra.ops.moe_fp8 import MoeSm90, _M1Params

    ours = MoeSm90(0, variant="v3", tune="m1fl")
    t = ours.t["m1"]
    fns = {name: _timed_fn(ML_TIMED.with_name(f"moe_m1f_ab_{name}.cubin"), "moe_m1f", t.block, t.smem_bytes,
                           AB_LAUNCH.get(name, "coop")) for name in M1_AB}
    ws = {name: torch.zeros(max(t.workspace.numel(), M1_AB_WS), dtype=torch.uint8, device="cuda") for name in M1_AB}
    w = make_weights()
    outs = {name: torch.zeros_like(ours.out) for name in M1_AB}
    sets = [make_routing(1, seed=500 + 13 * i) for i in range(ROT)]
    def fill_m1(p: Any, name: str) -> None:
        p.gu, p.out, p.bar, p.dbg_hq, p.dbg_hs = ours.gu.data_ptr(), outs[name].data_ptr(), ws[name].data_ptr(), None, None

    params = {name: _param_list(_M1Params, sets, w, lambda p, name=name: fill_m1(p, name)) for name in M1_AB}

    def launcher(name: str) -> Any:
        return _coop_runner(fns[name], params[name], name)

    same = {name: True for name in M1_AB}
    for ri in range(ROT):
        for name in M1_AB:
            outs[name].fill_(float("nan"))
            launcher(name)(ri)
        torch.cuda.synchronize()
        for name in M1_AB:
            same[name] &= bool(torch.equal(outs[name][:1].view(torch.int16), outs["base"][:1].view(torch.int16)))
    graphs = {name: _capture(launcher(name)) for name in M1_AB}
    torch.cuda.synchronize()
    times = interleaved_replay_us(graphs, reps, ROT)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    torch.cuda.synchronize()
    gave_up = {name: int(ws[name].view(torch.int32)[9]) for name in M1_AB}  # M1F_POLL_GIVEUP builds: polls that gave up
    res = {name: {"us": med[name], "vs_base": med[name] / med["base"], "bitwise_base": same[name],
                  "polls_gave_up": gave_up[name]} for name in M1_AB}
    (out / "m1_ab.json").write_text(json.dumps(res, indent=1))
    print("moe_m1f A/B at 1 token (interleaved graph replay, µs per launch; ratio to base)")
    print("  ".join(f"{n} {r['us']:6.2f} {r['vs_base']:5.3f}{'' if r['bitwise_base'] else ' DIFFERS'}"
                    f"{' GAVE UP ' + str(r['polls_gave_up']) if r['polls_gave_up'] else ''}" for n, r in res.items()))
    return res


QUANT_EXACT = ROOT / "build" / "explore" / "quant_exact.cubin"


def quant_exact(out: Path) -> bool:
    """scripts/gpu/quant_exact.cu over its whole domain: True when no e4m3 byte differs."""
    import time

    import torch

    from netra import runtime as rt

    cu = rt.driver()
    torch.zeros(1, device="cuda")
    module = rt.check(cu.cuModuleLoadData(QUANT_EXACT.read_bytes()), "cuModuleLoadData quant_exact")
    fn = rt.check(cu.cuModuleGetFunction(module, b"quant_exact"), "quant_exact")
    counts = torch.zeros(3, dtype=torch.int64, device="cuda")
    first = torch.zeros(3, dtype=torch.int32, device="cuda")
    args = (ctypes.c_uint64 * 2)(counts.data_ptr(), first.data_ptr())
    ptrs = (ctypes.c_void_p * 2)(ctypes.addressof(args), ctypes.addressof(args) + 8)
    cfg = rt._launch_config(256, 0)
    cfg.gridDimX, cfg.hStream = (0x7F80 + 255) // 256, torch.cuda.current_stream().cuda_stream
    t0 = time.time()
    rt.check(cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptrs), 0), "launch quant_exact")
    torch.cuda.synchronize()
    nbyte, nquot, n = (int(v) for v in counts.tolist())
    res = {"pairs": n, "byte_mismatches": nbyte, "quotient_mismatches": nquot, "first_mismatch_amax_x_bits": first.tolist()[1:],
           "seconds": round(time.time() - t0, 2)}
    (out / "quant_exact.json").write_text(json.dumps(res, indent=1))
    print("quant_exact:", json.dumps(res))
    return nbyte == 0


def m1_timeline(out: Path) -> dict[str, Any]:
    res = {name: m1_timeline_one(name) for name in M1_KERNELS}
    (out / "m1_timeline.json").write_text(json.dumps(res, indent=1))
    return res


def m1_timeline_one(name: str) -> dict[str, Any]:
    """Per-phase %globaltimer stamps of moe_m1 / moe_m1f (timed builds), per CTA, one token, single launches."""
    import torch

    from netra.bench.kernels_moe import make_routing, make_weights
    from netra.ops.moe_fp8 import MoeSm90, _fill_layer_inputs, _M1Params

    _src, sym, tune, cubin, _flags = M1_KERNELS[name]
    ours = MoeSm90(0, variant="v3", tune=tune)
    t = ours.t["m1"]
    fn, cfg = _timed_fn(cubin, sym, t.block, t.smem_bytes)
    ws = torch.zeros(max(t.workspace.numel(), M1_AB_WS), dtype=torch.uint8, device="cuda")
    w = make_weights()
    flat, base = ours.gu.view(torch.uint8).view(-1), 512 * 1024  # stamps at byte 512 K of gu (M1_TIMING / M1F_TIMING)
    per: list[Any] = []
    prev, keep = None, []
    for i in range(12):
        x, ids, wts, _sw = make_routing(1, seed=700 + 17 * i)
        p = _M1Params()
        _fill_layer_inputs(p, (x, ids, wts), w["w13"], w["s13"], w["w2"], w["s2"])
        p.gu, p.out, p.bar = ours.gu.data_ptr(), ours.out.data_ptr(), ws.data_ptr()
        p.dbg_hq = p.dbg_hs = None
        keep.append((x, ids, wts))  # prev's tensors stay allocated
        st = _launch_stamps(fn, cfg, p, flat, base, pre=M1_PRE if prev is not None else 0, pre_params=prev)
        prev = p
        if i >= 2:
            per.append(st)
    rows = _stamp_rows(torch.stack(per), M1_STAMPS)
    print(f"{name} ({sym}) timeline at 1 token: µs from the first CTA's entry (median over CTAs / min / max, median of {len(per)} launches)")
    for phase, r in rows.items():
        print(f"  {phase:22s} {r['median_us']:7.2f} {r['min_us']:7.2f} {r['max_us']:7.2f}")
    return rows


def ms_timeline(out: Path) -> dict[str, Any]:
    return {name: ms_timeline_one(out, name, path) for name, (_f, path) in TIMED_VARIANTS.items()}


def ms_timeline_one(out: Path, variant: str, cubin: Path) -> dict[str, Any]:
    """Per-phase %globaltimer stamps of the moe_ms kernel (timed build), per CTA, at 1 and 8 tokens."""
    import torch

    from netra import runtime as rt
    from netra.bench.kernels_moe import make_routing, make_weights
    from netra.ops.moe_fp8 import M1_CTAS, MoeSm90, _fill_layer_inputs, _MsParams

    cu = rt.driver()
    ours = MoeSm90(0, variant="v3", tune="ms")
    t = ours.t["ms"]
    module = rt.check(cu.cuModuleLoadData(cubin.read_bytes()), f"cuModuleLoadData {cubin.name}")
    fn = rt.check(cu.cuModuleGetFunction(module, b"moe_ms"), "moe_ms (timed)")
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    rt.check(cu.cuFuncSetAttribute(fn, attr, t.smem_bytes), "smem (timed)")
    cfg = rt._launch_config(t.block, t.smem_bytes, cooperative=True)
    ws = torch.zeros(256, dtype=torch.uint8, device="cuda")
    w = make_weights()
    res: dict[str, Any] = {}
    for m in (1, 8):
        per: list[Any] = []
        for i in range(10):
            x, ids, wts, _sw = make_routing(m, seed=900 + 31 * i + m)
            p = _MsParams()
            _fill_layer_inputs(p, (x, ids, wts), w["w13"], w["s13"], w["w2"], w["s2"])
            p.hbuf, p.out, p.bar, p.M = ours.gu.data_ptr(), ours.out.data_ptr(), ws.data_ptr(), m
            ptr = (ctypes.c_void_p * 1)(ctypes.addressof(p))
            ours.gu.view(torch.uint8).view(-1)[512 * 1024: 512 * 1024 + 128 * 16 * 8].zero_()
            cfg.gridDimX, cfg.hStream = M1_CTAS, torch.cuda.current_stream().cuda_stream
            torch.cuda.synchronize()
            rt.check(cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptr), 0), "launch moe_ms (timed)")
            torch.cuda.synchronize()
            st = ours.gu.view(torch.uint8).view(-1)[512 * 1024: 512 * 1024 + 128 * 16 * 8].view(torch.int64).view(128, 16)
            st = st.cpu().double()
            if i >= 2:  # the first launches warm up
                per.append(st)
        rows = _stamp_rows(torch.stack(per), STAMPS)  # per: [runs, 128, 16]
        res[str(m)] = rows
        print(f"[{variant}] moe_ms timeline at {m} token(s): µs from the first CTA's entry (median over CTAs / min / max, "
              f"median of {len(per)} launches)")
        for name, r in rows.items():
            print(f"  {name:22s} {r['median_us']:7.2f} {r['min_us']:7.2f} {r['max_us']:7.2f}")
    (out / f"ms_timeline_{variant}.json").write_text(json.dumps(res, indent=1))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("/tmp/probe"))
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--ms-timeline", action="store_true", help="only the moe_ms phase timeline (timed build)")
    ap.add_argument("--ml-timeline", action="store_true", help="only the moe_ml phase timeline (timed build)")
    ap.add_argument("--m1-timeline", action="store_true", help="only the moe_m1 phase timeline (timed build)")
    ap.add_argument("--ml-ab", action="store_true", help="only the moe_ml A/B of the ML_AB builds (graph replay)")
    ap.add_argument("--quant-exact", action="store_true", help="only the exhaustive moe::quant4_rcp == moe::quant4 check")
    ap.add_argument("--m1-ab", action="store_true", help="only the moe_m1f A/B of the M1_AB builds (1 token, graph replay)")
    args = ap.parse_args(argv)
    if args.build:
        build()
        return 0
    import torch

    from netra import runtime as rt
    from netra.bench.kernels_moe import copy_bandwidth, interleaved_replay_us

    args.out.mkdir(parents=True, exist_ok=True)
    if args.ms_timeline:
        ms_timeline(args.out)
        return 0
    if args.ml_timeline:
        ml_timeline(args.out)
        return 0
    if args.m1_timeline:
        m1_timeline(args.out)
        return 0
    if args.ml_ab:
        ml_ab(args.out, args.reps)
        return 0
    if args.m1_ab:
        m1_ab(args.out, args.reps)
        return 0
    if args.quant_exact:
        return 0 if quant_exact(args.out) else 1
    cu = rt.driver()
    torch.zeros(1, device="cuda")
    module = rt.check(cu.cuModuleLoadData(CUBIN.read_bytes()), "cuModuleLoadData stream_probe")
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    launches: dict[str, tuple[Any, int, int, int]] = {}
    for name, (threads, smem, grid) in VARIANTS.items():
        launches[name] = (name, threads, smem, grid)
    for name, (sym, threads, smem, grid) in EXTRA.items():
        launches[name] = (sym, threads, smem, grid)
    funcs: dict[str, Any] = {}
    for name, (sym, _threads, smem, _grid) in launches.items():
        fn = rt.check(cu.cuModuleGetFunction(module, sym.encode()), f"cuModuleGetFunction {sym}")
        if smem > 48 * 1024:
            rt.check(cu.cuFuncSetAttribute(fn, attr, smem), f"max dynamic smem {sym}")
        funcs[name] = fn
    e = 256
    w13 = torch.randint(0, 255, (e, 1024, 2048), dtype=torch.uint8, device="cuda")
    sink = torch.zeros(512, dtype=torch.int32, device="cuda")
    bw = copy_bandwidth()
    gen = torch.Generator().manual_seed(5)
    rows = []
    for d in DS:
        sets = [torch.randperm(e, generator=gen)[:d].to(torch.int32).cuda() for _ in range(ROT)]
        params = [_Params(w13.data_ptr(), s.data_ptr(), sink.data_ptr(), d, 0) for s in sets]
        ptrs = [(ctypes.c_void_p * 1)(ctypes.addressof(p)) for p in params]

        def make(name: str, ptrs: list[Any] = ptrs) -> Any:
            _sym, threads, smem, grid = launches[name]

            def run() -> None:
                stream = torch.cuda.current_stream().cuda_stream
                for pp in ptrs:
                    (err,) = cu.cuLaunchKernel(funcs[name], grid, 1, 1, threads, 1, 1, smem, stream,
                                               ctypes.addressof(pp), 0)
                    if int(err) != 0:
                        raise rt.RuntimeBridgeError(f"launch {name}: {int(err)}")
            return run

        graphs = {name: _capture(make(name)) for name in launches}
        torch.cuda.synchronize()
        times = interleaved_replay_us(graphs, args.reps, ROT)
        byts = d * 64 * 32768
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append({"D": d, "variant": name, "us": med, "TBps": byts / med / 1e6, "floor_us": byts / bw * 1e6,
                         "floor_frac": byts / bw * 1e6 / med})
    doc = {"copy_bw_TBps": bw / 1e12, "rows": rows, "rot": ROT, "reps": args.reps,
           "gpu": torch.cuda.get_device_name(0)}
    (args.out / "probe.json").write_text(json.dumps(doc, indent=1))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write); graph replay, median µs per launch")
    print(f"{'variant':28s} " + " ".join(f"D={d:3d} µs  (frac)" for d in DS))
    for name in launches:
        cells = []
        for d in DS:
            r = next(r for r in rows if r["D"] == d and r["variant"] == name)
            cells.append(f"{r['us']:7.1f} ({r['floor_frac']:.2f})")
        print(f"{name:28s} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
