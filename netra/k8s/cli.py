"""`netra k8s render|check|pod`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _render(args: argparse.Namespace) -> int:
    from netra.deploy.profile import ProfileError
    from netra.deploy.topology import PlacementError
    from netra.k8s.render import K8sError, RenderArgs, write

    ra = RenderArgs(profile=args.profile, nodes=args.nodes, layout=args.layout, strict=not args.unverified,
                    topology=args.topology)
    try:
        paths = write(ra, args.output)
    except (K8sError, ProfileError, PlacementError, ValueError) as exc:
        print(f"netra k8s render: refused: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} files to {args.output}", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    from netra.deploy.profile import ProfileError
    from netra.k8s.render import K8sError, check

    try:
        problems = check(args.directory)
    except (K8sError, ProfileError, ValueError) as exc:
        print(f"netra k8s check: {exc}", file=sys.stderr)
        return 2
    if problems:
        print(f"netra k8s check: {args.directory} differs from a fresh render:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"{args.directory}: equal to a fresh render", file=sys.stderr)
    return 0


def _pod(args: argparse.Namespace) -> int:
    from netra.k8s.pod import main

    return main(args.role, args.plan)


def register(sub: Any) -> None:
    from netra.cli import add_verb
    from netra.k8s.pod import PLAN_FILE
    from netra.k8s.render import LAYOUTS

    parser = add_verb(sub, "k8s")
    verbs = parser.add_subparsers(dest="k8s_verb", metavar="VERB", required=True)
    r = verbs.add_parser("render", help="render a profile's plan as Kubernetes manifests + kustomization")
    r.add_argument("--profile", required=True, help="profile name (launcher/NAME.yaml) or path")
    r.add_argument("--nodes", type=int, default=1, help="GPU nodes the workers spread over")
    r.add_argument("--layout", choices=LAYOUTS, default="per-gpu",
                   help="a pod per GPU (kubelet places), or a pod per node running `netra launch`")
    r.add_argument("--topology", help="sysfs tree to plan on (default: the target's reference fixture)")
    r.add_argument("--unverified", action="store_true", help="render unresolved image digests anyway")
    r.add_argument("-o", "--output", type=Path, required=True, help="directory to write")
    r.set_defaults(func=_render)
    c = verbs.add_parser("check", help="re-render a directory's arguments and name every field that differs")
    c.add_argument("directory", type=Path, help="a directory `netra k8s render` wrote")
    c.set_defaults(func=_check)
    p = verbs.add_parser("pod", help="(inside a worker pod) run this ordinal's engine or response layer")
    p.add_argument("role", choices=("engine", "serve"), help="the container: the engine or its response layer")
    p.add_argument("--plan", type=Path, default=PLAN_FILE, help="the mounted plan ConfigMap's plan.json")
    p.set_defaults(func=_pod)
