"""Tests of the ``triton`` attention backend (ast_t5/modules/triton_rpe_attention.py).

Without CUDA the kernels run under Triton's interpreter. Triton decides that when it and the
kernels are imported (its own ``tl.zeros``, ``tl.rand``... are kernels too), and reads
TRITON_INTERPRET again while they run. So on a host without CUDA this module sets
TRITON_INTERPRET=1 before importing triton, restores the variable, and sets it again around each
of its tests. If triton was already imported in compiled mode by an earlier module, the interpreter
checks run in a fresh pytest process instead (`test_interpreter_checks_in_a_fresh_process`).
With CUDA the compiled kernels run, and the GPU tests check that the interpreter was NOT used and
that the kernel really ran (DISPATCH_COUNTS).
"""
import argparse
import contextlib
import importlib
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
import torch

CUDA = torch.cuda.is_available()
_TRITON_WAS_IMPORTED = "triton" in sys.modules
if not CUDA:
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
try:
    pytest.importorskip("triton", reason="triton is not installed (it is installed on Linux x86_64 only)")
    import triton  # noqa: E402
    import triton.language as tl  # noqa: E402
    from ast_t5.modules import triton_rpe_attention as tra  # noqa: E402

    if not CUDA and not tra.INTERPRETED and not _TRITON_WAS_IMPORTED:
        tra = importlib.reload(tra)  # cannot happen without triton imported first; kept for clarity
finally:
    if not CUDA:
        if _saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _saved

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from ast_t5.modules import attention_backends as ab  # noqa: E402
from ast_t5.modules.relative_position_bias import RelativeBias, RelativePositionBias  # noqa: E402

from ..conftest import load_benchmark, tiny_model_pair  # noqa: E402

# Triton's own language kernels were decorated in interpreter mode: ours can run on CPU here
_INTERPRETER_READY = not CUDA and isinstance(tl.zeros, InterpretedFunction)
if _INTERPRETER_READY and not tra.INTERPRETED:  # our module came before the interpreter: redo it
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        tra = importlib.reload(tra)
    finally:
        if _saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _saved

_skip_without_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (the compiled Triton kernels)")


def requires_cuda(test):
    """GPU test: marked ``cuda`` (scripts/gpu_check.sh runs ``-m cuda``), skipped without CUDA."""
    return pytest.mark.cuda(_skip_without_cuda(test))
_INTERPRETER_PROBLEM = tra.interpreter_problem() if _INTERPRETER_READY else None
cpu_only = pytest.mark.skipif(
    not _INTERPRETER_READY or _INTERPRETER_PROBLEM is not None,
    reason="CUDA host: the GPU tests cover the compiled kernels" if CUDA else _INTERPRETER_PROBLEM or
    "triton was imported in compiled mode before this module: see test_interpreter_checks_in_a_fresh_process")
SMALL = (16, 16, 16, 4)  # blocks for the interpreter: several tiles per row at T ~ 40
RECT = (16, 16, 32, 4, 3, 4, 16)  # the backward on 32 x 16 tiles (BLOCK rows, STEP-wide steps)


@pytest.fixture(params=["split", "fused"])
def backward(request, monkeypatch):
    """Each backward structure (`triton_rpe_attention.BACKWARD`): dK/dV + dQ kernels, or dK/dV with dQ
    by atomic adds + the band kernel for the table gradient."""
    assert request.param in tra.BACKWARDS
    monkeypatch.setattr(tra, "BACKWARD", request.param)
    return request.param


@pytest.fixture(params=["none", "all"], ids=["one-loop", "far-loops"])
def far_loops(request, monkeypatch):
    """Each loop structure of the kernels (`triton_rpe_attention.FAR_LOOPS`): one loop over every tile, or
    two in every kernel (the far tiles before and after the band, then the band), forced on every call
    here (`far_loops_pay` keeps them to long calls), so that the tests' short rows reach every case: empty
    far spans, band spans taken from far tiles, rows of padding alone."""
    assert request.param in tra.FAR_LOOPS_CHOICES
    monkeypatch.setattr(tra, "FAR_LOOPS", request.param)
    monkeypatch.setattr(tra, "far_loops_pay", lambda *shape: True)
    return request.param


@pytest.fixture(params=["philox", "bits"])
def dropout_mask(request, monkeypatch):
    """Each source of the kernels' dropout keep mask (`triton_rpe_attention.DROPOUT_MASK`): Philox in each
    kernel, or the bits `_dropout_bits_kernel` drew once for the call."""
    assert request.param in tra.DROPOUT_MASKS
    monkeypatch.setattr(tra, "DROPOUT_MASK", request.param)
    return request.param


@pytest.fixture(autouse=True)
def _interpreter_env(monkeypatch):
    """Triton reads TRITON_INTERPRET while an interpreted kernel runs, too."""
    if _INTERPRETER_READY:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.skipif(CUDA or _INTERPRETER_READY, reason="the interpreter checks ran in this process"
                    if _INTERPRETER_READY else "CUDA host: the compiled kernels are tested")
def test_interpreter_checks_in_a_fresh_process():
    """triton was imported in compiled mode earlier in this process: run this file's interpreter
    checks in a new pytest process that imports triton under TRITON_INTERPRET=1."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fresh_process" not in proc.stdout.split("short test summary")[-1]  # there they ran in-process


@pytest.mark.skipif(not _INTERPRETER_READY or tuple(map(int, triton.__version__.split(".")[:2])) < (3, 9),
                    reason="needs Triton >= 3.9 (whose interpreter is known to run the kernels) imported "
                           "under the interpreter in this process (else test_interpreter_checks_in_a_fresh_process)")
def test_the_interpreter_probe_does_not_skip_the_checks_where_triton_can_run_them():
    """The probe that skips this file's interpreter checks (Triton 3.6's interpreter cannot run a
    loop bounded by a kernel argument) must not fire with Triton 3.9, which CI installs."""
    assert _INTERPRETER_PROBLEM is None


def test_tile_tuples_take_optional_stages_and_are_checked():
    stages = tra.DEFAULT_STAGES
    assert tra.resolve_blocks((128, 64, 64, 8)) == (128, 64, 64, 8, stages, 8, 64, stages)
    assert tra.resolve_blocks([64, 32, 32, 4, 3]) == (64, 32, 32, 4, 3, 4, 32, 3)
    assert tra.resolve_blocks([128, 64, 64, 8, 3, 4]) == (128, 64, 64, 8, 3, 4, 64, 3)  # backward on 4 warps
    assert tra.resolve_blocks([128, 64, 128, 8, 3, 8, 32]) == (128, 64, 128, 8, 3, 8, 32, 3)  # 128 x 32 backward
    assert tra.resolve_blocks([64, 64, 128, 4, 2, 8, 64, 3]) == (64, 64, 128, 4, 2, 8, 64, 3)  # stages of its own
    cuda = torch.device("cuda")
    # sm90 at head size <= 64: the measured winner, 64 x 64 on one warpgroup, 2 stages, dropout or not
    assert tra.default_blocks(64, cuda, capability=90) == (64, 64, 64, 4, 2, 4, 64, 2)
    assert tra.default_blocks(32, cuda, capability=90, dropout=True) == (64, 64, 64, 4, 2, 4, 64, 2)
    assert tra.default_blocks(64, cuda, capability=80) == (128, 64, 128, 8, stages, 8, 32, stages)
    assert tra.default_blocks(128, cuda, capability=90) == (128, 32, 128, 8, stages, 8, 32, stages)
    assert tra.default_blocks(128, cuda, capability=80) == (128, 32, 32, 8, stages, 8, 32, stages)
    assert tra.default_blocks(64, cuda, capability=89) == (128, 64, 128, 8, 2, 8, 32, 2)  # ~100 KB shared
    assert tra.default_blocks(64, cuda, capability=86, dropout=True) == (128, 64, 128, 8, 2, 8, 16, 2)
    assert tra.default_blocks(64, cuda, capability=80, dropout=True) == (128, 64, 128, 8, stages, 8, 32, stages)
    # fp32 (products as fused multiply-adds, no tensor cores): small tiles on every GPU, which do not spill
    # kilobytes (test_the_fp32_tiles_compile_without_spilling_kilobytes)
    for capability in (80, 86, 90):
        assert tra.default_blocks(64, cuda, capability=capability, dtype=torch.float32) == (32, 32, 32, 4, 2, 4, 32, 2)
        assert tra.default_blocks(128, cuda, capability=capability, dtype=torch.float32) == (32, 32, 16, 4, 2, 4, 16, 2)
    assert tra.default_blocks(64, cuda, capability=90, dtype=torch.bfloat16) == (64, 64, 64, 4, 2, 4, 64, 2)
    for bad in [(128, 64, 64), (128, 64, 8, 4), (128, 0, 64, 4, 2), (1, 2, 16, 4, 2, 9), (8, 32, 32, 4),
                (128, 48, 32, 4), (128, 64, 64, 8, 3, 0), (128, 64, 64, 8, 3, 4, 1), (128, 64, 64, 8, 3, 4, 8),
                (128, 64, 32, 8, 3, 8, 64), (128, 64, 64, 8, 3, 8, 48), (128, 64, 64, 8, 3, 8, 32, 0),
                (128, 64, 64, 8, 3, 8, 32, 3, 1)]:
        with pytest.raises(ValueError):
            tra.resolve_blocks(bad)


@pytest.mark.parametrize("T,S,blocks", [(37, 41, (16, 32, 16, 4)), (1000, 1000, (128, 64, 128, 8, 3, 8, 32)),
                                         (5, 300, (64, 128, 64, 4)), (5, 7, (16, 16, 16, 4))])
def test_bias_rows_hold_every_distance_the_tiles_read_in_log2_units(T, S, blocks):
    """`_bias_rows`: the kernels read query i's bias for key j at OFF + j - i without a clamp and
    without a mask, partial tiles' overhang included, so every such index must lie in the row
    (a read past it would not fail the interpreter tests: those elements are masked after the
    load) and hold log2(e) per_distance[clamp(j - i, -M, M) + M]. OFF is odd, so that Triton's launch
    never marks it divisible (`_bias_rows`: else its alignment analysis could take the rows' starts for
    16-byte aligned: test_the_bias_rows_are_gathered_4_bytes_at_a_time_whatever_the_lengths)."""
    M = 8
    per_distance = torch.randn(3, 2 * M + 1, dtype=torch.float64)
    blocks = tra.resolve_blocks(blocks)
    rows, off = tra._bias_rows(per_distance, T, S, max(blocks[:3]))
    assert off % 2 == 1 and rows.dtype == torch.float32 and rows.shape[0] == 3
    assert off + S + max(blocks[:3]) <= rows.size(1) <= off + S + max(blocks[:3]) + M + 1
    for rows_per_tile, keys_per_tile in ((blocks[0], blocks[1]), (blocks[2], blocks[6]), (blocks[6], blocks[2])):
        last_query = -(-T // rows_per_tile) * rows_per_tile - 1  # the last row of the last (partial) tile
        last_key = -(-S // keys_per_tile) * keys_per_tile - 1
        assert off + 0 - last_query >= 0 and off + last_key - 0 < rows.size(1)
    i = torch.arange(T)[:, None]
    j = torch.arange(S)[None, :]
    expected = per_distance[:, (j - i).clamp(-M, M) + M] * tra.LOG2E
    torch.testing.assert_close(rows[:, off + j - i].double(), expected, rtol=1e-6, atol=1e-6)
    # the clamped ends, which the far loops read as scalars (`FAR_LOOPS`), exist even when the call is
    # shorter than M on either side
    wide = torch.randn(3, 2 * 40 + 1, dtype=torch.float64)
    rows, off = tra._bias_rows(wide, T, S, max(blocks[:3]))
    assert off >= 40 and off + 40 < rows.size(1)
    torch.testing.assert_close(rows[:, off - 40].double(), wide[:, 0] * tra.LOG2E, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rows[:, off + 40].double(), wide[:, 80] * tra.LOG2E, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("M,q_block,k_block", [(8, 16, 16), (128, 64, 64), (12, 32, 16), (16, 16, 64), (40, 16, 16)])
@pytest.mark.parametrize("keys_major", [False, True])
def test_bias_tiles_hold_the_bias_of_every_tile_offset(M, q_block, k_block, keys_major):
    """`_bias_tiles`: tile n is the bias (log2 units) of every tile whose first key minus first query is
    (lo + n) step (`bias_tile_range`), row-major over (queries, keys), or (keys, queries) keys-major; a tile
    offset beyond either end reads the end tile (the kernels clamp its index), whose distances all clamp."""
    per_distance = torch.randn(3, 2 * M + 1, dtype=torch.float64)
    step, lo, hi = tra.bias_tile_range(M, q_block, k_block)
    assert step == min(q_block, k_block)
    tiles = tra._bias_tiles(per_distance, q_block, k_block, keys_major)
    assert tiles.dtype == torch.float32 and tiles.is_contiguous()
    tiles = tiles.view(3, hi - lo + 1, *((k_block, q_block) if keys_major else (q_block, k_block)))
    rows = torch.arange(q_block)[:, None]
    cols = torch.arange(k_block)[None, :]
    reach = 3 * (M + max(q_block, k_block)) // step
    for offset in range(-reach * step, reach * step + 1, step):  # every tile a call could hold
        index = min(max(offset // step, lo), hi) - lo
        expected = per_distance[:, (offset + cols - rows).clamp(-M, M) + M] * tra.LOG2E
        got = tiles[:, index].transpose(1, 2) if keys_major else tiles[:, index]
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    assert (tiles[:, 0] == tiles[:, 0, :1, :1]).all() and (tiles[:, -1] == tiles[:, -1, :1, :1]).all()
    torch.testing.assert_close(tiles[:, 0, 0, 0].double(), per_distance[:, 0] * tra.LOG2E)
    torch.testing.assert_close(tiles[:, -1, 0, 0].double(), per_distance[:, 2 * M] * tra.LOG2E)
    with pytest.raises(ValueError, match="divide"):
        tra.bias_tile_range(M, 48, 32)


def make(B, H, T, S, D, M, dtype=torch.float32, pad=False, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(device, dtype).requires_grad_() for n in (T, S, S))
    table = torch.randn(H, 2 * M + 1, generator=g).to(device).requires_grad_()
    kpm = None
    if pad:
        lengths = torch.tensor([S - (7 * b) % max(1, S // 2) for b in range(B)])
        kpm = (torch.arange(S)[None, :] >= lengths[:, None]).to(device)
        kpm[0, :3] = True  # left padding too
    return q, k, v, table, kpm


@contextlib.contextmanager
def count_ops():
    """The names of the aten operations run inside (a list, filled on exit)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(str(func))
            return func(*args, **(kwargs or {}))
    with Count():
        yield names


def spy_launches(monkeypatch, kernel: str, argument: str) -> list:
    """The value of keyword ``argument`` at every launch of the module's kernel ``kernel`` (which
    still runs), in order, for the rest of the test."""
    real, launched = getattr(tra, kernel), []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(kwargs[argument])
                return real[grid](*args, **kwargs)
            return launch
    monkeypatch.setattr(tra, kernel, Spy())
    return launched


def fwd_bwd(fn, leaves, grad):
    out = fn(*leaves)
    return [out, *torch.autograd.grad(out, leaves, grad)]


def max_errors(got, ref):
    return [(a.double() - b.double()).abs().max().item() / (b.abs().max().item() or 1.0) for a, b in zip(got, ref)]


def reference(q, k, v, table, kpm, causal, scale, keep=None, p=0.0):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, table)]
    return leaves, lambda *x: tra.reference_attention(*x, key_padding_mask=kpm, causal=causal, scale=scale,
                                                      keep_mask=keep, dropout_p=p)


CASES = [  # (T, S, D, M, causal, padding, blocks)
    (37, 37, 32, 8, False, False, SMALL),   # far tiles on both sides (|distance| >= M) and near ones
    (37, 37, 32, 8, True, True, SMALL),     # causal + padding
    (29, 45, 64, 8, False, True, SMALL),    # cross shapes (T != S), padding, D 64
    (37, 37, 8, 40, True, False, None),     # causal without padding, M beyond T, D 8 padded to 16
    (37, 37, 32, 16, False, True, SMALL),   # M a multiple of the key step: the band's tile accumulator
    # backward tiles of 32 rows walking 16 at a time: dQ's table gradient over 3 wraps of its diagonals
    (45, 45, 32, 16, True, True, RECT),     # causal + padding (the dK/dV loop starts at an odd 16-query tile)
    (29, 53, 32, 12, False, True, RECT),    # cross shapes, padding, band tiles reaching both far ends (gathers)
    (61, 67, 32, 16, False, True, RECT),    # the same with the tile accumulator
    (40, 40, 16, 16, False, False, (16, 16, 64, 4, 3, 4, 16)),  # 64 x 16: 5 wraps, a one-program backward
    (40, 40, 16, 4, True, False, (16, 16, 64, 4, 3, 4, 16)),    # and with gathers, causal
]


