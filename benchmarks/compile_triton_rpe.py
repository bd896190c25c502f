"""Compile the ``triton`` attention backend's kernels for NVIDIA GPUs without a GPU, and report for
each kernel what decides its speed there: registers, spill stack, shared memory, which
matrix-multiply instructions it uses (``wgmma``: Hopper's warpgroup MMA; ``mma``: the Ampere
instruction, about half of Hopper's rate) and whether its loop's loads are software-pipelined
(``cp.async`` or TMA copies into shared memory), and ``conv``: how many register tiles its loops
send through shared memory per iteration (`loop_conversions`), ``ex2``: whether its exponentials
are single instructions (`instructions`), ``occ``: how many of its programs an SM holds at once
(`resident_programs`), ``ser``: whether ptxas serializes its Hopper matrix products
(`wgmma_serialized`: each then waits for the previous one), ``bias``: whether it gathers the bias
4 bytes at a time (its rows are aligned to 4 bytes) in pipelined copies (`bias_copies`), and
``i/el``: the machine instructions of its main loop per tile element a thread holds
(`loop_instructions`; an H100 SM issues 128 lanes of instructions per cycle against 2048 bf16
multiply-adds, and at D 64 an element costs 128 multiply-adds in the forward, 256 in dK/dV: above
about 8 and 16 instructions per element, the issue of the element-wise work bounds the loop, not
the tensor cores). Triton ships ptxas and cuobjdump.

    python benchmarks/compile_triton_rpe.py                      # sm80 + sm90, D 32/64/128, every variant
    python benchmarks/compile_triton_rpe.py --arch 90 --head-dims 64 --variants padded-dropout
    python benchmarks/compile_triton_rpe.py --arch 90 --head-dims 64 --length 1000 --blocks 128,64,64,8,3,4
    python benchmarks/compile_triton_rpe.py --arch 90 --head-dims 64 --variants plain --length 1025 --keys 1024
    python benchmarks/compile_triton_rpe.py --arch 90 --head-dims 64 --variants plain padded --kernels dq  # one kernel

The kernels are specialized as Triton's JIT specializes them at launch (`jit_attributes`): every
pointer and every integer argument divisible by 16 at the modelled call is marked so, which is
what lets the compiler vectorize and pipeline the loads. The call modelled is the attention of
contiguous (B, H, L, D) tensors with L = --length queries and keys (default 1024; a length that
is not a multiple of 16, such as 1000, compiles the other variant the JIT makes). Compiling
without those attributes gives a different kernel (scalar loads, no pipelining, other register
counts) from the one that runs.

It catches what Triton's CPU interpreter cannot (type or layout errors found only by the
compiler) and shows where `default_blocks` spill registers (STACK > 0; sm90's measured default
does with dropout, and was faster anyway). Speed needs a GPU: benchmarks/bench_attention.py
--device cuda (--split times forward and backward apart). Must run without TRITON_INTERPRET=1.
"""
import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = {  # name -> (key padding, causal, dropout)
    "plain": (False, False, False), "padded": (True, False, False), "causal": (False, True, False),
    "dropout": (False, False, True), "padded-dropout": (True, False, True), "causal-dropout": (False, True, True),
}
# every kernel the check compiles: the split backward's (fwd, dkdv, dq), the fused backward's (dkdv+dq, band)
# and the yardstick's (--baseline)
KERNELS = ("fwd", "dkdv", "dq", "dkdv+dq", "band", "base-fwd", "base-dkdv", "base-dq")
MAX_DISTANCE = 128  # T5 v1.1's; --max-distance 256 for the paper's (the dQ kernel's table accumulator)
# the most shared memory one block may use (bytes, opt-in; CUDA programming guide, compute
# capabilities table): a kernel needing more fails at launch with "out of resources"
SHARED_LIMIT = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448}
# per SM (CUDA programming guide, compute capabilities table; occupancy calculator): shared memory
# (bytes; each resident block also takes 1 KB the system reserves), warps, blocks. Every one of
# these has 64 K 32-bit registers per SM in 4 partitions, allocated per warp in units of 256.
SM_LIMITS = {80: (167936, 64, 32), 86: (102400, 48, 16), 87: (167936, 48, 16), 89: (102400, 48, 24),
             90: (233472, 64, 32)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="compute capabilities (80: A100, 90: H100)")
    p.add_argument("--head-dims", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--length", type=int, default=1024,
                   help="queries = keys of the modelled call; decides which integers the JIT marks divisible by 16")
    p.add_argument("--keys", type=int, default=None,
                   help="keys of the modelled call (default: --length; T != S gives other bias row layouts)")
    p.add_argument("--heads", type=int, default=12, help="heads of the modelled call")
    p.add_argument("--max-distance", type=int, default=MAX_DISTANCE,
                   help="the relative bias's max_distance M (T5 v1.1: 128, the AST-T5 paper's model: 256)")
    p.add_argument("--backward", choices=("split", "fused"), default="split",
                   help="the backward's structure (triton_rpe_attention.BACKWARD): split = dK/dV and dQ kernels; "
                        "fused = the dK/dV kernel adding dQ atomically (dkdv+dq) and the band kernel (band)")
    p.add_argument("--far-loops", choices=("none", "backward", "all"), default="none",
                   help="triton_rpe_attention.FAR_LOOPS: which kernels walk their far tiles in a loop of their own "
                        "(adding the clamped bias as a scalar); with it, ``i/el`` is the band loop's and ``far`` "
                        "the far loop's")
    p.add_argument("--dropout-mask", choices=("bits", "philox"), default=None,
                   help="triton_rpe_attention.DROPOUT_MASK (default: the module's): every kernel loads the keep "
                        "mask's bits, drawn once by _dropout_bits_kernel (bits, its figures on a line of their own), "
                        "or draws the mask itself with Philox (philox); dropout variants only")
    p.add_argument("--band-weights", choices=("on", "off"), default="on",
                   help="the dQ kernel's BAND_WEIGHTS (on, as it launches: without dropout, its square band tiles "
                        "sum one diagonal class against a 0/1 weight tile; off: a masked sum, as with dropout, for "
                        "the comparison)")
    p.add_argument("--bias-layout", choices=("rows", "tiles"), default="rows",
                   help="triton_rpe_attention.BIAS_LAYOUT: each tile's bias gathered 4 bytes at a time from the head's "
                        "row of distances (rows), or read whole from its bias tiles (tiles); ``bias`` is then 16 "
                        "where no 4-byte copy of the gather is left")
    p.add_argument("--baseline", action="store_true",
                   help="also compile the bias-free FlashAttention-2 kernels of triton_flash_baseline.py at the same "
                        "tiles (rows base-fwd, base-dkdv, base-dq; plain and padded variants): the yardstick for "
                        "what the bias, the table gradient and the masks add to each loop")
    p.add_argument("--no-bias", action="store_true",
                   help="compile the kernels as the triton backend launches them for bias-free calls (padded "
                        "cross-attention): HAS_BIAS off, no table gradient, one loop; with --baseline, beside the "
                        "yardstick's")
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=None,
                   help="compile only these kernels (default: every kernel the options give: fwd, dkdv and dq; "
                        "fwd, dkdv+dq and band with --backward fused; base-* with --baseline); a name the options do "
                        "not give is an error")
    p.add_argument("--blocks", nargs="+", default=[],
                   metavar="BM,BN,BB,WARPS[,STAGES[,BWD_WARPS[,BB_STEP[,BWD_STAGES]]]]",
                   help="tile tuples to check instead of default_blocks (candidates of a GPU tile sweep)")
    args = p.parse_args(argv)
    try:
        args.blocks = [tuple(int(x) for x in spec.split(",")) for spec in args.blocks]
    except ValueError:
        p.error("--blocks: each value is BM,BN,BB,WARPS[,STAGES[,BWD_WARPS[,BB_STEP[,BWD_STAGES]]]] (integers)")
    if args.kernels:
        given = {"fwd"} | ({"dkdv+dq", "band"} if args.backward == "fused" else {"dkdv", "dq"})
        given |= {k for k in KERNELS if k.startswith("base-")} if args.baseline else set()
        missing = [k for k in args.kernels if k not in given]
        if missing:
            p.error(f"--kernels {' '.join(missing)}: not compiled with --backward {args.backward}"
                    f"{' --baseline' if args.baseline else ''} (these options give: {', '.join(sorted(given))})")
    if args.max_distance < 1:
        p.error("--max-distance must be >= 1")
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("unset TRITON_INTERPRET: the interpreter compiles nothing")
    return args


