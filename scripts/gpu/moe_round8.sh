#!/usr/bin/env bash
# Issue 7 round 8, one device call (carry build): the moe_m1 phase timeline (-DM1_TIMING=1), the moe_ml phase
# timelines of the exploration builds (stream_probe.py ML_VARIANTS), the weight-stream probe, moe_v3_check of
# BUILDS (bitwise vs st8 + interleaved graph replay), the GPU tests; everything tarred into $OUT/all.tgz.
#   AQ=1: checkrec also needs the act+quant twin (BUILDS with v3m1fl-aq) and the record runs netra-v3-unfused (round 11)
#   usage (device): [BUILDS=v3st8,v3m1l,v3m1fl] [NCU_PLAN=8:v3ml] bash scripts/gpu/moe_round8.sh [parts: m1 ml probe check ncu tests]
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
W=/tmp/w; rm -rf $W; mkdir -p $W
PARTS=${*:-m1 ml probe tests}
for part in $PARTS; do
  case $part in
    m1) timeout 120 python3 scripts/gpu/stream_probe.py --m1-timeline --out $W > $W/m1_timeline.txt 2>&1; grep -vE "^  (entry|copies issued)" $W/m1_timeline.txt ;;
    ml) timeout 300 python3 scripts/gpu/stream_probe.py --ml-timeline --out $W > $W/ml_timeline.txt 2>&1
        grep -v "last gate_up\|last down" $W/ml_timeline.txt | grep -E "^\[|metadata|gate_up done|first down B|down done|barrier 3|top-k sum|^moe_ml|^  [a-z]+ +[0-9]+:" ;;
    ab) timeout 300 python3 scripts/gpu/stream_probe.py --ml-ab --reps ${REPS:-40} --out $W > $W/ml_ab.txt 2>&1; tail -8 $W/ml_ab.txt ;;
    m1ab) timeout 200 python3 scripts/gpu/stream_probe.py --m1-ab --reps ${REPS:-40} --out $W > $W/m1_ab.txt 2>&1; tail -3 $W/m1_ab.txt ;;
    qx) timeout 120 python3 scripts/gpu/stream_probe.py --quant-exact --out $W > $W/quant_exact.txt 2>&1; tail -3 $W/quant_exact.txt ;;
    probe) timeout 200 python3 scripts/gpu/stream_probe.py --out $W/probe > $W/probe.txt 2>&1; tail -18 $W/probe.txt ;;
    check) timeout 560 python3 scripts/gpu/moe_v3_check.py --builds ${BUILDS:-v3st8,v3m1l,v3m1fl} --out $W/check > $W/check.txt 2>&1
           tail -16 $W/check.txt ;;
    ncu) MOE_NCU_PLAN=${NCU_PLAN:-8:v3ml,128:v3ml} timeout 200 python3 scripts/gpu/moe_v3_check.py --builds v3ml --step ncu --out $W/ncu > $W/ncu.txt 2>&1
         grep -E "^  moe_|Duration|DRAM Throughput|stalled_(long|barrier|wait|short|mio|lg|math|no_inst|membar|sleeping|dispatch|not_sel|selected)[a-z_]*_per_issue_active|bank_conflicts|wavefronts_mem_shared" $W/ncu/ncu.log | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '{$1=$1; print}' | head -70 ;;
    record) mkdir -p $W/rec; GIT_SHA=${SHA:-unknown} MOE_V3_TUNE=m1fl MOE_PROVIDERS=netra-v1,netra-v3,sglang,sglang-shared-mlp,torch-ref OUT=$W/rec \
              bash scripts/gpu/moe_h200.sh > $W/rec.txt 2>&1; tail -22 $W/rec.txt ;;
    checkrec) timeout 300 python3 scripts/gpu/moe_v3_check.py --builds ${BUILDS:-v3st8,v3m1fl} --out $W/check > $W/check.txt 2>&1
              tail -14 $W/check.txt
              if grep -qE "^check: [0-9]+ cases, 0 failing" $W/check.txt && grep -qE "^smoke: usable .*v3m1fl" $W/check.txt \
                 && { [ -z "${AQ:-}" ] || grep -qE "^smoke: usable .*v3m1fl-aq" $W/check.txt; }; then
                mkdir -p $W/rec; GIT_SHA=${SHA:-unknown} MOE_V3_TUNE=m1fl MOE_PROVIDERS=netra-v1,netra-v3${AQ:+,netra-v3-unfused},sglang,sglang-shared-mlp,torch-ref \
                  OUT=$W/rec bash scripts/gpu/moe_h200.sh > $W/rec.txt 2>&1; tail -22 $W/rec.txt
              else echo "check not clean: no record"; fi ;;
    tests) timeout 300 python3 -m pytest -q tests/ops/test_moe_sm90.py -p no:cacheprovider 2>&1 | grep -v '^{' | tail -4 | tee $W/pytest_gpu_moe.log ;;
  esac
done
tar -czf $OUT/all.tgz -C $W .
