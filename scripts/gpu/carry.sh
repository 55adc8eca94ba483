#!/usr/bin/env bash
# Prepare, on this (CPU) machine, the git-ignored folders the device calls carry (run from the repository root):
#   .whl/    the Python wheels the H200 image lacks (cp312, manylinux), at the lock's versions
#   .nginx/  Debian's nginx (the image has none) with the libraries it links, behind a wrapper that sets
#            LD_LIBRARY_PATH for nginx alone (the host's Python keeps its own libssl)
#   build/   the code objects (`netra kernels build`), .sglang_peer/ the SGLang peer (`make sglang-peer`)
# Then: run(carry=["build", ".whl", ".nginx"]) for scripts/gpu/serve_h200.sh, ["build", ".sglang_peer", ".whl"]
# for scripts/gpu/session.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.nginx/' .git/info/exclude 2>/dev/null || echo /.nginx/ >> .git/info/exclude
pin() { grep -i -E "^$1==" requirements/constraints.txt requirements/gpu.txt | head -1 | cut -d: -f2; }
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 any; do
  plat+=(--platform "$p")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d .whl \
  "$(pin fastapi)" "$(pin starlette)" "$(pin uvicorn)" "$(pin orjson)" "$(pin pydantic)" "$(pin pydantic_core)" \
  "$(pin annotated-types)" "$(pin annotated-doc)" "$(pin typing-inspection)" "$(pin typing_extensions)" \
  "$(pin anyio)" "$(pin opentelemetry-api)" "$(pin llguidance)" "$(pin fla-core)" "$(pin einops)"
mkdir -p .nginx/bin .nginx/lib /tmp/netra-nginx-deb
(cd /tmp/netra-nginx-deb && apt-get download nginx >/dev/null 2>&1 && dpkg-deb -x nginx_*.deb x)
cp /tmp/netra-nginx-deb/x/usr/sbin/nginx .nginx/lib/nginx.bin
for l in libcrypt.so.1 libpcre2-8.so.0 libssl.so.3 libcrypto.so.3 libz.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" .nginx/lib/
done
cat > .nginx/bin/nginx <<'WRAP'
#!/bin/sh
# Debian's nginx with its own libraries (carried to the H200, which has no nginx).
d=$(dirname "$(readlink -f "$0")")/../lib
LD_LIBRARY_PATH="$d" exec "$d/nginx.bin" "$@"
WRAP
chmod +x .nginx/bin/nginx
.nginx/bin/nginx -v
du -sh .whl .nginx