def _baseline_module():
    """benchmarks/triton_flash_baseline.py (the yardstick of --baseline), imported from this folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import triton_flash_baseline

    return triton_flash_baseline


def _signature(fn, dtype, consts):
    pointers = {"Q", "K", "V", "O", "DO", "DQ", "DKV", "DK", "DV"}  # DK, DV: the yardstick's
    fp32_pointers = {"PD", "LSE", "DELTA", "DTAB", "DQACC", "FAR"}
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = f"*{dtype}"
        elif name in fp32_pointers:
            sig[name] = "*fp32"
        elif name in ("KPM", "DMASK", "BITS"):
            sig[name] = "*u8"
        elif name in ("KV_END", "PAD_COUNT"):
            sig[name] = "*i32"
        elif name == "SEED":
            sig[name] = "*i64"
        elif name in ("scale", "dropout_p"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def call_integers(head_dim: int, length: int, heads: int, keys: int = None, max_distance: int = MAX_DISTANCE) -> dict:
    """The integer arguments of a call on contiguous (B, H, L, D) q, k, v (and outputs; ``keys``:
    S, default L): strides named s<tensor>_<b|h|t> (q, k, v, o, d: dO, g: the gradient written), H,
    T, S, D, and the bias rows' length and offset as `_bias_rows` makes them (at 128-row tiles)."""
    import torch

    from ast_t5.modules import triton_rpe_attention as tra

    keys = length if keys is None else keys
    rows, off = tra._bias_rows(torch.zeros(1, 2 * max_distance + 1), length, keys, 128)
    # dK and dV at their offsets in one buffer (`_gradient_layout`; unpacked: dK, then dV, each (B, H, S, D))
    ints = dict(H=heads, T=length, S=keys, D=head_dim, pd_len=rows.size(1), pd_off=off, dk_off=0,
                dv_off=heads * keys * head_dim)
    for tensor in "qkvodga":  # a: the fused backward's fp32 dQ accumulator
        n = keys if tensor in "kv" else length
        ints.update({f"s{tensor}_b": heads * n * head_dim, f"s{tensor}_h": n * head_dim, f"s{tensor}_t": head_dim})
    return ints