# the cases also run with the bias read whole from its tiles (`BIAS_LAYOUT` "tiles"): every tile shape of CASES
# (square, where the dQ kernel shares the forward's tiles; 32 x 16 and 64 x 16 backward tiles, with their own and
# the dK/dV kernel's keys-major ones; the default tiles with M beyond T), padding, causality and T != S
TILE_CASES = [CASES[i] for i in (1, 2, 3, 6, 9)]


@cpu_only
@pytest.mark.parametrize("case,layout", [(case, "rows") for case in CASES] + [(case, "tiles") for case in TILE_CASES])
def test_forward_and_every_gradient_match_the_fp64_reference(case, layout, backward, far_loops, monkeypatch):
    """Output and every gradient against fp64 attention, for each way the kernels read a tile's bias
    (`triton_rpe_attention.BIAS_LAYOUT`): gathered from the head's row of distances, or read whole from its
    bias tiles."""
    monkeypatch.setattr(tra, "BIAS_LAYOUT", layout)
    T, S, D, M, causal, pad, blocks = case
    q, k, v, table, kpm = make(2, 2, T, S, D, M, pad=pad)
    grad = torch.randn(2, 2, T, D, generator=torch.Generator().manual_seed(1))
    got = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, causal=causal, scale=0.3,
                                                      blocks=blocks), [q, k, v, table], grad)
    leaves, ref_fn = reference(q, k, v, table, kpm, causal, 0.3)
    ref = fwd_bwd(ref_fn, leaves, grad.double())
    errors = max_errors(got, ref)
    assert max(errors) < 2e-5, errors  # out, dq, dk, dv, d table
    if M < T - 1:  # both clamped ends of the table were reached and have a gradient
        assert ref[4][:, 0].abs().min() > 0 and got[4][:, 0].abs().min() > 0


@pytest.mark.skipif(not CUDA and (not _INTERPRETER_READY or _INTERPRETER_PROBLEM is not None),
                    reason=_INTERPRETER_PROBLEM or "needs CUDA or Triton's interpreter in this process")
def test_the_output_merges_its_heads_without_a_copy(backward):
    """O is written in (B, T, H, D) memory, seen as (B, H, T, D): the attention module's merge of
    the heads, out.transpose(1, 2).reshape(B, T, H * D), is a view (one copy of the output less per
    call), and the backward (whose dQ kernel reads O with dQ's strides) still matches the reference."""
    device = "cuda" if CUDA else "cpu"
    dtype = torch.bfloat16 if CUDA else torch.float32
    q, k, v, table, kpm = make(2, 3, 24, 24, 16, 4, dtype=dtype, pad=True, device=device)
    out = tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, blocks=None if CUDA else SMALL)
    merged = out.transpose(1, 2).reshape(2, 24, 3 * 16)
    assert out.shape == (2, 3, 24, 16) and merged.data_ptr() == out.data_ptr()
    grad = torch.randn(2, 24, 3 * 16, generator=torch.Generator().manual_seed(2)).to(device, dtype)
    got = torch.autograd.grad(merged, [q, k, v, table], grad)
    leaves, ref_fn = reference(q, k, v, table, kpm, False, 1.0)
    ref_out = ref_fn(*leaves)
    ref = torch.autograd.grad(ref_out.transpose(1, 2).reshape(2, 24, 48), leaves, grad.double())
    tol = 3e-2 if CUDA else 2e-5
    for a, b in zip([out, *got], [ref_out, *ref]):
        assert (a.double() - b).abs().max() <= tol * (b.abs().max() + 1)


LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg"}  # Triton's, not the kernel's arguments


@cpu_only
def test_every_launch_names_every_kernel_argument(monkeypatch):
    """torch.compile hands a user kernel's launch to inductor by argument name, and inductor's analysis
    of which tensors the kernel writes (torch's generate_ttir, 2.11 to 2.13) refuses a launch that leaves
    a defaulted argument out: it then takes every tensor argument to be written (a clone of each in the
    compiled graph, with a warning) and compiles the missing constexpr as None, not as its default, so
    another variant than eager runs. The dQ kernel's BAND_WEIGHTS was left out until 2026-11-26. Every
    launch of every kernel passes all its arguments, in every structure (split or fused backward, far
    loops, the dropout mask's bits, a frozen table)."""
    missing, seen = {}, set()
    kernels = ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_dropout_bits_kernel")
    for name in kernels:
        real = getattr(tra, name)

        class Spy:
            def __getitem__(self, grid, real=real, name=name):
                def launch(*args, **kwargs):
                    given = set(real.arg_names[:len(args)]) | (set(kwargs) - LAUNCH_OPTIONS)
                    missing.setdefault(name, set()).update(set(real.arg_names) - given)
                    seen.add(name)
                    return real[grid](*args, **kwargs)
                return launch
        monkeypatch.setattr(tra, name, Spy())
    monkeypatch.setattr(tra, "far_loops_pay", lambda *shape: True)
    q, k, v, table, kpm = make(1, 2, 24, 24, 16, 4, pad=True)
    structures = [("split", "none", "philox", 0.0, False), ("split", "all", "bits", 0.1, False),
                  ("fused", "backward", "philox", 0.1, False), ("fused", "none", "philox", 0.0, True)]
    for structure, far, mask, p, frozen in structures:
        monkeypatch.setattr(tra, "BACKWARD", structure)
        monkeypatch.setattr(tra, "FAR_LOOPS", far)
        monkeypatch.setattr(tra, "DROPOUT_MASK", mask)
        per_distance = table.detach().requires_grad_(not frozen)
        out = tra.triton_rpe_attention(q, k, v, per_distance, key_padding_mask=kpm, dropout_p=p, blocks=SMALL)
        torch.autograd.grad(out.sum(), [q, k, v] + ([] if frozen else [per_distance]))
    assert seen == set(kernels)
    assert {name: left for name, left in missing.items() if left} == {}


@pytest.mark.skipif(not CUDA and (not _INTERPRETER_READY or _INTERPRETER_PROBLEM is not None),
                    reason=_INTERPRETER_PROBLEM or "needs CUDA or Triton's interpreter in this process")
def test_a_packed_projection_gets_its_gradient_in_one_tensor_without_a_stack(backward):
    """Self-attention from a (B, T, 3, H, D) projection (`packed`): the same output and gradients as
    with q, k, v unpacked from it, and the backward writes the three gradients into one tensor of
    the projection's shape: autograd stacks nothing, and the split backward's dQ kernel writes dQ there
    itself (nothing copies it in). Likewise keys and values from a (B, S, 2, H, D) projection with q
    apart (cross-attention, bias-free over padded keys as the model calls it). Under torch.compile too
    (`_gradient_layout`: one flat buffer written whole by the kernels, which inductor reinplaces), except
    self-attention with the fused backward, whose dQ conversion is an aten copy into a view there."""
    from torch.utils._python_dispatch import TorchDispatchMode

    device = "cuda" if CUDA else "cpu"
    dtype = torch.bfloat16 if CUDA else torch.float32
    B, H, T, S, D = 2, 3, 24, 19, 16
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, T, 3 * H * D, generator=g).to(device, dtype).requires_grad_()
    y = torch.randn(B, S, 2 * H * D, generator=g).to(device, dtype).requires_grad_()
    table = torch.randn(H, 9, generator=g).to(device).requires_grad_()
    kpm = torch.zeros(B, T, dtype=torch.bool, device=device)
    kpm[1, -5:] = True
    kpm_src = torch.zeros(B, S, dtype=torch.bool, device=device)
    kpm_src[0, -4:] = True
    grad = torch.randn(B, H, T, D, generator=g).to(device, dtype)
    blocks = None if CUDA else SMALL

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            # (the interpreter copies each kernel argument to and from a flat host tensor: not counted)
            if not (name == "copy_" and args[0].dim() == 1):
                self.names.append(name)
            return func(*args, **(kwargs or {}))

    def self_attention(packed):
        qkv = (x * 1.0).view(B, T, 3, H, D)  # a non-leaf projection, as the module's
        q, k, v = tra.unpack_qkv(qkv)
        out = tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, blocks=blocks,
                                       packed=qkv if packed else None)
        with Ops() as ops:
            dx, dtable = torch.autograd.grad(out, [x, table], grad)
        return out, (dx, dtable), ops.names

    def cross_attention(packed):
        q = (x * 1.0).view(B, T, 3, H, D)[:, :, 0].transpose(1, 2)
        kv = (y * 1.0).view(B, S, 2, H, D)
        k, v = tra.unpack_qkv(kv)
        out = tra.triton_rpe_attention(q, k, v, None, key_padding_mask=kpm_src, blocks=blocks,
                                       packed=kv if packed else None)
        with Ops() as ops:
            grads = torch.autograd.grad(out, [x, y], grad)
        return out, grads, ops.names

    for run in (self_attention, cross_attention):
        (out0, grads0, ops0), (out1, grads1, ops1) = run(False), run(True)
        assert "stack" in ops0 and "stack" not in ops1, run.__name__
        if backward == "split":
            assert "copy_" not in ops1, (run.__name__, ops1)
        assert torch.equal(out0, out1), run.__name__
        for a, b in zip(grads0, grads1):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), run.__name__
        with mock.patch.object(torch.compiler, "is_compiling", lambda: True):  # the same when compiling
            out2, grads2, ops2 = run(True)
        # (but for the fused backward's self-attention, whose dQ an aten copy would write into the packed gradient)
        unpacked = backward == "fused" and run is self_attention
        assert ("stack" in ops2) == unpacked and torch.equal(out2, out1), run.__name__
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(grads1, grads2)), run.__name__

    (_, (dx1, _), _), tol = self_attention(True), (3e-2 if CUDA else 2e-5)
    q, k, v = tra.unpack_qkv(x.detach().view(B, T, 3, H, D))
    leaves, ref_fn = reference(q, k, v, table, kpm, False, 1.0)
    ref = torch.autograd.grad(ref_fn(*leaves), leaves, grad.double())
    ref_dx = torch.stack([r.transpose(1, 2) for r in ref[:3]], dim=2).reshape(B, T, -1)
    assert (dx1.double() - ref_dx).abs().max() <= tol * (ref_dx.abs().max() + 1)
    _, (_, dy1), _ = cross_attention(True)
    k, v = tra.unpack_qkv(y.detach().view(B, S, 2, H, D))
    leaves, ref_fn = reference(q, k, v, torch.zeros(H, 9, device=device), kpm_src, False, 1.0)
    ref = torch.autograd.grad(ref_fn(*leaves), leaves[1:3], grad.double())
    ref_dy = torch.stack([r.transpose(1, 2) for r in ref], dim=2).reshape(B, S, -1)
    assert (dy1.double() - ref_dy).abs().max() <= tol * (ref_dy.abs().max() + 1)
    with pytest.raises(ValueError, match="packed"):
        tra.triton_rpe_attention(q, q, q, table, packed=x.view(B, T, 3, D, H))
    with pytest.raises(ValueError, match="packed"):  # a key and value projection of another length
        tra.triton_rpe_attention(q, k, v, None, packed=y[:, :-1].reshape(B, S - 1, 2, H, D))


def _spans_probe(ARGS, OUT, M: tl.constexpr, ROWS: tl.constexpr, STEP: tl.constexpr, ONE_BAND: tl.constexpr):
    """`_far_spans` of the (start, lo, hi) triple ARGS[3 i:3 i + 3], stored at OUT[3 i:3 i + 3]."""
    i = tl.program_id(0)
    start, lo, hi = tl.load(ARGS + 3 * i), tl.load(ARGS + 3 * i + 1), tl.load(ARGS + 3 * i + 2)
    band_lo, band_hi, right_lo = tra._far_spans(start, lo, hi, M, ROWS, STEP, ONE_BAND)
    tl.store(OUT + 3 * i, band_lo)
    tl.store(OUT + 3 * i + 1, band_hi)
    tl.store(OUT + 3 * i + 2, right_lo)


@cpu_only
@pytest.mark.parametrize("one_band", [False, True])
def test_far_spans_split_the_tiles_into_far_band_far(one_band):
    """`_far_spans` over every program start and span of a row of 96 (tiles of 16 and 32): each tile of
    lo, lo + STEP, ... < hi falls in exactly one span; those before band_lo have every distance on the
    walked axis' start side at |d| >= M, those from right_lo on on its end side, and every tile crossing
    the band (-M, M) is in the band span (which, ONE_BAND, is never empty)."""
    probe = triton.jit(_spans_probe)  # decorated here, where TRITON_INTERPRET is set (Triton decides then)
    M = 20
    for rows, step in ((16, 16), (32, 16), (32, 32)):
        cases = [(start, lo, hi) for start in range(0, 96, rows) for lo in range(0, 96, step)
                 for hi in range(lo + 1, 97, 7)]
        args = torch.tensor(cases, dtype=torch.int32)
        out = torch.zeros_like(args)
        probe[(len(cases),)](args, out, M=M, ROWS=rows, STEP=step, ONE_BAND=one_band)
        for (start, lo, hi), (band_lo, band_hi, right_lo) in zip(cases, out.tolist()):
            tiles = range(lo, hi, step)
            before = [t for t in tiles if t < band_lo]
            band = [t for t in tiles if band_lo <= t < band_hi]
            after = [t for t in tiles if t >= right_lo]
            assert sorted(before + band + after) == list(tiles), (start, lo, hi)
            # distance = walked index - row index: start side far means t + step - 1 - start <= -M
            assert all(t + step - 1 - start <= -M for t in before), (start, lo, hi, band_lo)
            assert all(t - (start + rows - 1) >= M for t in after), (start, lo, hi, right_lo)
            crossing = [t for t in tiles if t + step - 1 - start > -M and t - (start + rows - 1) < M]
            assert set(crossing) <= set(band), (start, lo, hi, band_lo, band_hi)
            assert band or not one_band, (start, lo, hi)


@cpu_only
def test_with_the_dropout_bit_mask_the_dkdv_kernel_keeps_one_loop(monkeypatch):
    """`dkdv_far_loops`: far loops with the dropout bit mask made ptxas serialize the dK/dV kernel's
    matrix products (Triton 3.6), so there that kernel keeps one loop while the dQ kernel (and, with
    "all", the forward) keep theirs; the results equal one loop everywhere."""
    M, blocks, length = 4, SMALL, 81  # long enough for the far loops (`far_loops_pay`: 4 (M + 16) = 80)
    monkeypatch.setattr(tra, "DROPOUT_MASK", "bits")
    launched = {kernel: spy_launches(monkeypatch, kernel, "FAR_LOOPS")
                for kernel in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel")}
    q, k, v, table, kpm = make(1, 2, length, length, 16, M, pad=True)
    grad = torch.randn(1, 2, length, 16, generator=torch.Generator().manual_seed(1))
    results = []
    for mode in ("none", "all"):
        monkeypatch.setattr(tra, "FAR_LOOPS", mode)
        torch.manual_seed(3)  # the same keep mask for both
        results.append(fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, blocks=blocks,
                                                                   dropout_p=0.2), [q, k, v, table], grad))
    assert launched == {"_fwd_kernel": [False, True], "_bwd_dkdv_kernel": [False, False],
                        "_bwd_dq_kernel": [False, True]}, launched
    assert max(max_errors(results[1], results[0])) < 4e-6  # fp32 sums over 81 keys, in another order
    assert tra.dkdv_far_loops(True, False) and not tra.dkdv_far_loops(True, True)


def test_the_far_loops_of_the_backward_are_the_default():
    """`FAR_LOOPS` defaults to "backward" (the H200's figures of 2026-11-26: BENCHMARKS.md), unless
    AST_T5_TRITON_FAR_LOOPS says otherwise, or AST_T5_TRITON_BACKWARD selects the fused backward."""
    if "AST_T5_TRITON_FAR_LOOPS" in os.environ or "AST_T5_TRITON_BACKWARD" in os.environ:
        pytest.skip("AST_T5_TRITON_FAR_LOOPS or AST_T5_TRITON_BACKWARD is set in this environment")
    assert tra.FAR_LOOPS == "backward"
    # with the fused backward chosen the same way, one loop (as it was measured; it spills with the far loops)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AST_T5_TRITON_")}
    code = "from ast_t5.modules import triton_rpe_attention as tra; print(tra.BACKWARD, tra.FAR_LOOPS)"
    for backward, expected in (("fused", "fused none"), ("split", "split backward")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env=dict(env, AST_T5_TRITON_BACKWARD=backward)).stdout.split("\n")[-2]
        assert out == expected, out


