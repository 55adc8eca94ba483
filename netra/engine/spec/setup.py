"""Speculative decoding from the engine's options: the drafter, the block size T, the acceptance mode.

``dflash``: the DFlash drafter of ``--speculative-draft-model-path`` (z-lab's directory format), checked against
the target, its context pools sized to the engine's slots and context; T defaults to its block size.
``oracle``: forced acceptance (`ForcedAcceptance`) with a seeded schedule over ``--speculative-oracle-accept``
(default: every draft), drafting with the DFlash drafter when a path is given (its cost included) and with
`NullDrafter` otherwise; T defaults to 4 without a drafter.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from netra.engine.config import ModelConfig
from netra.engine.options import EngineOptions, OptionsError
from netra.engine.runner import ModelRunner
from netra.engine.spec.drafter import Drafter
from netra.engine.spec.oracle import ForcedAcceptance, NullDrafter, seeded_schedule
from netra.engine.spec.step import SpecStep
from netra.engine.weights import ModelWeights

ORACLE_STEPS = 4  # the oracle's default T without a drafter


def _dflash(path: str, cfg: ModelConfig, weights: ModelWeights, runner: ModelRunner) -> tuple[Drafter, int]:
    from netra.engine.config import ConfigError
    from netra.engine.spec.dflash import DFlashDrafter, load_dflash

    dcfg, dweights = load_dflash(Path(path), runner.device)
    try:
        dcfg.check_target(cfg)
    except ConfigError as exc:
        raise OptionsError(f"--speculative-draft-model-path {path}: {exc}") from exc
    drafter = DFlashDrafter(dcfg, dweights, weights.embed, weights.lm_head, runner.pools.num_slots,
                            runner.pools.context_length, device=runner.device)
    return drafter, dcfg.block_size


def speculation(options: EngineOptions, cfg: ModelConfig, weights: ModelWeights, runner: ModelRunner
                ) -> tuple[SpecStep | None, EngineOptions]:
    """The speculative step the options ask for (None: plain decoding), and the options with T resolved."""
    algo = options.speculative_algorithm
    if algo is None:
        return None, options
    drafter: Drafter
    block: int | None = None
    if options.speculative_draft_model_path:
        drafter, block = _dflash(options.speculative_draft_model_path, cfg, weights, runner)
    else:
        drafter = NullDrafter()
    t = options.speculative_num_draft_tokens or block or ORACLE_STEPS
    if block is not None and t > block:
        raise OptionsError(f"--speculative-num-draft-tokens {t}: the drafter drafts blocks of at most {block}")
    forced = None
    if algo == "oracle":
        accept = options.speculative_oracle_accept or (t - 1,)
        forced = ForcedAcceptance(seeded_schedule(options.seed, accept))
    return SpecStep(runner, drafter, t, forced), replace(options, speculative_num_draft_tokens=t)
