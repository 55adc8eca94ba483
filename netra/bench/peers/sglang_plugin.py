"""What Netra's SGLang plugin check (scripts/gpu/plugin_h200.py, issue 21) loads besides the MoE peer.

The plugin wraps SGLang 0.5.23's ``fused_experts`` and ``Sampler.forward`` through SGLang's own
``HookRegistry``. The MoE side is the MoE peer's manifest (``sglang_moe``: ``fused_experts`` with its
JIT per-token-group quant, JIT ``silu_and_mul``, JIT ``moe_align_block_size``, Triton kernels and
tuned configs); this manifest adds the plugin framework, the runner's ``MoeRunnerConfig``, and the
sampler with the modules its greedy and plain (temperature-only) sampling paths run: SGLang's
sampling ``softmax`` facade (on sm90 its Cake kernel does not qualify, so it runs ``torch.softmax``,
as production does there) and the NaN probe. Staged into the same folder as every peer
(``make sglang-peer``), so one tree serves the peers and the plugin check.
"""

from __future__ import annotations

from typing import Any

from netra.bench.peers.sglang_common import _bool_env
from netra.bench.peers.sglang_loader import Manifest

MODULES = (
    "sglang.srt.plugins.hook_registry", "sglang.srt.layers.moe.moe_runner.base",
    "sglang.srt.layers.sampler", "sglang.srt.utils.async_probe",
    "sglang.kernels.ops.sampling", "sglang.kernels.ops.sampling.murmur_hash",
    "sglang.kernels.cake_kernels", "sglang.kernels.cake_kernels.sampling",
)


class LazyImport:
    """``sglang.utils.LazyImport`` (sglang/utils.py imports the server's dependencies): the sampler
    binds FlashInfer's samplers with it at import; the paths the plugin check runs never call them."""

    def __init__(self, module: str, name: str) -> None:
        self.where = f"{module}.{name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"LazyImport {self.where} called: not on the paths the plugin check runs")


def _false(*args: Any, **kwargs: Any) -> bool:
    return False


STUBS: dict[str, dict[str, Any]] = {  # the sampler's platform probes at import (TP1 CUDA sm90)
    "sglang.srt.utils.common": {"get_bool_env_var": _bool_env, "is_hip": _false, "is_musa": _false,
                                "is_npu": _false, "is_xpu": _false, "is_gfx1250_supported": _false},
    "sglang.srt.layers.dp_attention": {"is_dp_attention_enabled": _false},
    "sglang.utils": {"LazyImport": LazyImport},
}
MANIFEST = Manifest("plugin", MODULES, stubs=STUBS)

__all__ = ["MANIFEST"]
