"""Tiled (FlashAttention-2 style) Triton attention with T5's relative-position bias read per
distance, attention dropout, and the bias table's gradient reduced per distance in the kernel.

    out = dropout_p(softmax(scale * q k^T + bias + masks)) v,
    bias[b, h, i, j] = per_distance[h, clamp(j - i, -M, M) + M]

The ``triton`` attention backend (`attention_backends`). Written for this project after reading
the FlashAttention-2 paper (Dao, 2023): no code of other projects is copied.

Bias-free calls (``per_distance`` None: the backend's cross-attention over a padded source) run the
same kernels with ``HAS_BIAS`` off, a compile-time switch: no table is read, the far loops stay off
and no table gradient is reduced; masks and dropout as below.

Forward (one program per (query block, batch x head)): loops over key blocks with an online
softmax (running max and sum in fp32), saves the log-sum-exp per query row for the backward. The
bias is gathered per tile (`_tile_bias`) from one row per head that holds every distance of the
call, unclamped (`_bias_rows`: (H, about T + S + 2 pad) floats built from the (H, 2 M + 1) vector
once per stack, `SharedInputs`; until 2026-11-25 the kernels clamped each element's index into that vector, about 4.5
more instructions per element), loaded unconditionally so that Triton's pipeliner stages it
into shared memory ahead of use, like K and V. (Until 2026-11-23 a tile whose
distances all clamp added one scalar instead; that branch made the compiler load the bias in
another register layout and convert it through shared memory synchronously on every tile.
Splitting the key loop in three instead, so the outer loops add a scalar without a branch, spilled
registers at head size 128 on the tiles of the day: `benchmarks/compile_triton_rpe.py`, BENCHMARKS.md;
it is an option now, `FAR_LOOPS` below.) No (T, S) or
(B, H, T, S) tensor is ever built.

Every kernel keeps the scores in log2 units, s = log2(e) (scale q k^T + bias): the per-distance
vector is multiplied by log2(e) once per call (2 M + 1 floats per head), the products by
log2(e) scale inside the kernels, and the log-sum-exp is saved as log2, so that every
probability is a single exp2 (`LOG2E`). The gradients are those of the natural-unit scores, as
before: the change of units costs nothing on them.

Masks: key padding is a (B, S) byte vector loaded per key tile; causality compares indices;
out-of-range rows and columns of partial tiles are masked. A query row whose keys are all masked
gets a zero output and zero gradients (FlashAttention's convention; the dense backends give a
bias-weighted average of all values there; neither means anything, and T5's inputs have such
rows only for a sequence that is padding throughout).

Dropout: Philox 4x32 with 7 rounds (``tl.randint4x``, `PHILOX_ROUNDS`; 10 until 2026-11-26: 7 is
FlashAttention-2's count, so that of PyTorch's flash SDPA with dropout, and Salmon et al. (2011)
found 7 rounds pass BigCrush, recommending 10 as a margin) keyed by one int64 seed drawn per call
from PyTorch's generator of q's device (``torch.randint`` on that device, no host sync), so
``torch.manual_seed`` reproduces it, and the backward regenerates the forward's keep mask. One Philox call gives four
32-bit words, which serve 8 elements at 16 bits each. Writing query i = 16 i16 + 8 a + r and key
j = 16 j16 + 8 c + 2 q + e (r < 8, q < 4, a, c, e < 2), the call with counter
((((b H + h) ceil(T / 16) + i16) ceil(S / 16) + j16) 8 + r) 4 + q gives element (i, j) the high
(e = 0) or low (e = 1) half of its word 2 a + c: the 8 elements one thread holds in the
tensor-core accumulator layouts of sm80 and sm90, so no two threads of a warpgroup compute the same
call (where Triton replicates a whole tile over two warpgroups, both do:
`benchmarks/compile_triton_rpe.py`'s ``dup`` column; the dK/dV kernel, on transposed tiles,
draws the mask in this layout and transposes the boolean tile). An element is
kept where its 16 bits, read as an integer, are >= 65536 p: the rate applied is p rounded to a
multiple of 2^-16 (`effective_dropout_p`; 0.1 -> 0.100006), and kept values are scaled by
1 / (1 - that rate). Philox costs about seventy integer instructions per call, and the mask is
drawn three times (forward, dK/dV, dQ): one call per element would cost several times the
tile's tensor-core time. `dropout_keep_mask` materialises the mask (tests, the eager reference).
With `DROPOUT_MASK` = "bits" (AST_T5_TRITON_DROPOUT_MASK; not the default until measured on a GPU)
the mask is drawn once per call instead, by `_dropout_bits_kernel`, a streaming pass that writes
one byte per Philox call (a bit per element, B H T S / 8 bytes kept for the backward), and the
three kernels load their bytes rather than run Philox: on sm90 at the default tiles about 25 fewer
instructions per element over the three kernels' loops for the bits kernel's 11 (BENCHMARKS.md).

Backward (`BACKWARD` = "split", the default), two kernels, with no atomics anywhere:
- dK/dV: one program per (key block of BLOCK keys, batch x head) looping over queries STEP at
  a time, on transposed tiles (keys as rows): it recomputes P^T = exp2(K Q^T + bias - lse) (log2 units),
  dV += P_drop^T dO, dP^T = V dO^T (dropout mask applied), dS^T = P^T (dP^T - delta) with
  delta = rowsum(dO * O), dK += dS^T Q. K and V are staged into shared memory once and
  every product's left operand is either them or a tile already in registers; in the untransposed
  form, K and V are re-staged and P and dS transposed through shared memory on every iteration.
- dQ: one program per (query block of BLOCK queries, batch x head) looping over keys STEP at a
  time, dQ += dS K. Its loop runs at least once: a compiled path skipping it made ptxas serialize
  every matrix product of the kernel (until 2026-11-26; `benchmarks/compile_triton_rpe.py`, ``ser``).
  It runs first and computes delta for its rows from its dO tile and O's, writing it for the dK/dV
  kernel (``DELTA_OUT``; until 2026-11-26 four PyTorch operations over (B, H, T, D), about 350 MB of
  memory traffic at B16 H12 T1024 D64 in fp32, and four launches of host time).
The host's side of a call (`SharedInputs`): the bias rows and the padding counts are built once per
stack and reused by its layers, and unused pointer arguments share one placeholder tensor, so that a
layer's call issues about 10 PyTorch operations besides the three kernels (29 until 2026-11-26;
benchmarks/bench_triton_host.py).
On 8 warps a program takes 128 rows, so that each of the two warpgroups owns 64 of them: with
square 64 x 64 tiles on 8 warps (the default until 2026-11-24), Triton laid the chained products
over 8 warps along the rows, and both warpgroups computed the same 64 rows (up to 1.67x the
minimum tensor-core work, and with key padding every element-wise step twice). 64 x 64 tiles on 4
warps, one warpgroup (sm90's default since 2026-11-26), compute each row once too.

The table gradient d per_distance[h, t] = sum over b and over pairs (i, j) with
clamp(j - i) = t of dS. It is reduced PER DISTANCE inside the dQ kernel, never per element (in
the dQ kernel, not the dK/dV one, because that one holds two accumulators: there, at 64 x 64
tiles on sm90, the reduction pushed it past 255 registers into spills; `benchmarks/compile_triton_rpe.py`):
- a tile whose distances all lie <= -M (or >= +M) adds its row sums to one of two fp32 vectors
  of the program, one value per query row (on the default tiles, whose warps split the rows, a
  reduction inside each warp: no shared memory, no barrier), summed once at the end;
- a tile that crosses the band (-M, M) is skewed with one ``tl.gather`` along the key axis (row
  i rotated by i), so that BLOCK / STEP + 1 masked column sums give its BLOCK + STEP - 1 diagonal
  sums (STEP divides BLOCK: both are powers of two). When M is a multiple of STEP (T5's 128 and
  the paper's 256 are), each of those sums is one row of a (ROWS, STEP) accumulator, selected by
  a comparison, and the accumulator is written out once at the end; otherwise two 1-D gathers
  per sum place it into a vector of the 2 M + 1 distances;
- each program writes its accumulator once to a (B H, query blocks, 2 M + 1) fp32 partial buffer
  (bytes: 4 (2 M + 1) per program, under 1 MB at B16 H12 T1024), which PyTorch sums.

The fused backward (`BACKWARD` = "fused", or AST_T5_TRITON_BACKWARD=fused; not measured on a GPU
yet, so not the default) does the dQ kernel's work where the tiles already are, as
FlashAttention-2 does: the dK/dV kernel also computes dQ += dS K for each tile (the transposed dS
tile goes through shared memory) and adds it to an fp32 buffer with relaxed atomic adds (vector
reductions; the buffer is padded to whole tiles so that they need no mask, and PyTorch applies the
scale and the cast afterwards), so the tiles are not recomputed: 5 matrix products per tile
instead of 7. It also sums dS over the tiles whose distances all clamp, by key row, into one pair
of fp32 per program. A band kernel (the dQ kernel with BAND_ONLY) then recomputes only the tiles
that cross the band (-M, M), 2 products each, for the rest of the table gradient: 6 of every 16
key tiles at T = 1024 with 64 x 64 tiles and M = 128, 6 of 8 at 512, 6 of 32 at 2048. The
tile classification is the band kernel's in both kernels, so each pair is counted once. The
costs: the buffer's zeroing and the cast to q's dtype, the atomics' traffic through L2 (16 KB per
64 x 64 tile at D 64), and dQ's sums in a scheduling-dependent order (not bitwise deterministic,
as FlashAttention's own dQ). Static figures (`compile_triton_rpe.py --backward fused`, Triton
3.6, sm90, D 64): the fused dK/dV kernel runs 23.3 instructions per tile element against the
split one's 17.0 and the dQ kernel's 26.3, the band kernel 22.5 on its tiles. It is built for
sm90 at head size <= 64 (`fused_backward_unfit`): elsewhere the split backward runs, with a warning.

Inputs: q (B, H, T, D), k and v (B, H, S, D) in fp16/bf16/fp32 (matmuls in that dtype with fp32
accumulation; fp32 inputs use IEEE fp32 dots, not TF32), any strides with a unit last one, any
head size up to 256 (padded to a power of two, at least 16), any T and S (T != S allowed; causal
requires T == S), fewer than 2^31 elements per tensor (int32 offsets), per_distance (H, 2 M + 1)
in any float dtype (read and accumulated in fp32; its gradient is returned in its dtype).

Tiles (`default_blocks`): on sm90 at head size <= 64, the fastest of a measured sweep (64 x 64
tiles on 4 warps in all three kernels, several programs per SM); elsewhere the largest that spill
no registers, fit the shared memory and, on sm90, run on Hopper's wgmma
(`benchmarks/compile_triton_rpe.py` compiles the kernels without a GPU, specialized as Triton's
JIT specializes them, and reports all three, with how many programs fit an SM), not yet
measured (the GPU benchmark's --triton-blocks option).

Masks cost only where needed: without key padding, a tile is masked only if it holds keys past
S or (causal) crosses the diagonal; interior tiles skip the mask.

Far loops (`FAR_LOOPS` = "backward", the default since 2026-11-27, "all" or "none"; or
AST_T5_TRITON_FAR_LOOPS). Most tiles of a long call lie wholly beyond the band (-M, M), where every
distance clamps to the same bias: at 64 x 64 tiles and M = 128, 11 of a row's 16 key tiles at
T = 1024, 27 of 32 at 2048. With FAR_LOOPS a kernel walks its other axis in two loops: the far
tiles of both sides (`_far_spans`, `_far_walk`), then the band. The far loop adds each side's
clamped bias as one scalar per tile, so it neither gathers the bias tile nor stages it through
shared memory (the gather is 32 of the forward's 40 asynchronous copies per thread and tile, and
32 KB of shared-memory traffic per 64 x 64 tile, written and read back), and the dQ kernel's far
loop reduces the table gradient by row sums with no per-tile branch (its far tiles: 26.3 -> 12.2
instructions per element, sm90 D 64, `compile_triton_rpe.py --far-loops`). Every loop runs at
least one tile: a loop that may run none made ptxas serialize the kernel's matrix products
(C7515), so a program with no far tile runs one tile whose bias is -inf, which adds nothing
(`_far_walk`), and an empty band span takes a far tile (the band loop computes any tile right).
Such programs are rare on the calls that take the far loops (`far_loops_pay`: both axes longer than
4 (M + tile); every program has far tiles past 2 (M + tile)); shorter calls keep one loop. The spans
are computed in whole tiles (`_far_spans`), so that the compiler knows every bound a multiple of the
step: computed as element indices, the band loops recomputed every bias address. The cost: two
pipelined loops hold more registers; in the forward, 161 instead of 128 at sm90's default tiles (3
programs per SM instead of 4; 2 instead of 3 with key padding), which is why "backward" (the dK/dV
and dQ kernels) is a choice of its own. On the H200 (2026-11-26, B16 H12 T=S=1024 D64 bf16,
fwd+bwd) "backward" took 1.575 ms against one loop's 1.934, 2.232 against 2.586 with dropout 0.1,
and 1.13 against 1.34 ms of GPU time padded (a CUDA graph's replay), hence the default; "all" is
not measured yet. At 512 tokens one loop made the T5-base step faster (2026-11-27), hence the length
rule.

Bias tiles (`BIAS_LAYOUT` = "tiles", or AST_T5_TRITON_BIAS_LAYOUT=tiles; not the default until measured).
A tile's bias depends only on its first key minus its first query, so a head has few distinct tiles (7 at
64 x 64 and M = 128; the rest clamp to the two end tiles: `bias_tile_range`). Built once per stack
(`_bias_tiles`, `SharedInputs`), each kernel reads its tile whole with 16-byte copies that bypass L1
(`_tiled_bias`; keys-major tiles for the dK/dV kernel) instead of gathering it per element from the row:
32 KB of shared-memory traffic per 64 x 64 tile instead of 48 KB or more, the gather's L1 reads gone
(BENCHMARKS.md, "The bias as whole tiles").

Execution: compiled kernels on CUDA. On CPU the kernels run only under Triton's interpreter, which
Triton selects when the module is imported with TRITON_INTERPRET=1 (`INTERPRETED`); the tests do
that on hosts without CUDA. Speed (H200, 2026-11-26, BENCHMARKS.md): 1.93 ms fwd+bwd at B16 H12
T=S=1024 D64 bf16 with one loop per kernel (1.575 with the far loops of today's default; SDPA
with the bias 2.43), 2.51 padded (SDPA 2.38; 1.34 in a CUDA graph, where
the host's time to issue the call is gone, against SDPA's 2.18) (`benchmarks/bench_attention.py
--device cuda`); slower than ``sdpa`` in the T5-base step, so ``auto`` does not pick it
(`attention_backends.AUTO_TABLE`).
"""
import logging
import math
import os
from typing import Optional

import torch

from .attention_backends import tensor_version

try:
    import triton
    import triton.language as tl
    from triton import knobs as _knobs

    TRITON_IMPORT_ERROR: Optional[str] = None
except Exception as e:  # noqa: BLE001 - any import failure means "no triton here"
    triton = None
    TRITON_IMPORT_ERROR = f"{type(e).__name__}: {e}"


def _triton_error_types() -> tuple:
    """Triton's own exception base (OutOfResources, PTXASError, CompilationError derive from it,
    and from Exception only), or () without triton."""
    if triton is None:
        return ()
    try:
        from triton.runtime.errors import TritonError
    except ImportError:  # Triton releases before the common base: the launch-time error alone
        from triton.runtime.errors import OutOfResources as TritonError
    return (TritonError,)


def _dynamo_limit_errors() -> tuple:
    """dynamo's refusal to compile past its recompile limit under fullgraph (flex's compiled wrapper),
    which derives from Exception only, or () where this torch has none."""
    try:
        from torch._dynamo.exc import FailOnRecompileLimitHit
    except ImportError:
        return ()
    return (FailOnRecompileLimitHit,)


