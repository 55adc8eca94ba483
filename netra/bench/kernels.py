"""`netra bench kernels --family F`: a family's GPU specs run by the one harness (`netra.bench.harness`).

The same run as ``python -m netra.bench.harness <spec>...`` for every spec of the family (``--list`` there names
them): each case checked, then timed side by side under the one protocol, one record per spec in ``--out`` with
the one promotion rule (`netra.validate.promotion`). The smoke paths (CPU, Triton's interpreter) run through the
harness itself: ``python -m netra.bench.harness <spec> --smoke``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def families() -> tuple[str, ...]:
    """The families that have a spec under netra/bench/specs."""
    from netra.bench.harness import specs

    return tuple(sorted({s.family for s in specs().values()}))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from netra.bench.harness import specs

    p.add_argument("--family", choices=families(), required=True, help="kernel family: its specs run in turn")
    p.add_argument("--out", type=Path, default=None,
                   help="record directory (default $NETRA_RUN_DIR/records; results/sm90 to keep them)")
    p.add_argument("--deadline", type=float, default=0.0, help="seconds per spec: no new case after (0: none)")
    p.add_argument("--samples", type=int, default=0, help="timed samples per provider (0: the spec's default)")
    p.add_argument("--git-sha", default="", help="commit measured, when the tree has no .git (device copies)")
    for s in specs().values():
        if s.add_arguments is not None:
            s.add_arguments(p)


def main(args: argparse.Namespace) -> int:
    import torch

    from netra import settings
    from netra.bench.harness import run, specs, summary, write

    if not torch.cuda.is_available():
        print("netra bench kernels: needs a CUDA GPU (the smoke paths: python -m netra.bench.harness NAME --smoke)",
              file=sys.stderr)
        return 2
    args.smoke = False
    out = args.out or settings.records_dir()
    rc = 0
    for name, spec in sorted(specs().items()):
        if spec.family != args.family:
            continue
        record = run(spec, args)
        print("record:", write(record, out, name))
        print(summary(record), flush=True)
        rc |= 0 if record["checks"]["mismatches"] == 0 and record["checks"]["cases"] > 0 else 1
    return rc