@cpu_only
def test_far_loops_run_on_long_calls_only_and_equal_one_loop(monkeypatch):
    """`FAR_LOOPS` = "backward" reaches the dK/dV and dQ kernels, "all" the forward too, on a call longer
    than 4 (M + the largest tile) on both axes (`far_loops_pay`), and no kernel of a shorter one; the
    results equal the one loop's. An unknown value is refused in one line."""
    M, blocks = 4, SMALL
    launched = {kernel: spy_launches(monkeypatch, kernel, "FAR_LOOPS")
                for kernel in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel")}
    for length, pays in ((80, False), (81, True)):
        q, k, v, table, kpm = make(1, 2, length, length, 16, M, pad=True)
        grad = torch.randn(1, 2, length, 16, generator=torch.Generator().manual_seed(1))
        results = []
        for mode in tra.FAR_LOOPS_CHOICES:
            monkeypatch.setattr(tra, "FAR_LOOPS", mode)
            for spied in launched.values():
                spied.clear()
            results.append(fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, blocks=blocks),
                                   [q, k, v, table], grad))
            expected = {"_fwd_kernel": [pays and mode == "all"], "_bwd_dkdv_kernel": [pays and mode != "none"],
                        "_bwd_dq_kernel": [pays and mode != "none"]}
            assert launched == expected, (length, mode, launched)
        for result in results[1:]:  # fp32 sums over 80 keys, in another order
            assert max(max_errors(result, results[0])) < 4e-6
    monkeypatch.setattr(tra, "FAR_LOOPS", "yes")
    with pytest.raises(ValueError, match="FAR_LOOPS"):
        tra.triton_rpe_attention(q, k, v, table)
    monkeypatch.setattr(tra, "FAR_LOOPS", "backward")
    monkeypatch.setattr(tra, "BIAS_LAYOUT", "tiles-fp16")  # tried, not offered (`BIAS_LAYOUT`)
    with pytest.raises(ValueError, match="BIAS_LAYOUT"):
        tra.triton_rpe_attention(q, k, v, table)


@cpu_only
def test_a_stacks_layers_share_the_bias_tiles(monkeypatch):
    """With `BIAS_LAYOUT` "tiles" the first layer's call builds the three kernels' bias tiles (the dQ
    kernel sharing the forward's when their tiles match), the next layers reuse them, and no bias rows are
    built; the same table changed in place, or other tiles, builds them again; the launches carry them."""
    monkeypatch.setattr(tra, "BIAS_LAYOUT", "tiles")
    monkeypatch.setattr(tra, "BLOCKS_OVERRIDE", SMALL)
    built = []
    real = tra._bias_tiles

    def tiles(*args):
        built.append(args[1:4])
        return real(*args)

    def no_rows(*args):
        raise AssertionError("bias rows built with BIAS_LAYOUT tiles")
    monkeypatch.setattr(tra, "_bias_tiles", tiles)
    monkeypatch.setattr(tra, "_bias_rows", no_rows)
    read = spy_launches(monkeypatch, "_bwd_dkdv_kernel", "BIAS_TILES")
    T, D, M = 37, 16, 8
    q, k, v, table, kpm = make(2, 2, T, T, D, M, pad=True)
    grad = torch.randn(2, 2, T, D, generator=torch.Generator().manual_seed(1))
    folded, _, _ = ab.fold_masks("triton", RelativeBias(table, T, T), kpm, False)
    layers = [fwd_bwd(lambda *x: ab.attention(*x[:3], bias=folded, backend="triton"), [q, k, v, table], grad)
              for _ in range(3)]
    assert built == [(16, 16, False), (16, 16, True)] and read == [True] * 3  # SMALL: forward = dQ tiles
    own = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm), [q, k, v, table], grad)
    for result in layers:
        assert max(max_errors(result, own)) == 0.0
    inputs = folded.triton_inputs()
    blocks = tra.resolve_blocks(SMALL)
    kept = inputs.bias_tiles(table, blocks)
    assert len(built) == 4
    with torch.no_grad():
        table.mul_(2.0)
    again = inputs.bias_tiles(table, blocks)
    assert len(built) == 6 and not torch.equal(again[0], kept[0])
    inputs.bias_tiles(table, tra.resolve_blocks(RECT))  # other tiles: the dQ kernel's its own
    assert built[6:] == [(16, 16, False), (32, 16, False), (16, 32, True)]


@cpu_only
def test_a_stacks_layers_share_the_bias_rows_and_padding_counts(monkeypatch):
    """`SharedInputs`, held by a stack's `FoldedBias`: the first layer's call builds the bias rows and the
    padding counts, the next layers reuse them, and their results and gradients equal calls that build
    their own. Another table, the same table changed in place, or another length builds the rows again;
    under torch.compile nothing is kept (`FoldedBias.triton_inputs` gives None)."""
    built = {"rows": 0, "counts": 0}
    real_rows, real_counts = tra._bias_rows, tra._padding_counts

    def rows(*args):
        built["rows"] += 1
        return real_rows(*args)

    def counts(*args):
        built["counts"] += 1
        return real_counts(*args)

    monkeypatch.setattr(tra, "_bias_rows", rows)
    monkeypatch.setattr(tra, "_padding_counts", counts)
    monkeypatch.setattr(tra, "BLOCKS_OVERRIDE", SMALL)
    T, D, M = 37, 16, 8
    q, k, v, table, kpm = make(2, 2, T, T, D, M, pad=True)
    grad = torch.randn(2, 2, T, D, generator=torch.Generator().manual_seed(1))
    folded, fpad, _ = ab.fold_masks("triton", RelativeBias(table, T, T), kpm, False)
    assert fpad is None
    shared = [fwd_bwd(lambda *x: ab.attention(*x[:3], bias=folded, backend="triton"), [q, k, v, table], grad)
              for _ in range(3)]  # three layers of one stack
    assert built == {"rows": 1, "counts": 1}
    own = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm), [q, k, v, table], grad)
    assert built == {"rows": 2, "counts": 2}
    for result in shared:
        assert max(max_errors(result, own)) == 0.0
    inputs = folded.triton_inputs()
    pad = max(SMALL[:3])
    inputs.bias_rows(table, T, T, pad)
    assert built["rows"] == 2
    inputs.bias_rows(table * 1.0, T, T, pad)  # another table
    inputs.bias_rows(table, T, T + 1, pad)  # another shape
    assert built["rows"] == 4
    before = built["rows"]
    inputs.bias_rows(table, T, T, pad)
    with torch.no_grad():
        table.mul_(2.0)  # the table changed in place (an optimizer step)
    rebuilt, _ = inputs.bias_rows(table, T, T, pad)
    assert built["rows"] == before + 2
    torch.testing.assert_close(rebuilt, real_rows(table, T, T, pad)[0])
    with pytest.raises(ValueError, match="not both"):
        tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, shared=inputs)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced, _, _ = ab.fold_masks("triton", RelativeBias(table, T, T), kpm, False)
    assert traced.triton_inputs() is None
    held = tra.SharedInputs(kpm)
    held.padding(q.device)
    held.bias_rows(table, T, T, pad)
    assert held._padding is None and held._rows is None


@cpu_only
def test_the_split_backward_takes_delta_from_the_dq_kernel(monkeypatch, backward):
    """The split backward launches the dQ kernel first, which writes delta = rowsum(dO o) for the dK/dV
    kernel (no PyTorch operation over (B, H, T, D) tensors in the backward); the fused backward, whose
    dK/dV kernel runs first, computes delta in PyTorch. Either way the dK/dV kernel reads the right delta."""
    from torch.utils._python_dispatch import TorchDispatchMode

    order = []

    def spy(name):
        real = getattr(tra, name)

        class Spy:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    order.append((name, kwargs.get("DELTA_OUT")))
                    in_kernel.append(name)  # the interpreter's own tensor work, and this check, are not counted
                    try:
                        if name == "_bwd_dkdv_kernel":  # q k v pd kpm kv_end pad_count seed dmask do lse delta
                            do, delta = args[9], args[11]
                            o = launched_o[0].view(B, T, H, D).transpose(1, 2)  # written as (B, T, H, D), flat
                            expected = (do.double() * o.double()).sum(-1).reshape(delta.shape)
                            torch.testing.assert_close(delta.double(), expected, rtol=1e-5, atol=1e-5)
                        return real[grid](*args, **kwargs)
                    finally:
                        in_kernel.pop()
                return launch
        monkeypatch.setattr(tra, name, Spy())

    launched_o, in_kernel = [], []
    real_fwd = tra._fwd_kernel

    class FwdSpy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched_o.append(args[9])  # q k v pd kpm kv_end pad_count seed dmask o
                return real_fwd[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(tra, "_fwd_kernel", FwdSpy())
    spy("_bwd_dq_kernel")
    spy("_bwd_dkdv_kernel")
    B, H, T, D, M = 2, 2, 37, 16, 8
    q, k, v, table, kpm = make(B, H, T, T, D, M, pad=True)
    grad = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(1))
    out = tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, blocks=SMALL)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.wide = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            views = (torch.ops.aten.detach.default, torch.ops.aten.view.default, torch.ops.aten.alias.default,
                     torch.ops.aten.transpose.int)
            if not in_kernel and func not in views and any(isinstance(a, torch.Tensor) and a.shape == (B, H, T, D)
                                                           for a in args):
                self.wide.append(str(func))
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        torch.autograd.grad(out, [q, k, v, table], grad)
    if backward == "split":
        assert order == [("_bwd_dq_kernel", True), ("_bwd_dkdv_kernel", None)]
        assert ops.wide == [], ops.wide
    else:
        assert order == [("_bwd_dkdv_kernel", None), ("_bwd_dq_kernel", False)]
        assert "aten.mul.Tensor" in ops.wide  # (dO o) in fp32


@cpu_only
@pytest.mark.parametrize("blocks", [SMALL, RECT], ids=["square", "rect"])
def test_fused_backward_launches_the_band_kernel_only_for_the_table_gradient(blocks, monkeypatch):
    """The fused backward: dQ comes from the dK/dV kernel's atomic adds, so the band kernel (the dQ kernel
    with BAND_ONLY) runs only when the table needs a gradient, and then visits band tiles alone; with
    the table frozen, only the dK/dV kernel runs. Both equal the split backward's gradients, and an
    unknown structure is refused in one line."""
    T, S, D, M = 45, 45, 16, 8
    q, k, v, table, kpm = make(2, 2, T, S, D, M, pad=True)
    grad = torch.randn(2, 2, T, D, generator=torch.Generator().manual_seed(1))
    launched = spy_launches(monkeypatch, "_bwd_dq_kernel", "BAND_ONLY")
    results = {}
    for mode in ("split", "fused"):
        monkeypatch.setattr(tra, "BACKWARD", mode)
        for frozen in (False, True):
            out = tra.triton_rpe_attention(q, k, v, table.detach() if frozen else table, key_padding_mask=kpm,
                                           scale=0.3, blocks=blocks)
            results[mode, frozen] = [out, *torch.autograd.grad(out, [q, k, v] + ([] if frozen else [table]), grad)]
    assert launched == [False, False, True]  # split: dQ twice; fused: the band kernel for the table only
    for frozen in (False, True):
        errors = max_errors(results["fused", frozen][:4], results["split", frozen][:4])
        assert max(errors) < 1e-5, errors
    assert max(max_errors(results["fused", False][4:], results["split", False][4:])) < 1e-5
    monkeypatch.setattr(tra, "BACKWARD", "atomic")
    with pytest.raises(ValueError, match="AST_T5_TRITON_BACKWARD"):
        tra.triton_rpe_attention(q, k, v, table, blocks=blocks)


def test_the_fused_backward_runs_where_it_was_built_and_says_why_not_elsewhere(monkeypatch):
    """sm90 at head size <= 64 (and the interpreter on CPU) run the fused backward; elsewhere its dQ
    product duplicates work across warps (compile_triton_rpe.py's dup column), so the split one
    runs, with the reason logged once."""
    cuda = torch.device("cuda")
    capability = {}
    monkeypatch.setattr(tra, "_capability", lambda device: capability["cc"])
    capability["cc"] = 90
    assert tra.fused_backward_unfit(cuda, 64) is None and tra.fused_backward_unfit(torch.device("cpu"), 128) is None
    why = tra.fused_backward_unfit(cuda, 128)
    assert "sm90 at head size <= 64" in why and "head size 128" in why and "split backward" in why
    capability["cc"] = 80
    assert "not sm80 at head size 64" in tra.fused_backward_unfit(cuda, 64)
    # bench_attention leaves the fused rows out there (they would time the split backward), says why
    bench = load_benchmark("bench_attention", "bench_attention_unfit")
    if tra.triton is not None:
        assert "not sm80 at head size 64" in bench.available("triton-fused", cuda, 64)
        assert "not sm80" in bench.available("triton-fused:64x64x64x4x2", cuda, 64)
        assert bench.available("triton", cuda, 64) is None
        # rows that pin the far loops: n/a where the kernels keep one loop (T <= 2 (M + tile)), run elsewhere
        assert "keep one loop" in bench.available("triton-far", cuda, 64, 512)  # sm80's 128-row tiles: 512
        assert bench.available("triton-far", cuda, 64, 1024) is None
        capability["cc"] = 90  # 64 x 64 tiles: 2 (128 + 64) = 384 < 512
        assert bench.available("triton-far-all", cuda, 64, 512) is None
        assert "keep one loop" in bench.available("triton-far:128x64x128x8", cuda, 64, 512)


@cpu_only
@pytest.mark.parametrize("blocks", [SMALL, RECT], ids=["square", "rect"])
@pytest.mark.parametrize("causal", [False, True])
def test_key_tiles_past_the_last_unpadded_key_are_never_read(blocks, causal, backward, far_loops):
    """`_padding_counts`: with right padding, no kernel visits a key tile that starts past a row's last
    unpadded key. NaN in those keys' K and V proves it (a visited tile multiplies its zero
    probabilities with them: NaN). A row of padding alone gets zeros. The rest equals the fp64
    reference, with a hole inside the unpadded part masked as before."""
    B, H, T, S, D, M = 3, 2, 40, 71, 16, 8
    q, k, v, table, _ = make(B, H, T, S, D, M)
    lengths = [17, 71, 0]  # tiles of 16 keys: row 0 has 3 whole tiles and part of one past its end
    kpm = torch.arange(S)[None, :] >= torch.tensor(lengths)[:, None]
    kpm[1, 20:23] = True  # a hole
    if causal:
        q, k, v = (t.detach()[:, :, :T].clone().requires_grad_() for t in (q, k, v))
        kpm, S = kpm[:, :T], T
    poisoned = [t.detach().clone() for t in (k, v)]
    for b, length in enumerate(lengths):
        first_unread = -(-length // 16) * 16  # the first 16-key tile wholly past the row's end
        for t in poisoned:
            t[b, :, first_unread:] = float("nan")
    k_p, v_p = (t.requires_grad_() for t in poisoned)
    grad = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(1))
    got = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, causal=causal, scale=0.3,
                                                      blocks=blocks), [q, k_p, v_p, table], grad)
    assert all(torch.isfinite(g).all() for g in got), [bool(torch.isfinite(g).all()) for g in got]
    assert got[0][2].abs().max() == 0 and got[1][2].abs().max() == 0  # the row of padding alone
    assert got[2][2].abs().max() == 0 and got[3][2].abs().max() == 0
    # the reference on the clean inputs, with the all-padding row left out (the dense convention
    # differs there: module docstring)
    keep_rows = [0, 1]
    leaves, ref_fn = reference(q[keep_rows], k[keep_rows], v[keep_rows], table, kpm[keep_rows], causal, 0.3)
    ref = fwd_bwd(ref_fn, leaves, grad[keep_rows].double())
    got_rows = [g[keep_rows] for g in got[:4]]
    trimmed = [g.clone() for g in got_rows]
    for i, length in enumerate(lengths[:2]):  # padded keys: zero gradient in the kernel, any in NaN-free ref
        trimmed[2][i, :, length:] = ref[2][i, :, length:].to(trimmed[2].dtype)
        trimmed[3][i, :, length:] = ref[3][i, :, length:].to(trimmed[3].dtype)
    errors = max_errors(trimmed, ref[:4])
    assert max(errors) < 2e-5, errors
    for i, length in enumerate(lengths[:2]):
        assert got_rows[2][i, :, length:].abs().sum() == 0 and got_rows[3][i, :, length:].abs().sum() == 0