# What a kernel launch can raise: torch's RuntimeError (OutOfMemoryError and most of dynamo's compile
# failures derive from it), dynamo's recompile-limit refusal and Triton's errors, which do not: a tile
# configuration needing more shared memory than the GPU has raises OutOfResources at its first launch.
# For code that measures or tries several configurations and must record one's failure and go on (the
# benchmarks).
KERNEL_ERRORS = (RuntimeError,) + _dynamo_limit_errors() + _triton_error_types()

# Whether the kernels below were decorated in interpreter mode (decided by Triton at import time).
INTERPRETED = bool(triton is not None and (_knobs.runtime.interpret or os.environ.get("TRITON_INTERPRET") == "1"))

# scores are kept in log2 units, s = log2(e) (scale q k^T + bias), so that each probability is one
# exp2: Triton lowers tl.exp2 to ex2.approx.ftz, one MUFU instruction, where tl.exp multiplies by
# log2(e) and adds the full-range ex2's subnormal handling (a compare and two multiplies), about
# four more instructions per element in each kernel (`benchmarks/compile_triton_rpe.py`, ``ex2``)
LOG2E = math.log2(math.e)
# rounds of the Philox 4x32 generator of the dropout mask (module docstring): FlashAttention-2's 7
PHILOX_ROUNDS = 7


def _device_unsupported(q: torch.Tensor) -> Optional[str]:
    """Why the kernels cannot run on ``q``'s device in this process, or None (`unsupported_reason`'s
    first test; `scripts/check_gpu_codegen.py` replaces it to trace the kernels on CPU tensors)."""
    if triton is None:
        return f"triton is not importable ({TRITON_IMPORT_ERROR})"
    if q.is_cuda and INTERPRETED:
        return "the kernels were imported under TRITON_INTERPRET=1 (interpreter) on a CUDA tensor"
    if not q.is_cuda and not INTERPRETED:
        return "CPU tensors need Triton's interpreter (import with TRITON_INTERPRET=1)"
    if not q.is_cuda and interpreter_problem() is not None:
        return interpreter_problem()
    return None


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       per_distance: Optional[torch.Tensor]) -> Optional[str]:
    """Why `triton_rpe_attention` cannot take these inputs here, or None (``per_distance`` None: a
    bias-free call)."""
    reason = _device_unsupported(q)
    if reason is not None:
        return reason
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (needs fp16, bf16 or fp32, the same for q, k, v)"
    if not 1 <= q.size(-1) <= 256 or v.size(-1) != q.size(-1):
        return f"head size {q.size(-1)} (needs <= 256, v's the same)"
    if max(q.numel(), k.numel()) >= 2 ** 31:
        return "tensors of 2^31 elements or more (the kernels use int32 offsets)"
    if per_distance is None:
        return None
    if not per_distance.is_floating_point() or per_distance.dim() != 2 or per_distance.size(0) != q.size(1):
        return "per_distance must be a float (H, 2 M + 1) tensor"
    if per_distance.size(1) < 3 or per_distance.size(1) % 2 == 0:
        return f"per_distance has {per_distance.size(1)} distances (needs 2 M + 1 with M >= 1)"
    return None


