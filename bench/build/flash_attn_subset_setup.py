"""setup.py for a subset of flash-attention, dropped into its unpacked PyPI sdist by flash-attn-source.sh.

The full extension is 73 nvcc jobs of about 3 minutes each on one core; this keeps the shape
of the real build at a size a benchmark can repeat: the C++ binding `flash_api.cpp` plus four
sm_80 forward kernels, compiled by torch's `cpp_extension` with the flags of flash-attention's
own setup.py, except `-std=c++20`, which torch 2.15's headers need. The module links with
unresolved kernel symbols and is never imported: the benchmark measures the compile.
"""
import os
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

here = Path(__file__).resolve().parent
kernels = [
    f"csrc/flash_attn/src/flash_fwd_hdim128_{kind}_sm80.cu"
    for kind in ("fp16", "bf16", "fp16_causal", "bf16_causal")
]
nvcc_flags = [
    "-O3",
    "-std=c++20",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "--threads",
    os.environ.get("NVCC_THREADS", "4"),
]

setup(
    name="flash-attn-subset",
    version="0.0.0",
    ext_modules=[
        CUDAExtension(
            name="flash_attn_subset_cuda",
            sources=["csrc/flash_attn/flash_api.cpp", *kernels],
            extra_compile_args={"cxx": ["-O3", "-std=c++20"], "nvcc": nvcc_flags},
            include_dirs=[
                here / "csrc" / "flash_attn",
                here / "csrc" / "flash_attn" / "src",
                here / "csrc" / "cutlass" / "include",
            ],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
