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
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)


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
