#!/usr/bin/env bash
# One device call for a whole session's kernel work: runs the per-family GPU scripts in sequence,
# each under its own time limit and into its own folder under $OUT, so that one family's failure or
# hang cannot cost the others their results.
#   usage (device): bash scripts/gpu/session.sh <git sha> [argmax|moe|moe-check]...   (default: all)
# Carry build/ (code objects from `netra kernels build`) and .sglang_peer/ (the MoE peer).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/netra-session-out}
SHA=${1:-unknown}
shift || true
PARTS=("$@")
[[ ${#PARTS[@]} -eq 0 ]] && PARTS=(argmax moe-check moe)
export PYTHONPATH=. PYTHONUNBUFFERED=1
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
    moe-check) step moe_check "${MOE_CHECK_LIMIT:-200}" python3 scripts/gpu/moe_v3_check.py ;;
    moe) step moe "${MOE_LIMIT:-400}" bash scripts/gpu/moe_h200.sh ;;
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