if triton is not None:
    _LOG2E = tl.constexpr(LOG2E)
    _PHILOX_ROUNDS = tl.constexpr(PHILOX_ROUNDS)

    @triton.jit
    def _dot(a, b, PRECISION: tl.constexpr):
        """a @ b with fp32 accumulation. PRECISION "upcast": in fp32 (Triton's interpreter
        multiplies bf16 operands wrongly, so interpreted bf16 runs take this path)."""
        if PRECISION == "upcast":
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PRECISION)

    @triton.jit
    def _tile_bias(pd_rows, offs_n):
        """(BLOCK_M, BLOCK_N) fp32 bias of a tile (log2 units): query row i reads the head's bias
        row (`_bias_rows`) at ``pd_rows[i] = row + OFF - i`` plus key j, with no clamp (the row
        holds every distance of the call, tile overhangs included): an L1/L2-resident gather,
        contiguous along a query's keys. Loaded unconditionally: in a loop, Triton's pipeliner
        then stages it into shared memory asynchronously like K and V and reads it back in the
        matrix-multiply layout. (Behind a branch it is loaded synchronously in another layout and
        converted through shared memory on every tile, stalling the loop:
        `benchmarks/compile_triton_rpe.py`.)"""
        return tl.load(pd_rows[:, None] + offs_n[None, :])

    @triton.jit
    def _tiled_bias(tiles, offset, M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    KEYS_MAJOR: tl.constexpr = False):
        """`_tile_bias` from the head's bias tiles (`BIAS_LAYOUT` "tiles", `_bias_tiles`): the tile of
        BLOCK_M queries and BLOCK_N keys whose first key minus first query is ``offset`` (a multiple of
        the smaller block), read whole from ``tiles`` (the head's first tile) with 16-byte copies, as
        (BLOCK_M, BLOCK_N) fp32, or (BLOCK_N, BLOCK_M) with KEYS_MAJOR (the dK/dV kernel's transposed
        tiles). A tile's bias depends on ``offset`` alone, and every tile beyond `bias_tile_range`'s
        ends is its end tile, whose distances all clamp."""
        STEP: tl.constexpr = BLOCK_M if BLOCK_M < BLOCK_N else BLOCK_N
        LO: tl.constexpr = -((M + BLOCK_N - 1 + STEP - 1) // STEP)
        HI: tl.constexpr = (M + BLOCK_M - 1 + STEP - 1) // STEP
        index = tl.minimum(tl.maximum(offset // STEP, LO), HI) - LO
        if KEYS_MAJOR:
            inner = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        else:
            inner = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        return tl.load(tiles + index * (BLOCK_M * BLOCK_N) + inner)

    @triton.jit
    def _clamped_entries(h, pd_len, pd_off, M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BIAS_TILES: tl.constexpr):
        """Where PD holds the head's bias at distances <= -M and >= M (what `FAR_LOOPS`' far tiles add as
        scalars): the bias row's entries OFF - M and OFF + M, or the first entry of the first and of the
        last bias tile (`_tiled_bias`: every distance of those clamps). Offsets, not loads: torch's analysis
        of which arguments a kernel writes (torch.compile) took a pointer passed to a helper that loads
        from it for written."""
        if BIAS_TILES:
            STEP: tl.constexpr = BLOCK_M if BLOCK_M < BLOCK_N else BLOCK_N
            LO: tl.constexpr = -((M + BLOCK_N - 1 + STEP - 1) // STEP)
            HI: tl.constexpr = (M + BLOCK_M - 1 + STEP - 1) // STEP
            before = h * pd_len
            after = before + (HI - LO) * (BLOCK_M * BLOCK_N)
        else:
            before = h * pd_len + pd_off - M
            after = h * pd_len + pd_off + M
        return before, after

    @triton.jit
    def _tile_valid(padded, offs_m, offs_n, T, S, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr):
        """(BLOCK_M, BLOCK_N) bool: the pair exists and is not masked (``padded``: the tile's keys'
        padding flags, 1 where padded or past S; read only with HAS_KPM)."""
        valid = (offs_m[:, None] < T) & (offs_n[None, :] < S)
        if HAS_KPM:
            valid = valid & (padded[None, :] == 0)
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        return valid

    @triton.jit
    def _any_padded(pad_count_ptr, start, stop, S):
        """Whether keys start .. stop - 1 hold padding or keys past S, from the row's running count
        of padded keys (`_padding_counts`): two scalar loads, where reducing the tile's flags
        would cost a reduction across warps, through shared memory, on every tile."""
        end = tl.minimum(stop, S)
        return (stop > S) | (tl.load(pad_count_ptr + end) > tl.load(pad_count_ptr + start))

    @triton.jit
    def _edge_tile(start_m, start_n, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        """Whether a tile without key padding needs masking: it holds keys past S or, causal,
        keys after some of its queries. (Queries past T need none: the forward stores nothing
        for them and the backward's lse = +inf makes their probabilities 0.)"""
        edge = start_n + BLOCK_N > S
        if CAUSAL:
            edge = edge | (start_n + BLOCK_N - 1 > start_m)
        return edge

    @triton.jit
    def _keep(rng, bh, start_m, start_n, T, S, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              FROM_BITS: tl.constexpr = False):
        """Dropout keep mask of the tile of queries start_m .. start_m + BLOCK_M - 1 and keys
        start_n .. start_n + BLOCK_N - 1 (starts multiples of 16, blocks >= 16): 16 random bits
        per element, 8 elements per Philox call (module docstring); keep where the bits >= 65536 p
        (p a multiple of 2^-16, `effective_dropout_p`). ``rng``: (the int64 seed, the call's bit
        mask). FROM_BITS (`DROPOUT_MASK`): the keep bits are loaded from the bit mask that
        `_dropout_bits_kernel` drew, one byte per Philox call, instead of drawn here.

        The tile is built as (i16, a, r8, j16, c, q, e) with query i = 16 i16 + 8 a + r8 and key
        j = 16 j16 + 8 c + 2 q + e: Philox runs on the (i16, r8, j16, q) grid, and its word 2 a + c
        gives keys 2 q, 2 q + 1 their high and low halves. Those 8 elements are the ones a thread
        holds in the tensor-core accumulator layouts of sm80 and sm90, so no two threads of a
        warpgroup compute the same call, and a thread reads the byte of each of its calls, whose bit
        4 a + 2 c + e is element (a, c, e)'s.
        """
        seed, bits_ptr = rng
        i16 = (start_m // 16 + tl.arange(0, BLOCK_M // 16)).to(tl.int64)[:, None, None, None, None, None, None]
        r8 = tl.arange(0, 8)[None, None, :, None, None, None, None]
        j16 = (start_n // 16 + tl.arange(0, BLOCK_N // 16))[None, None, None, :, None, None, None]
        q4 = tl.arange(0, 4)[None, None, None, None, None, :, None]
        counter = (((bh.to(tl.int64) * ((T + 15) // 16) + i16) * ((S + 15) // 16) + j16) * 8 + r8) * 4 + q4
        a = tl.arange(0, 2)[None, :, None, None, None, None, None]
        c = tl.arange(0, 2)[None, None, None, None, :, None, None]
        e = tl.arange(0, 2)[None, None, None, None, None, None, :]
        if FROM_BITS:  # tiles overhang the call's 16-blocks: no byte there (nor a key or query to keep)
            in_call = (i16 < (T + 15) // 16) & (j16 < (S + 15) // 16)
            byte = tl.load(bits_ptr + counter, mask=in_call, other=0).to(tl.int32)
            keep = (byte & (1 << (4 * a + 2 * c + e))) != 0
        else:
            r0, r1, r2, r3 = tl.randint4x(seed, counter, _PHILOX_ROUNDS)
            word = tl.where(a == 0, tl.where(c == 0, r0, r1), tl.where(c == 0, r2, r3))
            bits = tl.where(e == 0, word >> 16, word & 0xFFFF).to(tl.float32)  # exact: below 2^16
            keep = bits >= dropout_p * 65536.0  # an integer too
        return tl.reshape(keep, (BLOCK_M, BLOCK_N))

    @triton.jit
    def _keep_pair(word, threshold):
        """The keep bits of a Philox word's two elements, as `_keep` draws them: bit 0 from its high
        half, bit 1 from its low half."""
        high = ((word >> 16).to(tl.float32) >= threshold).to(tl.int32)
        low = ((word & 0xFFFF).to(tl.float32) >= threshold).to(tl.int32)
        return high | (low << 1)

    @triton.jit
    def _dropout_bits_kernel(SEED, BITS, n_calls, dropout_p, BLOCK: tl.constexpr):
        """A call's whole dropout keep mask, one bit per element: byte n holds the 8 elements of the
        Philox call with counter n (`_keep`'s layout), bit 2 w + e from word w (0 high half, 1 low).
        A streaming pass over every (b, h, query, key), once per call, instead of Philox in each of
        the three attention kernels (`DROPOUT_MASK`)."""
        dropout_p = tl.cast(dropout_p, tl.float32)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        r0, r1, r2, r3 = tl.randint4x(tl.load(SEED), offs, _PHILOX_ROUNDS)
        threshold = dropout_p * 65536.0
        packed = _keep_pair(r0, threshold) | (_keep_pair(r1, threshold) << 2) | \
            (_keep_pair(r2, threshold) << 4) | (_keep_pair(r3, threshold) << 6)
        tl.store(BITS + offs, packed.to(tl.uint8), mask=offs < n_calls)

    @triton.jit
    def _table_grad_tile(ds, base, tab, band, far_lo, far_hi, t_idx, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         M: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr, KIND: tl.constexpr = "any",
                         before=True, WEIGHTS: tl.constexpr = False):
        """Add the (BLOCK_M, BLOCK_N) tile ``ds`` (query rows, key columns; its (0, 0) element at
        distance ``base``, a multiple of BLOCK_N; BLOCK_M a multiple of BLOCK_N) to the program's
        per-distance sums (`_bwd_dq_kernel`): ``far_lo`` and ``far_hi`` per query row (distances
        <= -M, >= M), and the band's distances in ``band`` (ALIGNED: M a multiple of BLOCK_N) or
        ``tab`` (entry d + M for -M < d < M).

        A tile beyond the band adds its row sums (no reduction across warps). A tile crossing it
        is skewed: row i rotated by i, rot[i, c] = ds[i, (i + c) % BLOCK_N], holds distance
        base + c - BLOCK_N w in the elements with w = (i + c) // BLOCK_N, so BLOCK_M / BLOCK_N + 1
        column sums, one per class (`_band_tile`), give every diagonal once. ALIGNED, diagonal class w of the tile is entry
        t = c + BLOCK_N (r - BLOCK_M / BLOCK_N) with r = (base + M) / BLOCK_N - w + BLOCK_M /
        BLOCK_N: one row of ``band``, selected without moving data (the far distances land in its
        rows t <= 0 and t >= 2 M). Otherwise two 1-D gathers per class place it in ``tab``.

        KIND: "any" classifies the tile as above; a loop that knows its tiles' class says so
        (`FAR_LOOPS`, the band kernel), and the other branches are not compiled: "far" (every
        distance <= -M where ``before``, else >= M), "band" (crossing the band). WEIGHTS: `_band_tile`'s."""
        if KIND == "band":
            tab, band, far_lo, far_hi = _band_tile(ds, base, tab, band, far_lo, far_hi, t_idx, BLOCK_M, BLOCK_N, M,
                                                   ROWS, ALIGNED, WEIGHTS)
        elif KIND == "far":
            rows = tl.sum(ds, 1)
            far_lo += tl.where(before, rows, 0.0)
            far_hi += tl.where(before, 0.0, rows)
        elif base + BLOCK_N - 1 <= -M:
            far_lo += tl.sum(ds, 1)
        elif base - (BLOCK_M - 1) >= M:
            far_hi += tl.sum(ds, 1)
        else:
            tab, band, far_lo, far_hi = _band_tile(ds, base, tab, band, far_lo, far_hi, t_idx, BLOCK_M, BLOCK_N, M,
                                                   ROWS, ALIGNED, WEIGHTS)
        return tab, band, far_lo, far_hi

    @triton.jit
    def _band_tile(ds, base, tab, band, far_lo, far_hi, t_idx, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   M: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr, WEIGHTS: tl.constexpr = False):
        """`_table_grad_tile` for a tile crossing the band: the skew and the diagonal sums, of its
        BLOCK_M / BLOCK_N + 1 diagonal classes w (element (i, c) of the skewed tile is in class
        (i + c) // BLOCK_N). Square tiles (BLOCK_M = BLOCK_N: sm90's) have two: class 0 is a masked
        column sum (a compare, a select and an add per element) and class 1 the column sums less
        class 0's (one add per element), where two masked sums took five. WEIGHTS (square tiles):
        class 0 is summed against a 0/1 weight tile instead, which the compiler keeps out of the loop
        (one fused multiply-add per element), for the weights' registers (one per element a thread
        holds), which the dQ kernel has to spare without dropout only (with it, it spilled more).
        Taller tiles sum every class masked (the last as the sums less the others' took more
        instructions there)."""
        rows = tl.arange(0, BLOCK_M)[:, None]
        cols = tl.arange(0, BLOCK_N)[None, :]
        rot = tl.gather(ds, (rows + cols) % BLOCK_N, 1)
        if BLOCK_M == BLOCK_N:
            if WEIGHTS:
                first = tl.sum(rot * (rows + cols < BLOCK_N).to(tl.float32), 0)
            else:
                first = tl.sum(tl.where(rows + cols < BLOCK_N, rot, 0.0), 0)
            tab, band, far_lo, far_hi = _band_diagonals(first, 0, base, tab, band, far_lo, far_hi, t_idx, BLOCK_M,
                                                        BLOCK_N, M, ROWS, ALIGNED)
            tab, band, far_lo, far_hi = _band_diagonals(tl.sum(rot, 0) - first, 1, base, tab, band, far_lo, far_hi,
                                                        t_idx, BLOCK_M, BLOCK_N, M, ROWS, ALIGNED)
        else:
            wraps = (rows + cols) // BLOCK_N
            for w in tl.static_range(BLOCK_M // BLOCK_N + 1):
                tab, band, far_lo, far_hi = _band_diagonals(tl.sum(tl.where(wraps == w, rot, 0.0), 0), w, base, tab,
                                                            band, far_lo, far_hi, t_idx, BLOCK_M, BLOCK_N, M, ROWS,
                                                            ALIGNED)
        return tab, band, far_lo, far_hi

    @triton.jit
    def _band_diagonals(diag, w: tl.constexpr, base, tab, band, far_lo, far_hi, t_idx, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, M: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr):
        """Add ``diag``, the sums of diagonal class w of a band tile (`_table_grad_tile`: column c holds
        distance base + c - BLOCK_N w), to the program's per-distance sums."""
        if ALIGNED:
            r = (base + M) // BLOCK_N - w + BLOCK_M // BLOCK_N
            band += tl.where(tl.arange(0, ROWS)[:, None] == r, diag[None, :], 0.0)
        else:
            first_row = tl.arange(0, BLOCK_M) == 0
            exact = (t_idx > 0) & (t_idx < 2 * M)
            d = base + tl.arange(0, BLOCK_N) - BLOCK_N * w
            far_lo += tl.where(first_row, tl.sum(tl.where(d <= -M, diag, 0.0), 0), 0.0)
            far_hi += tl.where(first_row, tl.sum(tl.where(d >= M, diag, 0.0), 0), 0.0)
            r = t_idx - M - base + BLOCK_N * w  # the column of ``diag`` holding table entry t
            got = tl.gather(diag, tl.minimum(tl.maximum(r, 0), BLOCK_N - 1), 0)
            tab += tl.where(exact & (r >= 0) & (r < BLOCK_N), got, 0.0)
        return tab, band, far_lo, far_hi

    @triton.jit
    def _fwd_tiles(lo, stop, far, m_i, l_i, acc, q, K, V, pd_rows, kpm_ptr, count_ptr, seed, bh, b, h,
                   start_m, offs_m, offs_d, d_ok, hi, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, T, S, qk_scale, dropout_p,
                   HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, FAR: tl.constexpr,
                   DROPOUT_BITS: tl.constexpr = False, HAS_BIAS: tl.constexpr = True,
                   BIAS_TILES: tl.constexpr = False, M: tl.constexpr = 1):
        """The forward's online softmax over the key tiles lo, lo + BLOCK_N, ... < stop (no key from
        ``hi`` on is loaded: a row of padding alone, whose band loop runs one tile, reads none). FAR: tiles
        whose distances all clamp to one side (`_far_spans`), which add the scalar ``far_bias``
        (log2 units) and load no bias, both sides' in one loop of at least one tile (`_far_walk`,
        ``far``: (band_lo, right_lo, last, bias before, bias after)); otherwise each tile
        gathers its bias (`_tile_bias`), or reads it whole with BIAS_TILES (`_tiled_bias`: ``pd_rows``
        is then the head's first tile)."""
        split, shift, bias_before, bias_after = 0, 0, 0.0, 0.0
        if FAR:
            lo, stop, split, shift, bias_before, bias_after = _far_walk(lo, stop, *far, BLOCK_N)
        for x in range(lo, stop, BLOCK_N):
            start_n = x
            far_bias = bias_before
            if FAR:  # both far spans in one loop (`_far_walk`)
                start_n, far_bias, _ = _far_step(x, split, shift, bias_before, bias_after)
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_ok = (offs_n[:, None] < hi) & d_ok  # keys from hi on: padding, or after every query (causal)
            k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_ok, other=0.0)
            s = _dot(q, tl.trans(k), PRECISION) * qk_scale
            if FAR:
                s += far_bias
            elif HAS_BIAS and BIAS_TILES:
                s += _tiled_bias(pd_rows, start_n - start_m, M, BLOCK_M, BLOCK_N)
            elif HAS_BIAS:
                s += _tile_bias(pd_rows, offs_n)
            if HAS_KPM:  # a tile of unpadded keys skips its mask, like an interior tile without padding
                if _any_padded(count_ptr, start_n, start_n + BLOCK_N, S) | \
                        _edge_tile(start_m, start_n, S, BLOCK_M, BLOCK_N, CAUSAL):
                    padded = tl.load(kpm_ptr + offs_n, mask=offs_n < S, other=1)
                    s = tl.where(_tile_valid(padded, offs_m, offs_n, T, S, HAS_KPM, CAUSAL), s, float("-inf"))
            elif _edge_tile(start_m, start_n, S, BLOCK_M, BLOCK_N, CAUSAL):  # interior tiles: no mask
                s = tl.where(_tile_valid(0, offs_m, offs_n, T, S, HAS_KPM, CAUSAL), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            if DROPOUT:
                keep = _keep(seed, bh, start_m, start_n, T, S, dropout_p, BLOCK_M, BLOCK_N, DROPOUT_BITS)
                p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
            v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_ok, other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION)
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def _far_spans(start, lo, hi, M: tl.constexpr, ROWS: tl.constexpr, STEP: tl.constexpr,
                   ONE_BAND: tl.constexpr = False):
        """The spans of a program's far and band loops (`FAR_LOOPS`). The program holds ROWS rows from
        ``start`` (queries in the forward and dQ kernels, keys in dK/dV's) and walks the other axis
        STEP at a time over the tiles lo, lo + STEP, ... < hi (lo a multiple of STEP, hi > lo).
        Returns (band_lo, band_hi, right_lo), band_lo and right_lo multiples of STEP, band_hi =
        min(right_lo, hi): every distance |key - query| of the tiles before band_lo and of those
        from right_lo on is >= M, on the side of the walked axis' start (before band_lo) or end
        (from right_lo); every tile crossing the band (-M, M) lies from band_lo to before band_hi.
        ONE_BAND: the band span holds at least one tile, taken from the far ones if none crosses
        the band (the band loop computes any tile right; a loop that may run no iteration makes
        ptxas serialize the kernel's matrix products, `_far_walk`)."""
        # in tiles of STEP first, multiplied last: the compiler then knows every bound a multiple of STEP
        first = (tl.maximum(start - M - STEP + 2, 0) + STEP - 1) // STEP  # the first band tile
        first = tl.minimum(tl.maximum(first, lo // STEP), (hi + STEP - 1) // STEP)
        end = tl.minimum((start + M + ROWS - 1 + STEP - 1) // STEP, (hi + STEP - 1) // STEP)  # past the band
        end = tl.maximum(end, first)
        if ONE_BAND:  # an empty band span takes the last tile before it (when it starts at hi), else the next
            first = tl.minimum(first, (hi - 1) // STEP)
            end = tl.maximum(end, first + 1)
        band_lo = first * STEP
        right_lo = end * STEP
        return band_lo, tl.minimum(right_lo, hi), right_lo

    @triton.jit
    def _far_walk(lo, stop, band_lo, right_lo, last, bias_before, bias_after, STEP: tl.constexpr):
        """One loop over both far spans of `_far_spans` (`FAR_LOOPS`): the tiles lo, lo + STEP, ... <
        band_lo, then right_lo, right_lo + STEP, ... < stop. The loop walks positions x = first,
        first + STEP, ... < end; a position before ``split`` is the tile x, with the bias
        ``bias_before``; one from split on is the tile x + shift, with ``bias_after``. Returns
        (first, end, split, shift, bias_before, bias_after).

        At least one iteration, in a form the compiler sees (end >= first + STEP; the band loop's
        end is written so too): a loop that may run none leaves, on that path, its accumulators'
        initial values copied into the registers of the matrix product in flight past its end, and
        ptxas then serializes every product of the kernel (C7515; `compile_triton_rpe.py`, ``ser``).
        With no far tile at all, the loop runs the tile at lo (or at ``last``, the last tile start of
        the walked axis, if lo is past it) with the bias -inf: its probabilities are all 0, so it
        adds nothing. One loop for both spans, not one each, so that a program with far tiles on one
        side only (the first and last rows' programs) runs no such empty tile."""
        after = tl.maximum((stop - right_lo + STEP - 1) // STEP, 0)  # far tiles after the band
        live = (band_lo > lo) | (after > 0)
        first = tl.where(live, lo, tl.minimum(lo, last))
        split = tl.where(live, band_lo, first + STEP)
        end = tl.maximum(tl.where(live, band_lo + after * STEP, first + STEP), first + STEP)
        return first, end, split, right_lo - split, tl.where(live, bias_before, float("-inf")), bias_after

    @triton.jit
    def _far_step(x, split, shift, bias_before, bias_after):
        """Walk position ``x`` of a far loop (`_far_walk`): (its tile's start, its scalar bias, whether
        it lies before the band)."""
        before = x < split
        return tl.where(before, x, x + shift), tl.where(before, bias_before, bias_after), before

    @triton.jit
    def _fwd_kernel(Q, K, V, PD, KPM, KV_END, PAD_COUNT, SEED, DMASK, O, LSE,
                    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, so_t,
                    H, T, S, D, pd_len, pd_off, scale, dropout_p,
                    M: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    PRECISION: tl.constexpr, FAR_LOOPS: tl.constexpr = False, DROPOUT_BITS: tl.constexpr = False,
                    HAS_BIAS: tl.constexpr = True, BIAS_TILES: tl.constexpr = False):
        """DROPOUT_BITS (with DROPOUT): the keep mask's bits are read from DMASK (`_keep`). Without
        HAS_BIAS (bias-free calls, `triton_rpe_attention` with no table) nothing is read from PD and
        FAR_LOOPS is off: the scores are q k^T alone. BIAS_TILES (`BIAS_LAYOUT`): PD holds each head's
        bias tiles (`_bias_tiles`, pd_off unused), not its bias row."""
        # fp32 whatever the caller passed: under torch.compile, inductor may hand Python floats over as
        # fp64 scalars, which would promote the scores (and the loop-carried row maxima) to fp64
        scale = tl.cast(scale, tl.float32)
        dropout_p = tl.cast(dropout_p, tl.float32)
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        start_m = pid_m * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :],
                    mask=(offs_m[:, None] < T) & d_ok, other=0.0)
        pd_rows = PD + h * pd_len + pd_off - offs_m  # `_tile_bias`
        if BIAS_TILES:
            pd_rows = PD + h * pd_len  # `_tiled_bias`
        kpm_ptr = KPM + b * S
        count_ptr = PAD_COUNT + b * (S + 1)  # `_any_padded`
        qk_scale = scale * _LOG2E  # scores in log2 units (module docstring), PD already is
        seed = (0, DMASK)
        if DROPOUT:
            seed = (tl.load(SEED), DMASK)  # `_keep`'s rng
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        hi = S
        if HAS_KPM:
            hi = tl.load(KV_END + b)  # past the last unpadded key, every key is padding: no tile there
        if CAUSAL:
            hi = tl.minimum(hi, start_m + BLOCK_M)
        rest = (q, K, V, pd_rows, kpm_ptr, count_ptr, seed, bh, b, h, start_m, offs_m, offs_d, d_ok, hi, sk_b, sk_h,
                sk_t, sv_b, sv_h, sv_t, T, S, qk_scale, dropout_p)
        if FAR_LOOPS:  # two loops: the far tiles (both sides) add one scalar and load no bias; the band
            end = tl.maximum(hi, 1)  # a row of padding alone runs one band tile, whose keys it does not load
            band_lo, band_hi, right_lo = _far_spans(start_m, 0, end, M, BLOCK_M, BLOCK_N, ONE_BAND=True)
            band_hi = tl.maximum(band_hi, band_lo + BLOCK_N)  # (no more tiles: `_far_walk`)
            before, after = _clamped_entries(h, pd_len, pd_off, M, BLOCK_M, BLOCK_N, BIAS_TILES)
            before, after = tl.load(PD + before), tl.load(PD + after)
            spans = (band_lo, right_lo, (end - 1) // BLOCK_N * BLOCK_N, before, after)
            m_i, l_i, acc = _fwd_tiles(0, end, spans, m_i, l_i, acc, *rest, HAS_KPM=HAS_KPM, CAUSAL=CAUSAL,
                                       DROPOUT=DROPOUT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=PRECISION, FAR=True,
                                       DROPOUT_BITS=DROPOUT_BITS, HAS_BIAS=HAS_BIAS, BIAS_TILES=BIAS_TILES, M=M)
            m_i, l_i, acc = _fwd_tiles(band_lo, band_hi, (0, 0, 0, 0.0, 0.0), m_i, l_i, acc, *rest, HAS_KPM=HAS_KPM,
                                       CAUSAL=CAUSAL, DROPOUT=DROPOUT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                       PRECISION=PRECISION, FAR=False, DROPOUT_BITS=DROPOUT_BITS, HAS_BIAS=HAS_BIAS,
                                       BIAS_TILES=BIAS_TILES, M=M)
        else:
            m_i, l_i, acc = _fwd_tiles(0, hi, (0, 0, 0, 0.0, 0.0), m_i, l_i, acc, *rest, HAS_KPM=HAS_KPM, CAUSAL=CAUSAL,
                                       DROPOUT=DROPOUT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=PRECISION,
                                       FAR=False, DROPOUT_BITS=DROPOUT_BITS, HAS_BIAS=HAS_BIAS, BIAS_TILES=BIAS_TILES,
                                       M=M)
        has_key = l_i > 0.0
        out = acc / tl.where(has_key, l_i, 1.0)[:, None]
        tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=(offs_m[:, None] < T) & d_ok)
        lse = tl.where(has_key, m_i + tl.log2(tl.where(has_key, l_i, 1.0)), float("inf"))  # log2 units
        tl.store(LSE + bh * T + offs_m, lse, mask=offs_m < T)

    @triton.jit
    def _dkdv_tiles(lo, stop, far, dk, dv, far_lo, far_hi, k, v, Q, DO, LSE, DELTA, pd_keys, key_ok,
                    block_padded, seed, bh, b, h, start_n, offs_n, offs_d, d_ok, band_k, dq_head, sq_b, sq_h, sq_t,
                    sd_b, sd_h, sd_t, sa_t, T, S, D, qk_scale, dropout_p, M: tl.constexpr, HAS_KPM: tl.constexpr,
                    CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    PRECISION: tl.constexpr, FUSE_DQ: tl.constexpr, FAR_SUMS: tl.constexpr, BAND_Q: tl.constexpr,
                    BAND_K: tl.constexpr, FAR: tl.constexpr, DROPOUT_BITS: tl.constexpr = False,
                    HAS_BIAS: tl.constexpr = True, BIAS_TILES: tl.constexpr = False):
        """`_bwd_dkdv_kernel`'s loop over the query tiles lo, lo + BLOCK_M, ... < stop. FAR: tiles
        whose distances all clamp to one side (`_far_spans`), which add the scalar ``far_bias`` and
        load no bias, both sides' in one loop of at least one tile (`_far_walk`; ``far``: (band_lo,
        right_lo, last, bias before, bias after)). BIAS_TILES: ``pd_keys`` is the head's first
        keys-major bias tile (`_tiled_bias`)."""
        split, shift, bias_before, bias_after = 0, 0, 0.0, 0.0
        if FAR:
            lo, stop, split, shift, bias_before, bias_after = _far_walk(lo, stop, *far, BLOCK_M)
        for x in range(lo, stop, BLOCK_M):
            start_m = x
            far_bias = bias_before
            if FAR:  # both far spans in one loop (`_far_walk`)
                start_m, far_bias, _ = _far_step(x, split, shift, bias_before, bias_after)
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q_t = tl.load(Q + b * sq_b + h * sq_h + offs_m[None, :] * sq_t + offs_d[:, None],
                          mask=(offs_m[None, :] < T) & (offs_d[:, None] < D), other=0.0)  # (BLOCK_D, BLOCK_M)
            do = tl.load(DO + b * sd_b + h * sd_h + offs_m[:, None] * sd_t + offs_d[None, :],
                         mask=(offs_m[:, None] < T) & d_ok, other=0.0)
            lse = tl.load(LSE + bh * T + offs_m, mask=offs_m < T, other=float("inf"))
            delta = tl.load(DELTA + bh * T + offs_m, mask=offs_m < T, other=0.0)
            s_t = _dot(k, q_t, PRECISION) * qk_scale  # (keys, queries), log2 units
            if FAR:
                s_t += far_bias
            elif HAS_BIAS and BIAS_TILES:
                s_t += _tiled_bias(pd_keys, start_n - start_m, M, BLOCK_M, BLOCK_N, KEYS_MAJOR=True)
            elif HAS_BIAS:
                s_t += tl.load(pd_keys[:, None] - offs_m[None, :])  # `_tile_bias`, transposed
            p_t = tl.exp2(s_t - lse[None, :])  # 0 for queries past T (lse = +inf)
            if HAS_KPM:
                if block_padded | _edge_tile(start_m, start_n, S, BLOCK_M, BLOCK_N, CAUSAL):
                    valid = key_ok[:, None] & (offs_m[None, :] < T)
                    if CAUSAL:
                        valid = valid & (offs_n[:, None] <= offs_m[None, :])
                    p_t = tl.where(valid, p_t, 0.0)
            elif _edge_tile(start_m, start_n, S, BLOCK_M, BLOCK_N, CAUSAL):
                valid = key_ok[:, None] & (offs_m[None, :] < T)
                if CAUSAL:
                    valid = valid & (offs_n[:, None] <= offs_m[None, :])
                p_t = tl.where(valid, p_t, 0.0)
            dp_t = _dot(v, tl.trans(do), PRECISION)
            if DROPOUT:  # dS = P (dP_kept / (1 - p) - delta) = P_kept dP - P delta
                keep_t = tl.trans(_keep(seed, bh, start_m, start_n, T, S, dropout_p, BLOCK_M, BLOCK_N, DROPOUT_BITS))
                p_kept = tl.where(keep_t, p_t / (1.0 - dropout_p), 0.0)
                dv += _dot(p_kept.to(do.dtype), do, PRECISION)
                ds_t = p_kept * dp_t - p_t * delta[None, :]
            else:
                dv += _dot(p_t.to(do.dtype), do, PRECISION)
                ds_t = p_t * (dp_t - delta[None, :])
            ds_low = ds_t.to(q_t.dtype)
            dk += _dot(ds_low, tl.trans(q_t), PRECISION)
            if FUSE_DQ:  # dQ += dS K (scaled by PyTorch afterwards): the transposed tile goes through shared
                # memory, as in FlashAttention-2. DQACC is padded to whole tiles (rows to a multiple of
                # BLOCK_M, columns to BLOCK_D): no mask, so no branch around each vector reduction
                dq_part = _dot(tl.trans(ds_low), k, PRECISION)
                tl.atomic_add(dq_head + offs_m[:, None] * sa_t + offs_d[None, :], dq_part, sem="relaxed")
            if FAR_SUMS:  # the band kernel's tile of each key row: far when all its distances clamp
                base = band_k - start_m // BAND_Q * BAND_Q
                rows = tl.sum(ds_t, 1)
                far_lo += tl.where(base + BAND_K - 1 <= -M, rows, 0.0)
                far_hi += tl.where(base - (BAND_Q - 1) >= M, rows, 0.0)
        return dk, dv, far_lo, far_hi

    @triton.jit
    def _bwd_dkdv_kernel(Q, K, V, PD, KPM, KV_END, PAD_COUNT, SEED, DMASK, DO, LSE, DELTA, DKV, DQACC, FAR,
                         sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sd_b, sd_h, sd_t,
                         sg_b, sg_h, sg_t, sa_b, sa_h, sa_t, dk_off, dv_off,
                         H, T, S, D, pd_len, pd_off, scale, dropout_p,
                         M: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                         PRECISION: tl.constexpr, FUSE_DQ: tl.constexpr = False, FAR_SUMS: tl.constexpr = False,
                         BAND_Q: tl.constexpr = 16, BAND_K: tl.constexpr = 16, FAR_LOOPS: tl.constexpr = False,
                         DROPOUT_BITS: tl.constexpr = False, HAS_BIAS: tl.constexpr = True,
                         BIAS_TILES: tl.constexpr = False):
        """Works on transposed tiles (keys as rows): S^T = K Q^T, so the left operands of the
        products are K and V (staged into shared memory once, before the loop) and the tiles P^T
        and dS^T (from registers), and the right ones are Q^T and dO, pipelined into shared
        memory, where a transpose is free. dK and dV go to one tensor, DKV, at element offsets dk_off and
        dv_off, with the strides sg_* (`_gradient_layout`: the packed projection's gradient, or two halves).

        FUSE_DQ (the ``fused`` backward, `BACKWARD`): also dQ += dS K for each tile, added to the
        fp32 (B, H, T, D) DQACC with relaxed atomic adds (FlashAttention-2's dQ), so that no dQ
        kernel recomputes the tiles. FAR_SUMS: also the table gradient's sums over the tiles that
        the band kernel (`_bwd_dq_kernel` with BAND_ONLY, tiles of BAND_Q queries x BAND_K keys)
        leaves out, those whose distances all lie <= -M or >= M: one pair of fp32 per program in
        FAR (entries <= -M, >= M)."""
        # fp32 whatever the caller passed: under torch.compile, inductor may hand Python floats over as
        # fp64 scalars, which would promote the scores (and the loop-carried row maxima) to fp64
        scale = tl.cast(scale, tl.float32)
        dropout_p = tl.cast(dropout_p, tl.float32)
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        start_n = pid_n * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        kv_ok = (offs_n[:, None] < S) & d_ok
        k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_ok, other=0.0)
        pd_keys = PD + h * pd_len + pd_off + offs_n  # `_tile_bias`, transposed: key j's at query 0
        if BIAS_TILES:
            pd_keys = PD + h * pd_len  # `_tiled_bias`, keys-major tiles
        kpm_ptr = KPM + b * S
        qk_scale = scale * _LOG2E
        key_ok = offs_n < S
        block_padded = False  # some key of the block is padding: its tiles are masked
        if HAS_KPM:
            key_ok = key_ok & (tl.load(kpm_ptr + offs_n, mask=offs_n < S, other=1) == 0)
            block_padded = _any_padded(PAD_COUNT + b * (S + 1), start_n, start_n + BLOCK_N, S)
        seed = (0, DMASK)
        if DROPOUT:
            seed = (tl.load(SEED), DMASK)  # `_keep`'s rng
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        far_lo = tl.zeros((BLOCK_N,), dtype=tl.float32)  # FAR_SUMS: per key row, the far tiles' dS
        far_hi = tl.zeros((BLOCK_N,), dtype=tl.float32)
        band_k = offs_n // BAND_K * BAND_K  # FAR_SUMS: the first key of each row's band-kernel tile
        dq_head = DQACC + b * sa_b + h * sa_h  # FUSE_DQ
        lo = 0
        if CAUSAL:
            lo = start_n  # queries before the block's first key see none of it
        live = True
        if HAS_KPM:  # a block of keys past the last unpadded one is all padding: dK = dV = 0
            live = start_n < tl.load(KV_END + b)
        if live:
            rest = (k, v, Q, DO, LSE, DELTA, pd_keys, key_ok, block_padded, seed, bh, b, h, start_n, offs_n, offs_d,
                    d_ok, band_k, dq_head, sq_b, sq_h, sq_t, sd_b, sd_h, sd_t, sa_t, T, S, D, qk_scale, dropout_p)
            if FAR_LOOPS:  # the early queries see every key at distance >= M, the late ones at <= -M
                band_lo, band_hi, right_lo = _far_spans(start_n, lo, T, M, BLOCK_N, BLOCK_M, ONE_BAND=True)
                band_hi = tl.maximum(band_hi, band_lo + BLOCK_M)  # (no more tiles: `_far_walk`)
                before, after = _clamped_entries(h, pd_len, pd_off, M, BLOCK_M, BLOCK_N, BIAS_TILES)
                before, after = tl.load(PD + before), tl.load(PD + after)
                spans = (band_lo, right_lo, (T - 1) // BLOCK_M * BLOCK_M, after, before)
                dk, dv, far_lo, far_hi = _dkdv_tiles(lo, T, spans, dk, dv, far_lo, far_hi, *rest, M=M, HAS_KPM=HAS_KPM,
                                                     CAUSAL=CAUSAL, DROPOUT=DROPOUT, BLOCK_N=BLOCK_N, BLOCK_M=BLOCK_M,
                                                     PRECISION=PRECISION, FUSE_DQ=FUSE_DQ, FAR_SUMS=FAR_SUMS,
                                                     BAND_Q=BAND_Q, BAND_K=BAND_K, FAR=True, DROPOUT_BITS=DROPOUT_BITS,
                                                     HAS_BIAS=HAS_BIAS, BIAS_TILES=BIAS_TILES)
                dk, dv, far_lo, far_hi = _dkdv_tiles(band_lo, band_hi, (0, 0, 0, 0.0, 0.0), dk, dv, far_lo, far_hi,
                                                     *rest, M=M, HAS_KPM=HAS_KPM, CAUSAL=CAUSAL, DROPOUT=DROPOUT,
                                                     BLOCK_N=BLOCK_N, BLOCK_M=BLOCK_M, PRECISION=PRECISION,
                                                     FUSE_DQ=FUSE_DQ, FAR_SUMS=FAR_SUMS, BAND_Q=BAND_Q, BAND_K=BAND_K,
                                                     FAR=False, DROPOUT_BITS=DROPOUT_BITS, HAS_BIAS=HAS_BIAS,
                                                     BIAS_TILES=BIAS_TILES)
            else:
                dk, dv, far_lo, far_hi = _dkdv_tiles(lo, T, (0, 0, 0, 0.0, 0.0), dk, dv, far_lo, far_hi, *rest, M=M,
                                                     HAS_KPM=HAS_KPM, CAUSAL=CAUSAL, DROPOUT=DROPOUT, BLOCK_N=BLOCK_N,
                                                     BLOCK_M=BLOCK_M, PRECISION=PRECISION, FUSE_DQ=FUSE_DQ,
                                                     FAR_SUMS=FAR_SUMS, BAND_Q=BAND_Q, BAND_K=BAND_K, FAR=False,
                                                     DROPOUT_BITS=DROPOUT_BITS, HAS_BIAS=HAS_BIAS,
                                                     BIAS_TILES=BIAS_TILES)
        if FAR_SUMS:
            out = FAR + (pid_n * tl.num_programs(1) + bh) * 2  # row pid_n B H + bh
            tl.store(out, tl.sum(far_lo, 0))
            tl.store(out + 1, tl.sum(far_hi, 0))
        dk = dk * scale
        out_offs = b * sg_b + h * sg_h + offs_n[:, None] * sg_t + offs_d[None, :]  # dK, dV: same layout
        tl.store(DKV + dk_off + out_offs, dk.to(DKV.dtype.element_ty), mask=kv_ok)
        tl.store(DKV + dv_off + out_offs, dv.to(DKV.dtype.element_ty), mask=kv_ok)

    @triton.jit
    def _dq_tiles(lo, stop, far, dq, tab, band, far_lo, far_hi, q, do, lse, delta, t_idx, K, V, pd_rows,
                  kpm_ptr, count_ptr, seed, bh, b, h, start_m, offs_m, offs_d, d_ok, hi, sk_b, sk_h, sk_t, sv_b, sv_h,
                  sv_t, T, S, qk_scale, dropout_p, M: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr,
                  HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, TABLE_GRAD: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DQ_PRODUCT: tl.constexpr,
                  KIND: tl.constexpr, DROPOUT_BITS: tl.constexpr = False, LOOP_STAGES: tl.constexpr = None,
                  WEIGHTS: tl.constexpr = False, HAS_BIAS: tl.constexpr = True, BIAS_TILES: tl.constexpr = False):
        """`_bwd_dq_kernel`'s loop over the key tiles lo, lo + BLOCK_N, ... < stop (keys from ``hi``
        on are masked). KIND (`_table_grad_tile`): "any" tiles, or tiles all of one class: "far"
        (every distance clamps to -M on the tiles before the band, to M on those after it: they add
        the scalar bias of their side and load no bias; `FAR_LOOPS`; both sides in one loop of at
        least one tile, `_far_walk`, ``far``: (band_lo, right_lo, last, bias before, bias after)),
        "band". DQ_PRODUCT: dq += dS K (not in the band kernel). LOOP_STAGES: the loop's pipeline stages
        given explicitly (`tl.range`'s num_stages; None: the launch's), which makes Triton's pipeliner
        stage every load of the loop, not only those whose values reach a matrix product: the band
        kernel's bias reaches none (no dS K there), and was loaded synchronously without it. WEIGHTS:
        `_band_tile`'s. BIAS_TILES: ``pd_rows`` is the head's first bias tile (`_tiled_bias`)."""
        split, shift, bias_before, bias_after = 0, 0, 0.0, 0.0
        if KIND == "far":
            lo, stop, split, shift, bias_before, bias_after = _far_walk(lo, stop, *far, BLOCK_N)
        for x in tl.range(lo, stop, BLOCK_N, num_stages=LOOP_STAGES):
            start_n = x
            far_bias = bias_before
            before = True
            if KIND == "far":  # both far spans in one loop (`_far_walk`)
                start_n, far_bias, before = _far_step(x, split, shift, bias_before, bias_after)
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_ok = (offs_n[:, None] < hi) & d_ok
            k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=kv_ok, other=0.0)
            s = _dot(q, tl.trans(k), PRECISION) * qk_scale  # log2 units
            if KIND == "far":
                s += far_bias
            elif HAS_BIAS and BIAS_TILES:
                s += _tiled_bias(pd_rows, start_n - start_m, M, BLOCK_M, BLOCK_N)
            elif HAS_BIAS:
                s += _tile_bias(pd_rows, offs_n)
            p = tl.exp2(s - lse[:, None])  # 0 for queries past T (lse = +inf)
            if HAS_KPM:
                if _any_padded(count_ptr, start_n, start_n + BLOCK_N, S) | \
                        _edge_tile(start_m, start_n, S, BLOCK_M, BLOCK_N, CAUSAL):
                    padded = tl.load(kpm_ptr + offs_n, mask=offs_n < S, other=1)
                    p = tl.where(_tile_valid(padded, offs_m, offs_n, T, S, HAS_KPM, CAUSAL), p, 0.0)
            elif _edge_tile(start_m, start_n, S, BLOCK_M, BLOCK_N, CAUSAL):
                p = tl.where(_tile_valid(0, offs_m, offs_n, T, S, HAS_KPM, CAUSAL), p, 0.0)
            if DROPOUT:  # dS = P (dP_kept / (1 - p) - delta) = P_kept dP - P delta
                keep = _keep(seed, bh, start_m, start_n, T, S, dropout_p, BLOCK_M, BLOCK_N, DROPOUT_BITS)
                p_kept = tl.where(keep, p / (1.0 - dropout_p), 0.0)
                ds = p_kept * _dot(do, tl.trans(v), PRECISION) - p * delta[:, None]
            else:
                ds = p * (_dot(do, tl.trans(v), PRECISION) - delta[:, None])
            if DQ_PRODUCT:
                dq += _dot(ds.to(k.dtype), k, PRECISION)
            if TABLE_GRAD:  # BLOCK_M a multiple of BLOCK_N
                tab, band, far_lo, far_hi = _table_grad_tile(ds, start_n - start_m, tab, band, far_lo, far_hi,
                                                             t_idx, BLOCK_M, BLOCK_N, M, ROWS, ALIGNED, KIND, before,
                                                             WEIGHTS=WEIGHTS)
        return dq, tab, band, far_lo, far_hi

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, PD, KPM, KV_END, PAD_COUNT, SEED, DMASK, DO, O, LSE, DELTA, DQ, DTAB,
                       sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sd_b, sd_h, sd_t,
                       sg_b, sg_h, sg_t, so_b, so_h, so_t,
                       H, T, S, D, pd_len, pd_off, scale, dropout_p,
                       M: tl.constexpr, TAB: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr,
                       HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, TABLE_GRAD: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       PRECISION: tl.constexpr, BAND_ONLY: tl.constexpr = False, FAR_LOOPS: tl.constexpr = False,
                       DELTA_OUT: tl.constexpr = False, DROPOUT_BITS: tl.constexpr = False,
                       BAND_STAGES: tl.constexpr = None, BAND_WEIGHTS: tl.constexpr = True,
                       HAS_BIAS: tl.constexpr = True, BIAS_TILES: tl.constexpr = False):
        """dQ and the table gradient, one program per query block (module docstring). BAND_ONLY (the
        ``fused`` backward's band kernel, `BACKWARD`): only the key tiles whose distances do not all
        clamp, for the table gradient alone (no dQ: the dK/dV kernel adds it; the far tiles' sums
        come from there too). DELTA_OUT (the split backward, which runs this kernel first): delta =
        rowsum(dO o) computed here from O (strides so_*) and written to DELTA for the dK/dV kernel;
        otherwise read from DELTA. BAND_STAGES (with BAND_ONLY): the launch's pipeline stages, given to its
        loop explicitly (`_dq_tiles`' LOOP_STAGES). BAND_WEIGHTS: the band tiles' diagonal sums against a
        weight tile (`_band_tile`'s WEIGHTS) where it pays, without dropout (False: never; for
        benchmarks/compile_triton_rpe.py's comparison). BIAS_TILES (`BIAS_LAYOUT`): PD holds each head's
        bias tiles (`_bias_tiles`), as in the forward."""
        # fp32 whatever the caller passed: under torch.compile, inductor may hand Python floats over as
        # fp64 scalars, which would promote the scores (and the loop-carried row maxima) to fp64
        scale = tl.cast(scale, tl.float32)
        dropout_p = tl.cast(dropout_p, tl.float32)
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        start_m = pid_m * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        q_ok = (offs_m[:, None] < T) & d_ok
        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=q_ok, other=0.0)
        do = tl.load(DO + b * sd_b + h * sd_h + offs_m[:, None] * sd_t + offs_d[None, :], mask=q_ok, other=0.0)
        lse = tl.load(LSE + bh * T + offs_m, mask=offs_m < T, other=float("inf"))
        if DELTA_OUT:  # one pass over this block's rows of O instead of four PyTorch operations over all of them
            o = tl.load(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :], mask=q_ok, other=0.0)
            delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
            tl.store(DELTA + bh * T + offs_m, delta, mask=offs_m < T)
        else:
            delta = tl.load(DELTA + bh * T + offs_m, mask=offs_m < T, other=0.0)
        pd_rows = PD + h * pd_len + pd_off - offs_m  # `_tile_bias`
        if BIAS_TILES:
            pd_rows = PD + h * pd_len  # `_tiled_bias`
        kpm_ptr = KPM + b * S
        count_ptr = PAD_COUNT + b * (S + 1)  # `_any_padded`
        qk_scale = scale * _LOG2E
        seed = (0, DMASK)
        if DROPOUT:
            seed = (tl.load(SEED), DMASK)  # `_keep`'s rng
        dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        # the table gradient's sums (`_table_grad_tile`): per query row beyond the band, per distance in it
        far_lo = tl.zeros((BLOCK_M,), dtype=tl.float32)  # distances <= -M
        far_hi = tl.zeros((BLOCK_M,), dtype=tl.float32)  # distances >= +M
        band = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)  # ALIGNED: entry c + BLOCK_N (r - BLOCK_M / BLOCK_N)
        tab = tl.zeros((TAB,), dtype=tl.float32)  # otherwise: exact distances -M < d < M (entry d + M)
        t_idx = tl.arange(0, TAB)
        hi = S
        if HAS_KPM:
            hi = tl.load(KV_END + b)  # as in the forward
        if CAUSAL:
            hi = tl.minimum(hi, start_m + BLOCK_M)
        # At least one iteration, so that the compiled loop has no path that skips it: on that path the
        # zero-initialized dQ accumulator was copied into the registers of the dQ product the loop leaves
        # in flight past its end, and ptxas then serialized every wgmma of the kernel (C7515, each product
        # waiting for the one before: `benchmarks/compile_triton_rpe.py`'s ``ser`` column; every sm90 dQ
        # kernel until 2026-11-26). The one iteration of a row of padding alone (hi = 0) loads zeros for its
        # keys (the mask below: keys from hi on are padding or, causal, after every query of the block) and
        # adds nothing: its probabilities are masked to 0.
        end_n = tl.maximum(hi, 1)
        rest = (q, do, lse, delta, t_idx, K, V, pd_rows, kpm_ptr, count_ptr, seed, bh, b, h, start_m, offs_m, offs_d,
                d_ok, hi, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, T, S, qk_scale, dropout_p)
        if BAND_ONLY:  # the tiles with start_n - start_m + BLOCK_N - 1 > -M and start_n - start_m - BLOCK_M + 1 < M
            band_lo = (tl.maximum(start_m - M - BLOCK_N + 2, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
            band_hi = tl.minimum(hi, start_m + M + BLOCK_M - 1)
            dq, tab, band, far_lo, far_hi = _dq_tiles(band_lo, band_hi, (0, 0, 0, 0.0, 0.0), dq, tab, band, far_lo,
                                                      far_hi, *rest, M=M, ROWS=ROWS, ALIGNED=ALIGNED, HAS_KPM=HAS_KPM,
                                                      CAUSAL=CAUSAL, DROPOUT=DROPOUT, TABLE_GRAD=TABLE_GRAD,
                                                      BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=PRECISION,
                                                      DQ_PRODUCT=not BAND_ONLY, KIND="band", DROPOUT_BITS=DROPOUT_BITS,
                                                      HAS_BIAS=HAS_BIAS, BIAS_TILES=BIAS_TILES,
                                                      WEIGHTS=BAND_WEIGHTS and not DROPOUT,
                                                      LOOP_STAGES=BAND_STAGES)
        elif FAR_LOOPS:  # the key tiles far before and after the queries, then across the band
            band_lo, band_hi, right_lo = _far_spans(start_m, 0, end_n, M, BLOCK_M, BLOCK_N, ONE_BAND=True)
            band_hi = tl.maximum(band_hi, band_lo + BLOCK_N)  # (no more tiles: `_far_walk`)
            before, after = _clamped_entries(h, pd_len, pd_off, M, BLOCK_M, BLOCK_N, BIAS_TILES)
            before, after = tl.load(PD + before), tl.load(PD + after)
            spans = (band_lo, right_lo, (end_n - 1) // BLOCK_N * BLOCK_N, before, after)
            dq, tab, band, far_lo, far_hi = _dq_tiles(0, end_n, spans, dq, tab, band, far_lo, far_hi, *rest, M=M,
                                                      ROWS=ROWS, ALIGNED=ALIGNED, HAS_KPM=HAS_KPM, CAUSAL=CAUSAL,
                                                      DROPOUT=DROPOUT, TABLE_GRAD=TABLE_GRAD, BLOCK_M=BLOCK_M,
                                                      BLOCK_N=BLOCK_N, PRECISION=PRECISION, DQ_PRODUCT=not BAND_ONLY,
                                                      KIND="far", DROPOUT_BITS=DROPOUT_BITS, HAS_BIAS=HAS_BIAS,
                                                      BIAS_TILES=BIAS_TILES)
            dq, tab, band, far_lo, far_hi = _dq_tiles(band_lo, band_hi, (0, 0, 0, 0.0, 0.0), dq, tab, band, far_lo,
                                                      far_hi, *rest, M=M, ROWS=ROWS, ALIGNED=ALIGNED, HAS_KPM=HAS_KPM,
                                                      CAUSAL=CAUSAL, DROPOUT=DROPOUT, TABLE_GRAD=TABLE_GRAD,
                                                      BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=PRECISION,
                                                      DQ_PRODUCT=not BAND_ONLY, KIND="band", DROPOUT_BITS=DROPOUT_BITS,
                                                      HAS_BIAS=HAS_BIAS, BIAS_TILES=BIAS_TILES,
                                                      WEIGHTS=BAND_WEIGHTS and not DROPOUT)
        else:
            dq, tab, band, far_lo, far_hi = _dq_tiles(0, end_n, (0, 0, 0, 0.0, 0.0), dq, tab, band, far_lo, far_hi,
                                                      *rest, M=M, ROWS=ROWS, ALIGNED=ALIGNED, HAS_KPM=HAS_KPM,
                                                      CAUSAL=CAUSAL, DROPOUT=DROPOUT, TABLE_GRAD=TABLE_GRAD,
                                                      BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=PRECISION,
                                                      DQ_PRODUCT=not BAND_ONLY, KIND="any", DROPOUT_BITS=DROPOUT_BITS,
                                                      HAS_BIAS=HAS_BIAS, BIAS_TILES=BIAS_TILES,
                                                      WEIGHTS=BAND_WEIGHTS and not DROPOUT)
        if not BAND_ONLY:
            dq = dq * scale
            tl.store(DQ + b * sg_b + h * sg_h + offs_m[:, None] * sg_t + offs_d[None, :],
                     dq.to(DQ.dtype.element_ty), mask=q_ok)
        if TABLE_GRAD:  # this program's partial sums, one row of DTAB: entries 0 (<= -M) .. 2 M (>= M)
            out = DTAB + (pid_m * tl.num_programs(1) + bh) * (2 * M + 1)  # row pid_m B H + bh
            lo = tl.sum(far_lo, 0)
            hi = tl.sum(far_hi, 0)
            if ALIGNED:
                t_band = tl.arange(0, BLOCK_N)[None, :] + BLOCK_N * (tl.arange(0, ROWS)[:, None] - BLOCK_M // BLOCK_N)
                lo += tl.sum(tl.sum(tl.where(t_band <= 0, band, 0.0), 1), 0)
                hi += tl.sum(tl.sum(tl.where(t_band >= 2 * M, band, 0.0), 1), 0)
                tl.store(out + t_band, band, mask=(t_band > 0) & (t_band < 2 * M))
                tl.store(out + t_idx, tl.where(t_idx == 0, lo, hi), mask=(t_idx == 0) | (t_idx == 2 * M))
            else:
                tab = tl.where(t_idx == 0, lo, tab)
                tab = tl.where(t_idx == 2 * M, hi, tab)
                tl.store(out + t_idx, tab, mask=t_idx < 2 * M + 1)

    @triton.jit
    def _keep_mask_kernel(SEED, OUT, T, S, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        bh = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        keep = _keep((tl.load(SEED), SEED), bh, pid_m * BLOCK_M, pid_n * BLOCK_N, T, S, dropout_p, BLOCK_M, BLOCK_N)
        lin = (bh.to(tl.int64) * T + offs_m[:, None]) * S + offs_n[None, :]
        tl.store(OUT + lin, keep.to(tl.int8), mask=(offs_m[:, None] < T) & (offs_n[None, :] < S))

    @triton.jit
    def _loop_probe_kernel(OUT, n):
        total = tl.zeros((1,), dtype=tl.float32)
        for _ in range(0, n, 1):
            total += 1.0
        tl.store(OUT + tl.arange(0, 1), total)


_INTERPRETER_PROBE = []  # [None or the reason], filled by the first `interpreter_problem` call


def interpreter_problem() -> Optional[str]:
    """Why Triton's interpreter cannot run these kernels in this environment, or None (no
    interpreter in use, or it works). Probed once with a loop bounded by a kernel argument, which
    every kernel here has: Triton 3.6's interpreter fails there ("only 0-dimensional arrays can be
    converted to Python scalars", with NumPy 2.4 and 2.5); Triton 3.9's runs it."""
    if triton is None or not INTERPRETED:
        return None
    if not _INTERPRETER_PROBE:
        out = torch.zeros(1, dtype=torch.float32)
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"  # Triton reads it again while an interpreted kernel runs
        try:
            _loop_probe_kernel[(1,)](out, 3)
            problem = None if out.item() == 3.0 else f"a probe loop gave {out.item()} instead of 3.0"
        except Exception as e:  # noqa: BLE001 - any failure means the interpreter cannot run them
            problem = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
        finally:
            if saved is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = saved
        if problem is not None:
            problem = (f"Triton {triton.__version__}'s interpreter cannot run these kernels ({problem}); "
                       "Triton 3.9's can")
        _INTERPRETER_PROBE.append(problem)
    return _INTERPRETER_PROBE[0]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


BLOCKS_OVERRIDE = None  # a tile tuple (`resolve_blocks`) for every call: tuning runs
DEFAULT_STAGES = 3  # software-pipelining stages of every kernel when a tile tuple gives none (Triton's default)


_CAPABILITIES = {}  # CUDA device index -> major * 10 + minor


def _capability(device: torch.device) -> int:
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _CAPABILITIES:
        major, minor = torch.cuda.get_device_capability(index)
        _CAPABILITIES[index] = major * 10 + minor
    return _CAPABILITIES[index]


# The backward's structure (BACKWARDS; the module docstring):
# - "split" (the default): a dK/dV kernel and a dQ kernel that recomputes every tile and reduces the
#   table gradient (7 matrix products per tile, no atomics, deterministic);
# - "fused": the dK/dV kernel also adds dQ += dS K to an fp32 buffer with atomic adds
#   (FlashAttention-2's structure: 5 products per tile) and sums the table gradient over the tiles
#   whose distances all clamp, and a band kernel recomputes only the tiles crossing the band
#   (-M, M) for the rest of the table gradient (2 products each). dQ's sums then run in a
#   scheduling-dependent order (not bitwise deterministic, as FlashAttention's own dQ).
# Measured slower than the split backward on the H200 (2026-11-26: 2.084 ms against 1.934 at T=S=1024,
# dropout 0; `benchmarks/bench_attention.py`'s triton-fused row), so "split" stays the default.
BACKWARDS = ("split", "fused")
BACKWARD = os.environ.get("AST_T5_TRITON_BACKWARD", "split")
# FAR_LOOPS (FAR_LOOPS_CHOICES): which kernels walk their other axis in two loops instead of one: the
# tiles whose distances all clamp to -M, those crossing the band (-M, M), and those that all clamp to M. The
# outer loops add the clamped bias as a scalar, so they neither gather a bias tile nor stage it through
# shared memory (at 64 x 64 tiles and M = 128, 5 of a row's 16 key tiles cross the band at T = 1024, 5 of
# 32 at 2048), and the dQ kernel's table gradient takes no branch per tile there. Calls up to 4 (M + tile)
# keep one loop (`far_loops_pay`: 768 tokens at M = 128 and sm90's 64-token tiles).
# - "none": one loop everywhere (the default until 2026-11-27);
# - "backward" (the default): the dK/dV and dQ kernels (sm90 D 64, Triton 3.6, `compile_triton_rpe.py --far-loops`: dQ
#   26.3 -> 13.2 instructions per element on far tiles, 25.2 on band tiles; dK/dV 17.0 -> 15.2 far, 17.0
#   band; both kernels keep 2 programs per SM; BENCHMARKS.md, "Far loops"), but with the dropout bit mask
#   the dK/dV kernel keeps one loop (`dkdv_far_loops`);
# - "all": the forward too (16.5 -> 13.1 far, 14.8 band, but 159 registers instead of 128: 3 programs
#   per SM instead of 4; padded, 16.1 far and 17.8 band against 17.3, 2 programs instead of 3).
# Measured on the H200 (2026-11-26, B16 H12 T=S=1024 D64 bf16, fwd+bwd; `bench_attention.py`'s row
# triton-far then, triton now, against the one-loop row, triton-one-loop now): "backward" 1.575 ms
# against 1.934, 2.232 against 2.586 at dropout 0.1, padded 2.380 against 2.511 (GPU time in a CUDA
# graph 1.13 against 1.34), hence the default. "all" (the forward's far loop) is not measured yet. At 512
# tokens the T5-base step (H200, 2026-11-27, eager, B32 x 512/128) was faster with one loop: 71.6 ms
# against 76.9 at dropout 0, 81.0 against 83.8 at 0.1; hence `far_loops_pay`'s length rule.
# Under torch.compile the length rule is a guard: calls past 4 (M + tile) are a class of graphs of their
# own (one more graph per layer class or class pair, `AstT5Model`'s docstring).
# With the fused backward (`BACKWARD`) the default is "none": with the far loops its dK/dV kernel spilled
# (BENCHMARKS.md, "Far loops"), and it was measured with one loop (bench_attention's triton-fused row).
DROPOUT_MASKS = ("bits", "philox")
# Where the attention kernels get the dropout keep mask: "bits", drawn once per call by `_dropout_bits_kernel`
# into a bit per element (B H T S / 8 bytes, kept for the backward: 12.6 MB per layer at B32 H12 T=S=512) that
# the forward, dK/dV and dQ kernels load (a byte per 8 elements); "philox", each of the three draws it itself
# (`_keep`), keeping nothing.
DROPOUT_MASK = os.environ.get("AST_T5_TRITON_DROPOUT_MASK", "philox")
# the forward's register cap when it reads the dropout bits on 4-warp programs: 3 programs per SM (3 x 128
# threads x 168 <= 64 K registers). Uncapped, the padded forward took 176 (Triton 3.6, sm90, 64 x 64 tiles),
# 2 programs per SM against Philox's 3; capped, 168 and no spill there (16 bytes under Triton 3.9)
BITS_FORWARD_MAXNREG = 168


def forward_maxnreg(warps: int, dropout_bits: bool) -> Optional[int]:
    """The forward kernel's ``maxnreg`` launch option (`BITS_FORWARD_MAXNREG`), or None (Triton's own).
    Eager calls only: under torch.compile the forward launches without it (`_TritonRPEAttention`)."""
    return BITS_FORWARD_MAXNREG if dropout_bits and warps == 4 else None
FAR_LOOPS_CHOICES = ("none", "backward", "all")
# (the default: "backward", or "none" where AST_T5_TRITON_BACKWARD selects the fused backward, which was
# measured with one loop and spills with the far loops)
FAR_LOOPS = os.environ.get("AST_T5_TRITON_FAR_LOOPS", "none" if BACKWARD == "fused" else "backward")


BIAS_LAYOUTS = ("rows", "tiles")
# How the kernels read the bias of a tile that crosses the band (BIAS_LAYOUTS; AST_T5_TRITON_BIAS_LAYOUT):
# - "rows" (the default): gathered per element from one fp32 row per head holding every distance of the call
#   (`_bias_rows`, `_tile_bias`): 4-byte copies, each through L1, staged into shared memory and read back;
# - "tiles": read whole from the head's bias tiles (`_bias_tiles`, `_tiled_bias`): a tile's bias depends only
#   on its first key minus its first query, so a head has 2 (M + tile) / tile + 1 distinct tiles (7 at 64 x 64
#   and M = 128), built once per stack (16 KB each, in fp32), copied 16 bytes at a time, bypassing L1.
# Why: on the H200 (2026-11-26) the forward took 2.6x the bias-free yardstick at the same tiles and dK/dV 1.8x,
# where their loops run 1.3x its instructions; the bytes a 64 x 64 tile moves through shared memory and L1
# (the forward's K and V 32 KB, the gathered bias 48 KB or more) give about those ratios, and whole tiles
# move 32 KB of bias (BENCHMARKS.md, "The bias as whole tiles"). Not the default until a GPU measures it
# (bench_attention's triton-tiles row). Tiles in fp16 (half the bytes again) made ptxas serialize the
# forward's and dK/dV's matrix products under Triton 3.6, the GPU host's: not offered.
BIAS_LAYOUT = os.environ.get("AST_T5_TRITON_BIAS_LAYOUT", "rows")


def dkdv_far_loops(far_loops: bool, dropout_bits: bool) -> bool:
    """Whether the dK/dV kernel walks its far tiles in a loop of their own (`FAR_LOOPS`, where the
    call takes them): not when it reads the dropout bit mask (`DROPOUT_MASK`). Those two together
    made ptxas serialize that kernel's matrix products under Triton 3.6, the GPU host's (C7515, "non
    wgmma instructions defining accumulator registers of a wgmma between start and end of the
    pipeline stage": `compile_triton_rpe.py --far-loops backward --dropout-mask bits`, 2026-11-26),
    for about 2 instructions per element saved on its far tiles; the dQ kernel and the forward keep
    their far loops."""
    return far_loops and not dropout_bits


FAR_LOOPS_MIN_LENGTH = 4  # `far_loops_pay`: far loops on calls longer than this many (M + the largest tile)


def far_loops_pay(T: int, S: int, M: int, blocks: tuple, min_length: Optional[int] = None) -> bool:
    """Whether `FAR_LOOPS` walks a call's tiles in a far and a band loop: when both axes are longer
    than `FAR_LOOPS_MIN_LENGTH` (M + the largest tile), 768 tokens at M = 128 and 64-token tiles.
    Past 2 (M + tile) every program has far tiles (each loop runs at least one, `_far_walk`; T5's
    decoder lengths, T <= M, have none), but measured on an H200 the far loops lost at 512 tokens
    (the T5-base step, whose programs have 3-5 far tiles of 8, split in two spans: 7% slower at
    dropout 0, 3% at 0.1) and won at 1024 (11-16 of 16: the attention call 19% faster); the rule
    keeps them to calls as long as the winning one's majority of far tiles (BENCHMARKS.md, "Far
    loops"). ``min_length``: that multiple instead (benchmarks pinning the far loops: 2)."""
    reach = (FAR_LOOPS_MIN_LENGTH if min_length is None else min_length) * (M + max(blocks[:3]))
    return T > reach and S > reach
_FALLBACKS_LOGGED = set()


def fused_backward_unfit(device: torch.device, head_dim: int) -> Optional[str]:
    """None where the fused backward was built to run (sm90 at head size <= 64, the T5 models'
    shape, and Triton's interpreter), else why not: compiled for sm80 and sm86, or at head size
    128, its dQ product on 8 warps of 16- or 32-query steps computes the same rows on several
    warps (up to 4x the element-wise work: `compile_triton_rpe.py --backward fused`, ``dup``), and
    at sm90 head size 128 with causality ptxas serializes its matrix products. There the split
    backward runs instead, with a one-time warning."""
    if device.type != "cuda":
        return None
    capability = _capability(device)
    if 90 <= capability < 100 and head_dim <= 64:
        return None
    return (f"the fused backward is built for sm90 at head size <= 64, not sm{capability} at head size "
            f"{head_dim}: running the split backward")


def default_blocks(head_dim: int, device: torch.device, capability: Optional[int] = None,
                   dropout: bool = False, dtype: Optional[torch.dtype] = None) -> tuple:
    """(fwd BLOCK_M, fwd BLOCK_N, bwd BLOCK, num_warps, num_stages, bwd num_warps, bwd STEP, bwd
    num_stages) (`resolve_blocks`) for a call of head size ``head_dim``, with attention dropout
    or not, on q's ``dtype`` (None: half precision).

    fp32 on a GPU (IEEE fp32 products: no tensor-core instruction takes them, so each product is
    fused multiply-adds in registers): 32 x 32 tiles on 4 warps, 2 stages, and a 16-row backward at
    head size > 64, on every GPU. The half-precision tiles spilled up to 13.6 KB per thread there
    (sm90 D 64 dK/dV with dropout under Triton 3.6, `compile_triton_rpe.py --dtype fp32`), and took
    3-4x longer to compile; these spill 0-16 bytes (D <= 64) and 0-8 (D 128) on sm80, sm86 and sm90.
    `auto` never sends fp32 to this backend: only ``attention_backend=triton`` does, and the GPU tests.

    sm90 (H100, H200) at head size <= 64, the T5 and AST-T5 models' 64: **measured**. 64 x 64
    tiles on one warpgroup (4 warps) and 2 pipeline stages in all three kernels, with and without
    dropout. In gpu_check's tile sweep on an H200 (2026-11-25, padded, B16 H12 D64 bf16,
    BENCHMARKS.md) they were 2-12% faster than the 8-warp, 128-row tiles that were the default at
    each of the six conditions (2.28 against 2.47 ms at T=S=1024, 5.28 against 5.93 at 2048, 1.58
    against 1.74 at 512, dropout 0; 2.92, 6.67, 1.61 against 3.01, 7.58, 1.65 at 0.1), and the
    fastest of the six candidates summed over them (20.3 ms; the next, a 128 x 32 forward on 8
    warps with the 128-row backward, 20.5; the default 22.4). The likely reason is occupancy
    (`benchmarks/compile_triton_rpe.py`'s ``occ`` column): these tiles need few enough registers
    and little enough shared memory for 3 forward and 2 backward programs to share an SM, where
    the 128-row tiles fit one, so one program's exponentials and loads can overlap another's
    matrix products; the runner-up's forward fits 2. But the same 4-warp backward at 3 stages
    beside the old forward was slower than the old default, so which kernel gained is owed to
    the split timing of the next sweep (`bench_attention.py --split`). Every figure of that sweep
    also ran the dQ kernel with its matrix products serialized by ptxas (fixed the next day), so
    the backward's ranking is to be measured again. With dropout the backward spills 8-16 bytes at
    these tiles (Triton 3.6; 40-104 under 3.9) and was faster anyway.

    Elsewhere, not measured yet, for every mask variant: the largest tiles that spill no
    registers, fit the GPU's shared memory and, on sm90, use Hopper's wgmma instruction
    (`benchmarks/compile_triton_rpe.py` compiles the kernels as the JIT specializes them,
    without a GPU; Triton 3.6, the GPU host's, and 3.9). The backward gives each program 128 rows
    on 8 warps, walking the other axis 32 at a time (sm80 spills at 64); at head size 128 sm80
    keeps square 32 x 32 tiles (128 rows spill there). GPUs with about 100 KB of shared memory per
    block (sm86, sm89, sm120) pipeline 2 stages, not 3: the forward's staged K, V and bias tiles
    need 128 KB at 3; with dropout their backward walks 16 at a time (dQ spills at 32 with
    causality under Triton 3.6). `scripts/gpu_check.sh`'s triton_tiles step times candidates
    against the default. On CPU (the interpreter): moderate tiles, few programs.
    """
    if device.type != "cuda":
        return 32, 32, 32, 4, DEFAULT_STAGES, 4, 32, DEFAULT_STAGES
    if dtype == torch.float32:
        backward = 32 if head_dim <= 64 else 16
        return 32, 32, backward, 4, 2, 4, backward, 2
    if capability is None:
        capability = _capability(device)
    hopper = 90 <= capability < 100
    if hopper and head_dim <= 64:
        return 64, 64, 64, 4, 2, 4, 64, 2
    stages = DEFAULT_STAGES if capability in (80, 87) or 90 <= capability < 120 else 2
    if head_dim <= 64:
        step = 16 if dropout and stages == 2 else 32
        forward, backward = (128, 64), (128, step)
    elif head_dim <= 128:
        forward, backward = (128, 32), (128, 32) if hopper else (32, 32)
    else:
        forward, backward = (32, 32), (16, 16)
    return forward + (backward[0], 8, stages, 8, backward[1], stages)


def resolve_blocks(blocks) -> tuple:
    """(fwd BLOCK_M, fwd BLOCK_N, bwd BLOCK, num_warps[, num_stages[, backward num_warps[, bwd
    STEP[, backward num_stages]]]]) as the 8 integers the kernels take, checked. Stages default
    to `DEFAULT_STAGES`, the backward's warps to ``num_warps``, STEP to BLOCK, the backward's
    stages to ``num_stages``. The backward kernels give each program BLOCK rows (dK/dV: keys; dQ:
    queries) and walk the other axis STEP at a time, so their tiles are BLOCK x STEP. Every block
    is a power of two >= 16 (``tl.dot``, and the dropout mask's 16 x 16 groups), and STEP <= BLOCK
    (dQ's table gradient takes tiles of whole STEP-wide diagonals)."""
    blocks = tuple(int(b) for b in blocks)
    if len(blocks) == 4:
        blocks += (DEFAULT_STAGES,)
    if len(blocks) == 5:
        blocks += (blocks[3],)
    if len(blocks) == 6:
        blocks += (blocks[2],)
    if len(blocks) == 7:
        blocks += (blocks[4],)
    if len(blocks) != 8 or min(blocks) < 1:
        raise ValueError(f"tiles must be (fwd BLOCK_M, fwd BLOCK_N, bwd BLOCK, num_warps[, num_stages[, "
                         f"backward num_warps[, bwd STEP[, backward num_stages]]]]), positive, got {blocks}")
    sizes = blocks[:3] + blocks[6:7]
    if any(b < 16 or b & (b - 1) for b in sizes):
        raise ValueError(f"the blocks must be powers of two >= 16 (tl.dot, dropout groups), got {sizes}")
    if blocks[6] > blocks[2]:
        raise ValueError(f"the backward's STEP ({blocks[6]}) must not exceed its BLOCK ({blocks[2]})")
    return blocks


def _band_layout(M: int, block: int, step: int) -> dict:
    """The dQ kernel's ALIGNED and ROWS (`_table_grad_tile`): with M a multiple of its key step,
    the band's distances accumulate in a (ROWS, step) tile, ROWS covering 2 (M + block) / step
    rows (a power of two); otherwise in a vector through gathers (ROWS unused, 1)."""
    aligned = M % step == 0
    return dict(ALIGNED=aligned, ROWS=_next_pow2(2 * (M + block) // step) if aligned else 1)


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "ieee"  # true fp32 dots, not TF32
    if dtype == torch.bfloat16 and INTERPRETED:
        return "upcast"
    return "tf32"  # ignored for fp16/bf16 operands


def _as_kernel_input(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _bias_rows(per_distance: torch.Tensor, T: int, S: int, pad: int) -> tuple:
    """The bias the kernels read (`_tile_bias`): per head, one fp32 row in log2 units holding every
    distance d = key - query of the call, unclamped: entry OFF + d = log2(e) per_distance[h,
    clamp(d, -M, M) + M] for -OFF <= d < max(S + pad, M + 1), OFF the first odd number >= max(T - 1 +
    pad, M) (odd: see the comment in the body). ``pad`` (the
    largest block) covers the overhang of partial tiles, whose loads are not masked. The kernels
    then gather without a clamp: each element's address is one wide multiply-add from its row's
    pointer, where a clamped index into the 2 M + 1 distances took a subtraction, two min/max
    and two address instructions (about 4.5 SASS instructions per element fewer in each kernel:
    BENCHMARKS.md). Entries OFF - M and OFF + M always exist: the clamped ends, which the far
    tiles of `FAR_LOOPS` add as scalars. (H, T + S - 1 + 2 pad) floats, one more where that makes
    OFF odd (more if T or S is under M), about 0.2 MB at H12 T=S=2048, built from the (H, 2 M + 1)
    table in two or three launches
    (the table scaled, then its end entries repeated outwards: a replicate pad), once per stack
    (`SharedInputs`)."""
    M = (per_distance.size(1) - 1) // 2
    # -M and M included: `FAR_LOOPS` reads them. OFF is odd: Triton's alignment analysis (3.6, 3.9) takes
    # OFF - arange (a tile's row starts) to be as divisible as OFF and the arange's first element together,
    # though only that first entry is, so with OFF and the row length multiples of 16 (T != S of different
    # parities could give both) it loaded each tile row's bias 16 bytes at a time from addresses aligned to
    # 4: a misaligned-address fault on a GPU (`benchmarks/compile_triton_rpe.py --keys`; until 2026-11-26).
    # An odd OFF is never marked divisible at launch, so every analysis of a row start stays at 4 bytes.
    before, after = max(T - 1 + pad, M) | 1, max(S + pad, M + 1)
    scaled = per_distance.detach().to(torch.float32) * LOG2E
    rows = torch.nn.functional.pad(scaled[None], (before - M, after - M - 1), mode="replicate")[0]
    return rows, before


def bias_tile_range(M: int, q_block: int, k_block: int) -> tuple:
    """(step, lo, hi) of a head's bias tiles of ``q_block`` queries x ``k_block`` keys (`_bias_tiles`):
    tile n (0 <= n <= hi - lo) is the bias of a tile whose first key minus first query is (lo + n) step,
    step the smaller block (the larger is a multiple of it: both are powers of two). Tile 0's distances all
    clamp to -M, tile hi - lo's to M, and so does every tile beyond (the kernels clamp the index:
    `_tiled_bias`, which computes the same three numbers)."""
    step = min(q_block, k_block)
    if max(q_block, k_block) % step:
        raise ValueError(f"bias tiles need one block to divide the other, got {q_block} x {k_block}")
    return step, -((M + k_block - 1 + step - 1) // step), (M + q_block - 1 + step - 1) // step


_TILE_DISTANCES = {}  # (M, q_block, k_block, keys_major, device) -> the tiles' clamped distances + M


def _tile_distances(M: int, q_block: int, k_block: int, keys_major: bool, device: torch.device) -> torch.Tensor:
    """(tiles, rows, columns) int64 index into a (2 M + 1) per-distance vector of each element of the bias
    tiles (`_bias_tiles`), made once per shape and device (not under torch.compile: there it is part of the
    graph)."""
    def make():
        step, lo, hi = bias_tile_range(M, q_block, k_block)
        first = torch.arange(lo, hi + 1, device=device) * step
        dist = first[:, None, None] + torch.arange(k_block, device=device)[None, None, :] \
            - torch.arange(q_block, device=device)[None, :, None]  # (tiles, queries, keys)
        index = dist.clamp(-M, M) + M
        return index.transpose(1, 2).contiguous() if keys_major else index

    if torch.compiler.is_compiling():
        return make()
    key = (M, q_block, k_block, keys_major, device)
    if key not in _TILE_DISTANCES:
        with torch.inference_mode(False):  # made under inference_mode, it could not index a later training call
            _TILE_DISTANCES[key] = make()
    return _TILE_DISTANCES[key]


def _bias_tiles(per_distance: torch.Tensor, q_block: int, k_block: int, keys_major: bool) -> torch.Tensor:
    """The bias of every tile of ``q_block`` queries x ``k_block`` keys that the kernels read whole
    (`BIAS_LAYOUT` "tiles", `_tiled_bias`): (H, tiles x q_block x k_block) in log2 units, tile n the one
    whose first key minus first query is (lo + n) step (`bias_tile_range`), each tile row-major over
    (queries, keys), or over (keys, queries) with ``keys_major`` (the dK/dV kernel's transposed tiles),
    fp32. 7 tiles per head at 64 x 64 and M = 128: 1.3 MB for 12 heads (as much again for the dK/dV
    kernel's keys-major tiles), one gather launch, once per stack (`SharedInputs`)."""
    M = (per_distance.size(1) - 1) // 2
    index = _tile_distances(M, q_block, k_block, keys_major, per_distance.device)
    scaled = per_distance.detach().to(torch.float32) * LOG2E
    return scaled[:, index.reshape(-1)]


def _padding_counts(key_padding: torch.Tensor) -> tuple:
    """From the (B, S) uint8 padding mask, on the device (no host sync): (B,) int32 one past each
    row's last unpadded key (0 where every key is padding), and (B, S + 1) int32 running counts of
    padded keys (entry j: among keys 0 .. j - 1).

    The kernels visit no key tile past the first: with right padding (how batches are padded),
    the padded tail costs nothing, as block masks spare FlexAttention. The counts tell a tile of
    unpadded keys in two scalar loads (`_any_padded`): such a tile skips its mask. Padding
    elsewhere in a row (left padding, holes) is masked as before."""
    S = key_padding.size(1)
    position = torch.arange(1, S + 1, dtype=torch.int32, device=key_padding.device)
    keys_end = torch.where(key_padding == 0, position, 0).amax(1).to(torch.int32)
    counts = torch.nn.functional.pad(key_padding.cumsum(1, dtype=torch.int32), (1, 0))
    return keys_end, counts


def _padding_inputs(key_padding_mask: torch.Tensor, device: torch.device) -> tuple:
    """The kernels' padding inputs: the (B, S) mask as uint8, and `_padding_counts`."""
    kpm = key_padding_mask.to(device=device, dtype=torch.uint8).contiguous()
    return (kpm, *_padding_counts(kpm))


def _draw_seed(device: torch.device) -> torch.Tensor:
    """One int64 Philox seed from PyTorch's default generator of ``device`` (no host sync)."""
    return torch.randint(0, 2 ** 62, (1,), dtype=torch.int64, device=device)


_PLACEHOLDERS = {}  # (device, dtype) -> a one-element tensor


def _placeholder(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A one-element tensor for a pointer argument the kernel compiles out (no padding mask, no
    dropout seed, no table gradient), made once per device and dtype, not once per call."""
    if torch.compiler.is_compiling():
        return torch.zeros(1, dtype=dtype, device=device)
    key = (device, dtype)
    if key not in _PLACEHOLDERS:
        with torch.inference_mode(False):  # made under inference_mode, autograd could not save it later
            _PLACEHOLDERS[key] = torch.zeros(1, dtype=dtype, device=device)
    return _PLACEHOLDERS[key]


class SharedInputs:
    """What the kernels read that every layer of a stack shares, built by the first layer's call
    and reused by the others: the key padding mask as uint8 with its counts (`_padding_counts`), and
    the bias rows (`_bias_rows`) of the stack's per-distance table. `attention_backends.FoldedBias`
    holds one per stack, outside torch.compile (`FoldedBias.triton_inputs`); a call of
    `triton_rpe_attention` without one builds them for itself. Built per call, these are about a
    dozen small launches, which on a GPU cost host time more than GPU time (the benchmark's ``host
    ms``). Under torch.compile nothing is kept: each call builds its own, and inductor fuses those
    operations into its graph."""

    def __init__(self, key_padding_mask: Optional[torch.Tensor] = None):
        self.key_padding_mask = key_padding_mask  # (B, S), True (nonzero) at padded keys
        self._padding = None
        self._rows = None  # (per_distance, its version, (T, S, pad), rows, offset)
        self._tiles = None  # (per_distance, its version, tiles' shapes, bias tiles)

    def padding(self, device: torch.device) -> Optional[tuple]:
        """None without a mask; else the (B, S) uint8 mask, (B,) keys end and (B, S + 1) counts."""
        if self.key_padding_mask is None:
            return None
        if self._padding is not None:
            return self._padding
        padding = _padding_inputs(self.key_padding_mask, device)
        if not torch.compiler.is_compiling():
            self._padding = padding
        return padding

    def bias_rows(self, per_distance: torch.Tensor, T: int, S: int, pad: int) -> tuple:
        """`_bias_rows`, kept while the layers pass the same table, unchanged, at the same shape."""
        if torch.compiler.is_compiling():  # nothing kept (class docstring)
            return _bias_rows(per_distance, T, S, pad)
        kept = self._rows
        version = tensor_version(per_distance)
        if kept is not None and kept[0] is per_distance and version is not None and kept[1] == version \
                and kept[2] == (T, S, pad):
            return kept[3], kept[4]
        rows, offset = _bias_rows(per_distance, T, S, pad)
        if version is not None:
            self._rows = (per_distance, version, (T, S, pad), rows, offset)
        return rows, offset

    def bias_tiles(self, per_distance: torch.Tensor, blocks: tuple) -> tuple:
        """`_call_bias_tiles`, kept while the layers pass the same table, unchanged, with the same tiles."""
        if torch.compiler.is_compiling():  # nothing kept (class docstring)
            return _call_bias_tiles(per_distance, blocks)
        kept = self._tiles
        version = tensor_version(per_distance)
        key = tuple(blocks)
        if kept is not None and kept[0] is per_distance and version is not None and kept[1] == version \
                and kept[2] == key:
            return kept[3]
        tiles = _call_bias_tiles(per_distance, blocks)
        if version is not None:
            self._tiles = (per_distance, version, key, tiles)
        return tiles


def _call_bias_tiles(per_distance: torch.Tensor, blocks: tuple) -> tuple:
    """The three kernels' bias tiles (`_bias_tiles`) for tiles ``blocks``: (forward's, dQ kernel's, dK/dV
    kernel's keys-major ones); the dQ kernel shares the forward's where their tiles are the same."""
    block_m, block_n, block_bwd, _, _, _, step_bwd, _ = blocks
    fwd = _bias_tiles(per_distance, block_m, block_n, False)
    dq = fwd if (block_m, block_n) == (block_bwd, step_bwd) else _bias_tiles(per_distance, block_bwd, step_bwd, False)
    return fwd, dq, _bias_tiles(per_distance, step_bwd, block_bwd, True)


def _time_major(B: int, H: int, T: int, D: int, dtype, device):
    """An empty flat buffer for a (B, H, T, D) tensor in (B, T, H, D) memory, and that tensor's three
    leading strides: a kernel writes into the buffer with those strides, and `_heads_view` is the
    tensor afterwards. Under torch.compile inductor copied a written tensor of permuted strides (even
    an ``empty_strided`` of its own) into a new buffer before each launch: its reinplacing declined it
    (an uninitialized copy, as large as the output, per call); a flat buffer it reinplaces."""
    return torch.empty(B * T * H * D, dtype=dtype, device=device), (T * H * D, D, H * D)


def _heads_view(flat: torch.Tensor, B: int, H: int, T: int, D: int) -> torch.Tensor:
    """The (B, H, T, D) view of a `_time_major` buffer."""
    return flat.view(B, T, H, D).transpose(1, 2)


def _gradient_layout(n_packed: int, B: int, H: int, T: int, S: int, D: int, dtype, device):
    """The one flat buffer the dK/dV kernel writes dK and dV into (its DKV), laid out as the gradient the
    caller's autograd wants: (the buffer, the (b, h, t) strides of dK and dV in it, dK's element offset,
    dV's). ``n_packed`` 3: the (B, T, 3, H, D) gradient of a packed self-attention projection, whose
    slot 0 the dQ kernel fills with the same strides; 2: the (B, S, 2, H, D) gradient of a packed key and
    value projection (cross-attention); 0: dK then dV, each a contiguous (B, H, S, D). One tensor passed
    whole, not views of it: under torch.compile inductor functionalizes what a user kernel writes, and a
    flat buffer written by two launches it reinplaces (a view written through is where torch has had
    silent-correctness bugs: pytorch issue 192510, PR 184050), so compiled graphs get the packed gradient
    too, with no stack or copy after the kernels."""
    if n_packed == 3:
        flat = torch.empty(B * T * 3 * H * D, dtype=dtype, device=device)
        return flat, (T * 3 * H * D, D, 3 * H * D), H * D, 2 * H * D
    if n_packed == 2:
        flat = torch.empty(B * S * 2 * H * D, dtype=dtype, device=device)
        return flat, (S * 2 * H * D, D, 2 * H * D), 0, H * D
    flat = torch.empty(2 * B * H * S * D, dtype=dtype, device=device)
    return flat, (H * S * D, S * D, D), 0, B * H * S * D


class _TritonRPEAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, packed, per_distance, pd, pd_dq, pd_dkdv, pd_off, kpm, kv_end, pad_count, causal,
                dropout_p, scale, blocks):
        # pd, pd_off: `_bias_rows`, or with pd_off None the forward's bias tiles and pd_dq, pd_dkdv the dQ and
        # dK/dV kernels' (`_call_bias_tiles`); None where a kernel reads pd (dynamo refuses an autograd.Function
        # given one tensor as two inputs);
        # kpm, kv_end, pad_count: `_padding_inputs`, or None without padding;
        # packed: None, or the (B, T, 3, H, D) projection that q, k, v are read from (then None), or the
        # (B, S, 2, H, D) one that k and v are read from (then None; q given);
        # per_distance None: bias-free (pd a placeholder, never read; M only sizes unused constants)
        ctx.n_packed = 0 if packed is None else packed.size(2)
        if ctx.n_packed == 3:
            q, k, v = unpack_qkv(packed)
        elif ctx.n_packed == 2:
            k, v = unpack_qkv(packed)
        B, H, T, D = q.shape
        S = k.size(2)
        has_bias = per_distance is not None
        M = (per_distance.size(1) - 1) // 2 if has_bias else 1
        q, k, v = _as_kernel_input(q), _as_kernel_input(k), _as_kernel_input(v)
        has_kpm = kpm is not None
        if not has_kpm:
            kpm = _placeholder(q.device, torch.uint8)
            kv_end = pad_count = _placeholder(q.device, torch.int32)
        seed = _draw_seed(q.device) if dropout_p > 0 else _placeholder(q.device, torch.int64)
        bits = dropout_p > 0 and DROPOUT_MASK == "bits"
        if bits:  # the keep mask, drawn once for the forward and the backward: a bit per element
            n_calls = B * H * triton.cdiv(T, 16) * triton.cdiv(S, 16) * 32  # a byte per Philox call (`_keep`)
            dmask = torch.empty(n_calls, dtype=torch.uint8, device=q.device)
            _dropout_bits_kernel[(triton.cdiv(n_calls, 1024),)](seed, dmask, n_calls, float(dropout_p), BLOCK=1024)
        else:
            dmask = _placeholder(q.device, torch.uint8)
        block_m, block_n, _, warps, stages, _, _, _ = blocks
        # not under torch.compile: dynamo hands a user kernel's launch options over to inductor by name, and
        # maxnreg is not among those it knows (torch 2.11-2.13), so there it could reach the kernel as an argument
        maxnreg = None if torch.compiler.is_compiling() else forward_maxnreg(warps, bits)
        far_loops = has_bias and FAR_LOOPS != "none" and far_loops_pay(T, S, M, blocks)
        tiles = has_bias and pd_off is None
        pd_off = 0 if pd_off is None else pd_off
        # O in (B, T, H, D) memory, seen as (B, H, T, D): the caller's merge of the heads
        # (out.transpose(1, 2).reshape(B, T, H * D)) is then a view, not a copy
        o_flat, o_strides = _time_major(B, H, T, D, q.dtype, q.device)
        lse = torch.empty(B * H, T, dtype=torch.float32, device=q.device)
        precision = _precision(q.dtype)
        _fwd_kernel[(triton.cdiv(T, block_m), B * H)](
            q, k, v, pd, kpm, kv_end, pad_count, seed, dmask, o_flat, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), *o_strides,
            H, T, S, D, pd.size(-1), pd_off, float(scale), float(dropout_p),
            M=M, HAS_KPM=has_kpm, CAUSAL=bool(causal), DROPOUT=dropout_p > 0,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, _next_pow2(D)), PRECISION=precision,
            FAR_LOOPS=far_loops and FAR_LOOPS == "all", DROPOUT_BITS=bits, HAS_BIAS=has_bias, BIAS_TILES=tiles,
            num_warps=warps, num_stages=stages, **({} if maxnreg is None else dict(maxnreg=maxnreg)))
        o = _heads_view(o_flat, B, H, T, D)
        ctx.save_for_backward(q, k, v, pd, pd_dq, pd_dkdv, kpm, kv_end, pad_count, seed, dmask, o, lse)
        ctx.dropout_bits = bits
        ctx.far_loops = far_loops  # read at the forward, as the table of the call it belongs to
        ctx.meta = (has_kpm, bool(causal), float(dropout_p), float(scale), blocks,
                    per_distance.dtype if has_bias else None, M, pd_off, has_bias, tiles)
        return o_flat.view(B, T, H, D)  # (B, T, H, D): `triton_rpe_attention` returns its heads' view

    @staticmethod
    def backward(ctx, grad_out):  # grad_out: (B, T, H, D), as the forward's output
        q, k, v, pd, pd_dq, pd_dkdv, kpm, kv_end, pad_count, seed, dmask, o, lse = ctx.saved_tensors
        grad_out = grad_out.transpose(1, 2)
        pd_dq = pd if pd_dq is None else pd_dq
        pd_dkdv = pd if pd_dkdv is None else pd_dkdv
        has_kpm, causal, dropout_p, scale, blocks, table_dtype, M, pd_off, has_bias, tiles = ctx.meta
        B, H, T, D = q.shape
        S = k.size(2)
        _, _, block_bwd, _, _, warps, step_bwd, stages = blocks
        do = _as_kernel_input(grad_out)
        # packed: the gradients in one tensor shaped as the projection, no stack of them after
        grads, g_strides, dk_off, dv_off = _gradient_layout(ctx.n_packed, B, H, T, S, D, q.dtype, q.device)
        table_grad = ctx.needs_input_grad[4]  # per_distance
        why = fused_backward_unfit(q.device, D) if BACKWARD == "fused" else None
        fused = BACKWARD == "fused" and why is None
        if why is not None:
            if why not in _FALLBACKS_LOGGED:
                _FALLBACKS_LOGGED.add(why)
                logging.getLogger(__name__).warning("triton attention: %s", why)
        n_blocks = triton.cdiv(T, block_bwd)  # programs of the dQ kernel, which reduces the table gradient
        n_key_blocks = triton.cdiv(S, block_bwd)  # programs of the dK/dV kernel
        unused = _placeholder(q.device, torch.float32)
        # the table gradient's partial sums, one row per dQ program: (n_blocks B, H, 2 M + 1), summed over the
        # first axis. A dimension of n_blocks alone (this was (B H, n_blocks, .), viewed as (B, H, n_blocks, .))
        # made torch.compile specialize the graph on n_blocks == 1, targets of at most one tile, or not: a
        # second graph at the first longer target. n_blocks B is never 1 for a batch size marked dynamic (>= 2).
        dtab = torch.empty(n_blocks * B, H, 2 * M + 1, dtype=torch.float32, device=q.device) if table_grad \
            else unused
        if fused:  # dQ accumulated in fp32 by the dK/dV kernel's atomic adds; the far tiles' table sums there too
            # padded to whole tiles, so that the kernel's adds need no mask
            dq_acc = torch.zeros(B, H, triton.cdiv(T, step_bwd) * step_bwd, max(16, _next_pow2(D)),
                                 dtype=torch.float32, device=q.device)
            far = torch.empty(n_key_blocks * B, H, 2, dtype=torch.float32, device=q.device) if table_grad \
                else unused
            delta = (do.float() * o.float()).sum(-1).reshape(B * H, T)  # the dK/dV kernel runs first
        else:  # dQ into the packed gradient's slot 0, else laid out as O
            dq_flat, dq_strides = (grads, g_strides) if ctx.n_packed == 3 else _time_major(B, H, T, D, q.dtype,
                                                                                           q.device)
            dq_acc = far = unused
            delta = torch.empty(B * H, T, dtype=torch.float32, device=q.device)  # written by the dQ kernel
        precision = _precision(q.dtype)
        common = dict(M=M, HAS_KPM=has_kpm, CAUSAL=causal, DROPOUT=dropout_p > 0,
                      BLOCK_D=max(16, _next_pow2(D)), PRECISION=precision, FAR_LOOPS=ctx.far_loops,
                      DROPOUT_BITS=ctx.dropout_bits, HAS_BIAS=has_bias, BIAS_TILES=tiles, num_warps=warps,
                      num_stages=stages)
        strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
        acc_strides = dq_acc.stride()[:3] if fused else (0, 0, 0)

        # every launch names every kernel argument, defaulted ones too: under torch.compile, inductor's
        # analysis of what a user kernel writes refuses a launch missing one (then it clones every tensor
        # argument and compiles that constexpr as None; test_every_launch_names_every_kernel_argument)
        def dq_kernel():  # dQ and the table gradient (fused: the band's table gradient alone)
            _bwd_dq_kernel[(n_blocks, B * H)](
                q, k, v, pd_dq, kpm, kv_end, pad_count, seed, dmask, do, o, lse, delta, unused if fused else dq_flat,
                dtab, *strides, *(acc_strides if fused else dq_strides), *o.stride()[:3],
                H, T, S, D, pd_dq.size(-1), pd_off, scale, dropout_p, TAB=_next_pow2(2 * M + 1), TABLE_GRAD=table_grad,
                **_band_layout(M, block_bwd, step_bwd), BAND_ONLY=fused, DELTA_OUT=not fused,
                BAND_STAGES=stages if fused else None, BAND_WEIGHTS=True,
                BLOCK_M=block_bwd, BLOCK_N=step_bwd, **common)

        dq = None
        if not fused:  # first: it writes delta
            dq_kernel()
            if ctx.n_packed != 3:
                dq = _heads_view(dq_flat, B, H, T, D)
        _bwd_dkdv_kernel[(n_key_blocks, B * H)](
            q, k, v, pd_dkdv, kpm, kv_end, pad_count, seed, dmask, do, lse, delta, grads, dq_acc, far, *strides,
            *g_strides, *acc_strides, dk_off, dv_off, H, T, S, D, pd_dkdv.size(-1), pd_off, scale, dropout_p,
            BLOCK_N=block_bwd, BLOCK_M=step_bwd, FUSE_DQ=fused, FAR_SUMS=fused and table_grad,
            BAND_Q=block_bwd, BAND_K=step_bwd,
            **dict(common, FAR_LOOPS=dkdv_far_loops(ctx.far_loops, ctx.dropout_bits)))
        if fused and table_grad:
            dq_kernel()
        d_table = None
        if table_grad:
            d_table = dtab.sum(0)
            if fused:
                far_sums = far.sum(0)
                d_table[:, 0] += far_sums[:, 0]
                d_table[:, 2 * M] += far_sums[:, 1]
            d_table = d_table.to(table_dtype)
        if fused:
            dq_acc = dq_acc[:, :, :T, :D]
            if scale != 1.0:  # T5 scales nothing
                dq_acc.mul_(scale)
            if ctx.n_packed == 3:  # (eager: compiled, such a call is left unpacked, `triton_rpe_attention`)
                grads.view(B, T, 3, H, D).select(2, 0).copy_(dq_acc.transpose(1, 2))
            else:
                dq = dq_acc.to(q.dtype, memory_format=torch.contiguous_format)
        rest = (d_table, None, None, None, None, None, None, None, None, None, None, None)
        if ctx.n_packed == 3:
            return (None, None, None, grads.view(B, T, 3, H, D), *rest)
        if ctx.n_packed == 2:
            return (dq, None, None, grads.view(B, S, 2, H, D), *rest)
        half = B * H * S * D
        return (dq, grads[:half].view(B, H, S, D), grads[half:].view(B, H, S, D), None, *rest)


def unpack_qkv(packed: torch.Tensor):
    """q, k, v, each (B, H, T, D), as views of a (B, T, 3, H, D) self-attention projection (or k, v
    of a (B, S, 2, H, D) key and value projection)."""
    return packed.permute(2, 0, 3, 1, 4).unbind(0)


def triton_rpe_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, per_distance: Optional[torch.Tensor], *,
                         key_padding_mask: Optional[torch.Tensor] = None, causal: bool = False,
                         dropout_p: float = 0.0, scale: float = 1.0, blocks=None,
                         shared: Optional[SharedInputs] = None,
                         packed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Biased attention on the Triton kernels (module docstring).

    Args:
        q: (B, H, T, D); k, v: (B, H, S, D); fp16/bf16/fp32.
        per_distance: (H, 2 M + 1): bias per head and clamped distance key - query; None for
            bias-free attention (the same kernels with no bias read and no table gradient: what the
            ``triton`` backend runs for bias-free calls with padded keys).
        key_padding_mask: optional (B, S) bool, True at padded keys.
        shared: the inputs the layers of a stack share (`SharedInputs`, holding the stack's padding
            mask: then pass no ``key_padding_mask``); by default built for this call alone.
        causal: keys after the query are masked (T == S).
        dropout_p: attention-probability dropout (0 in eval).
        scale: multiplier of q k^T.
        blocks: (fwd BLOCK_M, fwd BLOCK_N, bwd BLOCK, num_warps[, num_stages[, backward
            num_warps[, bwd STEP[, backward num_stages]]]]) (`resolve_blocks`), default
            `default_blocks`.
        packed: self-attention whose q, k, v are ``unpack_qkv(packed)`` of a (B, T, 3, H, D)
            projection: the kernels read them from it, and the backward writes their three
            gradients into one tensor of its shape, which reaches the projection as is (from q, k, v
            autograd would stack the three into a new tensor, and copy that again into the
            projection's layout). Or attention whose k, v are ``unpack_qkv(packed)`` of a
            (B, S, 2, H, D) key and value projection (cross-attention): dK and dV likewise, q apart.
            Eager and under torch.compile alike (`_gradient_layout`), except a packed self-attention
            with the fused backward (`BACKWARD`) under torch.compile, which is left unpacked.
    Returns:
        (B, H, T, D) in q's dtype, in (B, T, H, D) memory (merging the heads is a view).
    """
    if packed is not None and packed.dim() == 5 and packed.size(2) == 3 and BACKWARD == "fused" \
            and torch.compiler.is_compiling():
        # the fused backward converts its fp32 dQ into the packed gradient's slot 0 with an aten copy into a
        # view, which a compiled graph functionalizes into a copy of the whole buffer: no cheaper than the stack
        packed = None
    if packed is not None:
        B, H, T, D = q.shape
        S = k.size(2)
        kinds = {3: (B, T, 3, H, D), 2: (B, S, 2, H, D)}
        n = packed.size(2) if packed.dim() == 5 else 0
        if n not in kinds or packed.shape != kinds[n] or k.shape != v.shape or (n == 3 and k.shape != q.shape):
            raise ValueError(f"packed must be the (B, T, 3, H, D) projection that q, k, v {tuple(q.shape)} are "
                             f"unpacked from, or the (B, S, 2, H, D) one of k, v {tuple(k.shape)}, got "
                             f"{tuple(packed.shape)}")
    reason = unsupported_reason(q, k, v, per_distance)
    if reason is not None:
        raise RuntimeError(f"triton relative-bias attention cannot run: {reason}")
    if causal and q.size(2) != k.size(2):
        raise ValueError(f"causal attention needs as many queries as keys, got {q.size(2)} and {k.size(2)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if FAR_LOOPS not in FAR_LOOPS_CHOICES:
        raise ValueError(f"triton_rpe_attention.FAR_LOOPS (AST_T5_TRITON_FAR_LOOPS) must be one of "
                         f"{FAR_LOOPS_CHOICES}, got {FAR_LOOPS!r}")
    if BACKWARD not in BACKWARDS:
        raise ValueError(f"triton_rpe_attention.BACKWARD (AST_T5_TRITON_BACKWARD) must be one of {BACKWARDS}, "
                         f"got {BACKWARD!r}")
    if DROPOUT_MASK not in DROPOUT_MASKS:
        raise ValueError(f"triton_rpe_attention.DROPOUT_MASK (AST_T5_TRITON_DROPOUT_MASK) must be one of "
                         f"{DROPOUT_MASKS}, got {DROPOUT_MASK!r}")
    if BIAS_LAYOUT not in BIAS_LAYOUTS:
        raise ValueError(f"triton_rpe_attention.BIAS_LAYOUT (AST_T5_TRITON_BIAS_LAYOUT) must be one of "
                         f"{BIAS_LAYOUTS}, got {BIAS_LAYOUT!r}")
    if shared is not None and key_padding_mask is not None:
        raise ValueError("pass the key padding mask in `shared` (SharedInputs) or as key_padding_mask, not both")
    dropout_p = effective_dropout_p(dropout_p)
    blocks = resolve_blocks(blocks or BLOCKS_OVERRIDE or default_blocks(q.size(-1), q.device,
                                                                         dropout=dropout_p > 0, dtype=q.dtype))
    T, S, pad = q.size(2), k.size(2), max(blocks[:3])
    if per_distance is None:
        pd, pd_off = _placeholder(q.device, torch.float32), 0
    elif BIAS_LAYOUT == "tiles":  # the kernels read whole bias tiles; pd_off None says so
        tiles = (_call_bias_tiles(per_distance, blocks) if shared is None
                 else shared.bias_tiles(per_distance, blocks))
        pd, pd_off = tiles, None
    elif shared is None:
        pd, pd_off = _bias_rows(per_distance, T, S, pad)
    else:
        pd, pd_off = shared.bias_rows(per_distance, T, S, pad)
    pd, pd_dq, pd_dkdv = pd if isinstance(pd, tuple) else (pd, None, None)
    pd_dq = None if pd_dq is pd else pd_dq  # (one tensor is not passed as two inputs: `_TritonRPEAttention`)
    if shared is None:
        padding = None if key_padding_mask is None else _padding_inputs(key_padding_mask, q.device)
    else:
        padding = shared.padding(q.device)
    kpm, kv_end, pad_count = (None, None, None) if padding is None else padding
    if packed is not None:  # read from packed (the gradient goes there)
        k = v = None
        if packed.size(2) == 3:
            q = None
    # the Function's output is (B, T, H, D) contiguous, its heads' view made here, outside it: the
    # output's gradient then comes back contiguous (the o projection's backward makes it so), where the
    # (B, H, T, D) view's would not, and dynamo's backward of a Function makes every gradient contiguous
    # (a copy of it per call under torch.compile)
    return _TritonRPEAttention.apply(q, k, v, packed, per_distance, pd, pd_dq, pd_dkdv, pd_off, kpm, kv_end,
                                     pad_count, causal, dropout_p, scale, blocks).transpose(1, 2)


def effective_dropout_p(dropout_p: float) -> float:
    """The dropout rate the kernels apply for ``dropout_p``: the nearest multiple of 2^-16 (they
    compare 16 random bits per element with 65536 p), below 1."""
    return min(round(dropout_p * 65536), 65535) / 65536


def dropout_keep_mask(seed: torch.Tensor, batch: int, heads: int, q_len: int, k_len: int,
                      dropout_p: float) -> torch.Tensor:
    """The (B, H, T, S) bool keep mask the kernels draw from ``seed`` (tests, eager reference)."""
    out = torch.empty(batch, heads, q_len, k_len, dtype=torch.int8, device=seed.device)
    _keep_mask_kernel[(triton.cdiv(q_len, 32), triton.cdiv(k_len, 32), batch * heads)](
        seed, out, q_len, k_len, effective_dropout_p(dropout_p), BLOCK_M=32, BLOCK_N=32)
    return out.bool()


def reference_attention(q, k, v, per_distance, key_padding_mask=None, causal=False, scale=1.0,
                        keep_mask=None, dropout_p=0.0):
    """Eager PyTorch reference (in q's dtype; pass float64 for a tight reference), with the same
    conventions as the kernel: fully masked rows give zeros; ``keep_mask`` (B, H, T, S) applies
    dropout with 1 / (1 - p) scaling."""
    T, S = q.size(2), k.size(2)
    M = (per_distance.size(1) - 1) // 2
    dist = torch.arange(S, device=q.device)[None, :] - torch.arange(T, device=q.device)[:, None]
    bias = per_distance[:, dist.clamp(-M, M) + M].to(q.dtype)  # (H, T, S)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
    masked = torch.zeros(s.shape[-2:], dtype=torch.bool, device=q.device)[None, None]
    if causal:
        masked = masked | torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1)
    if key_padding_mask is not None:
        masked = masked | key_padding_mask[:, None, None, :]
    s = s.masked_fill(masked, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if keep_mask is not None:
        p = p * keep_mask.to(p.dtype) / (1.0 - dropout_p)
    return torch.matmul(p, v)