def jit_attributes(fn, signature, ints) -> dict:
    """Triton's launch-time specialization: ``tt.divisibility`` 16 on every pointer (PyTorch's
    allocations, and the views the model passes, are 16-byte aligned) and on every integer
    argument whose value in ``ints`` is a multiple of 16 (integers not given count as not)."""
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        kind = signature[name]
        if kind.startswith("*") or (kind == "i32" and name in ints and ints[name] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def compile_kernel(fn, dtype, consts, arch, num_warps, num_stages, ints=None, maxnreg=None):
    """Compile ``fn`` for sm ``arch``, specialized as the JIT would for a call with ``ints``
    (`call_integers`; None: no specialization at all), with the launch's ``maxnreg`` if any."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = _signature(fn, dtype, consts)
    constexprs = {(fn.arg_names.index(name),): value for name, value in consts.items()}
    attrs = jit_attributes(fn, signature, ints) if ints is not None else None
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def instructions(kernel, tile_elements: int = 0, num_warps: int = 0, copies: int = 1) -> dict:
    """What the kernel's PTX uses: its matrix-multiply instruction, whether any load is an
    asynchronous copy into shared memory (the mark of a software-pipelined loop), and, given the
    elements of the one tile a backward kernel exponentiates per iteration and its warps, ``dup``:
    the ``ex2`` instructions per thread over the tile's elements per thread (1: each element's
    work done once; 2: Triton's layout replicates the tile over two warp groups, so every
    element-wise operation, and the products in that layout, run twice), and ``ex2``: ``ftz`` when
    every exponential is the one-instruction ``ex2.approx.ftz`` (what ``tl.exp2`` gives), ``full``
    when some is the full-range ``ex2.approx.f32`` (what ``tl.exp`` gives: a multiply by log2(e)
    plus a compare and two multiplies around the MUFU instruction for subnormals). ``copies``: how
    many times the kernel's loop is compiled (2 with `FAR_LOOPS`), each with its own exponentials."""
    ptx = kernel.asm["ptx"]
    if re.search(r"\bwgmma\.mma_async", ptx):
        mma = "wgmma"
    elif re.search(r"\bmma\.sync", ptx):
        mma = "mma"
    else:
        mma = "none"
    pipelined = bool(re.search(r"\bcp\.async\.", ptx))  # cp.async.* (Ampere) and cp.async.bulk.* (TMA)
    dup = None
    if tile_elements and num_warps:
        dup = len(re.findall(r"\bex2\.approx", ptx)) / (tile_elements / (32 * num_warps)) / copies
    ex2 = "full" if re.search(r"\bex2\.approx\.f32\b", ptx) else "ftz" if re.search(r"\bex2\.approx\.ftz", ptx) \
        else "-"
    return dict(mma=mma, pipelined=pipelined, dup=dup, ex2=ex2)


