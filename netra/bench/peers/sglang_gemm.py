"""The dense FP8 projection peer: SGLang 0.5.23's ``triton_w8a8_block_fp8_linear`` as its linear method calls it.

``dispatch_w8a8_block_fp8_linear([128, 128])`` (sglang/srt/layers/quantization/fp8_utils.py) on an H200 without
DeepGEMM (not importable on the H200's torch 2.11: sglang_common) picks ``triton_w8a8_block_fp8_linear``: SGLang's
per-token-group quantization (its JIT CUDA module, built by ``make sglang-peer``) then
``w8a8_block_fp8_matmul_triton`` (sglang/kernels/ops/gemm/fp8_kernel.py) with the tuned config file for (N, K) on
the device when the wheel has one, else its default tile (64 x 128 x 128, 3 stages). The wheel's tuned H200
block-[128, 128] files are carried (FILES), so the lookup is SGLang's own; none of them is for Netra's
projection shapes (N = 12288 / 9216 / 2048 at K = 2048 / 4096), so SGLang runs its default there (RUN_NOTES).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from netra.bench.peers.sglang_loader import DEFAULT_ROOT, Manifest

BLOCK = [128, 128]
_CFG = "sglang/kernels/ops/gemm/configs/"
# every tuned H200 block-[128, 128] config in the wheel (sglang/kernels/ops/gemm/configs)
_TUNED_NK = ((512, 7168), (576, 7168), (1536, 7168), (2048, 512), (2304, 7168), (3072, 1536), (3072, 7168),
             (4096, 512), (4608, 7168), (7168, 256), (7168, 1024), (7168, 1152), (7168, 2048), (7168, 2304),
             (7168, 16384), (7168, 18432), (24576, 7168), (32768, 512), (36864, 7168))
FILES = tuple(f"{_CFG}N={n},K={k},device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
              for n, k in _TUNED_NK)
MODULES = ("sglang.kernels.ops.gemm.fp8_kernel", "sglang.srt.layers.quantization.fp8_utils")
MANIFEST = Manifest("gemm", MODULES, files=FILES)
RUN_NOTES = ("no tuned H200 config in the wheel for these (N, K): SGLang's default block config runs",
             "torch 2.11 / triton 3.6 on the H200 (SGLang 0.5.23 pins torch 2.14.1)")


class SglangBlockFp8Linear:
    """``linear(x)`` = SGLang's block-FP8 linear for one weight (E4M3 ``[N, K]``, FP32 scales ``[N/128, K/128]``);
    ``matmul(xq, xs)`` = its ``w8a8_block_fp8_matmul_triton`` alone on pre-quantized activations."""

    def __init__(self, weight: Any, scale: Any, root: Path | str = DEFAULT_ROOT) -> None:
        import importlib

        from netra.bench.peers import sglang_loader

        sglang_loader.install(Path(root))  # no-op when a run installed the peers already
        fp8u = importlib.import_module("sglang.srt.layers.quantization.fp8_utils")
        self.gemm = importlib.import_module("sglang.kernels.ops.gemm.fp8_kernel")
        self.fn = fp8u.dispatch_w8a8_block_fp8_linear(BLOCK)
        self.w, self.s = weight, scale

    def linear(self, x: Any) -> Any:
        return self.fn(input=x, weight=self.w, block_size=BLOCK, weight_scale=self.s, input_scale=None, bias=None)

    def matmul(self, xq: Any, xs: Any) -> Any:
        import torch

        return self.gemm.w8a8_block_fp8_matmul_triton(xq, self.w, xs, self.s, BLOCK, torch.bfloat16)
