#!/usr/bin/env bash
# One device call for the MoE decode family (issue 7): resources/SASS check, oracle checks, and the
# side-by-side benchmark against SGLang's Triton pipeline; everything lands under $OUT.
# Needs: build/ (code objects from `netra kernels build`, carried) and .sglang_peer/ (the SGLang
# 0.5.23 wheel's kernel files, carried; see netra/bench/peers/sglang_moe.py).
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/moe_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for c in build/sm90/moe/*.cubin; do
  echo "== $c" >> "$OUT/sass_summary.txt"
  cuobjdump --dump-sass "$c" | grep -oE "\b(HMMA|QMMA|HGMMA|QGMMA|LDG|STG|LDL|STL)[A-Z0-9._]*" | sort | uniq -c >> "$OUT/sass_summary.txt"
done
cat "$OUT/sass_summary.txt" | head -60
python3 -m netra.bench.kernels_moe --out "$OUT" --sglang-root .sglang_peer "$@" 2>&1 | tee "$OUT/log.txt"
