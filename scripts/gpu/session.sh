#!/usr/bin/env bash
# One device call for a session's kernel work: the per-family GPU scripts in sequence, each under its own time
# limit (cut to the call's DEADLINE_S), so that one family's failure or hang cannot cost the others their results.
#   usage (device): bash scripts/gpu/session.sh <git sha> PART...   (default: moe-tests moe step)
#   parts: harness (every spec of netra/bench/specs, one step each: HARNESS_SPECS narrows it, HARNESS_LIMIT is each
#          step's limit, HARNESS_DEADLINE the seconds after which a spec starts no new case) moe-tests step plugin determinism gpu-tests prefill
# Carry build/ (code objects from `netra kernels build`), .sglang_peer/ (the peers) and .whl/ (fla-core, ...).
# Everything comes back as $OUT/out.tar.gz beside $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/netra-session-out}
DEFAULT_PARTS=(moe-tests moe step)
source scripts/gpu/lib.sh "$@"
export NETRA_SGLANG_PEER=${NETRA_SGLANG_PEER:-$PWD/.sglang_peer}
for part in "${PARTS[@]}"; do
  case "$part" in
    harness)  # each spec its own step (its own time limit), so that one spec's hang cannot cost the others
      for s in ${HARNESS_SPECS:-$(python3 -m netra.bench.harness --list | cut -d' ' -f1)}; do
        step "harness_$s" "${HARNESS_LIMIT:-60}" python3 -m netra.bench.harness "$s" --out "$OUT/harness" \
          --deadline "${HARNESS_DEADLINE:-30}" --git-sha "$SHA"
      done ;;
    argmax) step argmax "${ARGMAX_LIMIT:-240}" bash scripts/gpu/argmax.sh "$SHA" ;;
    moe-tests) step moe_tests "${MOE_TESTS_LIMIT:-240}" python3 -m pytest -q -m gpu tests/ops/test_moe_sm90.py ;;
    moe) step moe "${MOE_LIMIT:-300}" python3 -m netra.bench.harness moe moe_prefill --out "$OUT/moe" \
           --git-sha "$SHA" --deadline 130 ;;
    step) step step "${STEP_LIMIT:-300}" python3 -m netra.bench.step --batches "${STEP_BATCHES:-1,8,64}" \
            --out "$OUT/step" --git-sha "$SHA" ;;
    plugin) step plugin "${PLUGIN_LIMIT:-150}" python3 scripts/gpu/plugin_h200.py --sglang-root .sglang_peer --git-sha "$SHA" ;;
    determinism) step determinism "${DET_LIMIT:-90}" python3 scripts/gpu/determinism_stress.py ;;
    gpu-tests) step gpu_tests "${GPU_TESTS_LIMIT:-300}" python3 -m pytest -q -s -m gpu \
                 tests/ops/test_attention_prefill_sdpa.py tests/engine/test_sched_gpu.py tests/ops/test_gdn_fla_gpu.py \
                 tests/engine/test_gpu.py tests/engine/test_sampler_gpu.py tests/ops/test_norm_fp8_gpu.py ;;
    prefill) step prefill "${PREFILL_LIMIT:-300}" python3 scripts/gpu/prefill_profile.py --out "$OUT/prefill" ;;
    *) echo "unknown part $part" | tee -a "$summary" ;;
  esac
done
pack
