"""The MoE peer: what SGLang 0.5.23 runs for Qwen3.5/3.6-MoE's sparse block on a TP1 H200.

Every kernel below is SGLang's own code from the pinned wheel, loaded without the server by
``netra.bench.peers.sglang_loader`` (its JIT CUDA modules prebuilt here for sm_90a with SGLang's own
``load_jit`` and run through apache-tvm-ffi). Production path (``Qwen2MoeSparseMoeBlock.forward``,
sglang/srt/models/qwen2_moe.py; TP1, no EP/DP, ``--moe-runner-backend auto`` -> ``triton`` for a
block-FP8 checkpoint, ``Fp8MoEMethod.create_moe_runner``):

* router: ``ReplicatedLinear`` gate, unquantized -> ``F.linear`` (``UnquantizedLinearMethod``; the
  auto BF16 backend is cuBLAS on sm90), then ``TopK`` -> ``select_experts`` -> ``fused_topk`` ->
  ``moe_fused_gate(logits, None, 8, "softmax", renormalize=True)`` (SGLang's Triton router; CUDA
  takes it for every softmax top-k). TP1 binds no ``num_token_non_padded``: no id masking.
* routed experts: ``fused_experts`` -> ``outplace_fused_experts`` -> ``fused_experts_impl`` (called
  directly here, the torch.library wrapper aside; ``filter_expert=False`` since E == local E,
  ``inplace=False`` since the shared expert still needs the input). Inside, for E=256, top-8,
  N=512, block [128, 128], M <= 128: the wheel's tuned H200 configs (up: the M=256 entry; down:
  ``USE_TMA`` at every M, so the down GEMM reads a sorted, TMA-described activation);
  ``moe_align_small_numel`` (Triton) for <= 64 routes, else ``moe_align_block_size``; the JIT
  ``per_token_group_quant`` (flat for the up GEMM, sorted for the down GEMM); ``fused_moe_kernel``
  twice (Triton, PDL); the JIT ``silu_and_mul`` (sorted-filtered rows); ``moe_sum_reduce_triton``
  (PDL) for <= 32 tokens, else ``sgl_kernel.moe_sum_reduce``.
* shared expert: ``Qwen2MoeMLP`` (gate_up ``MergedColumnParallelLinear`` -> ``SiluAndMul`` ->
  ``RowParallelLinear``), each linear ``Fp8LinearMethod`` -> ``dispatch_w8a8_block_fp8_linear``;
  then ``fused_gate_sigmoid_mul_add(x, shared_expert_gate.weight, shared, routed)`` (Triton; CUDA
  always takes this fused combine). Under CUDA-graph capture ``forward_normal_dual_stream`` runs the
  shared MLP (on ``x.clone()``) on the capture stream and router + routed experts on ``alt_stream``,
  joined before the combine; eagerly everything runs in order on one stream. ``block`` does the same.

What cannot run as in production (each is also in ``RUN_NOTES`` and in the record):
  * ``sgl_kernel`` (sglang-kernel 0.4.10, AOT) and DeepGEMM (sgl-deep-gemm 0.2.3.post2) are torch
    extensions built for torch 2.14.1: both import ``c10::cuda::CUDAErrorLogCapture``, which the
    H200's torch 2.11 lacks, and the AOT wheel is 373 MB. So: for > 64 routes SGLang's AOT
    ``moe_align_block_size`` -> its JIT ``moe_align_block_size`` (the JIT backend registered for
    the same op); for > 32 tokens the AOT ``moe_sum_reduce`` -> SGLang's Triton
    ``moe_sum_reduce_triton`` (the kernel it runs for <= 32 tokens, and on HIP);
  * the shared expert's FP8 block linear: production's auto backend on sm90 is DeepGEMM
    (``deepgemm_w8a8_block_fp8_linear_with_fallback``, JIT-compiled at run time); without DeepGEMM
    SGLang's own dispatch returns ``triton_w8a8_block_fp8_linear`` (per-token-group quant + the
    Triton ``w8a8_block_fp8_matmul``, tuned H200 config for the down projection, default tile for
    gate_up), which is what runs (the dispatch itself runs, with ``ENABLE_JIT_DEEPGEMM`` False);
  * ``SiluAndMul.forward_cuda`` (sglang/srt/layers/activation.py, not importable without the
    server) calls the same JIT ``silu_and_mul``; the peer calls it directly;
  * torch 2.11 / triton 3.6 on the H200 where SGLang 0.5.23 pins torch 2.14.1 (the tuned configs
    are the wheel's triton_3_6_0 files, so the Triton tiles are the ones SGLang would pick).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from netra.bench.peers.sglang_loader import DEFAULT_ROOT, JitBuild, Manifest

E, TOPK, HIDDEN, INTER = 256, 8, 2048, 512
BLOCK = [128, 128]

_MOE_CFG = "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/"
_CFG_NAME = "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]"
MODULES = (  # besides sglang_common.COMMON's (SGLang's JIT loader, environ, kernel registry)
    # routed experts
    "sglang.srt.layers.moe.moe_runner.triton_utils", "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe",
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config",
    "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size",
    "sglang.kernels.ops.moe", "sglang.kernels.ops.moe.fused_moe_triton_kernels", "sglang.kernels.ops.moe.moe_align",
    "sglang.kernels.ops.moe.moe_align_small_numel", "sglang.kernels.ops.activation.activation",
    "sglang.kernels.ops.quantization", "sglang.kernels.ops.quantization.fp8_kernel",
    "sglang.kernels.ops.quantization.fp8_utils", "sglang.kernels.ops.quantization.int8_kernel",
    "sglang.kernels.ops.quantization.per_token_group_quant", "sglang.kernels.ops.quantization.per_tensor_quant_fp8",
    # router, shared expert, combine
    "sglang.kernels.ops.moe.moe_fused_gate", "sglang.kernels.ops.elementwise.elementwise",
    "sglang.kernels.ops.gemm.fp8_kernel", "sglang.srt.layers.quantization.fp8_utils",
)
FILES = (f"{_MOE_CFG}{_CFG_NAME}.json", f"{_MOE_CFG}{_CFG_NAME}_down.json",
         "sglang/kernels/ops/gemm/configs/N=2048,K=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,"
         "block_shape=[128, 128].json")
# SGLang's JIT modules this path loads, as SGLang asks for them (getter + arguments): the flat and
# the sorted per-token-group quant (bf16 -> e4m3, groups of 128, row-major fp32 scales, PDL on
# sm90), the activation module (bf16, PDL, fast math) and the align kernel.
_PTGQ = ("torch.bfloat16", "torch.float8_e4m3fn", 128, False, True, True, False, False, True)
JIT = (JitBuild("sglang.kernels.ops.quantization.per_token_group_quant", "_jit_module", (*_PTGQ, False, "legacy")),
       JitBuild("sglang.kernels.ops.quantization.per_token_group_quant", "_jit_module", (*_PTGQ, True, "legacy")),
       JitBuild("sglang.kernels.ops.activation.activation", "activation_module", ("torch.bfloat16",)),
       JitBuild("sglang.kernels.ops.moe.moe_align", "_jit_moe_align_module", ("torch.int32", False, False, False)),
       # SGLang's router gives int32 ids; a caller's int64 ids (torch.topk) take SGLang's int64 variant
       JitBuild("sglang.kernels.ops.moe.moe_align", "_jit_moe_align_module", ("torch.int64", False, False, False)))


STUBS: dict[str, dict[str, Any]] = {  # MoE-only; the platform facts are sglang_common.COMMON's
    "sglang.srt.layers.moe.utils": {"get_moe_padding_size": lambda *a, **k: 0},
    "sglang.srt.layers.moe.moe_runner": {"MoeRunnerConfig": lambda *a, **k: None},
}
_NO_AOT = "sglang-kernel 0.4.10 (AOT, torch 2.14.1 ABI) cannot load on the H200's torch 2.11"
REFS = {"sgl_kernel": {
    "moe_align_block_size": ("sglang.kernels.ops.moe.moe_align:moe_align_block_size",
                             f"{_NO_AOT}: SGLang's JIT moe_align_block_size (same op, JIT backend) ran"),
    "moe_sum_reduce": ("sglang.kernels.ops.moe.fused_moe_triton_kernels:moe_sum_reduce_triton",
                       f"{_NO_AOT}: SGLang's Triton moe_sum_reduce_triton (its <= 32-token kernel) ran"),
}}
MANIFEST = Manifest("moe", MODULES, files=FILES, stubs=STUBS, refs=REFS, jit=JIT)
RUN_NOTES = (
    f"{_NO_AOT}: > 64 routes align with SGLang's JIT moe_align_block_size instead of the AOT kernel; "
    "> 32 tokens sum with SGLang's Triton moe_sum_reduce_triton instead of the AOT moe_sum_reduce",
    "shared-expert FP8 block linear: production's sm90 auto backend is DeepGEMM (sgl-deep-gemm 0.2.3.post2, "
    "torch 2.14.1 ABI, not loadable on torch 2.11); SGLang's dispatch without DeepGEMM ran: "
    "triton_w8a8_block_fp8_linear (JIT per-token-group quant + Triton w8a8_block_fp8_matmul)",
    "shared-expert SiluAndMul: the JIT silu_and_mul that SiluAndMul.forward_cuda calls, called directly",
    "torch 2.11 / triton 3.6 on the H200 (SGLang 0.5.23 pins torch 2.14.1); tuned configs: the wheel's triton_3_6_0",
)


class SglangMoePeer:
    """SGLang's MoE block for Qwen3.6 (E=256, top-8, H=2048, I=512, shared expert I=512).

    Weights (CUDA): ``w13`` [E, 1024, 2048] e4m3 (gate rows then up rows), ``s13`` [E, 8, 16] fp32;
    ``w2`` [E, 2048, 512] e4m3, ``s2`` [E, 16, 4]; ``router_w`` [E, 2048] bf16; the shared expert
    ``sh_w13`` [1024, 2048] e4m3, ``sh_s13`` [8, 16], ``sh_w2`` [2048, 512] e4m3, ``sh_s2`` [16, 4];
    ``gate_w`` [1, 2048] bf16 (``shared_expert_gate``). ``x`` is [M, 2048] bf16, M >= 1.

    No call synchronises with the host; every call is capturable once it has run eagerly at that M
    (Triton compiles, JIT modules load, configs are read, the TMA descriptor cache fills). SGLang's
    functions allocate their outputs and intermediates per call, as in production; under capture
    those come from the graph's pool.
    """

    def __init__(self, w13: Any, s13: Any, w2: Any, s2: Any, router_w: Any, sh_w13: Any, sh_s13: Any,
                 sh_w2: Any, sh_s2: Any, gate_w: Any, root: Path | str = DEFAULT_ROOT) -> None:
        import importlib

        import torch

        from netra.bench.peers import sglang_loader

        sglang_loader.install(Path(root))
        self.fm = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")
        self.gate = importlib.import_module("sglang.kernels.ops.moe.moe_fused_gate")
        self.ew = importlib.import_module("sglang.kernels.ops.elementwise.elementwise")
        self.act = importlib.import_module("sglang.kernels.ops.activation.activation")
        fp8u = importlib.import_module("sglang.srt.layers.quantization.fp8_utils")
        self.linear = fp8u.dispatch_w8a8_block_fp8_linear(BLOCK)  # SGLang's own choice (no DeepGEMM here)
        self.w13, self.s13, self.w2, self.s2 = w13, s13, w2, s2
        self.router_w = router_w
        self.sh = (sh_w13, sh_s13, sh_w2, sh_s2)
        self.gate_w = gate_w.reshape(-1).contiguous()  # shared_expert_gate.weight.squeeze()
        self.alt = torch.cuda.Stream() if w13.is_cuda else None  # the model's alt_stream

    @classmethod
    def from_moe_weights(cls, w: Any, root: Path | str | None = None) -> SglangMoePeer:
        """From a ``netra.ops.moe.MoEWeights`` (E4M3 experts and shared expert, BF16 router and gate)."""
        return cls(w.w13.data, w.w13.scale_inv, w.w2.data, w.w2.scale_inv, w.router.data, w.shared_w13.data,
                   w.shared_w13.scale_inv, w.shared_w2.data, w.shared_w2.scale_inv, w.shared_gate.data,
                   root=Path(root) if root is not None else DEFAULT_ROOT)

    # ---- the parts -------------------------------------------------------------------------
    def router(self, x: Any) -> tuple[Any, Any]:
        """``self.gate(x)`` + ``self.topk``: (fp32 weights [M, 8], int32 ids [M, 8])."""
        import torch.nn.functional as F

        logits = F.linear(x, self.router_w)
        w, ids = self.gate.moe_fused_gate(logits, None, TOPK, scoring_func="softmax", renormalize=True)
        return w, ids

    def routed(self, x: Any, topk_ids: Any, topk_w: Any) -> Any:
        """``fused_experts_impl`` as ``outplace_fused_experts`` calls it for this layer: ``topk_ids``
        [M, 8] int32 (as SGLang's router gives them; int64 also runs), ``topk_w`` [M, 8] fp32."""
        return self.fm.fused_experts_impl(
            x, self.w13, self.w2, topk_w, topk_ids, None, None, False, "silu", True, False, True, False, False,
            False, False, self.s13, self.s2, None, None, None, None, BLOCK, no_combine=False,
            routed_scaling_factor=None, gemm1_alpha=None, gemm1_limit=None, filter_expert=False,
            swiglu_limit=None, gate_up_interleaved=True, a1_q=None, fuse_swiglu_interleaved=False,
            no_combine_keep_router_weight=False)

    def shared(self, x: Any) -> Any:
        """``Qwen2MoeMLP.forward``: gate_up linear -> SiluAndMul -> down linear (ungated)."""
        w13, s13, w2, s2 = self.sh
        gu = self.linear(input=x, weight=w13, block_size=BLOCK, weight_scale=s13, input_scale=None, bias=None)
        h = gu.new_empty(*gu.shape[:-1], gu.shape[-1] // 2)  # SiluAndMul.forward_cuda
        self.act.silu_and_mul(gu, h)
        return self.linear(input=h, weight=w2, block_size=BLOCK, weight_scale=s2, input_scale=None, bias=None)

    def routed_block(self, x: Any) -> Any:
        """``_forward_router_experts``: router, then the routed experts."""
        w, ids = self.router(x)
        return self.routed(x, ids, w)

    def block(self, x: Any) -> Any:
        """``Qwen2MoeSparseMoeBlock.forward`` (use_fused_gate): dual-stream while capturing."""
        import torch

        if x.is_cuda and torch.cuda.is_current_stream_capturing():  # forward_normal_dual_stream
            assert self.alt is not None
            cur = torch.cuda.current_stream()
            self.alt.wait_stream(cur)
            shared = self.shared(x.clone())
            with torch.cuda.stream(self.alt):
                out = self.routed_block(x)
            cur.wait_stream(self.alt)
        else:
            shared = self.shared(x)
            out = self.routed_block(x)
        self.ew.fused_gate_sigmoid_mul_add(x, self.gate_w, shared, out)
        return out

    # ---- what ran ---------------------------------------------------------------------------
    def configs(self, m: int) -> dict[str, Any]:
        """SGLang's tuned (up, down) fused-MoE configs at ``m`` tokens, as it resolves them."""
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (  # type: ignore
            try_get_optimal_moe_config,
        )

        up, (down, _) = try_get_optimal_moe_config(self.w13.shape, self.w2.shape, TOPK, "fp8_w8a8", m,
                                                   block_shape=BLOCK, return_down_config=True)
        return {"up": dict(up), "down": dict(down) if down else None}


def path_notes(m: int) -> list[str]:
    """Which SGLang kernels the routed call runs at ``m`` tokens (from the code paths above)."""
    routes = m * TOPK
    align = ("moe_align_small_numel (Triton)" if routes <= 64
             else "moe_align_block_size: SGLang's JIT kernel in place of the AOT sgl_kernel one")
    total = ("moe_sum_reduce_triton (PDL)" if m <= 32
             else "moe_sum_reduce_triton in place of the AOT sgl_kernel.moe_sum_reduce")
    return [align, "per_token_group_quant JIT (flat) -> fused_moe_kernel up (c_sorted)",
            "silu_and_mul JIT (sorted-filtered) -> per_token_group_quant JIT (sorted)",
            "fused_moe_kernel down (TMA A and B descriptors)", total]


__all__ = ["MANIFEST", "RUN_NOTES", "SglangMoePeer", "path_notes"]

if __name__ == "__main__":
    from netra.bench.peers.sglang_loader import main

    raise SystemExit(main())
