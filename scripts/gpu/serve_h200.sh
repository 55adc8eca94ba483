#!/usr/bin/env bash
# Issue 20's serving records on one H200, in one device call: launch the `dp1-h200` profile (the
# embedded engine at the full Qwen3.6 shape, seeded weights, its response layer and nginx), drive it
# through nginx with `netra bench serve` / `netra bench sweep` from separate client processes, and
# bring back the records, the engine's /metrics and /server_info, and the launch logs.
#
#   usage (device): bash scripts/gpu/serve_h200.sh SHA [PART...]
#     parts (default: c128 sweep): smoke c128 sweep long off
#       smoke  1K/64 at C=32, 32 requests (warms the path; no retained record)
#       c128   1K/1K at C=128, 384 requests, K=2
#       sweep  1K/1K at C=1,8,32,64,128, 2 rounds each (tok/s and TPOT against concurrency, with a plot)
#       long   1K/8K at C=64, 64 requests (stream bytes per output token against the 1K/1K rows)
#       off    NETRA_DISABLE_TACTICS=1, shortened: 1K/16 at C=4, 4 requests (a fresh launch)
#       tests    the GPU tests of the scheduler (decode overlap included), fla prefill and SDPA attention prefill
#       overlap  the next launch sets engine.decode_overlap=true, if `tests` passed
#   LAUNCH_SET="KEY=VALUE ..." overrides profile keys at launch (an A/B: LAUNCH_SET="engine.decode_overlap=true").
#       prefill  the prefill_ops spec (python -m netra.bench.harness prefill_ops: the prefill tactics checked and timed
#                beside reference and peer), then
#                scripts/gpu/prefill_profile.py, each in its own process, no deployment up (where a prefill chunk's time goes)
#   carry: build .whl .nginx .sglang_peer is not needed. .whl holds the Python wheels the image lacks
#   (fastapi, starlette, uvicorn, orjson, pydantic(+core), annotated-types, typing-inspection,
#   llguidance, fla-core, einops); .nginx is Debian bookworm's nginx 1.22 with its libraries.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/netra-serve-out}
DEFAULT_PARTS=(c128 sweep)
STEP_GREP="output tok/s|output throughput|exact checks|BENCH FAILED|K= *[0-9]+ rep"
source scripts/gpu/lib.sh "$@"
unset NETRA_TACTIC_MIN_MATURITY  # the profile says which contracts its workers select (engine.tactic_min_maturity)
export PATH=$PWD/.nginx/bin:$PATH
REC=$OUT/serving
RUN=/tmp/netra-run
mkdir -p "$REC"
nginx -v >> "$summary" 2>&1
# Every module the launch imports, first: a missing wheel shows here in one line.
python3 -c "import fastapi, uvicorn, orjson, pydantic, httpx, prometheus_client, llguidance, fla, netra.serve.app, netra.engine.server, netra.bench.serve" \
  >> "$summary" 2>&1 || { echo "preflight import failed" | tee -a "$summary"; exit 2; }
URL=http://127.0.0.1:8000
INFO=http://127.0.0.1:30000
BENCH=(python3 -m netra bench serve --url "$URL" --info-url "$INFO" --workers 1 --results-dir "$REC" --target sm90)

launch() {  # launch NAME [ENV=VALUE...]
  local name=$1
  shift
  rm -rf "$RUN"
  local sets=()
  for kv in ${LAUNCH_SET:-}; do sets+=(--set "$kv"); done  # e.g. LAUNCH_SET="engine.decode_overlap=true"
  step "launch_$name" 240 env "$@" python3 -m netra launch --profile dp1-h200 "${sets[@]}" --run-dir "$RUN" --detach
}

stop() {
  local name=$1 n=2
  while [[ -e "$OUT/metrics_$name.txt" ]]; do name="$1$n"; n=$((n + 1)); done  # a second launch of one name keeps both
  curl -s "$INFO/metrics" > "$OUT/metrics_$name.txt" 2>&1
  curl -s "$INFO/server_info" > "$OUT/server_info_$name.json" 2>&1
  curl -s "$INFO/engine_stats" > "$OUT/engine_stats_$name.json" 2>&1  # step counts and seconds (chained_steps, device_s)
  python3 -m netra stop --run-dir "$RUN" > "$OUT/stop_$name.log" 2>&1
  mkdir -p "$OUT/run_$name" && cp "$RUN"/*.log "$RUN"/*.json "$OUT/run_$name/" 2>/dev/null
  grep -hE "warmed up|warm-up failed" "$RUN"/worker*.engine.log 2>/dev/null | cut -c1-200 >> "$summary"  # a cold start shows
}

on=0
for part in "${PARTS[@]}"; do
  case "$part" in
    smoke|c128|sweep|long)
      if [[ $on -eq 0 ]]; then
        launch on || { stop on; break; }
        on=1
      fi ;;
  esac
  case "$part" in
    # A failed point ends the run (its logs are what the next call needs; the rest would fail the same way).
    smoke) step smoke 120 "${BENCH[@]}" -K 2 -C 8 -R 8 -I 1024 -O 32 --scenario smoke-h200 || break ;;
    c128) step c128 420 "${BENCH[@]}" -K 2 -C 128 -R 384 -I 1024 -O 1024 --scenario dp1-h200-1k1k || break ;;
    sweep) step sweep 420 python3 -m netra bench sweep --url "$URL" --info-url "$INFO" --workers 1 \
             --concurrencies "${SWEEP_C:-1,8,32,64,128}" --rounds 2 -K 2 -I 1024 -O 1024 --scenario dp1-h200-sweep \
             --results-dir "$REC" --target sm90 || break ;;
    long) step long 420 "${BENCH[@]}" -K 2 -C 64 -R 64 -I 1024 -O 8192 --scenario dp1-h200-1k8k || break ;;
    tests) step gpu_tests 150 python3 -m pytest -q -s -m gpu tests/engine/test_sched_gpu.py tests/ops/test_gdn_fla_gpu.py \
             tests/ops/test_attention_prefill_sdpa.py; tests_rc=$? ;;
    overlap)  # the next launch chains greedy decode steps (engine.decode_overlap), if the GPU tests just passed
      if [[ ${tests_rc:-1} -eq 0 ]]; then LAUNCH_SET="${LAUNCH_SET:-} engine.decode_overlap=true"
      else echo "overlap skipped: the GPU tests did not pass (rc ${tests_rc:-none})" | tee -a "$summary"; fi ;;
    prefill)
      if [[ $on -eq 1 ]]; then stop on; on=0; fi
      step prefill_ops 180 python3 -m netra.bench.harness prefill_ops --out "$OUT/prefill_ops" --git-sha "$SHA"
      step prefill 300 python3 scripts/gpu/prefill_profile.py --out "$OUT/prefill" ;;
    off)
      if [[ $on -eq 1 ]]; then stop on; on=0; fi
      launch off NETRA_DISABLE_TACTICS=1 && \
        step off 400 "${BENCH[@]}" -K 2 -C 4 -R 4 -I 1024 -O 16 --scenario dp1-h200-1k16-tactics-off
      stop off ;;
    *) echo "unknown part $part" | tee -a "$summary" ;;
  esac
done
[[ $on -eq 1 ]] && stop on
pack
