#!/usr/bin/env bash
# One device call for a whole session's kernel work: runs the per-family GPU scripts in sequence,
# each under its own time limit and into its own folder under $OUT, so that one family's failure or
# hang cannot cost the others their results.
#   usage (device): bash scripts/gpu/session.sh <git sha> [argmax|moe-tests|moe|step|plugin|dense|gdn|attention]...   (default: moe-tests moe step)
# Carry build/ (code objects from `netra kernels build`) and .sglang_peer/ (the MoE peer).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/netra-session-out}
SHA=${1:-unknown}
shift || true
PARTS=("$@")
[[ ${#PARTS[@]} -eq 0 ]] && PARTS=(moe-tests moe step)
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1  # /tmp/site: wheels carried in .whl (install them first)
# New contracts are measured before their promotion: let dispatch select them.
export NETRA_TACTIC_MIN_MATURITY=${NETRA_TACTIC_MIN_MATURITY:-experiment}
summary="$OUT/summary.txt"
: > "$summary"
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  mkdir -p "$OUT/$name"
  local t0=$SECONDS
  OUT="$OUT/$name" timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$OUT/$name/stdout.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc ${limit}s-limit took $((SECONDS - t0))s" | tee -a "$summary"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> "$summary" 2>&1
for part in "${PARTS[@]}"; do
  case "$part" in
    argmax) step argmax "${ARGMAX_LIMIT:-240}" bash scripts/gpu/argmax.sh "$SHA" ;;
    moe-tests) step moe_tests "${MOE_TESTS_LIMIT:-240}" python3 -m pytest -q -m gpu tests/ops/test_moe_sm90.py ;;
    moe) step moe "${MOE_LIMIT:-300}" python3 -m netra.bench.kernels_moe --out "$OUT/moe" --git-sha "$SHA" ;;
    step) step step "${STEP_LIMIT:-300}" python3 -m netra.bench.step --batches "${STEP_BATCHES:-1,8,64}" \
            --out "$OUT/step" --git-sha "$SHA" ;;
    plugin) step plugin "${PLUGIN_LIMIT:-150}" python3 scripts/gpu/plugin_h200.py --sglang-root .sglang_peer --git-sha "$SHA" ;;
    dense) step dense "${DENSE_LIMIT:-200}" python3 scripts/gpu/dense.py --out "$OUT/dense" ;;
    gdn) step gdn "${GDN_LIMIT:-240}" python3 scripts/gpu/gdn.py --out "$OUT/gdn" ${GDN_ARGS:-} ;;
    attention) step attention "${ATTN_LIMIT:-240}" python3 scripts/gpu/attention.py --out "$OUT/attention" ;;
    *) echo "unknown part $part" | tee -a "$summary" ;;
  esac
done
# The tails, last, so the call's output shows them.
for d in "$OUT"/*/; do
  echo "==== $(basename "$d") (tail)"
  tail -25 "$d/stdout.txt"
done
cat "$summary"
# At most 8 files come back from $OUT: one tarball per part, plus the summary.
for d in "$OUT"/*/; do
  n=$(basename "$d")
  tar -czf "$OUT/$n.tar.gz" -C "$OUT" "$n" && rm -rf "$d"
done
ls -la "$OUT"
