#!/usr/bin/env bash
# The package as a user gets it: build the wheel from a copy of the tree, install it into a fresh
# venv outside the checkout, and run the commands a new user runs, from a directory that is not the
# checkout: `netra --help` (and every verb's --help) with only the core dependencies, then
# `netra plan --profile local`, `netra explain`, and a detached `netra launch --profile local` that
# answers one chat completion, `netra status`, `netra stop`. Run by `make test` (make wheel-test).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PY:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/netra-wheel.XXXXXX")"
RUN="$WORK/run"
cleanup() {
  if [ -f "$RUN/launch.json" ]; then "$WORK/venv/bin/netra" stop --run-dir "$RUN" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
LOCK=(-c "$ROOT/requirements/constraints.txt" -c "$ROOT/requirements/cpu.txt")
t0=$(date +%s)
step() { echo "[wheel-test +$(( $(date +%s) - t0 ))s] $*"; }

step "copy the tracked and unignored files, build the wheel"
(cd "$ROOT" && git ls-files -z -co --exclude-standard) | "$PY" -c '
import os, shutil, sys
root, dest = sys.argv[1], sys.argv[2]
for rel in sys.stdin.read().split("\0"):
    src = os.path.join(root, rel)
    if rel and os.path.isfile(src):
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel))
' "$ROOT" "$WORK/src"
"$ROOT/.venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/netra-*.whl)"

step "fresh venv, the wheel with its core dependencies only"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "${LOCK[@]}" "$WHEEL"
NETRA="$WORK/venv/bin/netra"
cd "$WORK"  # not the checkout: data must come from the installed package
"$NETRA" --version
"$NETRA" --help >/dev/null
for verb in $("$WORK/venv/bin/python" -c 'from netra.cli import VERBS; print(" ".join(VERBS))'); do
  "$NETRA" "$verb" --help >/dev/null
done
for verb in $("$WORK/venv/bin/python" -c 'from netra.bench.cli import VERBS; print(" ".join(VERBS))'); do
  "$NETRA" bench "$verb" --help >/dev/null
done
"$NETRA" plan --profile local --table >/dev/null
hash_printed="$("$NETRA" plan --profile local --table | sed -n 's/^plan sha256 //p')"
hash_json="$("$NETRA" plan --profile local --json | sha256sum | cut -d' ' -f1)"
[ "$hash_printed" = "$hash_json" ] || { echo "plan hash $hash_printed != sha256sum of --json $hash_json"; exit 1; }
"$WORK/venv/bin/python" - <<'PY'
import netra, pathlib, sys
from netra import resources, settings
assert not resources.is_checkout(), resources.data_root()
root = resources.data_root()
assert root.is_relative_to(pathlib.Path(netra.__file__).parent), root
for must in ("launcher/local.yaml", "launcher/schema.json", "nginx/netra.conf.template", "images/lock.json",
             "kernels/schema.json"):
    assert (root / must).is_file(), must
run = settings.run_dir()
assert "site-packages" not in str(run), run
print(f"data {root}; run dir {run}")
PY

step "the engine and deploy extras; netra explain; launch, one chat completion, status, stop"
"$WORK/venv/bin/pip" install -q "${LOCK[@]}" "netra[engine,deploy] @ file://$WHEEL"
step "extras installed"
"$NETRA" explain > "$WORK/explain.txt"
head -3 "$WORK/explain.txt"
grep -q "^argmax \[" "$WORK/explain.txt"  # the packaged catalog was found (not "no contract")
read -r FRONT BASE < <("$WORK/venv/bin/python" - <<'PY'
import random, socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
while True:
    front, base = random.randrange(20000, 29000), random.randrange(40000, 49000)
    if free(front) and all(free(base + i) for i in range(4)):
        print(front, base)
        break
PY
)
"$NETRA" launch --profile local --front-port "$FRONT" --port-base "$BASE" --run-dir "$RUN" --detach
"$WORK/venv/bin/python" - "$FRONT" <<'PY'
import sys, httpx
r = httpx.post(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions", timeout=120,
               json={"model": "netra-tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
                     "temperature": 0})
r.raise_for_status()
body = r.json()
assert body["usage"]["completion_tokens"] == 8 and body["choices"][0]["finish_reason"] == "length", body
print("chat completion:", repr(body["choices"][0]["message"]["content"]))
PY
"$NETRA" status --run-dir "$RUN"
"$NETRA" stop --run-dir "$RUN"
after="$("$NETRA" status --run-dir "$RUN" || true)"  # exit 1: nothing is serving
echo "$after" | head -1
echo "$after" | grep -q "^local: stopped" || { echo "netra status does not say stopped after netra stop"; exit 1; }
step "passed"