def resident_programs(arch: int, regs: int, shared: int, num_warps: int) -> int:
    """How many programs (thread blocks) of a kernel an SM of ``arch`` holds at once, from its
    registers per thread, shared memory per block and warps: the occupancy calculator's rule
    (each warp takes ``regs`` rounded up to 8, times 32 threads, from one of the SM's four 16 K
    register partitions). A single program of 8 warps leaves each scheduler 2 warps, all in one
    program's lock-step loop, so its exponentials, loads and barriers stall the tensor cores;
    programs side by side overlap one's element-wise work with another's products (what
    FlashAttention-3 schedules by hand). In the H200 tile sweep of 2026-11-25 the two tile sets
    whose forward fits 2 or 3 programs per SM were the fastest (BENCHMARKS.md, "Tiles")."""
    smem, max_warps, max_blocks = SM_LIMITS.get(arch, SM_LIMITS[80])
    regs_per_warp = -(-max(regs, 1) // 8) * 8 * 32
    by_regs = 4 * (16384 // regs_per_warp) // num_warps
    by_shared = smem // (shared + 1024)
    return max(0, min(by_regs, by_shared, max_warps // num_warps, max_blocks))


def loop_conversions(ttgir: str) -> int:
    """Round trips of register tiles through shared memory inside the kernel's loops, counted in
    its TTGIR: layout conversions of 2-D tiles (``ttg.convert_layout``, except into the
    dot-operand layout of the same matrix-multiply layout, which stays in registers) and stores
    of register tiles into shared memory (``ttg.local_alloc %value``). Each costs a shared-memory
    write, a barrier and a read per iteration: for a 64 x 64 fp32 tile, about as long on an H100
    as one 64 x 64 x 64 product. The loads the pipeliner stages into shared memory (K, V, the
    bias) are not counted: those are asynchronous."""
    count = 0
    stack = []  # per open region: whether it is a loop body
    for line in ttgir.splitlines():
        code = line.strip()
        if code.startswith("}"):
            if stack:
                stack.pop()
        in_loop = any(stack)
        if in_loop and "ttg.convert_layout" in code:
            found = re.search(r":\s*tensor<(\d+)x(\d+)x\w+,\s*(#[\w.]+)>\s*->\s*tensor<\d+x\d+x\w+,\s*(.*)$", code)
            if found and not re.match(r"#ttg\.dot_op<\{[^}]*parent = " + re.escape(found.group(3)) + r"[,}]",
                                      found.group(4)):
                count += 1
        elif in_loop and re.search(r"ttg\.local_alloc %", code):
            count += 1
        if code.endswith("{"):
            stack.append("scf.for" in code)
    return count


def loop_sizes(sass: str) -> list:
    """Machine instructions in the body of each loop of a ``cuobjdump -sass`` listing, largest
    first: the span from a backward branch's target to the branch, all its blocks counted (the
    branches taken on some iterations only, such as the dQ kernel's tile crossing the band,
    included). A loop nested in another counts in both."""
    code = [(int(addr, 16), text.strip()) for addr, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    sizes = []
    for addr, text in code:
        target = re.search(r"\bBRA\b(?:\.\w+)*\s+(?:`\()?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            start = int(target.group(1), 16)
            sizes.append(sum(start <= a <= addr for a, _ in code))
    return sorted(sizes, reverse=True)


def loop_instructions(sass: str) -> int:
    """Instructions in the body of the largest loop of a ``cuobjdump -sass`` listing (`loop_sizes`),
    0 when it has none."""
    return (loop_sizes(sass) or [0])[0]


def _cuobjdump(kernel, flag: str) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([tool, flag, path], capture_output=True, text=True).stdout


def _ptxas_log(kernel, arch: int) -> str:
    """ptxas's verbose log for the kernel's PTX (Triton runs ptxas with -v but discards the log)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        return subprocess.run([tool, "-v", f"--gpu-name={gpu}", path, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True).stderr


def wgmma_serialized(ptxas_log: str):
    """Why ptxas serialized the kernel's wgmma instructions (its C7515 "Potential Performance
    Loss"), or None. Serialized, every Hopper matrix product waits for the previous one to finish
    (no overlap of a product with the next, nor of products with the element-wise work), in the
    whole kernel. It happened in the dQ kernel until 2026-11-26: on the path where its key loop runs
    no iteration, the zero-initialized accumulator was copied into the registers of the product
    that the loop leaves in flight past its end."""
    found = re.search(r"C7515\)[^:]*: wgmma\.mma_async instructions are serialized due to (.*?)(?: in the function|$)",
                      ptxas_log, re.M)
    return found.group(1).strip() if found else None


def bits_kernel_line(arch: int, dtype: str) -> str:
    """A ``#`` line on `_dropout_bits_kernel` (the dropout keep mask's bits, drawn once per call):
    its registers and SASS instructions per element of the mask (8 per byte it writes)."""
    from ast_t5.modules import triton_rpe_attention as tra

    block, warps = 1024, 4
    kernel = compile_kernel(tra._dropout_bits_kernel, dtype, dict(BLOCK=block), arch, warps, 1, dict(n_calls=1 << 20))
    count = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", _cuobjdump(kernel, "-sass"), re.M))
    return (f"# {arch} dropout bits kernel (_dropout_bits_kernel, {block} bytes per program, {warps} warps): "
            f"{resources(kernel)['regs']} registers, {count / (block * 8 / (32 * warps)):.1f} SASS instructions per "
            f"mask element")


def bias_copies(ptx: str) -> str:
    """"4" when the kernel copies 4 bytes at a time asynchronously, "-" otherwise. In these kernels
    only the bias rows' gather (`_tile_bias`) is copied 4 bytes at a time (K, V, Q and dO go 16 at a
    time, lse and delta 8): its rows start at any entry, so they are aligned to 4 bytes only, and a
    wider copy faults on a GPU (misaligned address). Until 2026-11-26 Triton's alignment analysis
    took them for 16-byte aligned on calls whose row offset and length were multiples of 16 (T != S
    of different parities: `--length 1025 --keys 1024`). "-" also flags a gather that is not
    pipelined (loaded synchronously, 4 bytes at a time, so that its loop waits on it: the fused
    backward's band kernel until 2026-11-26, `triton_rpe_attention._dq_tiles`' LOOP_STAGES)."""
    return "4" if re.search(r"cp\.async\.\w+\.shared\.global \[[^\]]+\], \[[^\]]+\], (?:0x4|4)\b", ptx) else "-"


def four_byte_copies(ptx: str) -> int:
    """How many asynchronous copies of 4 bytes the kernel's PTX holds. The bias rows' gather is 32 per
    thread and 64 x 64 tile in each pipeline stage (64 or more in a kernel); whole bias tiles
    (`triton_rpe_attention.BIAS_LAYOUT` "tiles") leave only the few of the other per-row vectors (lse,
    delta, padding flags: 4 at sm90's default tiles)."""
    return len(re.findall(r"cp\.async\.\w+\.shared\.global(?:\.L2::\w+)? \[[^\]]+\], \[[^\]]+\], (?:0x4|4)\b",
                          ptx))


def resources(kernel) -> dict:
    """REG / STACK (spill) of a compiled kernel's cubin, and its shared memory."""
    found = re.search(r"REG:(\d+) STACK:(\d+)", _cuobjdump(kernel, "--dump-resource-usage"))
    return dict(regs=int(found.group(1)) if found else None, stack=int(found.group(2)) if found else None,
                shared=kernel.metadata.shared)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from ast_t5.modules import triton_rpe_attention as tra

    if tra.triton is None:
        print(f"triton is not importable: {tra.TRITON_IMPORT_ERROR}", file=sys.stderr)
        return 2
    spills = unpipelined = ampere_mma_on_hopper = too_much_shared = duplicated = full_exp = serialized = 0
    wide_bias = 0
    args.dropout_mask = args.dropout_mask or tra.DROPOUT_MASK
    print(f"# triton {tra.triton.__version__}, {args.dtype}, specialized as the JIT does for contiguous "
          f"(B, {args.heads}, {args.length}, D) tensors, max_distance {args.max_distance}, dropout mask "
          f"{args.dropout_mask}")
    print(f"{'arch':>4} {'D':>4} {'variant':<15} {'kernel':<7} {'tiles':<14} "
          f"{'regs':>4} {'stack':>5} {'smem':>6} {'occ':>4} {'mma':<5} {'ser':<3} {'pipe':<4} {'dup':>4} {'conv':>4} "
          f"{'ex2':<4} {'bias':>4} {'i/el':>5} {'far':>5} {'s':>5}")
    for arch, head_dim, variant, blocks in itertools.product(args.arch, args.head_dims, args.variants,
                                                            args.blocks or [None]):
        padded, causal, dropout = VARIANTS[variant]
        try:
            block_m, block_n, block_bwd, warps, stages, bwd_warps, step_bwd, bwd_stages = tra.resolve_blocks(
                blocks or tra.default_blocks(head_dim, torch.device("cuda"), capability=arch, dropout=dropout,
                                             dtype=torch.float32 if args.dtype == "fp32" else None))
        except ValueError as e:
            print(f"compile_triton_rpe: {e}", file=sys.stderr)
            return 2
        ints = call_integers(head_dim, args.length, args.heads, args.keys, args.max_distance)
        bias_tiles = args.bias_layout != "rows" and not args.no_bias
        if bias_tiles:  # `_bias_tiles`: a head's tiles (a multiple of 16 elements) and no row offset
            step, lo, hi = tra.bias_tile_range(args.max_distance, block_m, block_n)
            ints.update(pd_len=(hi - lo + 1) * block_m * block_n, pd_off=0)
        common = dict(M=args.max_distance, HAS_KPM=padded, CAUSAL=causal, DROPOUT=dropout, BIAS_TILES=bias_tiles,
                      BLOCK_D=max(16, tra._next_pow2(head_dim)), PRECISION="ieee" if args.dtype == "fp32" else "tf32",
                      FAR_LOOPS=args.far_loops != "none" and not args.no_bias, HAS_BIAS=not args.no_bias)
        # the dropout mask (triton_rpe_attention.DROPOUT_MASK): every kernel reads its bits (drawn by a kernel of
        # its own: `bits_kernel_line`)
        bits = dropout and args.dropout_mask == "bits"
        bwd_tile = block_bwd * step_bwd
        kernels = (("fwd", tra._fwd_kernel, dict(common, BLOCK_M=block_m, BLOCK_N=block_n,
                                                  FAR_LOOPS=args.far_loops == "all" and not args.no_bias,
                                                  DROPOUT_BITS=bits),
                    f"{block_m}x{block_n}",
                    warps, stages, 0, block_m * block_n),
                   ("dkdv", tra._bwd_dkdv_kernel, dict(common, DROPOUT_BITS=bits, BLOCK_N=block_bwd,
                                                        FAR_LOOPS=tra.dkdv_far_loops(common["FAR_LOOPS"], bits),
                                                        BLOCK_M=step_bwd, FUSE_DQ=False,
                                                        FAR_SUMS=False, BAND_Q=block_bwd, BAND_K=step_bwd),
                    f"{block_bwd}x{step_bwd}", bwd_warps, bwd_stages, bwd_tile, bwd_tile),
                   ("dq", tra._bwd_dq_kernel, dict(common, DROPOUT_BITS=bits,
                                                  TAB=tra._next_pow2(2 * args.max_distance + 1),
                                                  TABLE_GRAD=not args.no_bias, BLOCK_M=block_bwd, BLOCK_N=step_bwd,
                                                  BAND_ONLY=False,
                                                  DELTA_OUT=True, BAND_WEIGHTS=args.band_weights == "on",
                                                  **tra._band_layout(args.max_distance, block_bwd, step_bwd)),
                    f"{block_bwd}x{step_bwd}",
                    bwd_warps, bwd_stages, bwd_tile, bwd_tile))
        if args.backward == "fused":  # the dK/dV kernel with dQ and the far sums, and the band kernel
            (fwd, (_, dkdv, dkdv_consts, *dkdv_rest), (_, dq_fn, dq_consts, *dq_rest)) = kernels
            kernels = (fwd, ("dkdv+dq", dkdv, dict(dkdv_consts, FUSE_DQ=True, FAR_SUMS=True, BAND_Q=block_bwd,
                                                    BAND_K=step_bwd), *dkdv_rest),
                       ("band", dq_fn, dict(dq_consts, BAND_ONLY=True, DELTA_OUT=False, BAND_STAGES=bwd_stages),
                        *dq_rest))
        if args.baseline and not (causal or dropout):  # the yardstick (triton_flash_baseline.py), same tiles
            tfb = _baseline_module()

            base = dict(HAS_END=padded, BLOCK_D=common["BLOCK_D"], PRECISION=common["PRECISION"])
            kernels += (("base-fwd", tfb._base_fwd_kernel, dict(base, BLOCK_M=block_m, BLOCK_N=block_n),
                         f"{block_m}x{block_n}", warps, stages, 0, block_m * block_n),
                        ("base-dkdv", tfb._base_dkdv_kernel, dict(base, BLOCK_N=block_bwd, BLOCK_M=step_bwd),
                         f"{block_bwd}x{step_bwd}", bwd_warps, bwd_stages, bwd_tile, bwd_tile),
                        ("base-dq", tfb._base_dq_kernel, dict(base, BLOCK_M=block_bwd, BLOCK_N=step_bwd),
                         f"{block_bwd}x{step_bwd}", bwd_warps, bwd_stages, bwd_tile, bwd_tile))
        if args.kernels:
            kernels = tuple(k for k in kernels if k[0] in args.kernels)
        for name, fn, consts, tiles, kernel_warps, kernel_stages, tile_elements, loop_tile in kernels:
            t0 = time.time()
            maxnreg = tra.forward_maxnreg(kernel_warps, consts["DROPOUT_BITS"]) if name == "fwd" else None
            far_loops = consts.get("FAR_LOOPS", False)
            kernel = compile_kernel(fn, args.dtype, consts, arch, kernel_warps, kernel_stages, ints, maxnreg)
            # FAR_LOOPS: the kernel's loop compiled twice (the band kernel's once): the band loop's is
            # ``i/el`` (the larger), the far loop's ``far``
            copies = 2 if far_loops and not consts.get("BAND_ONLY") else 1
            per_thread = loop_tile / (32 * kernel_warps)
            sizes = loop_sizes(_cuobjdump(kernel, "-sass"))
            info = dict(resources(kernel), **instructions(kernel, tile_elements, kernel_warps, copies),
                        conv=loop_conversions(kernel.asm["ttgir"]),
                        per_element=(sizes or [0])[0] / per_thread,
                        far=sizes[1] / per_thread if copies > 1 and len(sizes) >= copies else None)
            serial = "-"
            if info["mma"] == "wgmma":
                why = wgmma_serialized(_ptxas_log(kernel, arch))
                serial = "yes" if why else "no"
                if why:
                    serialized += 1
                    print(f"# {arch} {head_dim} {variant} {name}: ptxas serializes its wgmma: {why}", flush=True)
            duplicated += (info["dup"] or 0) > 1.01
            full_exp += info["ex2"] == "full"
            yardstick = name.startswith("base-") or args.no_bias  # no bias to gather
            bias = "-" if yardstick else bias_copies(kernel.asm["ptx"])
            if bias_tiles and not yardstick:  # whole tiles, 16 bytes at a time: no gather's 4-byte copies left
                bias = "16" if four_byte_copies(kernel.asm["ptx"]) <= 8 and info["pipelined"] else "4!"
            wide_bias += bias != ("16" if bias_tiles else "4") and not yardstick
            spills += bool(info["stack"])
            too_much_shared += info["shared"] > SHARED_LIMIT.get(arch, SHARED_LIMIT[80])
            unpipelined += not info["pipelined"]
            ampere_mma_on_hopper += arch >= 90 and info["mma"] != "wgmma" and args.dtype != "fp32"
            config = f"{tiles}/{kernel_warps}w{kernel_stages}s"
            dup = "-" if info["dup"] is None else f"{info['dup']:.1f}"
            occ = resident_programs(arch, info["regs"] or 255, info["shared"], kernel_warps)
            print(f"{arch:>4} {head_dim:>4} {variant:<15} {name:<7} {config:<14} "
                  f"{info['regs']:>4} {info['stack']:>5} {info['shared']:>6} {occ:>4} {info['mma']:<5} {serial:<3} "
                  f"{'yes' if info['pipelined'] else 'no':<4} {dup:>4} {info['conv']:>4} {info['ex2']:<4} {bias:>4} "
                  f"{info['per_element']:>5.1f} {'-' if info['far'] is None else format(info['far'], '.1f'):>5} "
                  f"{time.time() - t0:>5.1f}",
                  flush=True)
    if args.dropout_mask == "bits" and any(VARIANTS[v][2] for v in args.variants):
        for arch in args.arch:
            print(bits_kernel_line(arch, args.dtype), flush=True)
    print(f"{spills} kernel(s) with a spill stack")
    print(f"{unpipelined} kernel(s) without pipelined loads")
    print(f"{ampere_mma_on_hopper} sm90 kernel(s) without wgmma")
    print(f"{serialized} kernel(s) whose wgmma ptxas serializes (C7515)")
    print(f"{too_much_shared} kernel(s) needing more shared memory than their GPU has")
    print(f"{duplicated} backward kernel(s) doing their element-wise work more than once (dup > 1)")
    print(f"{full_exp} kernel(s) with full-range exponentials (ex2 full: about 4 more instructions per element)")
    if args.bias_layout == "rows" or args.no_bias:
        print(f"{wide_bias} kernel(s) without 4-byte bias copies (bias '-': a wider gather faults on its 4-byte "
              f"aligned rows, an unpipelined one stalls)")
    else:
        print(f"{wide_bias} kernel(s) still copying 4 bytes at a time or unpipelined (bias '4!'; whole bias tiles go "
              f"16 bytes at a time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
