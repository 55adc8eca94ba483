# Shared by the device scripts (session.sh, serve_h200.sh): sourced from the repository root with OUT and
# DEFAULT_PARTS set and the script's arguments (`source scripts/gpu/lib.sh "$@"`):
# - reads them as SHA [PART...] into SHA and PARTS (DEFAULT_PARTS where none is named);
# - installs the carried wheels (.whl, when present) into /tmp/site and puts the tree and them on PYTHONPATH;
# - records the commit measured (NETRA_GIT_SHA: a device copy's .git is not the tree's) and lets dispatch select
#   contracts not yet promoted (NETRA_TACTIC_MIN_MATURITY=experiment unless set);
# - `step NAME LIMIT_S CMD...`: runs CMD under `timeout`, cut to what is left of DEADLINE_S (seconds from the
#   script's start, less a 25 s margin), output in $OUT/NAME.log, one line in $OUT/summary.txt (plus the lines of
#   the log matching $STEP_GREP);
# - `pack`: the device returns at most 8 files: everything under $OUT but the summary goes into one tarball.
SHA=${1:-unknown}
shift || true
PARTS=("$@")
[[ ${#PARTS[@]} -eq 0 ]] && PARTS=("${DEFAULT_PARTS[@]}")
mkdir -p "$OUT"
summary=$OUT/summary.txt
: > "$summary"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$summary"; exit 2; }
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export NETRA_GIT_SHA=$SHA
export NETRA_TACTIC_MIN_MATURITY=${NETRA_TACTIC_MIN_MATURITY:-experiment}
DEADLINE_S=${DEADLINE_S:-570}
# A source edited after `netra kernels build` would be refused at its first load, minutes into the call: check first.
python3 -m netra kernels verify > /tmp/netra-verify.log 2>&1 \
  || { echo "kernel lock mismatch (rebuild with \`netra kernels build\` and commit the lock):" | tee -a "$summary";
       tail -8 /tmp/netra-verify.log | tee -a "$summary"; exit 2; }
STEP_GREP=${STEP_GREP:-'^$^'}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv \
  >> "$summary" 2>&1

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE_S - SECONDS - 25))
  (( left < limit )) && limit=$left
  if (( limit < 10 )); then echo "$name skipped: no time left" | tee -a "$summary"; return 124; fi
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc limit=${limit}s took=$((SECONDS - t0))s" | tee -a "$summary"
  grep -E "$STEP_GREP" "$OUT/$name.log" | cut -c1-200 >> "$summary"
  return $rc
}

pack() {
  for f in "$OUT"/*.log; do
    [[ -e "$f" ]] || continue
    echo "==== $(basename "$f") (tail)"
    tail -15 "$f"
  done
  cat "$summary"
  tar -czf /tmp/netra-device-out.tar.gz -C "$OUT" --exclude=./summary.txt . \
    && find "$OUT" -mindepth 1 -maxdepth 1 ! -name summary.txt -exec rm -rf {} + \
    && mv /tmp/netra-device-out.tar.gz "$OUT/out.tar.gz"
  ls -la "$OUT"
}
