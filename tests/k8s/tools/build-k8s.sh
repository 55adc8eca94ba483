#!/usr/bin/env bash
# Copied from ../shared/tools/k8s/k8s-from-debian.sh; WHAT= picks the binaries (the control-plane tier needs only
# cmd/kube-apiserver, the node tier the four). Idempotent: the download, the unpacking and the patches are skipped
# when done; `make` rebuilds incrementally (Go cache under the tree's _output/local/go/cache).
# Build a real Kubernetes v1.20.2 control plane + kubelet from Debian bookworm's own `kubernetes` SOURCE
# package with Debian's Go 1.19, etcd 3.4 from Debian; nothing installed system-wide (all under $OUT).
# Verified on the team's machine kind (2 cores, Debian 12, Docker 20.10, no registry/GitHub access).
set -euo pipefail
OUT=${1:?usage: $0 OUTDIR}; mkdir -p "$OUT"/{apt/lists/partial,apt/cache/archives/partial,debs,root,shim}; cd "$OUT"
URI=$(sed -n 's/^URIs: //p' /etc/apt/sources.list.d/debian.sources | head -1)       # the archive apt already uses
KEY=/usr/share/keyrings/debian-archive-keyring.gpg
printf 'deb [signed-by=%s] %s bookworm main\ndeb-src [signed-by=%s] %s bookworm main\n' "$KEY" "$URI" "$KEY" "$URI" > apt/sources.list
A="-o Dir::Etc::SourceList=$OUT/apt/sources.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=$OUT/apt/lists -o Dir::Cache=$OUT/apt/cache"
S=$OUT/kubernetes-1.20.2
if [ ! -f debs/.done ]; then
  apt-get $A -qq update
  (cd debs && apt-get $A -qq source --download-only kubernetes=1.20.5+really1.20.2-1.1+deb12u1 \
   && apt-get $A -qq download golang-1.19-go golang-1.19-src etcd-server golang-github-modern-go-reflect2-dev rsync libpopt0)
  for d in debs/*.deb; do dpkg -x "$d" root; done
  touch debs/.done
fi
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/root/usr/lib/x86_64-linux-gnu exec %s/root/usr/bin/rsync "$@"\n' "$OUT" "$OUT" > shim/rsync; chmod +x shim/rsync
if [ ! -f "$S/.netra-patched" ]; then
  tar xzf debs/kubernetes_1.20.5+really1.20.2.orig.tar.gz
  # Go >= 1.18 needs reflect2 >= 1.0.2 (map iteration); Debian ships it: swap the vendored 1.0.1.
  rm -rf "$S/vendor/github.com/modern-go/reflect2"; cp -r root/usr/share/gocode/src/github.com/modern-go/reflect2 "$S/vendor/github.com/modern-go/reflect2"; rm -f "$S/vendor/github.com/modern-go/reflect2/go.mod"
  # This sandbox has no CAP_SYS_RESOURCE: a negative oom_score_adj fails runc ("can't get final child's PID"). Test build only.
  sed -i 's/defaultSandboxOOMAdj int = -998/defaultSandboxOOMAdj int = 0/' "$S/pkg/kubelet/dockershim/docker_sandbox.go"
  sed -i 's/guaranteedOOMScoreAdj int = -997/guaranteedOOMScoreAdj int = 0/' "$S/pkg/kubelet/qos/policy.go"
  touch "$S/.netra-patched"
fi
export GOROOT=$OUT/root/usr/lib/go-1.19 PATH=$OUT/shim:$OUT/root/usr/lib/go-1.19/bin:$PATH GOCACHE=$OUT/gocache GOPROXY=off CGO_ENABLED=0
cd "$S" && nice make WHAT="${WHAT:-cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet}" KUBE_BUILD_PLATFORMS=linux/amd64 GOLDFLAGS="-s -w"
ls -la "$S/_output/local/bin/linux/amd64/"; "$OUT/root/usr/bin/etcd" --version | sed -n 1p
