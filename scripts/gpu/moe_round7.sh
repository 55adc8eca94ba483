#!/usr/bin/env bash
# Issue 7 round 7, one device call (carry build .sglang_peer): moe_v3_check (st8 / ml / the act+quant twin / m1l,
# bitwise + interleaved graph replay), the records of tune ml (act+quant A/B) and m1l (layer), the GPU tests;
# everything tarred into $OUT/all.tgz.   usage (device): bash scripts/gpu/moe_round7.sh <git sha>
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
SHA=$1
W=/tmp/w; rm -rf $W; mkdir -p $W
python3 scripts/gpu/moe_v3_check.py --builds v3st8,v3ml,v3ml-aq,v3m1l --out $W/check > $W/check.txt 2>&1
tail -16 $W/check.txt
for tune in ml m1l; do
  GIT_SHA=$SHA MOE_V3_TUNE=$tune MOE_PROVIDERS=netra-v1,netra-v3,netra-v3-unfused,sglang,sglang-shared-mlp,torch-ref OUT=$W/rec_$tune \
    bash scripts/gpu/moe_h200.sh > $W/rec_$tune.txt 2>&1
  grep -E "gates|act\+quant gate|m= *[0-9]+ distinct|layer graph" $W/rec_$tune.txt
done
timeout 300 python3 -m pytest -q tests/ops/test_moe_sm90.py -p no:cacheprovider 2>&1 | grep -v '^{' | tail -4 | tee $W/pytest_gpu_moe.log
tar -czf $OUT/all.tgz -C $W .