@cpu_only
@pytest.mark.parametrize("blocks", [SMALL, RECT], ids=["square", "rectangular-backward"])
def test_dropout_uses_the_philox_mask_it_exposes_and_is_seeded(blocks, backward, far_loops, dropout_mask):
    T, S, D, M, p = 37, 41, 32, 8, 0.25
    q, k, v, table, kpm = make(2, 2, T, S, D, M, pad=True)
    grad = torch.randn(2, 2, T, D, generator=torch.Generator().manual_seed(1))

    def call(*x):
        return tra.triton_rpe_attention(*x, key_padding_mask=kpm, dropout_p=p, blocks=blocks)

    torch.manual_seed(5)
    got = fwd_bwd(call, [q, k, v, table], grad)
    torch.manual_seed(5)
    keep = tra.dropout_keep_mask(tra._draw_seed(q.device), 2, 2, T, S, p)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.03  # 6068 draws: 5 standard deviations
    leaves, ref_fn = reference(q, k, v, table, kpm, False, 1.0, keep=keep, p=tra.effective_dropout_p(p))
    errors = max_errors(got, fwd_bwd(ref_fn, leaves, grad.double()))
    assert max(errors) < 2e-5, errors
    with torch.no_grad():
        torch.manual_seed(5)
        same = call(q, k, v, table)
        other = call(q, k, v, table)  # the generator moved on: another mask
        plain = tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, blocks=SMALL)
    assert torch.equal(same, got[0]) and not torch.equal(other, same)
    without_dropout = tra.reference_attention(q.double(), k.double(), v.double(), table.double(), kpm)
    assert (plain.double() - without_dropout).abs().max() < 1e-5  # p = 0: no mask drawn at all


NOBIAS_CASES = [  # (T, S, D, causal, blocks): bias-free calls with padded keys (left padding too: `make`)
    (37, 37, 32, False, SMALL),
    (29, 45, 64, False, SMALL),  # cross shapes (a decoder's cross-attention)
    (45, 45, 32, True, RECT),    # causal, the backward on 32 x 16 tiles
    (1, 41, 16, False, SMALL),   # one query: a cached decoding step's cross-attention
]


@cpu_only
@pytest.mark.parametrize("case", NOBIAS_CASES)
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_bias_free_calls_run_the_kernels_without_a_bias(case, p, backward, monkeypatch):
    """``per_distance`` None: the same kernels with nothing read from a table (HAS_BIAS off) and no table
    gradient: output and q, k, v gradients as the fp64 reference with a zero bias, with and without
    dropout (the keep mask the kernels expose), for each backward. No bias rows are built, and the far
    loops stay off even where their length rule would turn them on."""
    T, S, D, causal, blocks = case
    monkeypatch.setattr(tra, "FAR_LOOPS", "all")
    monkeypatch.setattr(tra, "far_loops_pay", lambda *shape: True)

    def no_rows(*args):
        raise AssertionError("a bias-free call built bias rows")

    monkeypatch.setattr(tra, "_bias_rows", no_rows)
    has_bias = spy_launches(monkeypatch, "_fwd_kernel", "HAS_BIAS")
    dkdv = spy_launches(monkeypatch, "_bwd_dkdv_kernel", "FAR_LOOPS")
    q, k, v, _, kpm = make(2, 2, T, S, D, 4, pad=True)
    grad = torch.randn(2, 2, T, D, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    got = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, None, key_padding_mask=kpm, causal=causal, scale=0.3,
                                                      dropout_p=p, blocks=blocks), [q, k, v], grad)
    assert has_bias == [False] and dkdv == [False]
    keep = None
    if p:
        torch.manual_seed(5)
        keep = tra.dropout_keep_mask(tra._draw_seed(q.device), 2, 2, T, S, p)
    zero = torch.zeros(2, 3)
    leaves, ref_fn = reference(q, k, v, zero, kpm, causal, 0.3, keep=keep, p=tra.effective_dropout_p(p))
    ref = fwd_bwd(lambda *x: ref_fn(*x, leaves[3]), leaves[:3], grad.double())  # the zero bias: no gradient asked
    errors = max_errors(got, ref)
    assert len(errors) == 4 and max(errors) < 2e-5, errors  # out, dq, dk, dv


@cpu_only
def test_bias_free_padded_calls_of_the_triton_backend_run_its_kernels_and_share_the_mask_inputs(monkeypatch):
    """`attention(backend="triton")` without a bias: padded keys go to the kernels without a bias (counted
    "triton-nobias"), equal to the torch backend in output and gradients; the mask's kernel inputs are
    built once for the calls that pass the same unchanged mask tensor (a decoder's cross-attention
    layers), again for another mask or the same one changed in place, and never kept for a mask made
    under torch.inference_mode (no version counter) or under torch.compile. Unpadded calls go to flash."""
    built = [0]
    real_counts = tra._padding_counts

    def counts(*args):
        built[0] += 1
        return real_counts(*args)

    monkeypatch.setattr(tra, "_padding_counts", counts)
    monkeypatch.setattr(tra, "BLOCKS_OVERRIDE", SMALL)
    monkeypatch.setattr(ab, "_NOBIAS_PADDING", [None])
    q, k, v, _, kpm = make(2, 2, 13, 29, 16, 4, pad=True)
    grad = torch.randn(2, 2, 13, 16, generator=torch.Generator().manual_seed(1))

    def call(mask, backend="triton"):
        return lambda *x: ab.attention(*x, key_padding_mask=mask, scale=0.5, backend=backend)

    ab.DISPATCH_COUNTS.clear()
    layers = [fwd_bwd(call(kpm), [q, k, v], grad) for _ in range(3)]
    assert ab.DISPATCH_COUNTS["triton-nobias"] == 3 and built[0] == 1, dict(ab.DISPATCH_COUNTS)
    ref = fwd_bwd(call(kpm, "torch"), [q, k, v], grad)
    for got in layers:
        assert max(max_errors(got, ref)) < 2e-5
    other = kpm.clone()
    with torch.no_grad():
        ab.attention(q, k, v, key_padding_mask=other, backend="triton")
        assert built[0] == 2
        other[1, 0] = True  # changed in place
        changed = ab.attention(q, k, v, key_padding_mask=other, backend="triton")
        assert built[0] == 3
        assert (changed - ab.attention(q, k, v, key_padding_mask=other, backend="torch")).abs().max() < 1e-5
    with torch.inference_mode():
        frozen = kpm.clone()
        for _ in range(2):
            ab.attention(q, k, v, key_padding_mask=frozen, backend="triton")
    assert built[0] == 5
    ab.DISPATCH_COUNTS.clear()
    ab.attention(q, k, v, backend="triton")  # unpadded: flash
    assert ab.DISPATCH_COUNTS["sdpa-flash"] == 1 and ab.DISPATCH_COUNTS["triton-nobias"] == 0
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        for _ in range(2):
            ab.attention(q, k, v, key_padding_mask=kpm, backend="triton")
    assert built[0] == 7


def _philox4x32(c0, c1, key, rounds):
    """Philox 4x32 with ``rounds`` rounds (Salmon et al. 2011) in NumPy, on counters (c0, c1, 0, 0)
    and a 64-bit key: an independent reference of what ``tl.randint4x`` computes."""
    import numpy as np

    mask = np.uint64(0xFFFFFFFF)
    c0, c1 = c0.astype(np.uint64), c1.astype(np.uint64)
    c2, c3 = np.zeros_like(c0), np.zeros_like(c0)
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    for _ in range(rounds):
        p0, p2 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2  # exact in 64 bits
        c0, c1, c2, c3 = (p2 >> np.uint64(32)) ^ c1 ^ k0, p2 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return c0, c1, c2, c3


@cpu_only
def test_dropout_bits_hold_the_philox_keep_mask_one_bit_per_element(monkeypatch):
    """`_dropout_bits_kernel`: byte n holds the 8 elements of the Philox call with counter n, bit 4 a + 2 c + e
    for query 16 i16 + 8 a + r8 and key 16 j16 + 8 c + 2 q + e (`_keep`): decoded by that layout, the bits equal
    the keep mask the kernels draw with Philox (`dropout_keep_mask`), at sizes that are not multiples of 16.
    The forward reads them (`DROPOUT_MASK` = "bits"): one bits kernel per call, no other launch."""
    B, H, T, S, p = 2, 3, 37, 50, 0.3
    T16, S16 = -(-T // 16), -(-S // 16)
    seed = torch.tensor([123456789], dtype=torch.int64)
    n_calls = B * H * T16 * S16 * 32
    bits = torch.empty(n_calls, dtype=torch.uint8)
    rate = tra.effective_dropout_p(p)
    tra._dropout_bits_kernel[(triton.cdiv(n_calls, 256),)](seed, bits, n_calls, rate, BLOCK=256)
    unpacked = (bits.long()[:, None] >> torch.arange(8)) & 1  # (calls, 4 a + 2 c + e)
    unpacked = unpacked.view(B * H, T16, S16, 8, 4, 2, 2, 2)  # (bh, i16, j16, r8, q, a, c, e)
    decoded = unpacked.permute(0, 1, 5, 3, 2, 6, 4, 7).reshape(B, H, T16 * 16, S16 * 16)[:, :, :T, :S]
    expected = tra.dropout_keep_mask(seed, B, H, T, S, p)
    assert torch.equal(decoded.bool(), expected)
    launched = []
    real = tra._dropout_bits_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(args[2])  # n_calls
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(tra, "_dropout_bits_kernel", Spy())
    q, k, v, table, kpm = make(B, H, T, S, 16, 8, pad=True)
    for mode, calls in (("philox", []), ("bits", [n_calls])):
        monkeypatch.setattr(tra, "DROPOUT_MASK", mode)
        launched.clear()
        with torch.no_grad():
            tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, dropout_p=p, blocks=SMALL)
            tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, blocks=SMALL)  # no dropout: no mask
        assert launched == calls, (mode, launched)
    monkeypatch.setattr(tra, "DROPOUT_MASK", "bytes")
    with pytest.raises(ValueError, match="AST_T5_TRITON_DROPOUT_MASK"):
        tra.triton_rpe_attention(q, k, v, table, dropout_p=p, blocks=SMALL)


