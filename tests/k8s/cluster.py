"""A real Kubernetes 1.20 control plane for the tests: etcd + kube-apiserver built from Debian's source
package by tests/k8s/tools/build-k8s.sh (cached per machine under ~/.cache/netra/k8s-1.20.2, or
NETRA_K8S_BUILD), on loopback ports of their own, with token auth and RBAC. Talks to it over plain
HTTPS (urllib), so no kubectl of a matching version is needed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUILD = Path(os.environ.get("NETRA_K8S_BUILD", str(Path.home() / ".cache/netra/k8s-1.20.2")))
APISERVER = BUILD / "kubernetes-1.20.2/_output/local/bin/linux/amd64/kube-apiserver"
ETCD = BUILD / "root/usr/bin/etcd"
TOOLS = Path(__file__).parent / "tools"

# kind -> (API path prefix, plural, namespaced); what 1.20 serves of the kinds `netra k8s render` writes.
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Pod": ("/api/v1", "pods", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}
# Served only by newer control planes (policy/v1 from 1.21, ValidatingAdmissionPolicy v1 from 1.30):
# these are checked by schema only (kubernetes-validate 1.32 and 1.37).
SCHEMA_ONLY = ("PodDisruptionBudget", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def built() -> bool:
    return APISERVER.is_file() and ETCD.is_file()


class ApiError(RuntimeError):
    def __init__(self, code: int, body: dict[str, Any]) -> None:
        super().__init__(f"{code}: {body.get('message', body)}")
        self.code = code
        self.body = body


@dataclass
class ControlPlane:
    run: Path
    port: int
    token: str
    tokens: dict[str, str] = field(default_factory=dict)  # user -> token (service accounts)
    pids: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _ctx(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.run / "pki/ca.crt"))

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {token or self.token}",
                                              "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=self._ctx(), timeout=30) as r:
                out: dict[str, Any] = json.loads(r.read() or b"{}")
                return out
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = {"message": raw.decode(errors="replace")}
            raise ApiError(exc.code, parsed) from None

    def path(self, doc: dict[str, Any], name: bool = False) -> str:
        prefix, plural, namespaced = KINDS[doc["kind"]]
        ns = f"/namespaces/{doc['metadata']['namespace']}" if namespaced else ""
        return f"{prefix}{ns}/{plural}" + (f"/{doc['metadata']['name']}" if name else "")

    def create(self, doc: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        return self.request("POST", self.path(doc) + ("?dryRun=All" if dry_run else ""), doc)

    def delete(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self.request("DELETE", self.path(doc, name=True) + "?gracePeriodSeconds=0")

    def patch_status(self, doc: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", self.path(doc, name=True) + "/status", {"status": status},
                            content_type="application/merge-patch+json")

    def kubeconfig(self, user: str) -> Path:
        """A kubeconfig for `user` (a service account's token from the static token file)."""
        path = self.run / f"kubeconfig-{user.replace(':', '_')}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "t", "cluster": {"server": self.url,
                                                  "certificate-authority": str(self.run / "pki/ca.crt")}}],
            "users": [{"name": "u", "user": {"token": self.tokens[user]}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u", "namespace": "default"}}]}))
        return path

    def stop(self) -> None:
        _stop_pids(self.pids)  # reaps them: a zombie answers kill(pid, 0), so waiting on that took 10 s each


def _sh(*argv: str, cwd: Path) -> None:
    subprocess.run(list(argv), cwd=cwd, check=True, capture_output=True, timeout=60)


def start(run: Path, port: int, etcd_port: int, peer_port: int, service_accounts: list[str]) -> ControlPlane:
    """etcd + kube-apiserver on loopback; `service_accounts` ("ns:name") get static tokens."""
    pki = run / "pki"
    pki.mkdir(parents=True)
    _sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days",
        "2", "-subj", "/CN=test-ca", cwd=pki)
    _sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
        "-subj", "/CN=kube-apiserver", cwd=pki)
    (pki / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _sh("openssl", "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "apiserver.crt", "-days", "2", "-extfile", "ext.cnf", cwd=pki)
    _sh("openssl", "genrsa", "-out", "sa.key", "2048", cwd=pki)
    _sh("openssl", "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    admin = secrets.token_hex(16)
    cp = ControlPlane(run, port, admin)
    lines = [f'{admin},admin,admin,"system:masters"']
    for i, sa in enumerate(service_accounts):
        ns, name = sa.split(":")
        user = f"system:serviceaccount:{ns}:{name}"
        cp.tokens[user] = secrets.token_hex(16)
        lines.append(f'{cp.tokens[user]},{user},sa-{i},"system:serviceaccounts,system:serviceaccounts:{ns}"')
    (run / "tokens.csv").write_text("\n".join(lines) + "\n")
    etcd = subprocess.Popen(
        [str(ETCD), "--data-dir", str(run / "etcd"), "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}", "--listen-peer-urls",
         f"http://127.0.0.1:{peer_port}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer_port}"],
        stdout=(run / "etcd.log").open("wb"), stderr=subprocess.STDOUT)
    cp.pids.append(etcd.pid)
    api = subprocess.Popen(
        [str(APISERVER), f"--etcd-servers=http://127.0.0.1:{etcd_port}", "--bind-address=127.0.0.1",
         "--advertise-address=127.0.0.1", f"--secure-port={port}", "--insecure-port=0",
         f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
         f"--token-auth-file={run}/tokens.csv", "--authorization-mode=Node,RBAC",
         f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
         "--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range=10.96.0.0/24",
         "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true"],
        stdout=(run / "apiserver.log").open("wb"), stderr=subprocess.STDOUT)
    cp.pids.append(api.pid)
    deadline = time.monotonic() + 120
    while True:
        try:
            req = urllib.request.Request(cp.url + "/readyz", headers={"Authorization": f"Bearer {admin}"})
            with urllib.request.urlopen(req, context=cp._ctx(), timeout=5) as r:
                if r.status == 200:
                    break
        except (OSError, urllib.error.URLError):
            pass
        if api.poll() is not None or time.monotonic() > deadline:
            cp.stop()
            raise RuntimeError("kube-apiserver did not become ready: " + (run / "apiserver.log").read_text()[-3000:])
        time.sleep(0.5)
    return cp


# --- a node: controller-manager, scheduler and a kubelet on the local Docker Engine (dockershim) -------------
# Written from ../shared/tools/k8s/k8s-single-node-up.sh and k8s-single-node-down.sh (the team's scripts,
# run end to end on this machine kind): the same flags and kubelet settings, with ports of their own, the
# kubelet's root and dockershim dirs under the run dir, and an undo that checks it left nothing behind.

CONTROLLER_MANAGER = APISERVER.with_name("kube-controller-manager")
SCHEDULER = APISERVER.with_name("kube-scheduler")
KUBELET = APISERVER.with_name("kubelet")
PAUSE_IMAGE = "k8s.gcr.io/pause:3.2"
NODE_NAME = "ci-node"
# What the kubelet writes outside its run dir (fixed paths in 1.20), and the sysctls it sets at start
# (pkg/kubelet/cm/container_manager_linux.go setupKernelTunables): undone by `Node.stop`.
HOST_PATHS = (Path("/var/lib/kubelet"), Path("/var/log/pods"), Path("/var/log/containers"),
              Path("/var/run/dockershim.sock"), Path("/var/lib/dockershim"))
SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes")
K8S_CONTAINERS = ["docker", "ps", "-aq", "--filter", "label=io.kubernetes.pod.namespace"]


def node_built() -> bool:
    return built() and all(p.is_file() for p in (CONTROLLER_MANAGER, SCHEDULER, KUBELET))


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    return {k: _sysctl_path(k).read_text().strip() for k in SYSCTLS}


def kubepods_cgroups() -> list[Path]:
    return sorted(p for p in Path("/sys/fs/cgroup").glob("*/kubepods*") if p.is_dir())


def leftovers(sysctls: dict[str, str] | None = None) -> list[str]:
    """What a node left on this machine: containers of pods, the kubelet's fixed paths, kubepods cgroups,
    sysctls that differ from `sysctls`. Empty before a node starts and after it stops."""
    out = []
    ids = subprocess.run(K8S_CONTAINERS, capture_output=True, text=True, timeout=60, check=False).stdout.split()
    if ids:
        out.append(f"{len(ids)} containers of pods: {' '.join(ids)}")
    out += [f"{p} exists" for p in HOST_PATHS if p.exists() or p.is_symlink()]
    out += [f"cgroup {p} exists" for p in kubepods_cgroups()]
    if sysctls is not None:
        now = read_sysctls()
        out += [f"sysctl {k} = {now[k]}, was {v}" for k, v in sysctls.items() if now[k] != v]
    out += [f"mount {m} left" for m in kubelet_mounts()]
    return out


def kubelet_mounts() -> list[str]:
    """Mount points of a kubelet: its root dir (it bind-mounts the dir onto itself) and the volumes under it."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if "/kubelet/" in point + "/":
            out.append(point)
    return out


def admin_kubeconfig(cp: ControlPlane) -> Path:
    path = cp.run / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": cp.url,
                                              "certificate-authority": str(cp.run / "pki/ca.crt")}}],
        "users": [{"name": "admin", "user": {"token": cp.token}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "admin"}}]}))
    return path


@dataclass
class Node:
    cp: ControlPlane
    run: Path
    sysctls: dict[str, str]  # as they were before the kubelet started
    pids: list[int] = field(default_factory=list)
    made_pause: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def ready(self) -> bool:
        try:
            node = self.cp.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        except ApiError:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    def stop(self, namespaces: list[str]) -> list[str]:
        """Undo the node (as k8s-single-node-down.sh): the pods first (the kubelet removes their containers
        and unmounts their volumes), then the processes, then whatever is still left; returns `leftovers`."""
        for ns in namespaces:
            try:
                self.cp.request("DELETE", f"/api/v1/namespaces/{ns}")
            except (ApiError, OSError):
                pass
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ids = subprocess.run(K8S_CONTAINERS, capture_output=True, text=True, timeout=60,
                                 check=False).stdout.split()
            if not ids or not self.pids:
                break
            time.sleep(1)
        _stop_pids(self.pids)
        ids = subprocess.run(K8S_CONTAINERS, capture_output=True, text=True, timeout=60, check=False).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", "-v", *ids], capture_output=True, timeout=120, check=False)
        for m in sorted(kubelet_mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30, check=False)
        for p in HOST_PATHS:
            if p.is_symlink() or p.is_file() or p.is_socket():
                p.unlink(missing_ok=True)
            elif p.is_dir():
                subprocess.run(["rm", "-rf", "--one-file-system", str(p)], timeout=60, check=False)
        for cg in kubepods_cgroups():
            for d in sorted((x for x in cg.rglob("*") if x.is_dir()), key=lambda x: len(x.parts), reverse=True):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                cg.rmdir()
            except OSError:
                pass
        for k, v in self.sysctls.items():
            if _sysctl_path(k).read_text().strip() != v:
                _sysctl_path(k).write_text(v + "\n")
        if self.made_pause:
            subprocess.run(["docker", "rmi", PAUSE_IMAGE], capture_output=True, timeout=60, check=False)
        return leftovers(self.sysctls)


def _stop_pids(pids: list[int]) -> None:
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(100):
            try:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    break
            except ChildProcessError:  # not our child: gone when kill(pid, 0) says so
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    pids.clear()


def _pause_image(run: Path) -> bool:
    """The pause image from the tree's own build/pause/linux/pause.c, static, imported (no registry);
    True when made here (then removed by `Node.stop`)."""
    if subprocess.run(["docker", "image", "inspect", PAUSE_IMAGE], capture_output=True, check=False).returncode == 0:
        return False
    src = APISERVER.parents[5] / "build/pause/linux/pause.c"
    _sh("gcc", "-Os", "-static", "-DVERSION=v3.2-local", "-o", "pause", str(src), cwd=run)
    _sh("tar", "-cf", "pause.tar", "pause", cwd=run)
    _sh("docker", "import", "-c", 'ENTRYPOINT ["/pause"]', "pause.tar", PAUSE_IMAGE, cwd=run)
    return True


KUBELET_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
healthzPort: {healthz}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
failSwapOn: false
makeIPTablesUtilChains: false
cpuManagerPolicy: static
topologyManagerPolicy: single-numa-node
kubeReserved: {{cpu: 500m, memory: 1Gi}}
evictionHard: {{memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}}
"""


def prepare_node(cp: ControlPlane, run: Path) -> Node:
    """A node not started yet, with the sysctls as they are now; refused if another node's state is on this
    machine (the kubelet's paths are fixed, so one node at a time). Start it with `start_node`; stop it with
    `Node.stop` in a finalizer, also when `start_node` raised."""
    run.mkdir(parents=True, exist_ok=True)
    before = leftovers()
    if before:
        raise RuntimeError("another node's state is on this machine; refusing to start: " + "; ".join(before))
    return Node(cp, run, read_sysctls())


def start_node(node: Node, kubelet_port: int, healthz_port: int, timeout: float = 180) -> None:
    """controller-manager + scheduler + kubelet (static CPU manager, single-numa-node topology manager) on
    the local Docker Engine, registered as `NODE_NAME`; returns once the node is Ready."""
    cp, run = node.cp, node.run
    kubeconfig = admin_kubeconfig(cp)
    pki = cp.run / "pki"
    t0 = time.monotonic()
    kcm = subprocess.Popen(
        [str(CONTROLLER_MANAGER), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
         f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1", "--port=0", "--secure-port=0",
         "--leader-elect=false", f"--service-account-private-key-file={pki}/sa.key", f"--root-ca-file={pki}/ca.crt",
         "--controllers=*,-nodeipam,-service,-route,-cloud-node-lifecycle"],
        stdout=(run / "kcm.log").open("wb"), stderr=subprocess.STDOUT)
    node.pids.append(kcm.pid)
    sched = subprocess.Popen(
        [str(SCHEDULER), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
         f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1", "--port=0", "--secure-port=0",
         "--leader-elect=false"],
        stdout=(run / "sched.log").open("wb"), stderr=subprocess.STDOUT)
    node.pids.append(sched.pid)
    node.made_pause = _pause_image(run)
    (run / "kubelet.yaml").write_text(KUBELET_CONFIG.format(port=kubelet_port, healthz=healthz_port))
    kubelet = subprocess.Popen(
        [str(KUBELET), f"--kubeconfig={kubeconfig}", f"--config={run}/kubelet.yaml", f"--root-dir={run}/kubelet",
         f"--experimental-dockershim-root-directory={run}/dockershim", "--container-runtime=docker",
         f"--pod-infra-container-image={PAUSE_IMAGE}", f"--hostname-override={NODE_NAME}", "--oom-score-adj=0"],
        stdout=(run / "kubelet.log").open("wb"), stderr=subprocess.STDOUT)
    node.pids.append(kubelet.pid)
    deadline = time.monotonic() + timeout
    while not node.ready():
        for name, proc in (("kube-controller-manager", kcm), ("kube-scheduler", sched), ("kubelet", kubelet)):
            if proc.poll() is not None:
                log = {"kube-controller-manager": "kcm", "kube-scheduler": "sched", "kubelet": "kubelet"}[name]
                raise RuntimeError(f"{name} exited {proc.returncode}: " + (run / f"{log}.log").read_text()[-3000:])
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {NODE_NAME} not Ready in {timeout} s: "
                               + (run / "kubelet.log").read_text()[-3000:])
        time.sleep(0.5)
    node.timings["node_ready_s"] = time.monotonic() - t0
