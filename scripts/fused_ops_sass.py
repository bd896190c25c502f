"""How the fused softmax-dropout kernels load a row, read from their machine code (no GPU needed).

Compiles ``fused_ops/csrc/cuda/softmax_dropout_kernel.cu`` with nvcc for one GPU architecture (the
flags of the extension's build), disassembles it with cuobjdump (the one on PATH, else the copy
Triton ships), and prints per kernel: registers per thread, bytes spilled, instructions, global
loads, and the largest number of global loads in one basic block.

That last figure is the one to watch. Loads in one basic block are issued one after another and are
in flight together. Until 2026-11-28 every key had a branch of its own (``if (col < k_len)``), and
its block consumed the key's loads (score, bias, mask) before the next key's block began. So the
largest block held 3 loads, and a row of 1,024 keys made 32 memory round trips, one after the other,
where one suffices. Now a row's loads share one block (96 at 1,024 keys with bias and mask).

    python scripts/fused_ops_sass.py                 # sm_90, bf16 kernels
    python scripts/fused_ops_sass.py --arch 80 --dtype all

Exit status 2 with one line when nvcc or cuobjdump is missing.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_SOURCE = os.path.join(ROOT, "fused_ops", "csrc", "cuda", "softmax_dropout_kernel.cu")
# the extension's own nvcc flags (setup.py, scripts/check_cuda_compile.sh)
NVCC_FLAGS = ["-O3", "--use_fast_math", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__",
              "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"]
DTYPES = {"float": "fp32", "6__half": "fp16", "13__nv_bfloat16": "bf16"}
_KERNEL_NAME = re.compile(r"softmax_dropout_(forward|backward)_kernelI(\w+?)Li(\d+)ELi(\d+)E")


class ToolMissing(RuntimeError):
    pass


def cuobjdump_path() -> Optional[str]:
    """cuobjdump on PATH, else the one bundled with Triton's NVIDIA backend (CPU installs have it)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return bundled if os.path.exists(bundled) else None


def compile_kernels(arch: int, workdir: str) -> Dict[str, Dict]:
    """Compile the kernel file for ``sm_<arch>``; per mangled kernel name, its registers (ptxas)
    and its SASS instructions (cuobjdump), in order."""
    nvcc, cuobjdump = shutil.which("nvcc"), cuobjdump_path()
    if nvcc is None or cuobjdump is None:
        raise ToolMissing("needs nvcc on PATH and cuobjdump (on PATH or from Triton's NVIDIA backend)")
    obj = os.path.join(workdir, "softmax_dropout_kernel.o")
    proc = subprocess.run([nvcc, "-c", KERNEL_SOURCE, "-o", obj, *NVCC_FLAGS, "-Xptxas", "-v",
                           f"-gencode=arch=compute_{arch},code=sm_{arch}"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed: {proc.stderr[-2000:]}")
    registers, spills, current = {}, {}, None
    for line in proc.stderr.splitlines():
        entry = re.search(r"Compiling entry function '(\S+)'", line)
        if entry:
            current = entry.group(1)
        used = re.search(r"Used (\d+) registers", line)
        if used and current:
            registers[current] = int(used.group(1))
        spilled = re.search(r"(\d+) bytes spill stores", line)
        if spilled and current:
            spills[current] = int(spilled.group(1))
    sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
    kernels = {}
    for match in re.finditer(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S):
        instructions = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", match.group(2))
        name = match.group(1)
        kernels[name] = {"registers": registers.get(name), "spill_bytes": spills.get(name),
                         "instructions": [(int(a, 16), text.strip()) for a, text in instructions]}
    return kernels


def basic_blocks(instructions) -> List[List[str]]:
    """Split (address, text) instructions into basic blocks: a block ends at a branch, a convergence
    barrier (BSSY/BSYNC) or an exit, and a new one starts at every branch or barrier target."""
    targets = set()
    for _, text in instructions:
        if re.search(r"\b(BRA|BSSY|CALL|BRX)\b", text):
            targets.update(int(t, 16) for t in re.findall(r"0x([0-9a-f]+)\b", text.split(",")[-1]))
    blocks, block = [], []
    for address, text in instructions:
        if address in targets and block:
            blocks.append(block)
            block = []
        block.append(text)
        if re.search(r"\b(BRA|BSSY|BSYNC|EXIT|RET|CALL)\b", text):
            blocks.append(block)
            block = []
    if block:
        blocks.append(block)
    return blocks


def summarize(name: str, kernel: Dict) -> Optional[Dict]:
    """Figures of one softmax-dropout kernel, or None for a name that is not one."""
    parsed = _KERNEL_NAME.search(name)
    if not parsed:
        return None
    direction, dtype, iters, threads = parsed.groups()
    texts = [text for _, text in kernel["instructions"]]
    loads_per_block = [sum(" LDG" in f" {t}" for t in block) for block in basic_blocks(kernel["instructions"])]
    return {"direction": direction, "dtype": DTYPES.get(dtype, dtype), "keys_per_thread": int(iters),
            "threads_per_row": int(threads), "keys": int(iters) * int(threads), "registers": kernel["registers"],
            "spill_bytes": kernel.get("spill_bytes"),
            "instructions": len(texts), "loads": sum(" LDG" in f" {t}" for t in texts),
            "max_loads_in_a_block": max(loads_per_block, default=0)}


def kernel_table(arch: int) -> List[Dict]:
    with tempfile.TemporaryDirectory() as tmp:
        kernels = compile_kernels(arch, tmp)
    rows = [row for row in (summarize(n, k) for n, k in kernels.items()) if row]
    return sorted(rows, key=lambda r: (r["dtype"], r["direction"] != "forward", r["keys"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80 or 90 (default 90)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32", "all"), default="bf16")
    args = p.parse_args(argv)
    try:
        rows = kernel_table(args.arch)
    except ToolMissing as e:
        print(f"fused_ops_sass: {e}", file=sys.stderr)
        return 2
    print(f"fused softmax-dropout kernels, sm_{args.arch}: registers, instructions, global loads, and the "
          "most global loads in one basic block (issued together)")
    print(f"{'kernel':<10}{'dtype':<6}{'keys':>6}{'keys/thr':>9}{'regs':>6}{'spill B':>8}{'instr':>7}{'loads':>7}"
          f"{'max/block':>10}")
    for r in rows:
        if args.dtype in ("all", r["dtype"]):
            print(f"{r['direction']:<10}{r['dtype']:<6}{r['keys']:>6}{r['keys_per_thread']:>9}{r['registers']:>6}"
                  f"{r['spill_bytes']:>8}{r['instructions']:>7}{r['loads']:>7}{r['max_loads_in_a_block']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