@cpu_only
def test_keep_mask_is_philox_in_the_documented_layout():
    """Bit for bit against NumPy's Philox 4x32 with 7 rounds (FlashAttention-2's count; 10 rounds
    give other bits): element (b, h, i, j) takes the high (j even) or low half of word
    2 ((i // 8) % 2) + (j // 8) % 2 of the call with counter
    ((((b H + h) ceil(T/16) + i // 16) ceil(S/16) + j // 16) 8 + i % 8) 4 + (j // 2) % 4, and is
    kept where that half >= 65536 p. Shapes not multiples of 16 or of the 32-wide mask tiles."""
    import numpy as np

    B, H, T, S, p = 2, 3, 40, 75, 0.3
    key = 0x1234_5678_9ABC_DEF0 & (2 ** 62 - 1)
    keep = tra.dropout_keep_mask(torch.tensor([key], dtype=torch.int64), B, H, T, S, p).numpy()
    bh, i, j = np.meshgrid(np.arange(B * H), np.arange(T), np.arange(S), indexing="ij")
    counter = ((((bh * -(-T // 16) + i // 16) * -(-S // 16) + j // 16) * 8 + i % 8) * 4 + (j // 2) % 4)
    assert tra.PHILOX_ROUNDS == 7

    def mask_of(rounds):
        words = _philox4x32(counter & 0xFFFFFFFF, counter >> 32, key, rounds)
        word = np.choose(2 * ((i // 8) % 2) + (j // 8) % 2, words)
        half = np.where(j % 2 == 0, word >> np.uint64(16), word & np.uint64(0xFFFF))
        return half >= round(65536 * p)

    expected = mask_of(7)
    assert keep.shape == (B, H, T, S) and np.array_equal(keep.reshape(B * H, T, S), expected)
    assert not np.array_equal(mask_of(10), expected)  # the reference tells the round counts apart
    assert abs(expected.mean() - (1 - p)) < 0.02  # 18,000 draws
    assert tra.effective_dropout_p(0.1) == 6554 / 65536 and tra.effective_dropout_p(0.0) == 0.0
    assert tra.effective_dropout_p(1 - 1e-9) == 65535 / 65536  # never 1: the scale 1 / (1 - p) stays finite


@cpu_only
@pytest.mark.parametrize("layout", ["rows", "tiles"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_within_a_small_multiple_of_torchs_own_error(dtype, layout, monkeypatch):
    """Half-precision calls, with the bias rows and with the bias tiles (`BIAS_LAYOUT`), within 4x PyTorch's
    own error in the same dtype."""
    monkeypatch.setattr(tra, "BIAS_LAYOUT", layout)
    tiles = spy_launches(monkeypatch, "_fwd_kernel", "BIAS_TILES")
    T, S, D, M = 37, 37, 32, 8
    q, k, v, table, kpm = make(2, 2, T, S, D, M, dtype=dtype, pad=True)
    grad = torch.randn(2, 2, T, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, blocks=SMALL),
                  [q, k, v, table], grad)
    leaves, ref_fn = reference(q, k, v, table, kpm, False, 1.0)
    ref = fwd_bwd(ref_fn, leaves, grad.double())
    own_leaves = [t.detach().requires_grad_() for t in (q, k, v, table)]
    own = fwd_bwd(lambda *x: tra.reference_attention(*x, key_padding_mask=kpm), own_leaves, grad)
    for name, err, own_err in zip("out dq dk dv dtable".split(), max_errors(got, ref), max_errors(own, ref)):
        assert err <= 4 * own_err + 1e-4, (name, err, own_err)
    assert tiles == [layout != "rows"]


@cpu_only
def test_backend_dispatch_fold_masks_and_fallbacks(caplog):
    module = RelativePositionBias(2, 8, 10, bidirectional=True)
    q, k, v, _, kpm = make(2, 2, 21, 21, 16, 10, pad=True)
    # (no causality here: with the left padding its first rows would have no key at all, where
    # the kernel gives zeros and the dense backends a mean; both are meaningless)
    folded, fpad, fcausal = ab.fold_masks("triton", module(21, 21), kpm, causal=False)
    assert isinstance(folded, ab.FoldedBias) and folded.dense is None and folded._flex_dense is None
    assert fpad is None and fcausal is False
    ab.DISPATCH_COUNTS.clear()
    out = ab.attention(q, k, v, bias=folded, backend="triton")
    assert ab.DISPATCH_COUNTS["triton-rpe"] == 1
    ref = ab.attention(q, k, v, bias=module(21, 21), key_padding_mask=kpm, backend="torch")
    assert (out - ref).abs().max() < 1e-5
    params = [q, k, v, module.embedding.weight]
    for g_out, g_ref in zip(torch.autograd.grad(out.sum(), params), torch.autograd.grad(ref.sum(), params)):
        assert (g_out - g_ref).abs().max() < 1e-4
    # fallbacks, each logged once: cached decoding (query offset), a dense bias, bias-free -> flash
    ab.DISPATCH_COUNTS.clear()
    with caplog.at_level("INFO", logger=ab.logger.name):
        step = ab.attention(q[:, :, -1:], k, v, bias=module(1, 21, query_offset=20), backend="triton")
        dense = ab.attention(q, k, v, bias=module(21, 21).dense(), backend="triton")
        ab.attention(q, k, v, key_padding_mask=None, backend="triton")
    assert ab.DISPATCH_COUNTS["triton-rpe"] == 0 and ab.DISPATCH_COUNTS["sdpa-flash"] == 1
    assert "cached decoding step" in caplog.text and "dense bias tensor" in caplog.text
    assert (step - ab.attention(q[:, :, -1:], k, v, bias=module(1, 21, query_offset=20), backend="torch")
            ).abs().max() < 1e-5
    assert (dense - ab.attention(q, k, v, bias=module(21, 21), backend="torch")).abs().max() < 1e-5
    # bias-free with dropout on CPU: PyTorch's CPU flash kernel has none -> sdpa instead of an error
    ab.DISPATCH_COUNTS.clear()
    ab.attention(q, k, v, dropout_p=0.1, causal=True, backend="triton")
    assert ab.DISPATCH_COUNTS["sdpa"] == 1


@cpu_only
def test_cpu_tensors_without_the_interpreter_fall_back_to_sdpa(monkeypatch, caplog):
    monkeypatch.setattr(tra, "INTERPRETED", False)
    q, k, v, table, _ = make(1, 2, 9, 9, 16, 4)
    assert "TRITON_INTERPRET=1" in tra.unsupported_reason(q, k, v, table)
    with pytest.raises(RuntimeError, match="cannot run: CPU tensors need"):
        tra.triton_rpe_attention(q, k, v, table)
    ab.DISPATCH_COUNTS.clear()
    with caplog.at_level("INFO", logger=ab.logger.name):
        ab.attention(q, k, v, bias=RelativeBias(table, 9, 9), backend="triton")
    assert ab.DISPATCH_COUNTS["sdpa"] == 1 and ab.DISPATCH_COUNTS["triton-rpe"] == 0
    # a bias-free padded call: to flash (on CPU, without a varlen kernel, SDPA with the mask), said once
    ab.DISPATCH_COUNTS.clear()
    pad = torch.zeros(1, 9, dtype=torch.bool)
    pad[0, -2:] = True
    with caplog.at_level("INFO", logger=ab.logger.name):
        out = ab.attention(q, k, v, key_padding_mask=pad, backend="triton")
    assert ab.DISPATCH_COUNTS["triton-nobias"] == 0 and ab.DISPATCH_COUNTS["sdpa"] == 1
    assert "-> flash for bias-free calls with padded keys" in caplog.text
    assert (out - ab.attention(q, k, v, key_padding_mask=pad, backend="torch")).abs().max() < 1e-5


@cpu_only
@pytest.mark.parametrize("arch", ["t5_v11_tiny", "ast_t5_paper_tiny"])
def test_a_model_on_the_triton_backend_runs_under_inference_mode(arch, monkeypatch):
    """Under torch.inference_mode tensors have no version counter: the stack's kept bias rows and the
    cross-attention's kept mask inputs (keyed on it) are then rebuilt per call instead of raising, and
    the output equals the one under no_grad. The placeholder tensors of unused kernel arguments, made
    once per process, are made as normal tensors even there, so a training step after it can save them
    for its backward."""
    monkeypatch.setattr(tra, "_PLACEHOLDERS", {})
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, attention_backend="triton", arch=arch).eval()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, len(d), (2, 19), generator=g)
    src[1, -5:] = d.pad()
    prev = torch.randint(4, len(d), (2, 11), generator=g)
    ab.DISPATCH_COUNTS.clear()
    with torch.inference_mode():
        out = model(src, None, prev)[0]
    assert ab.DISPATCH_COUNTS["triton-nobias"] == len(model.decoder.layers), dict(ab.DISPATCH_COUNTS)
    with torch.no_grad():
        assert (out - model(src, None, prev)[0]).abs().max() < 1e-5
    model.train()
    model(src, None, prev)[0].logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@cpu_only
@pytest.mark.parametrize("arch,biased_calls", [("t5_v11_tiny", 4), ("ast_t5_paper_tiny", 2)])
def test_tiny_model_forward_and_backward_with_the_triton_backend_equal_sdpa(arch, biased_calls, backward):
    """Tiny models in train mode without dropout (T5 v1.1: one relative bias per stack, biased
    causal decoder; paper: per-layer encoder bias with M = 256, bias-free decoder self-attention ->
    flash), padded source: loss and every gradient as with sdpa, the biased calls ran the kernel and
    the cross-attention over the padded source its bias-free form. With attention dropout (paper
    default 0.1) the same seed gives the same output."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    kwargs = dict(arch=arch, dropout=0.0, attention_dropout=0.0)
    model = AstT5Model.from_dictionary(d, attention_backend="triton", **kwargs).train()
    reference = AstT5Model.from_dictionary(d, attention_backend="sdpa", **kwargs).train()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, len(d), (2, 19), generator=g)
    src[1, -5:] = d.pad()
    prev = torch.randint(4, len(d), (2, 11), generator=g)
    ab.DISPATCH_COUNTS.clear()
    loss = model(src, None, prev)[0].logsumexp(-1).mean()
    loss.backward()
    assert ab.DISPATCH_COUNTS["triton-rpe"] == biased_calls
    assert ab.DISPATCH_COUNTS["triton-nobias"] == len(model.decoder.layers)  # cross-attention
    ref = reference(src, None, prev)[0].logsumexp(-1).mean()
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-5
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad - p_ref.grad).abs().max() < 1e-4 * (p_ref.grad.abs().max() + 1e-6), name
    if arch.startswith("ast_t5_paper"):
        dropping = AstT5Model.from_dictionary(d, attention_backend="triton", arch=arch, dropout=0.0,
                                              attention_dropout=0.1).train()
        with torch.no_grad():
            outs = []
            for seed in (1, 1, 2):
                torch.manual_seed(seed)
                outs.append(dropping(src, None, prev)[0])
        assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


@pytest.mark.skipif(CUDA, reason="CUDA host: the script measures the host's work on CPU tensors")
def test_host_work_benchmark_counts_fewer_operations_per_layer_in_a_stack():
    """benchmarks/bench_triton_host.py (in a process of its own: it needs the interpreter's import of
    triton): per layer call, the stack path (shared bias rows and padding counts) issues fewer PyTorch
    operations than calls that build their own, and neither computes delta in PyTorch; bias-free padded calls
    sharing one mask (a decoder's cross-attention) fewer still: allocations, and the mask's inputs once."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_triton_host.py")
    result = subprocess.run([sys.executable, script, "--layers", "3", "--repeats", "2"], capture_output=True,
                            text=True, timeout=300)
    refusal = re.search(r"interpreter cannot run these kernels.*", result.stderr)
    if result.returncode != 0 and refusal:  # Triton 3.6 with NumPy >= 2.4 (`interpreter_problem`): as cpu_only does
        pytest.skip(refusal.group(0))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = dict(re.findall(r"^(call|stack|cross)\s+([0-9.]+\s+[0-9.]+)$", result.stdout, re.M))
    assert set(rows) == {"call", "stack", "cross"}, result.stdout
    (call_ms, call_ops), (stack_ms, stack_ops), (cross_ms, cross_ops) = (
        map(float, rows[name].split()) for name in ("call", "stack", "cross"))
    assert call_ms > 0 and stack_ms > 0 and cross_ms > 0
    assert cross_ops < stack_ops, result.stdout
    # per layer: the forward's allocations and the backward's, plus (call) the table lookup, bias rows and
    # padding counts of each call; 47 and 29 before the rows, counts and delta were shared or moved
    assert stack_ops < call_ops <= 24, result.stdout
    assert "stack / call" in result.stdout


@cpu_only
@pytest.mark.parametrize("checkpointed,mask", [(False, None), (True, None), (False, "bits")],
                         ids=["plain", "checkpointed", "dropout-bits"])
def test_a_model_on_the_triton_backend_traces_as_one_graph(checkpointed, mask, monkeypatch):
    """Under torch.compile (fullgraph) a t5_v11 model on the triton backend is one graph, its attention
    calls inside it, with activation checkpointing too: nothing traced mutates the stack's `FoldedBias`
    or `SharedInputs` (a mutation is an unsafe side effect inside a checkpoint, and dynamo then gave up
    on the layers). The kernels are replaced by no-ops: dynamo cannot trace the interpreter, and their
    results are the other tests' concern; the GPU test compiles them for real. With attention dropout
    from the bit mask, whose eager forward launches with a register cap (`forward_maxnreg`), no launch
    made while compiling passes ``maxnreg`` (not a launch option dynamo hands on to inductor)."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    def launch(*args, **kwargs):  # traced: what it raises fails the fullgraph compilation
        if "maxnreg" in kwargs:
            raise AssertionError("maxnreg passed to a launch under torch.compile")

    class NoLaunch:
        def __getitem__(self, grid):
            return launch

    for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_dropout_bits_kernel"):
        monkeypatch.setattr(tra, name, NoLaunch())
    attention_dropout = 0.0
    if mask is not None:
        monkeypatch.setattr(tra, "DROPOUT_MASK", mask)
        attention_dropout = 0.1
        assert tra.forward_maxnreg(4, True) is not None  # what an eager call would pass
    torch._dynamo.reset()
    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", dropout=0.0, attention_dropout=attention_dropout,
                                       attention_backend="triton", checkpoint_activations=checkpointed).train()
    src = torch.randint(4, len(d), (2, 19), generator=torch.Generator().manual_seed(0))
    src[1, -5:] = d.pad()
    prev = torch.randint(4, len(d), (2, 11), generator=torch.Generator().manual_seed(1))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    out = torch.compile(model, backend=backend, fullgraph=True)(src, None, prev)[0]
    out.float().sum().backward()
    assert len(graphs) == 1
    code = "\n".join(module.code for module in graphs[0].modules() if hasattr(module, "code"))
    # encoder and decoder self-attention, two layers each, and the decoder's cross-attention over the padded
    # source (the kernels without a bias)
    assert code.count("autograd_function_apply") >= 4 + len(model.decoder.layers), code.count("autograd_function_apply")
    torch._dynamo.reset()


@cpu_only
@pytest.mark.parametrize("scope", ["model", "layers"])
@pytest.mark.parametrize("far", ["none", "backward"])
def test_a_compiled_model_on_the_triton_backend_keeps_one_graph_over_batch_sizes_and_lengths(monkeypatch, scope,
                                                                                             far):
    """model.compile with model.compile_dynamic (the default): the first graph already has the batch
    and the lengths symbolic, and the triton backend's host code (bias rows, padding counts, grids,
    `SharedInputs`) specializes none of them, so batches of other sizes and length buckets, source
    and target, compile nothing more. (torch's automatic dynamic shapes made 3 graphs of this mix: a
    static one, then one per dimension that changed later; a size the host code turned into a Python
    int would add a graph per bucket, until the recompile limit sends training to eager mode.)
    Kernels replaced by no-ops, as above. With compile_scope=layers (gpu_check's bench_model_compiled):
    one graph per layer class, encoder and decoder, and none more. With the far loops (FAR_LOOPS'
    default), lengths past 4 (M + tile) are a class of their own (`far_loops_pay`, a guard on the
    length), each graph dynamic from its first bucket on (its first forward is marked: unmarked, it
    compiled a static graph, then again at the class's next bucket). compile_scope=layers: one graph
    more per layer class (long sources for the encoder layer, long targets for the decoder layer's
    self-attention); the whole forward (model): one per pair of classes met, 4 on this mix."""
    from fairseq.data import Dictionary
    from torch._dynamo import register_backend

    from ast_t5.models import AstT5Model
    from ast_t5.models.ast_t5_model import bucketed_length

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_dropout_bits_kernel"):
        monkeypatch.setattr(tra, name, NoLaunch())
    monkeypatch.setattr(tra, "FAR_LOOPS", far)
    if "ast_t5_test_triton_graphs" not in torch._dynamo.list_backends(exclude_tags=()):
        register_backend(_count_triton_graph, name="ast_t5_test_triton_graphs")
    graphs = _TRITON_GRAPHS
    torch._dynamo.reset()
    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0,
                                       attention_backend="triton", compile=True, compile_scope=scope,
                                       compile_backend="ast_t5_test_triton_graphs").train()
    del graphs[:]
    g = torch.Generator().manual_seed(0)
    reach = tra.FAR_LOOPS_MIN_LENGTH * (model.cfg.rel_pos_max_distance + max(
        tra.default_blocks(16, torch.device("cpu"), dtype=torch.float32)[:3]))
    shapes = [(4, 40, 10), (6, 100, 30), (3, 170, 20), (6, 230, 70), (2, 300, 140), (2, 500, 30), (2, 600, 60),
              (2, 700, 30), (2, 770, 60), (3, 100, 700), (2, 660, 650)]
    assert reach == 640 and all(max(lengths[1:]) <= reach for lengths in shapes[:7])  # padded to 16: at most 608
    # the first target fits one tile of the backward (one dQ program per row: n_blocks 1, which the table
    # gradient's reduction once specialized the graph on), the later ones do not
    tile = tra.default_blocks(16, torch.device("cpu"), dtype=torch.float32)[2]
    assert bucketed_length(shapes[0][2], model.cfg.compile_pad_multiple, 1024) <= tile < shapes[3][2]
    for rows, src_len, tgt_len in shapes:
        src = torch.randint(4, len(d), (rows, src_len), generator=g)
        src[0, -5:] = d.pad()
        prev = torch.randint(4, len(d), (rows, tgt_len), generator=g)
        model(src, None, prev)[0].float().sum().backward()
    assert len(graphs) == {("model", "none"): 1, ("layers", "none"): 2, ("model", "backward"): 4,
                           ("layers", "backward"): 4}[scope, far]
    code = "\n".join(module.code for g in graphs for module in g.modules() if hasattr(module, "code"))
    assert code.count("autograd_function_apply") >= (4 if scope == "model" else 2)  # the kernels' calls traced
    torch._dynamo.reset()


_TRITON_GRAPHS = []  # the graphs the test backend above received


def _count_triton_graph(gm, example_inputs):
    _TRITON_GRAPHS.append(gm)
    return gm


@cpu_only
def test_activation_checkpointing_recomputes_the_same_dropout_mask(backward):
    """checkpoint_activations=true recomputes each layer in backward: the kernel's seed comes from
    PyTorch's generator, whose state the checkpoint restores, so gradients with attention dropout
    are exactly those without checkpointing."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    kwargs = dict(arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.2, attention_backend="triton")
    plain = AstT5Model.from_dictionary(d, **kwargs).train()
    checkpointed = AstT5Model.from_dictionary(d, checkpoint_activations=True, **kwargs).train()
    checkpointed.load_state_dict(plain.state_dict())
    src = torch.randint(4, len(d), (2, 19), generator=torch.Generator().manual_seed(0))
    src[1, -5:] = d.pad()
    prev = torch.randint(4, len(d), (2, 11), generator=torch.Generator().manual_seed(1))
    for model in (plain, checkpointed):
        torch.manual_seed(3)
        model(src, None, prev)[0].logsumexp(-1).mean().backward()
    for p, p_ckpt in zip(plain.parameters(), checkpointed.parameters()):
        assert torch.equal(p.grad, p_ckpt.grad)


@cpu_only
def test_attention_benchmark_has_triton_rows_and_names_a_winner(tmp_path, monkeypatch):
    """bench_attention.py's CPU smoke run with the triton rows (interpreter): the kernel ran as
    itself (no fallback), its error is PyTorch's order, tile variants get their own rows, and
    every condition names a winner in the JSON. The tile rows give the backward its own warps
    (and stages); ``--split`` times each row's forward alone too, ``--kernel-times`` lists the
    triton rows' kernels (here the profiler's CPU operators). Every row has its host time; ``--graph``
    does nothing on CPU."""
    import json

    bench = load_benchmark("bench_attention", "bench_attention_triton")
    out = tmp_path / "attention.json"
    # the far rows run their far loops at this short length only with the length rule lifted
    assert "keep one loop" in bench.available("triton-far", torch.device("cpu"), 16, 24)
    monkeypatch.setattr(tra, "far_loops_pay", lambda *shape: True)
    far_launches = spy_launches(monkeypatch, "_bwd_dq_kernel", "FAR_LOOPS")
    bits_launches = spy_launches(monkeypatch, "_dropout_bits_kernel", "BLOCK")
    assert bench.main(["--backends", "sdpa", "triton", "triton-fused", "triton-frozen", "triton-far", "triton-bits",
                       "triton-one-loop", "triton-prebuilt",
                       "--triton-blocks", "16,16,16,4,3,2", "16,16,32,4,3,2,16,2", "fused:16,16,32,4,3,2,16,2",
                       "fused+far-all:16,16,16,4,3,2", "one-loop:16,16,16,4,3,2",
                       "--lengths", "24",
                       "--dropouts", "0", "0.1", "--padding", "padded", "--repeats", "1", "--warmup", "0",
                       "--split", "--kernel-times", "--graph", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    rows = {(r["backend"], r["dropout"]): r for r in payload["rows"]}
    # the dropout mask's bits: a row with dropout only (its kernels are the triton row's without), which ran
    # the bits kernel
    skipped = rows.pop(("triton-bits", 0.0))
    assert skipped["ms"] is None and skipped["note"] == "= triton (no dropout)", skipped
    assert rows[("triton-bits", 0.1)]["ms"] > 0 and bits_launches
    assert set(rows) == {(b, p) for b in ("sdpa", "triton", "triton-fused", "triton-frozen", "triton-far",
                                          "triton-one-loop", "triton-prebuilt",
                                          "triton:16x16x16x4x3x2", "triton:16x16x32x4x3x2x16x2",
                                          "triton-fused:16x16x32x4x3x2x16x2", "triton-fused-far-all:16x16x16x4x3x2",
                                          "triton-one-loop:16x16x16x4x3x2")
                         for p in (0.0, 0.1)} | {("triton-bits", 0.1)}
    assert True in far_launches and False in far_launches  # the far rows' dQ kernels walked far loops
    for (backend, dropout), row in rows.items():
        assert row["ms"] > 0 and row["pass"] == "fwd+bwd" and row["fwd_ms"] > 0, row
        assert row["host_ms"] > 0 and "graph_ms" not in row and "graph_note" not in row, row
        assert (backend == "sdpa") == ("kernels" not in row), row  # --kernel-times: the triton rows
        if backend != "sdpa":
            assert row["kernels"] and all(ms > 0 for ms in row["kernels"].values()), row
        if backend != "sdpa":
            assert row["ran"] == "triton-rpe", row
        if dropout == 0.0:
            assert row["err_ratio"] < 3.0, row
    assert len(payload["winners"]) == 2
    # what "triton" meant in this run: the module's settings and default tiles (FAR_LOOPS changed meaning once)
    assert payload["triton"]["FAR_LOOPS"] == tra.FAR_LOOPS and payload["triton"]["BACKWARD"] == tra.BACKWARD
    assert len(payload["triton"]["tiles"]) == 8
    # the frozen table's row leaves the table gradient out, the prebuilt row the stack's inputs: they are timed
    # beside the others, never winners
    assert all(w["backend"] not in ("triton-frozen", "triton-prebuilt") for w in payload["winners"])
    # and its dQ kernel really runs without the reduction (TABLE_GRAD off), where the triton row's has it
    launched = spy_launches(monkeypatch, "_bwd_dq_kernel", "TABLE_GRAD")
    case = bench.make_case(argparse.Namespace(batch=1, heads=2, head_dim=16), 24, True, torch.float32,
                           torch.device("cpu"))
    _, frozen = bench.step_fn("triton-frozen", *case, 0.0, True)()
    _, full = bench.step_fn("triton", *case, 0.0, True)()
    assert launched == [False, True] and len(frozen) == 3 and full[3] is not None
    for got, want in zip(frozen, full):
        assert torch.equal(got, want)  # the same q, k, v gradients
    # the prebuilt row: the same kernels and gradients, the table's included, while its calls after the first
    # build none of the stack's inputs (no bias rows: replicate pad; no padding counts: cumsum)
    prebuilt = bench.step_fn("triton-prebuilt", *case, 0.0, True)
    with count_ops() as first:
        _, grads = prebuilt()
    with count_ops() as second:
        _, again = prebuilt()
    with count_ops() as per_call:
        bench.step_fn("triton", *case, 0.0, True)()
    for got, want in zip(grads + again, full + full):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for ops in (first, per_call):
        assert {"aten.replication_pad1d.default", "aten.cumsum.default"} <= set(ops)
    assert not {"aten.replication_pad1d.default", "aten.cumsum.default"} & set(second)
    assert "aten.embedding_dense_backward.default" in second  # the table gradient, to the buckets
    # the triton row runs FAR_LOOPS' default (the far loops of the backward), the one-loop rows one loop, the
    # fused row one loop too (as it was measured), whatever the module's setting
    far = spy_launches(monkeypatch, "_bwd_dq_kernel", "FAR_LOOPS")
    for name in ("triton", "triton-one-loop", "triton-one-loop:16x16x16x4x3x2", "triton-far", "triton-fused"):
        bench.step_fn(name, *case, 0.0, True)()
    assert far == [True, False, False, True, False]
    with pytest.raises(SystemExit):  # one loop structure per tile row
        bench.parse_args(["--triton-blocks", "one-loop+far:16,16,16,4,3,2"])


@cpu_only
@pytest.mark.parametrize("T, S, blocks, ends", [
    (40, 40, SMALL, None),                 # several tiles, the last one partial
    (29, 45, SMALL, [45, 20]),             # T != S, right padding: a row's end inside a tile
    (37, 37, RECT, [37, 0]),               # 32 x 16 backward tiles; a row of padding alone gets zeros
])
def test_the_yardstick_kernels_compute_bias_free_attention(T, S, blocks, ends, monkeypatch):
    """benchmarks/triton_flash_baseline.py, the bias-free FlashAttention-2 kernels that bench_attention's
    triton-baseline row and compile_triton_rpe.py --baseline set beside the backend's: output and q, k, v
    gradients against fp64 softmax attention over each row's keys before kv_end, at the backend's tiles
    (here the interpreter's), fp32."""
    tfb = load_benchmark("triton_flash_baseline", "triton_flash_baseline_interpreted")
    monkeypatch.setattr(tra, "BLOCKS_OVERRIDE", blocks)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 32, generator=g).requires_grad_() for n in (T, S, S))
    grad = torch.randn(2, 2, T, 32, generator=g)
    kv_end = None if ends is None else torch.tensor(ends, dtype=torch.int32)
    got = fwd_bwd(lambda *x: tfb.baseline_attention(*x, kv_end, scale=0.3), [q, k, v], grad)

    def dense(qq, kk, vv):
        scores = qq @ kk.transpose(-1, -2) * 0.3
        if kv_end is not None:
            scores = scores.masked_fill(torch.arange(S)[None, None, None, :] >= kv_end.long()[:, None, None, None],
                                        float("-inf"))
        return torch.nan_to_num(scores.softmax(-1)) @ vv  # a row without keys: zeros, as the kernels give
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = fwd_bwd(dense, leaves, grad.double())
    assert max(max_errors(got, ref)) < 2e-5, max_errors(got, ref)
    if ends is not None and 0 in ends:
        for tensor in got:
            assert not tensor[1].any()  # out, dq, dk, dv of the batch row without keys
    # the benchmark turns its right-padded masks into kv_end; any other padding is refused
    pad = torch.arange(S)[None, :] >= torch.tensor([S, S // 2])[:, None]
    assert tfb.kv_end_from_padding(pad).tolist() == [S, S // 2]
    with pytest.raises(ValueError, match="right padding only"):
        tfb.kv_end_from_padding(pad.flip(-1))
    with pytest.raises(ValueError, match="powers of two"):
        tfb.baseline_attention(q[..., :24], k[..., :24], v[..., :24])


@cpu_only
def test_the_attention_benchmark_times_the_yardstick_beside_the_triton_row():
    """bench_attention's triton-baseline row: the yardstick's own kernels (not a backend's), bias-free
    gradients equal to the bias-free reference's, no row with dropout, and never a winner."""
    bench = load_benchmark("bench_attention", "bench_attention_yardstick")
    case = bench.make_case(argparse.Namespace(batch=2, heads=2, head_dim=16), 24, True, torch.float32,
                           torch.device("cpu"))
    ab.DISPATCH_COUNTS.clear()
    out, grads = bench.step_fn("triton-baseline", *case, 0.0, True)()
    assert not ab.DISPATCH_COUNTS  # nothing went through `attention`
    ref_out, ref_grads = bench.step_fn("eager-nobias", *case, 0.0, True)()
    assert grads[3] is None and (out - ref_out).abs().max() < 1e-5
    for got, want in zip(grads[:3], ref_grads[:3]):
        assert (got - want).abs().max() < 1e-5
    assert bench.step_fn("triton-baseline", *case, 0.1, True) is None
    assert bench.available("triton-baseline", torch.device("cpu"), 24) == \
        "head size 24: the baseline takes powers of two >= 16"
    rows = [dict(backend=name, ms=ms, length=24, dropout=0.0, padded=True, ran=ran)
            for name, ms, ran in (("triton-baseline", 1.0, "triton-baseline"), ("triton", 2.0, "triton-rpe"))]
    assert bench.condition_winner(rows)["backend"] == "triton"


def compile_check(*options) -> tuple:
    """benchmarks/compile_triton_rpe.py --arch 90 --head-dims 64 with ``options``, in a process without
    TRITON_INTERPRET: (its stdout, its table's rows as dicts keyed by the header). Fails on a nonzero exit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "compile_triton_rpe.py")
    proc = subprocess.run([sys.executable, script, "--arch", "90", "--head-dims", "64", *options], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    header = next(line.split() for line in proc.stdout.splitlines() if line.startswith("arch"))
    rows = [dict(zip(header, line.split())) for line in proc.stdout.splitlines() if line.strip().startswith("90")]
    return proc.stdout, rows


# Run in a process of its own without TRITON_INTERPRET (the kernels must be Triton's JIT functions, as
# torch.compile sees them): Triton's driver is replaced by one that names an sm90 target, every launch of
# the backend is recorded instead of run, and torch's analysis of user Triton kernels (what inductor does
# with a launch traced into a compiled graph) says which tensor arguments each launch writes.
_WRITTEN_SCRIPT = r"""
import json, sys
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

class Sm90:
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def __getattr__(self, name): raise AttributeError(name)
driver.set_active(Sm90())
from torch._higher_order_ops import triton_kernel_wrap as wrap
from ast_t5.modules import triton_rpe_attention as tra

OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg"}
launches = []
class Record:
    def __init__(self, name):
        self.name, self.real = name, getattr(tra, name)
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = dict(zip(self.real.arg_names, args))
            named.update({k: v for k, v in kwargs.items() if k not in OPTIONS})
            launches.append((self.name, self.real, named))
        return launch
for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_dropout_bits_kernel"):
    setattr(tra, name, Record(name))
tra.unsupported_reason = lambda *args: None  # CPU tensors stand for CUDA ones: nothing runs
tra.far_loops_pay = lambda *shape: True

def written(kernel, kwargs):  # torch 2.13's analysis, or 2.11's (the GPU host's)
    if hasattr(wrap, "identify_accessed_tensors"):
        found = wrap.identify_accessed_tensors(kernel, kwargs, {})
        return sorted(d.name for d in found.read_writes.writes if isinstance(kwargs.get(d.name), torch.Tensor))
    return sorted(wrap.identify_mutated_tensors(kernel, kwargs, {}))

result = {}
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 2, 512, 64, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(3))
table = torch.randn(2, 257).requires_grad_()
kpm = torch.zeros(2, 512, dtype=torch.bool)
kpm[1, -5:] = True
for structure, far, mask, p in json.loads(sys.argv[1]):
    tra.BACKWARD, tra.FAR_LOOPS, tra.DROPOUT_MASK = structure, far, mask
    launches.clear()
    out = tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, dropout_p=p,
                                   blocks=(64, 64, 64, 4, 2, 4, 64, 2))
    out.backward(torch.ones_like(out))
    result[f"{structure} {far} {mask} {p}"] = [[name, written(kernel, kwargs)] for name, kernel, kwargs in launches]
    # from a packed (B, T, 3, H, D) projection: the split backward's dQ kernel writes dQ into the buffer the dK/dV
    # kernel writes dK and dV into (`_gradient_layout`), the one tensor each launch is given
    launches.clear()
    x = torch.randn(2, 512, 3 * 2 * 64, generator=g).to(torch.bfloat16).requires_grad_()
    qkv = (x * 1.0).view(2, 512, 3, 2, 64)
    out = tra.triton_rpe_attention(*tra.unpack_qkv(qkv), table, key_padding_mask=kpm, dropout_p=p,
                                   blocks=(64, 64, 64, 4, 2, 4, 64, 2), packed=qkv)
    out.backward(torch.ones_like(out))
    named = {name: kwargs for name, _, kwargs in launches}
    shared = named["_bwd_dq_kernel"]["DQ"] is named["_bwd_dkdv_kernel"]["DKV"]
    assert shared == (structure == "split") and named["_bwd_dkdv_kernel"]["DKV"].dim() == 1
    result[f"{structure} {far} {mask} {p} packed"] = [[name, written(kernel, kwargs)]
                                                      for name, kernel, kwargs in launches]
print(json.dumps(result))
"""


def _torch_and_triton():
    import re

    versions = [torch.__version__, getattr(triton, "__version__", "0.0") if triton is not None else "0.0"]
    return [tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", v).groups()) for v in versions]


@pytest.mark.skipif(_torch_and_triton()[0] < (2, 12) and _torch_and_triton()[1] >= (3, 9),
                    reason="torch 2.11's analysis of user Triton kernels cannot parse Triton 3.9's (a CPU torch "
                           "with the newest Triton; a GPU host's torch pins the Triton it analyses)")
def test_inductor_sees_each_launch_write_only_its_outputs():
    """What torch.compile does with the backend's launches, checked without a GPU: inductor's analysis
    of a user Triton kernel (torch's own code, given an sm90 target) finds which tensor arguments each
    launch writes, and copies nothing else. Each kernel writes only its outputs: the forward O and the
    log-sum-exp; the split backward's dQ kernel dQ, the table's partial sums and delta, its dK/dV kernel
    the one buffer of dK and dV (with a packed projection, the buffer dQ went to as well: one flat tensor
    written by both launches, `_gradient_layout`); the fused backward's dK/dV kernel that buffer, the fp32 dQ
    accumulator and the far sums, its band
    kernel the table's partial sums; the dropout bits kernel its bits; with the bias rows and with the bias
    tiles (`BIAS_LAYOUT`; a version reading the far tiles' bias in a helper given PD had the dK/dV kernel
    write PD, found 2026-11-27). When the analysis fails (a launch
    leaving out a defaulted argument: the dQ kernel's BAND_WEIGHTS until 2026-11-26), it takes every tensor
    argument as written, and the compiled graph clones q, k, v, O, dO, ... around every call; this test
    then fails."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    structures = [("split", "none", "philox", 0.0), ("split", "all", "bits", 0.1), ("fused", "backward", "philox", 0.1)]
    written = {}
    for layout in ("rows", "tiles"):  # `BIAS_LAYOUT`: the bias read from its rows, or whole from its tiles
        proc = subprocess.run([sys.executable, "-c", _WRITTEN_SCRIPT, json.dumps(structures)],
                              env=dict(env, AST_T5_TRITON_BIAS_LAYOUT=layout), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "identify" not in proc.stderr, proc.stderr[-3000:]  # torch's warning when its analysis fails
        written.update({f"{key} {layout}": launches
                        for key, launches in json.loads(proc.stdout.strip().splitlines()[-1]).items()})
    outputs = {"_fwd_kernel": ["LSE", "O"], "_dropout_bits_kernel": ["BITS"]}
    split = dict(outputs, _bwd_dq_kernel=["DELTA", "DQ", "DTAB"], _bwd_dkdv_kernel=["DKV"])
    fused = dict(outputs, _bwd_dq_kernel=["DTAB"], _bwd_dkdv_kernel=["DKV", "DQACC", "FAR"])
    assert sum(" packed " in key for key in written) == 2 * len(structures)  # (keys end with the layout)
    for key, launches in written.items():
        expected = fused if key.startswith("fused") else split
        assert launches and all(found == expected[name] for name, found in launches), (key, launches)
    assert [name for name, _ in written["split all bits 0.1 tiles"]][0] == "_dropout_bits_kernel"


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_the_fp32_tiles_compile_without_spilling_kilobytes():
    """fp32 calls (``attention_backend=triton`` in fp32, and the GPU tests) at their own default tiles: at
    the half-precision tiles the sm90 D 64 dK/dV kernel with dropout spilled 13.6 KB per thread (and every
    kernel took 3-4x longer to compile); at fp32's, tens of bytes at most."""
    stdout, lines = compile_check("--variants", "padded-dropout", "--dtype", "fp32")
    assert sorted(line["kernel"] for line in lines) == ["dkdv", "dq", "fwd"], stdout
    assert all(int(line["stack"]) <= 64 for line in lines), stdout  # Triton 3.9: 40 bytes in dK/dV, 3.6: 8
    assert {line["tiles"] for line in lines} == {"32x32/4w2s"}, stdout


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_kernels_compile_for_hopper_as_the_jit_does_on_wgmma_with_pipelined_loads_several_per_sm():
    """What the interpreter cannot check: the kernels compile for sm90 (Triton's compiler and
    bundled ptxas, no GPU needed; in a process without TRITON_INTERPRET), specialized as the JIT
    specializes them, and at the default tiles, with key padding, with and without dropout (and
    the table gradient): they run their matrix products on wgmma and pipeline their loads, the
    forward's loop has no layout conversion through shared memory, every exponential is a single
    ex2 instruction, an SM holds at least 2 programs of each kernel (what made the default tiles
    faster on the H200: `default_blocks`), ptxas does not serialize the products, and without
    dropout nothing spills. (With dropout the backward spills a few bytes at these tiles and was
    faster anyway.)"""
    stdout, every = compile_check("--variants", "padded", "padded-dropout", "--baseline")
    lines = [line for line in every if not line["kernel"].startswith("base-")]
    # the yardstick (triton_flash_baseline.py, --baseline) at the same tiles: padded only (it has no dropout),
    # on wgmma with pipelined loads and unserialized products, and fewer instructions per element than ours
    base = {line["kernel"][len("base-"):]: line for line in every if line["kernel"].startswith("base-")}
    assert sorted(base) == ["dkdv", "dq", "fwd"] and {line["variant"] for line in base.values()} == {"padded"}, stdout
    for kernel, line in base.items():
        ours = next(o for o in lines if o["variant"] == "padded" and o["kernel"] == kernel)
        assert (line["mma"], line["pipe"], line["ser"], line["stack"]) == ("wgmma", "yes", "no", "0"), stdout
        assert line["tiles"] == ours["tiles"] and float(line["i/el"]) < float(ours["i/el"]), stdout
    assert sorted((line["variant"], line["kernel"]) for line in lines) == [
        (variant, kernel) for variant in ("padded", "padded-dropout") for kernel in ("dkdv", "dq", "fwd")], stdout
    assert {line["mma"] for line in lines} == {"wgmma"} and {line["pipe"] for line in lines} == {"yes"}, stdout
    # the forward's loop sends no tile through shared memory (the bias is staged asynchronously)
    assert {line["conv"] for line in lines if line["kernel"] == "fwd"} == {"0"}, stdout
    # every exponential is one ex2.approx.ftz (scores in log2 units, tl.exp2), in all three kernels
    assert {line["ex2"] for line in lines} == {"ftz"}, stdout
    assert min(int(line["occ"]) for line in lines) >= 2, stdout
    assert {line["stack"] for line in lines if line["variant"] == "padded"} == {"0"}, stdout
    # ptxas overlaps the matrix products (every sm90 dQ kernel had them serialized until 2026-11-26)
    assert {line["ser"] for line in lines} == {"no"}, stdout
    # the bias rows, aligned to 4 bytes, are gathered 4 bytes at a time (pipelined)
    assert {line["bias"] for line in lines} == {"4"}, stdout
    for summary in ("0 kernel(s) without pipelined loads", "0 sm90 kernel(s) without wgmma",
                    "0 kernel(s) whose wgmma ptxas serializes",
                    "0 kernel(s) needing more shared memory", "0 kernel(s) with full-range exponentials"):
        assert summary in stdout, stdout


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_the_bias_rows_are_gathered_4_bytes_at_a_time_whatever_the_lengths():
    """A tile row's bias starts at any entry of its head's row (query i's at OFF - i), so the gather is
    aligned to 4 bytes only. With T = 1025 and S = 1024 the rows' offset and length used to be multiples
    of 16 (1088 and 2176 at 64-row tiles), the launch marked both divisible, and Triton's alignment
    analysis then took OFF - arange for 16-byte aligned: the forward and dQ kernels copied the bias 16
    bytes at a time (a misaligned-address fault on a GPU; `compile_triton_rpe.bias_copies`). `_bias_rows`
    now makes OFF odd."""
    stdout, lines = compile_check("--variants", "plain", "--length", "1025", "--keys", "1024")
    assert [line["kernel"] for line in lines] == ["fwd", "dkdv", "dq"], stdout
    assert {line["bias"] for line in lines} == {"4"}, stdout
    assert "0 kernel(s) without 4-byte bias copies" in stdout, stdout


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_whole_bias_tiles_compile_for_hopper_with_16_byte_copies_and_no_gather():
    """`BIAS_LAYOUT` "tiles" for sm90 at the default tiles, with and without padding (no dropout): each
    kernel's bias goes 16 bytes at a time (none of the gather's 4-byte copies left), its loads pipelined,
    wgmma not serialized, 2 or more programs per SM. (No spill under Triton 3.6, the GPU host's; under 3.9
    the dQ kernel, at 255 registers with the rows, spills 8 bytes with the tiles.)"""
    stdout, tiles = compile_check("--variants", "plain", "padded", "--bias-layout", "tiles")
    assert [r["kernel"] for r in tiles] == ["fwd", "dkdv", "dq"] * 2, stdout
    assert "0 kernel(s) still copying 4 bytes at a time or unpipelined" in stdout, stdout
    for row in tiles:  # (the rows' gather copies 4 bytes at a time: test_the_bias_rows_are_gathered_4_bytes...)
        assert row["bias"] == "16", row
        assert row["mma"] == "wgmma" and row["pipe"] == "yes" and row["ser"] == "no", row
        assert int(row["occ"]) >= 2 and int(row["stack"]) <= 8, row


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_the_kernels_reading_dropout_bits_compile_for_hopper_without_spills_and_fewer_instructions():
    """`DROPOUT_MASK` = "bits" for sm90 at the default tiles, padded with dropout: every kernel still runs
    wgmma with pipelined loads and no serialized product, 2 or more programs per SM, no more spill than
    with Philox (none at all under Triton 3.6, the GPU host's, where the dQ kernel spills 56 bytes with
    Philox), and each kernel's loop issues fewer instructions per element than with Philox; the forward,
    under its register cap (`BITS_FORWARD_MAXNREG`), holds as many programs per SM as with Philox (at
    the price of a 16-byte spill under Triton 3.9, none under 3.6); the bits kernel compiles too."""
    philox_out, philox = compile_check("--variants", "padded-dropout", "--dropout-mask", "philox")
    stdout, bits = compile_check("--variants", "padded-dropout", "--dropout-mask", "bits")
    assert "dropout mask bits" in stdout and "dropout mask philox" in philox_out
    assert re.search(r"# 90 dropout bits kernel .*: \d+ registers, [0-9.]+ SASS instructions per mask element", stdout)
    assert [r["kernel"] for r in bits] == [r["kernel"] for r in philox] == ["fwd", "dkdv", "dq"]
    for row, before in zip(bits, philox):
        assert row["mma"] == "wgmma" and row["pipe"] == "yes" and row["ser"] == "no", row
        assert int(row["occ"]) >= 2, row
        if row["kernel"] == "fwd":
            assert int(row["stack"]) <= 16 and int(row["occ"]) >= int(before["occ"]), (row, before)
        else:
            assert int(row["stack"]) <= int(before["stack"]), (row, before)
        assert float(row["i/el"]) < float(before["i/el"]), (row, before)


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_the_band_tiles_diagonal_sums_against_weights_take_fewer_instructions_without_spilling():
    """`_band_tile`'s WEIGHTS at sm90's default (square) tiles: without dropout, the dQ kernel (split
    backward) and the band kernel (fused backward) issue at least 1 fewer instruction per element in
    their loop than with the masked sum (`--band-weights off`; about 2 under Triton 3.6, 1.5 under 3.9),
    spill nothing and hold as many programs per SM; with dropout, where the weights' registers would
    spill, the dQ kernel is the same either way."""
    options = ("--variants", "plain", "padded", "padded-dropout", "--kernels", "dq")
    _, split_on = compile_check(*options)
    _, split_off = compile_check(*options, "--band-weights", "off")
    fused = ("--variants", "padded", "--backward", "fused", "--kernels", "band")
    _, fused_on = compile_check(*fused)
    _, fused_off = compile_check(*fused, "--band-weights", "off")
    on, off = split_on + fused_on, split_off + fused_off
    assert [(r["variant"], r["kernel"]) for r in on] == [(r["variant"], r["kernel"]) for r in off] == [
        ("plain", "dq"), ("padded", "dq"), ("padded-dropout", "dq"), ("padded", "band")]
    for row, before in zip(on, off):
        if row["variant"] == "padded-dropout":
            assert {k: v for k, v in row.items() if k != "s"} == {k: v for k, v in before.items() if k != "s"}
            continue
        assert float(row["i/el"]) <= float(before["i/el"]) - 1, (row, before)
        assert row["stack"] == "0" and row["occ"] == before["occ"], (row, before)


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_the_fused_backward_compiles_for_hopper_on_overlapped_wgmma_with_pipelined_loads():
    """The fused backward's two kernels (`BACKWARD` = "fused": dK/dV adding dQ atomically, and the band
    kernel) at sm90's default tiles, with key padding, with and without dropout: wgmma whose products
    ptxas does not serialize, pipelined loads, single-instruction exponentials, 2 programs per SM, and
    the bias gathered in pipelined 4-byte copies (the band kernel's bias feeds no matrix product, and
    was loaded synchronously until its loop gave its stages explicitly: `_dq_tiles`' LOOP_STAGES)."""
    stdout, lines = compile_check("--variants", "padded", "padded-dropout", "--backward", "fused")
    assert sorted((line["variant"], line["kernel"]) for line in lines) == [
        (variant, kernel) for variant in ("padded", "padded-dropout") for kernel in ("band", "dkdv+dq", "fwd")]
    assert {line["mma"] for line in lines} == {"wgmma"} and {line["pipe"] for line in lines} == {"yes"}, stdout
    assert {line["ex2"] for line in lines} == {"ftz"} and {line["ser"] for line in lines} == {"no"}, stdout
    assert min(int(line["occ"]) for line in lines) >= 2, stdout
    assert {line["bias"] for line in lines} == {"4"}, stdout


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_the_far_loops_compile_for_hopper_without_serialized_products():
    """`FAR_LOOPS` = "all" at sm90's default tiles, with key padding, with and without dropout: each
    kernel's two loops run wgmma that ptxas does not serialize (a loop that may run no iteration made
    it serialize them: `_far_tiles`), pipeline their loads, and do each tile's element-wise work once per
    loop copy; 2 programs per SM at least; each far loop smaller than the band loop (no bias gather)."""
    stdout, lines = compile_check("--variants", "padded", "padded-dropout", "--far-loops", "all")
    assert sorted((line["variant"], line["kernel"]) for line in lines) == [
        (variant, kernel) for variant in ("padded", "padded-dropout") for kernel in ("dkdv", "dq", "fwd")]
    assert {line["mma"] for line in lines} == {"wgmma"} and {line["pipe"] for line in lines} == {"yes"}, stdout
    assert {line["ex2"] for line in lines} == {"ftz"} and {line["ser"] for line in lines} == {"no"}, stdout
    assert {line["dup"] for line in lines if line["kernel"] != "fwd"} == {"1.0"}, stdout
    assert min(int(line["occ"]) for line in lines) >= 2, stdout
    assert all(float(line["far"]) < float(line["i/el"]) for line in lines), stdout
    assert {line["bias"] for line in lines} == {"4"}, stdout  # the band loops' gather


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_the_bias_free_kernels_compile_for_hopper_as_the_yardstick_s_loops_with_a_padding_test():
    """``--no-bias`` (HAS_BIAS off, how the triton backend launches bias-free padded calls) beside the
    yardstick at sm90's default tiles: no spill, wgmma not serialized, loads pipelined; the dQ kernel, whose
    table gradient held the biased one at 2 programs per SM, at the yardstick's 4; each loop within 3.5
    instructions per element of the yardstick's (its padding test of each tile)."""
    stdout, lines = compile_check("--variants", "padded", "--no-bias", "--baseline")
    by = {line["kernel"]: line for line in lines}
    assert sorted(by) == ["base-dkdv", "base-dq", "base-fwd", "dkdv", "dq", "fwd"], stdout
    assert {line["mma"] for line in lines} == {"wgmma"} and {line["pipe"] for line in lines} == {"yes"}, stdout
    assert {line["ser"] for line in lines} == {"no"} and {line["stack"] for line in lines} == {"0"}, stdout
    assert by["dq"]["occ"] == by["base-dq"]["occ"] == "4", stdout
    for kernel in ("fwd", "dkdv", "dq"):
        assert float(by[kernel]["i/el"]) <= float(by[f"base-{kernel}"]["i/el"]) + 3.5, stdout


def test_wgmma_serialized_reads_ptxas_performance_warning():
    """The compile check's ``ser`` column: ptxas's C7515 note, which it prints when it makes every
    wgmma of a kernel wait for the previous one."""
    serialized = load_benchmark("compile_triton_rpe").wgmma_serialized
    log = ("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
           "to non wgmma instructions defining accumulator registers of a wgmma between start and end of the "
           "pipeline stage in the function '_bwd_dq_kernel'\nptxas info    : Used 227 registers, used 1 barriers\n")
    assert serialized(log) == ("non wgmma instructions defining accumulator registers of a wgmma between start "
                               "and end of the pipeline stage")
    assert serialized("ptxas info    : Used 134 registers, used 1 barriers\n") is None
    assert serialized("") is None


def test_resident_programs_follows_the_occupancy_rules():
    """The compile check's ``occ`` column: programs per SM from registers (per warp, in units of
    256, from four 16 K partitions), shared memory (plus 1 KB per block) and warps."""
    occ = load_benchmark("compile_triton_rpe").resident_programs
    assert occ(90, 255, 80000, 4) == 2  # 256 x 32 = 8 K registers a warp: 2 warps per partition
    assert occ(90, 240, 140000, 8) == 1  # 240 x 32: 2 warps per partition, one 8-warp block
    assert occ(90, 128, 57344, 4) == 4  # registers allow 8, shared memory 4 (57 + 1 KB each)
    assert occ(90, 129, 1000, 4) == 3  # 136 x 32 a warp: 3 per partition, 12 warps
    assert occ(90, 32, 0, 1) == 32  # the block limit
    assert occ(90, 32, 0, 32) == 2  # the warp limit (64)
    assert occ(86, 128, 40000, 4) == 2  # ~100 KB of shared memory on sm86
    assert occ(90, 128, 240000, 4) == 0  # over the SM's shared memory


@pytest.mark.skipif(CUDA, reason="CUDA host: the GPU tests compile and run the kernels")
def test_every_tile_candidate_of_the_gpu_check_fits_hopper_shared_memory():
    """scripts/gpu_check.sh's triton_tiles step times these tiles on the H100: one needing more
    shared memory than a block may have there fails at launch instead of giving a figure."""
    gpu_check = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_check.sh")
    found = re.search(r"^TRITON_TILES=\$\{GPU_CHECK_TRITON_TILES:-([0-9a-z:,+ -]+)\}$", open(gpu_check).read(), re.M)
    assert found, "gpu_check.sh: no TRITON_TILES default"
    candidates = found.group(1).split()
    prefix = r"((fused|far|far-all)(\+(fused|far|far-all))*:)?"
    assert len(candidates) >= 3 and all(re.fullmatch(prefix + r"[0-9,]+", c) for c in candidates), candidates
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "compile_triton_rpe.py")
    groups = {}  # (backward, far loops) -> tiles: the kernels each prefix runs (bench_attention's --triton-blocks)
    for candidate in candidates:
        flags = set(candidate.split(":")[0].split("+")) if ":" in candidate else set()
        far = "all" if "far-all" in flags else "backward" if "far" in flags else "none"
        groups.setdefault(("fused" if "fused" in flags else "split", far), []).append(candidate.split(":")[-1])
    for (structure, far), tiles in groups.items():
        proc = subprocess.run([sys.executable, script, "--arch", "90", "--head-dims", "64", "--variants",
                               "padded-dropout", "--backward", structure, "--far-loops", far, "--blocks", *tiles],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert sum(line.strip().startswith("90") for line in proc.stdout.splitlines()) == 3 * len(tiles)
        assert "0 kernel(s) needing more shared memory than their GPU has" in proc.stdout, proc.stdout


def test_the_compile_check_specializes_arguments_as_triton_jit_does():
    """Without these attributes the compiler cannot vectorize or pipeline the loads, and reports
    registers of a kernel that never runs (the check did that until 2026-11-23)."""
    compile_check = load_benchmark("compile_triton_rpe")
    ints = compile_check.call_integers(64, 1000, 12)
    signature = compile_check._signature(tra._fwd_kernel, "bf16", {"BLOCK_M": 128})
    attrs = compile_check.jit_attributes(tra._fwd_kernel, signature, ints)
    marked = {tra._fwd_kernel.arg_names[i[0]] for i in attrs}
    assert {"Q", "K", "V", "O", "LSE", "sq_t", "sk_h", "so_b", "D"} <= marked
    assert not {"H", "T", "S", "scale", "dropout_p", "BLOCK_M"} & marked  # 12, 1000: not multiples of 16
    assert all(value == [["tt.divisibility", 16]] for value in attrs.values())



def test_the_compile_check_refuses_a_kernel_its_options_do_not_compile(monkeypatch, capsys):
    """``--kernels`` names kernels of the backward and yardstick the other options choose; asking for
    one they do not give is a one-line error naming those that they do, not an empty table."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    parse_args = load_benchmark("compile_triton_rpe").parse_args
    assert parse_args(["--kernels", "dq", "fwd"]).kernels == ["dq", "fwd"]
    assert parse_args(["--backward", "fused", "--kernels", "band"]).kernels == ["band"]
    assert parse_args(["--baseline", "--kernels", "base-dq"]).kernels == ["base-dq"]
    for argv, wrong in ((["--kernels", "band"], "band"), (["--backward", "fused", "--kernels", "dq"], "dq"),
                        (["--kernels", "base-fwd"], "base-fwd")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        err = capsys.readouterr().err
        assert f"--kernels {wrong}: not compiled with" in err and "these options give: " in err, err


def test_loop_conversions_counts_shared_memory_round_trips_inside_loops_only():
    """The compile check's ``conv`` column: a layout conversion of a tile between two register
    layouts, or a store of a register tile into shared memory, inside a loop body (nested regions
    included); not the register-only conversion into the dot-operand layout of the same MMA
    layout, nor anything outside the loop."""
    count = load_benchmark("compile_triton_rpe").loop_conversions
    ttgir = """
    %a = ttg.convert_layout %x : tensor<64x64xf32, #blocked> -> tensor<64x64xf32, #mma> loc(#loc1)
    %r:2 = scf.for %i = %c0 to %n step %c64 iter_args(%u = %z) -> (tensor<64x64xf32, #mma>) {
      %b = ttg.convert_layout %y : tensor<64x64xf32, #blocked> -> tensor<64x64xf32, #mma> loc(#loc2)
      %c = ttg.convert_layout %p : tensor<64x64xbf16, #mma> -> \
tensor<64x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> loc(#loc3)
      %d = ttg.convert_layout %p : tensor<64x64xbf16, #mma1> -> \
tensor<64x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> loc(#loc4)
      %e = scf.if %flag -> (tensor<64x64xf32, #mma>) {
        %f = ttg.local_alloc %p : (tensor<64x64xbf16, #mma>) -> !ttg.memdesc<64x64xbf16, #shared, #smem> loc(#loc5)
        scf.yield %u : tensor<64x64xf32, #mma> loc(#loc6)
      } else {
        scf.yield %u : tensor<64x64xf32, #mma> loc(#loc7)
      } loc(#loc8)
      %g = ttg.local_alloc : () -> !ttg.memdesc<3x64x64xbf16, #shared, #smem, mutable> loc(#loc9)
      scf.yield %e : tensor<64x64xf32, #mma> loc(#loc10)
    } loc(#loc11)
    %h = ttg.convert_layout %r : tensor<64x64xf32, #mma> -> tensor<64x64xf32, #blocked> loc(#loc12)
    """
    assert count(ttgir) == 3  # %b (blocked -> mma), %d (another MMA layout's operand), %f (a tile stored)
    same_parent = ttgir.replace("parent = #mma, kWidth = 2}>> loc(#loc4)", "parent = #mma1, kWidth = 2}>> loc(#loc4)")
    assert count(same_parent) == 2


def test_loop_instructions_counts_the_largest_loop_body_of_a_sass_listing():
    """The compile check's ``i/el`` column: the instructions from a backward branch's target to
    the branch (both included), the largest such loop, its inner branches counted."""
    count = load_benchmark("compile_triton_rpe").loop_instructions
    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                      /* 0x0000000000007919 */
        /*0020*/                   FFMA R2, R3, R4, R5 ;                   /* 0x0000000403027223 */
        /*0030*/              @!P0 BRA 0x60 ;                              /* 0x0000000000088947 */
        /*0040*/                   MUFU.EX2 R6, R2 ;                       /* 0x0000000200067308 */
        /*0050*/                   FADD R7, R6, R7 ;                       /* 0x0000000706077221 */
        /*0060*/                   ISETP.GE.AND P1, PT, R8, R9, PT ;       /* 0x000000090800720c */
        /*0070*/              @!P1 BRA `(.L_x_1) ;                         /* 0x0000000000008947 */
        /*0080*/               @P1 BRA 0x20 ;                              /* 0xffffffffff941947 */
        /*0090*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;  /* 0x0000000004187df0 */
        /*00a0*/                   BRA 0x90 ;                              /* 0xfffffffc00fc7947 */
        /*00b0*/                   EXIT ;                                  /* 0x000000000000794d */
    """
    assert count(sass) == 7  # 0x20 .. 0x80; the 2-instruction loop at 0x90 is smaller
    assert count(sass.replace("@P1 BRA 0x20", "@P1 BRA 0xb0")) == 2  # a forward branch is no loop
    assert count("") == 0
    assert load_benchmark("compile_triton_rpe").loop_sizes(sass) == [7, 2]  # every loop, largest first


# --------------------------------------------------------------------------------------- GPU
@requires_cuda
def test_gpu_runs_the_compiled_kernels_not_the_interpreter():
    assert not tra.INTERPRETED, "TRITON_INTERPRET=1 was set when the kernels were imported on a GPU host"
    q, k, v, table, _ = make(1, 2, 64, 64, 64, 8, dtype=torch.bfloat16, device="cuda")
    ab.DISPATCH_COUNTS.clear()
    ab.attention(q, k, v, bias=RelativeBias(table, 64, 64), backend="triton").sum().backward()
    assert ab.DISPATCH_COUNTS["triton-rpe"] == 1 and ab.DISPATCH_COUNTS["sdpa-masked-no-cudnn"] == 0


@requires_cuda
@pytest.mark.parametrize("length,causal,pad", [(512, False, True), (1024, False, False), (1000, True, True),
                                               (576, False, True)])  # 576 % 128 == 64: cuDNN's bad case
def test_gpu_bf16_within_a_small_multiple_of_torchs_bf16_error(length, causal, pad, backward, far_loops):
    M = 128
    q, k, v, table, kpm = make(2, 4, length, length, 64, M, dtype=torch.bfloat16, pad=pad, device="cuda")
    grad = torch.randn(q.shape, device="cuda").bfloat16()
    got = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, causal=causal),
                  [q, k, v, table], grad)
    wide = [t.detach().float().requires_grad_() for t in (q, k, v, table)]
    ref = fwd_bwd(lambda *x: tra.reference_attention(*x, key_padding_mask=kpm, causal=causal), wide, grad.float())
    own_leaves = [t.detach().requires_grad_() for t in (q, k, v, table)]
    own = fwd_bwd(lambda *x: tra.reference_attention(*x, key_padding_mask=kpm, causal=causal), own_leaves, grad)
    for name, err, own_err in zip("out dq dk dv dtable".split(), max_errors(got, ref), max_errors(own, ref)):
        assert err <= 4 * own_err + 1e-3, (name, err, own_err)


@requires_cuda
@pytest.mark.parametrize("T,S", [(128, 500), (1000, 1000)])  # a decoder's cross-attention; a long padded call
def test_gpu_bias_free_padded_calls_within_a_small_multiple_of_torchs_bf16_error(T, S, backward):
    """The triton backend's bias-free call with padded keys, compiled: the kernels without a bias ran (not
    flash, not the interpreter), and output and q, k, v gradients are within a small multiple of PyTorch's
    own bf16 error against the fp32 reference; with dropout 0.1, the reference under the kernels' mask."""
    q, k, v, _, kpm = make(2, 4, T, S, 64, 4, dtype=torch.bfloat16, pad=True, device="cuda")
    grad = torch.randn(q.shape, device="cuda").bfloat16()
    zero = torch.zeros(4, 3, device="cuda")

    def ref_fn(*x, keep=None, p=0.0):
        return tra.reference_attention(*x, zero.to(x[0].dtype), key_padding_mask=kpm, keep_mask=keep, dropout_p=p)

    ab.DISPATCH_COUNTS.clear()
    got = fwd_bwd(lambda *x: ab.attention(*x, key_padding_mask=kpm, backend="triton"), [q, k, v], grad)
    assert ab.DISPATCH_COUNTS["triton-nobias"] == 1 and not tra.INTERPRETED, dict(ab.DISPATCH_COUNTS)
    ref = fwd_bwd(ref_fn, [t.detach().float().requires_grad_() for t in (q, k, v)], grad.float())
    own = fwd_bwd(ref_fn, [t.detach().requires_grad_() for t in (q, k, v)], grad)
    for name, err, own_err in zip("out dq dk dv".split(), max_errors(got, ref), max_errors(own, ref)):
        assert err <= 4 * own_err + 1e-3, (name, err, own_err)
    torch.manual_seed(3)
    got = fwd_bwd(lambda *x: ab.attention(*x, key_padding_mask=kpm, dropout_p=0.1, backend="triton"), [q, k, v], grad)
    torch.manual_seed(3)
    keep = tra.dropout_keep_mask(tra._draw_seed(q.device), 2, 4, T, S, 0.1)
    ref = fwd_bwd(lambda *x: ref_fn(*x, keep=keep, p=tra.effective_dropout_p(0.1)),
                  [t.detach().float().requires_grad_() for t in (q, k, v)], grad.float())
    assert max(max_errors(got, ref)) < 3e-2


def _compiled_kernels(fn) -> list:
    """The kernels Triton's JIT compiled for ``fn`` in this process (its per-device caches: a
    tuple whose first item maps specializations to compiled kernels, in Triton 3.x)."""
    kernels = []
    try:
        for entry in getattr(fn, "device_caches", {}).values():
            for kernel in entry[0].values():
                kernels.append(kernel.result() if hasattr(kernel, "result") else kernel)
    except (AttributeError, IndexError, TypeError) as e:
        raise AssertionError(f"Triton {triton.__version__}'s JIT cache has another layout ({e}): "
                             "update _compiled_kernels") from e
    return kernels


@requires_cuda
@pytest.mark.skipif(CUDA and torch.cuda.get_device_capability()[0] != 9,
                    reason="ptxas serializes wgmma, Hopper's instruction: an sm90 check")
def test_gpu_the_kernels_that_ran_keep_their_matrix_products_overlapped(monkeypatch):
    """ptxas's C7515 note on the kernels the JIT compiled here (every dQ kernel had its products
    serialized until 2026-11-26; `compile_triton_rpe.wgmma_serialized`), for the default tiles
    with and without padding and dropout, in one loop and with far loops (`FAR_LOOPS`). Fails if no
    kernel of the three was found to check. Only this test's kernels are checked: the JIT's caches are
    emptied first, since earlier tests compile head size 16 (tiny models), which ptxas does serialize at
    sm90's tiles (another cause: "non wgmma instructions defining accumulator registers"; `compile_triton_rpe.py
    --head-dims 16`), and which no real model uses."""
    ptxas_log = load_benchmark("compile_triton_rpe")._ptxas_log
    serialized = load_benchmark("compile_triton_rpe").wgmma_serialized
    for fn in (tra._fwd_kernel, tra._bwd_dkdv_kernel, tra._bwd_dq_kernel):
        _compiled_kernels(fn)  # checks the cache's layout
        fn.device_caches.clear()  # recompiled on the next launch (from Triton's disk cache)
    conditions = [(far, pad, p) for far in ("none", "all") for pad, p in ((False, 0.0), (True, 0.0), (True, 0.1))]
    for far, pad, p in conditions:  # T = 1000 > 2 (128 + 64): the far loops run at the default tiles
        monkeypatch.setattr(tra, "FAR_LOOPS", far)
        q, k, v, table, kpm = make(2, 4, 1000, 1000, 64, 128, dtype=torch.bfloat16, pad=pad, device="cuda")
        out = tra.triton_rpe_attention(q, k, v, table, key_padding_mask=kpm, dropout_p=p)
        torch.autograd.grad(out, [q, k, v, table], torch.randn_like(out))
    torch.cuda.synchronize()
    for fn in (tra._fwd_kernel, tra._bwd_dkdv_kernel, tra._bwd_dq_kernel):
        kernels = _compiled_kernels(fn)
        assert kernels, f"no compiled {fn.fn.__name__} found in Triton's JIT cache"
        for kernel in kernels:
            assert serialized(ptxas_log(kernel, 90)) is None, fn.fn.__name__


@requires_cuda
def test_gpu_dropout_matches_the_reference_with_the_kernel_mask(backward, far_loops):
    T, p = 300, 0.1
    q, k, v, table, kpm = make(2, 4, T, T, 64, 128, pad=True, device="cuda")
    grad = torch.randn(q.shape, device="cuda")
    torch.manual_seed(3)
    got = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, dropout_p=p), [q, k, v, table], grad)
    torch.manual_seed(3)
    keep = tra.dropout_keep_mask(tra._draw_seed(q.device), 2, 4, T, T, p)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.01
    leaves, ref_fn = reference(q, k, v, table, kpm, False, 1.0, keep=keep, p=tra.effective_dropout_p(p))
    assert max(max_errors(got, fwd_bwd(ref_fn, leaves, grad.double()))) < 1e-4


@requires_cuda
def test_gpu_dropout_from_the_bit_mask_matches_the_reference(monkeypatch):
    """`DROPOUT_MASK` = "bits" compiled: the bits kernel ran (one launch per call), and the forward, dK/dV and
    dQ kernels reading its bits give the reference's results with the Philox keep mask."""
    monkeypatch.setattr(tra, "DROPOUT_MASK", "bits")
    launched = spy_launches(monkeypatch, "_dropout_bits_kernel", "BLOCK")
    T, p = 300, 0.1
    q, k, v, table, kpm = make(2, 4, T, T, 64, 128, pad=True, device="cuda")
    grad = torch.randn(q.shape, device="cuda")
    torch.manual_seed(3)
    got = fwd_bwd(lambda *x: tra.triton_rpe_attention(*x, key_padding_mask=kpm, dropout_p=p), [q, k, v, table], grad)
    assert len(launched) == 1
    torch.manual_seed(3)
    keep = tra.dropout_keep_mask(tra._draw_seed(q.device), 2, 4, T, T, p)
    leaves, ref_fn = reference(q, k, v, table, kpm, False, 1.0, keep=keep, p=tra.effective_dropout_p(p))
    assert max(max_errors(got, fwd_bwd(ref_fn, leaves, grad.double()))) < 1e-4


@requires_cuda
def test_gpu_tiny_model_trains_one_step_on_the_triton_kernel(backward):
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", attention_backend="triton", head_dim=16).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    src = torch.randint(4, len(d), (4, 200), device="cuda")
    src[1, -60:] = d.pad()
    prev = torch.randint(4, len(d), (4, 136), device="cuda")
    before = [p.detach().clone() for p in model.parameters()]
    ab.DISPATCH_COUNTS.clear()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(src, None, prev)[0].float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    assert ab.DISPATCH_COUNTS["triton-rpe"] >= 4, dict(ab.DISPATCH_COUNTS)
    assert ab.DISPATCH_COUNTS["triton-nobias"] == len(model.decoder.layers), dict(ab.DISPATCH_COUNTS)
    assert torch.isfinite(loss) and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@requires_cuda
def test_gpu_compiled_model_with_the_triton_backend_matches_eager_and_runs_its_kernels(backward):
    """model.compile=true: the kernels are traced into the model's graph (user-defined Triton
    kernels); loss and gradients as in eager, and the profiler sees our kernels."""
    from torch.profiler import ProfilerActivity, profile

    d, model, reference = tiny_model_pair("triton", device="cuda", head_dim=16)
    src = torch.randint(4, len(d), (4, 200), device="cuda")
    src[1, -60:] = d.pad()
    prev = torch.randint(4, len(d), (4, 136), device="cuda")
    compiled = torch.compile(model)
    loss = compiled(src, None, prev)[0].float().logsumexp(-1).mean()
    loss.backward()
    ref = reference(src, None, prev)[0].float().logsumexp(-1).mean()
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-4
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad - p_ref.grad).abs().max() < 1e-3 * (p_ref.grad.abs().max() + 1e-6), name
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        compiled(src, None, prev)[0].float().logsumexp(-1).mean().backward()
        torch.cuda.synchronize()
    names = " ".join(e.key for e in prof.key_averages())
    assert "_fwd_kernel" in names and "_bwd_dkdv_kernel" in names and "_bwd_dq_kernel" in names, names
    # the kernels go into the model's one graph: no graph break around them (what `auto` needs
    # before a measurement may put triton into AUTO_TABLE for the compiled recipes)
    explained = torch._dynamo.explain(lambda: model(src, None, prev)[0])()
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons

