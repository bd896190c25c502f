"""Packaging for AST-T5 on fairseq.

Metadata lives in pyproject.toml. This file only maps the source folders to globally unique import
names and, when asked by an environment variable, builds the optional CUDA extension:

    AST_T5_BUILD_CUDA_EXT=1 TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX" pip install --no-build-isolation -e .

Without the variable nothing is compiled and the PyTorch reference implementations are used.
"""
import glob
import os
import re

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version() -> str:
    with open(os.path.join(HERE, "ast_t5", "version.py"), encoding="utf-8") as f:
        return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


def cuda_extensions():
    """The fused softmax-dropout extension, only when AST_T5_BUILD_CUDA_EXT=1."""
    if os.environ.get("AST_T5_BUILD_CUDA_EXT", "0") != "1":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    nvcc_flags = ["-O3", "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__",
                  "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"]
    sources = sorted(glob.glob("fused_ops/csrc/*.cpp") + glob.glob("fused_ops/csrc/cuda/*.cu"))
    ext = CUDAExtension(
        name="fused_ops._C",
        sources=sources,
        extra_compile_args={"cxx": ["-O3"], "nvcc": nvcc_flags},  # torch picks the C++ standard
    )
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = cuda_extensions()

setup(
    version=read_version(),
    packages=[
        "ast_t5", "ast_t5.tasks", "ast_t5.models", "ast_t5.modules", "ast_t5.data",
        "ast_t5.criterions", "ast_t5.eval", "ast_t5.optim", "ast_t5.generation", "ast_t5.hf",
        "ast_t5.ablate",
        "ast_t5_preprocess",
        "fused_ops",
        "hydra_plugins.ast_t5_hydra",
        "ast_t5_configs",
    ],
    # `preprocess` alone is too generic a top-level name, so the folder installs as
    # `ast_t5_preprocess`.
    # `config/` installs as `ast_t5_configs` (YAML files only), so the Hydra plugin finds the
    # configs by name from any directory.
    package_dir={"ast_t5_preprocess": "preprocess", "ast_t5_configs": "config"},
    package_data={"ast_t5_preprocess": ["default_corpus/*/*"], "fused_ops": ["csrc/*", "csrc/cuda/*"],
                  "ast_t5_configs": ["pretrain/*.yaml", "pretrain/run_config/*.yaml", "finetune/*.yaml"],
                  "hydra_plugins.ast_t5_hydra": ["conf/hydra/job_logging/*.yaml"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
