"""`netra k8s render`: Kubernetes manifests for a profile's plan, one file per concern, plus a kustomization.

The same path as `netra compose`: profile -> `netra.deploy.plan.make_plan` (on the profile's reference
topology, `REFERENCE_TOPOLOGY`, so that a render never depends on the machine it ran on) -> manifests.

Layouts:

* ``per-gpu`` (default): a StatefulSet ``netra-<plan hash[:12]>`` of ``nodes x dp`` pods, one GPU each;
  pod ordinal k runs worker ``k % dp`` of the plan (`netra.k8s.pod`). Each pod holds the engine
  container (integer CPUs = its placement's cores and SMT siblings, requests = limits, one GPU) and the
  response-layer container (a fractional CPU: the kubelet's static CPU manager gives the engine
  exclusive cores and leaves the response layer in the shared pool). Guaranteed QoS throughout.
* ``per-node``: the fallback for clusters whose kubelet settings cannot change: a StatefulSet of
  ``nodes`` pods, each running today's `netra launch` (placement by hand, nginx front) on all of a
  node's GPUs; SMG reaches each pod's front through the ``smg.ai/worker-ports`` annotation.

Beside the workers: the plan as a ConfigMap (its canonical JSON, hashed by the pod), the lock
ConfigMap (images allowed, plan hash) with a ValidatingAdmissionPolicy and binding that refuse any
other Netra pod, a PodDisruptionBudget, and the SMG router (Deployment, Service, ServiceAccount, Role
and RoleBinding to get/list/watch pods in the namespace).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYOUTS = ("per-gpu", "per-node")
NAME = "netra"
GROUP = "netra.dev"
A_PROFILE = f"{GROUP}/profile"
A_PROFILE_SHA = f"{GROUP}/profile-sha256"
A_PLAN_SHA = f"{GROUP}/plan-sha256"
A_RENDER = f"{GROUP}/render"
L_PLAN = f"{GROUP}/plan"
L_NAME = "app.kubernetes.io/name"
L_COMPONENT = "app.kubernetes.io/component"
L_INSTANCE = "app.kubernetes.io/instance"
SMG_PORTS = "smg.ai/worker-ports"
PLAN_MOUNT = "/etc/netra/plan"
AUDIT_DIR = "/run/netra-pod"
HF_CACHE = "/root/.cache/huggingface"
CONTAINER_RUN_ROOT = "/run/netra"
# The sysfs fixture each target is planned on (numa/): a render is the same wherever it runs.
REFERENCE_TOPOLOGY = {"sm90": "numa/dual-socket-8x-h200", "gfx950": "numa/dual-socket-8x-mi350x",
                      "cpu": "numa/no-numa-2x-h200"}
GPU_RESOURCE = {"sm90": "nvidia.com/gpu", "gfx950": "amd.com/gpu"}
# Memory per container by target (requests = limits). The engine's covers the checkpoint's host copy
# while loading, the KV cache's host side and the CUDA context; the response layer's its tokenizer.
MEMORY = {"sm90": ("192Gi", "4Gi"), "gfx950": ("256Gi", "4Gi"), "cpu": ("3Gi", "1Gi")}
ENGINE_CPUS_CPU_TARGET = 1
SERVE_CPU = "500m"
ROUTER_RESOURCES = {"cpu": "1", "memory": "1Gi"}
# Profile front.balance -> SMG policy (round robin keeps the one-node contract).
SMG_POLICY = {"round_robin": "round_robin", "least_conn": "power_of_two"}
FILES = ("namespace.yaml", "lock.yaml", "plan.yaml", "workers.yaml", "pdb.yaml", "router-rbac.yaml",
         "router.yaml", "admission.yaml", "kustomization.yaml")


class K8sError(RuntimeError):
    """The profile cannot be rendered (refused verification, unresolved digest, unsupported layout)."""


@dataclass(frozen=True)
class RenderArgs:
    profile: str
    nodes: int = 1
    layout: str = "per-gpu"
    strict: bool = True
    topology: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "nodes": self.nodes, "layout": self.layout, "strict": self.strict,
                "topology": self.topology}


def _image(profile: Any, strict: bool) -> tuple[str, str, str]:
    """(lock name, image reference, pull policy). An image built here (recorded ID, not in a registry)
    runs by its tag with pull policy Never; any other by ``tag@digest``, refused unresolved when strict."""
    from netra.deploy import images
    from netra.deploy.compose import ComposeError
    from netra.deploy.compose import _image as lock_image

    try:
        name, entry = lock_image(profile)
    except ComposeError as exc:
        raise K8sError(str(exc)) from None
    if strict:
        problems = [p for p in images.check(profile.replace("image", name) if profile.image is None else profile,
                                            True) if "unresolved" in p or "not made" in p]
        if problems:
            raise K8sError("; ".join(problems))
    if entry.built_id is not None:
        return name, entry.tag, "Never"
    if entry.resolved:
        return name, f"{entry.tag}@{entry.digest}", "IfNotPresent"
    return name, entry.tag, "IfNotPresent"


def _meta(name: str, ns: str | None, labels: dict[str, str] | None = None,
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name}
    if ns is not None:
        m["namespace"] = ns
    if labels:
        m["labels"] = dict(labels)
    if annotations:
        m["annotations"] = dict(annotations)
    return m


def _res(cpu: str, memory: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    q = {"cpu": cpu, "memory": memory, **(extra or {})}
    return {"requests": dict(q), "limits": dict(q)}


def _probe(port: int, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def reference_plan(profile: Any, topology_dir: str | None = None) -> Any:
    """The plan a render uses: on `topology_dir`, or the target's reference fixture, named by its relative
    path (the plan hash must not depend on where the checkout is); the run dir is the container path."""
    from dataclasses import replace

    from netra.deploy.plan import Overrides, make_plan
    from netra.deploy.topology import read_topology
    from netra.resources import DataMissing, require_data

    if profile.target not in REFERENCE_TOPOLOGY:
        raise K8sError(f"profile {profile.name!r}: no Kubernetes rendering for target {profile.target}")
    try:
        topo = topology_dir or str(require_data(*REFERENCE_TOPOLOGY[profile.target].split("/")))
    except DataMissing as exc:
        raise K8sError(f"{exc}; pass --topology (a sysfs tree as under numa/)") from None
    topology = replace(read_topology(topo), source=topology_dir or REFERENCE_TOPOLOGY[profile.target])
    # Paths under the run dir (a relative engine.model_path) are the container's, not this machine's.
    saved = os.environ.get("NETRA_RUN_DIR")
    os.environ["NETRA_RUN_DIR"] = CONTAINER_RUN_ROOT
    try:
        return make_plan(profile, topo, Overrides(run_dir=Path(CONTAINER_RUN_ROOT) / profile.name),
                         topology=topology)
    finally:
        if saved is None:
            del os.environ["NETRA_RUN_DIR"]
        else:
            os.environ["NETRA_RUN_DIR"] = saved


def build(args: RenderArgs) -> dict[str, list[dict[str, Any]]]:
    """File name -> its documents, in `FILES` order."""
    from netra.deploy.profile import load_profile

    if args.layout not in LAYOUTS:
        raise K8sError(f"--layout {args.layout}: one of {', '.join(LAYOUTS)}")
    if args.nodes < 1:
        raise K8sError(f"--nodes {args.nodes}: at least one node")
    profile = load_profile(args.profile)
    plan = reference_plan(profile, args.topology)
    plan_json = plan.canonical_json()
    plan_sha = plan.sha256()
    short = plan_sha[:12]
    ns = f"{NAME}-{profile.name}"
    image_name, image, pull = _image(profile, args.strict)
    gpu_res = GPU_RESOURCE.get(profile.target)
    engine_mem, serve_mem = MEMORY[profile.target]
    base_labels = {L_NAME: NAME, L_INSTANCE: profile.name, L_PLAN: short}
    worker_labels = {**base_labels, L_COMPONENT: "worker"}
    router_labels = {**base_labels, L_COMPONENT: "router"}
    hashes = {A_PROFILE: profile.name, A_PROFILE_SHA: plan.profile_sha256, A_PLAN_SHA: plan_sha}
    render_note = json.dumps(args.to_dict(), sort_keys=True, separators=(",", ":"))
    sts_name = f"{NAME}-{short}"
    serve_port = plan.workers[0].serve_port
    engine_port = plan.workers[0].engine_port
    files: dict[str, list[dict[str, Any]]] = {}

    files["namespace.yaml"] = [{"apiVersion": "v1", "kind": "Namespace",
                                "metadata": _meta(ns, None, base_labels, {**hashes, A_RENDER: render_note})}]
    files["lock.yaml"] = [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": _meta(f"{NAME}-lock", ns, base_labels, hashes),
                           "data": {"images": image, "image-name": image_name, "plan-sha256": plan_sha}}]
    plan_cm = f"{NAME}-plan-{short}"
    files["plan.yaml"] = [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": _meta(plan_cm, ns, base_labels, hashes),
                           "data": {"plan.json": plan_json}}]

    common_env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                  {"name": "NETRA_PLAN_SHA256", "value": plan_sha},
                  {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "netra-hf-token", "key": "token",
                                                                       "optional": True}}}]
    plan_volume = {"name": "plan", "configMap": {"name": plan_cm}}
    volumes: list[dict[str, Any]] = [plan_volume, {"name": "hf-cache", "emptyDir": {}},
                                     {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    mounts = [{"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
              {"name": "hf-cache", "mountPath": HF_CACHE}]
    template_annotations = dict(hashes)
    if args.layout == "per-gpu":
        replicas = args.nodes * plan.dp
        cpu_counts = {len(w.cpus) for w in plan.workers}
        if profile.target == "cpu":
            engine_cpu = ENGINE_CPUS_CPU_TARGET
        elif len(cpu_counts) == 1 and min(cpu_counts) > 0:
            engine_cpu = cpu_counts.pop()
        else:
            raise K8sError(f"profile {profile.name!r}: workers' CPU shares differ ({sorted(cpu_counts)}): "
                           "one pod template cannot carry them")
        volumes.append({"name": "audit", "emptyDir": {"medium": "Memory"}})
        containers = [
            {"name": "engine", "image": image, "imagePullPolicy": pull,
             "args": ["netra", "k8s", "pod", "engine"],
             "env": common_env,
             "ports": [{"name": "engine", "containerPort": engine_port, "protocol": "TCP"}],
             "resources": _res(str(engine_cpu), engine_mem, {gpu_res: 1} if gpu_res else None),
             "volumeMounts": [*mounts, {"name": "shm", "mountPath": "/dev/shm"}]},
            {"name": "serve", "image": image, "imagePullPolicy": pull,
             "args": ["netra", "k8s", "pod", "serve"],
             "env": [*common_env, {"name": "NETRA_AUDIT_FILE", "value": f"{AUDIT_DIR}/audit.json"},
                     {"name": "NETRA_ENGINE_CPUS", "value": str(engine_cpu)}],
             "ports": [{"name": "http", "containerPort": serve_port, "protocol": "TCP"}],
             "resources": _res(SERVE_CPU, serve_mem),
             "readinessProbe": _probe(serve_port, 2, 2),
             "startupProbe": _probe(serve_port, 5, max(1, int(profile.supervisor.health_timeout_s // 5))),
             "volumeMounts": [*mounts, {"name": "audit", "mountPath": AUDIT_DIR}]},
        ]
        share_pid = True
        discovery_port = serve_port
    else:
        replicas = args.nodes
        cpus = sum(len(w.cpus) for w in plan.workers) if profile.target != "cpu" else plan.dp
        front_port = plan.front.port
        template_annotations[SMG_PORTS] = str(front_port)
        containers = [
            {"name": "node", "image": image, "imagePullPolicy": pull,
             "args": ["netra", "launch", "--profile", profile.name, "--front-host", "0.0.0.0"],
             "env": common_env,
             "ports": [{"name": "http", "containerPort": front_port, "protocol": "TCP"}],
             "resources": _res(str(cpus + 1), engine_mem, {gpu_res: plan.dp} if gpu_res else None),
             "readinessProbe": _probe(front_port, 2, 2),
             "startupProbe": _probe(front_port, 5, max(1, int(profile.supervisor.health_timeout_s // 5))),
             "volumeMounts": [*mounts, {"name": "shm", "mountPath": "/dev/shm"}]},
        ]
        share_pid = False
        discovery_port = front_port
    pod_spec: dict[str, Any] = {"shareProcessNamespace": share_pid, "enableServiceLinks": False,
                                "automountServiceAccountToken": False,
                                "terminationGracePeriodSeconds": 30, "containers": containers,
                                "volumes": volumes}
    if gpu_res:
        pod_spec["tolerations"] = [{"key": gpu_res, "operator": "Exists", "effect": "NoSchedule"}]
    headless = {"apiVersion": "v1", "kind": "Service",
                "metadata": _meta(sts_name, ns, worker_labels, hashes),
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": False, "selector": dict(worker_labels),
                         "ports": [{"name": "http", "port": discovery_port, "targetPort": discovery_port,
                                    "protocol": "TCP"}]}}
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": _meta(sts_name, ns, worker_labels, hashes),
           "spec": {"serviceName": sts_name, "replicas": replicas, "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": dict(worker_labels)},
                    "updateStrategy": {"type": "RollingUpdate"},
                    "template": {"metadata": {"labels": dict(worker_labels), "annotations": template_annotations},
                                 "spec": pod_spec}}}
    files["workers.yaml"] = [headless, sts]
    files["pdb.yaml"] = [{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                          "metadata": _meta(sts_name, ns, worker_labels, hashes),
                          "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(worker_labels)}}}]

    router = f"{NAME}-router"
    files["router-rbac.yaml"] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(router, ns, router_labels)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(router, ns, router_labels),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(router, ns, router_labels),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": router},
         "subjects": [{"kind": "ServiceAccount", "name": router, "namespace": ns}]},
    ]
    policy = SMG_POLICY[profile.front.balance]
    router_port = plan.front.port
    selector = [f"{k}={v}" for k, v in worker_labels.items()]
    smg_args = ["smg", "launch", "--host", "0.0.0.0", "--port", str(router_port), "--policy", policy,
                "--service-discovery", "--selector", *selector,
                "--service-discovery-port", str(discovery_port), "--service-discovery-namespace", ns,
                "--health-check-endpoint", "/health", "--request-timeout-secs", str(plan.front.read_timeout_s),
                "--prometheus-port", str(router_port + 1)]
    router_spec = {"serviceAccountName": router, "automountServiceAccountToken": True, "enableServiceLinks": False,
                   "containers": [{"name": "smg", "image": image, "imagePullPolicy": pull,
                                   "command": smg_args,
                                   "ports": [{"name": "http", "containerPort": router_port, "protocol": "TCP"},
                                             {"name": "metrics", "containerPort": router_port + 1,
                                              "protocol": "TCP"}],
                                   "resources": _res(ROUTER_RESOURCES["cpu"], ROUTER_RESOURCES["memory"]),
                                   "readinessProbe": {"tcpSocket": {"port": router_port}, "periodSeconds": 2}}]}
    files["router.yaml"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(router, ns, router_labels, hashes),
         "spec": {"replicas": 1, "selector": {"matchLabels": dict(router_labels)},
                  "template": {"metadata": {"labels": dict(router_labels), "annotations": dict(hashes)},
                               "spec": router_spec}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(router, ns, router_labels, hashes),
         "spec": {"selector": dict(router_labels),
                  "ports": [{"name": "http", "port": router_port, "targetPort": router_port, "protocol": "TCP"}]}},
    ]

    vap = f"{NAME}-{profile.name}-lock"
    netra_pod = f"has(object.metadata.labels) && '{L_NAME}' in object.metadata.labels && " \
                f"object.metadata.labels['{L_NAME}'] == '{NAME}'"
    files["admission.yaml"] = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": _meta(vap, None, base_labels),
         "spec": {"failurePolicy": "Fail",
                  "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["CREATE", "UPDATE"],
                                                          "resources": ["pods"]}]},
                  "matchConditions": [{"name": "netra-pod", "expression": netra_pod}],
                  "validations": [
                      {"expression": "object.spec.containers.all(c, c.image in params.data['images'].split(' '))",
                       "message": "a Netra pod runs only images of the image lock"},
                      {"expression": f"has(object.metadata.annotations) && '{A_PLAN_SHA}' in object.metadata."
                                     f"annotations && object.metadata.annotations['{A_PLAN_SHA}'] == "
                                     "params.data['plan-sha256']",
                       "message": "a Netra pod carries the plan hash of the lock"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": _meta(vap, None, base_labels),
         "spec": {"policyName": vap, "validationActions": ["Deny"],
                  "paramRef": {"name": f"{NAME}-lock", "namespace": ns, "parameterNotFoundAction": "Deny"},
                  "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}},
    ]
    files["kustomization.yaml"] = [{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                    "resources": [f for f in FILES if f != "kustomization.yaml"]}]
    return {f: files[f] for f in FILES}


def header(args: RenderArgs) -> str:
    cmd = f"netra k8s render --profile {args.profile} --nodes {args.nodes} --layout {args.layout}"
    cmd += "" if args.strict else " --unverified"
    cmd += f" --topology {args.topology}" if args.topology else ""
    return f"# Rendered by `{cmd}`; do not edit (re-render; `netra k8s check DIR` names what differs).\n"


def to_text(args: RenderArgs, docs: list[dict[str, Any]]) -> str:
    from netra.deploy.compose import to_yaml

    # A JSON round trip: shared sub-objects would otherwise be written as YAML anchors and aliases.
    return header(args) + "---\n".join(to_yaml(json.loads(json.dumps(d))) for d in docs)


def render(args: RenderArgs) -> dict[str, str]:
    """File name -> its text."""
    return {name: to_text(args, docs) for name, docs in build(args).items()}


def write(args: RenderArgs, out: Path) -> list[Path]:
    texts = render(args)  # refused (raises) before anything is written
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        path = out / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written


# --- check -------------------------------------------------------------------------------------------------


def render_args_of(directory: Path) -> RenderArgs:
    """The arguments a directory was rendered with (the Namespace's render annotation)."""
    import yaml

    ns_file = directory / "namespace.yaml"
    if not ns_file.is_file():
        raise K8sError(f"{ns_file}: missing (not a directory `netra k8s render` wrote)")
    docs = [d for d in yaml.safe_load_all(ns_file.read_text()) if d]
    try:
        raw = json.loads(docs[0]["metadata"]["annotations"][A_RENDER])
    except (IndexError, KeyError, TypeError, ValueError):
        raise K8sError(f"{ns_file}: no {A_RENDER} annotation on the Namespace") from None
    return RenderArgs(profile=raw["profile"], nodes=int(raw["nodes"]), layout=raw["layout"],
                      strict=bool(raw["strict"]), topology=raw.get("topology"))


def _diff(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append(f"{p}: added (not rendered)")
            elif k not in b:
                out.append(f"{p}: missing (rendered {json.dumps(a[k])[:80]})")
            else:
                out += _diff(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    if a != b:
        return [f"{path}: {json.dumps(b)[:120]} (rendered: {json.dumps(a)[:120]})"]
    return []


def _key(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return f"{doc.get('kind')}/{meta.get('name')}"


def check(directory: Path, args: RenderArgs | None = None) -> list[str]:
    """What differs between `directory` and a fresh render of its arguments, one line per field."""
    import yaml

    args = args or render_args_of(directory)
    expected = build(args)
    problems: list[str] = []
    for name, docs in expected.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        try:
            found = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as exc:
            problems.append(f"{name}: not YAML ({exc})")
            continue
        want = {_key(d): d for d in docs}
        have = {_key(d): d for d in found if isinstance(d, dict)}
        for k in want:
            if k not in have:
                problems.append(f"{name}: {k} missing")
            else:
                problems += [f"{name}: {k} {d}" for d in _diff(want[k], have[k], "")]
        problems += [f"{name}: {k} not rendered" for k in have if k not in want]
    extra = sorted(p.name for p in directory.glob("*.yaml") if p.name not in expected)
    problems += [f"{n}: not rendered" for n in extra]
    return problems
