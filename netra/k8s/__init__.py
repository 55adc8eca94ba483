"""Netra past one node: Kubernetes manifests rendered from the same profiles and plans as `netra compose`.

`netra.k8s.render` builds the manifests, `netra.k8s.pod` is what runs inside a worker pod (the
ordinal's worker of the plan, and the in-pod audit that gates readiness), `netra.k8s.cli` the verb.
"""
