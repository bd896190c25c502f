"""Scaled dot-product attention behind one switch (`AstT5Config.attention_backend`).

    out = dropout(softmax(scale * q k^T + bias + masks)) v

- ``torch``: the eager reference, written out (fused_ops' PyTorch reference for softmax-dropout).
- ``fused``: the same, with softmax + dropout + bias in the fused_ops CUDA kernel. Raises where it
  cannot run (CPU, extension missing). Measured slower than ``sdpa`` on an H100 (see `AUTO_TABLE`),
  so ``auto`` never picks it; it stays selectable for comparison.
- ``sdpa``: torch.nn.functional.scaled_dot_product_attention, the bias and masks as one float mask
  in q's dtype. On CUDA, calls with a mask never run the cuDNN kernel (NaN grad_q at
  seq % 128 == 64 and wrong results with an fp32 mask and bf16 q on Hopper: pytorch issues
  196678 and 191612).
- ``flash``: flash kernels for bias-free calls (the paper decoder's self-attention, all cross
  attention): the flash-attn package when installed, else PyTorch's flash SDPA; padded keys are
  dropped (unpadded / varlen kernels: flash-attn's, or ``torch.nn.attention.varlen`` without
  dropout) instead of sending the call to a masked kernel. Biased calls go to ``sdpa``, logged once.
- ``flex``: FlexAttention (torch.nn.attention.flex_attention) for biased calls. The relative-position
  bias is a (H, 2 M + 1) vector, one value per head and clamped distance (`RelativeBias`, M =
  max_distance). Without autograd the ``score_mod`` adds ``per_distance[h, clamp(kv - q) + M]``:
  no (T, S) bias at all. With autograd it reads a (1, H, T, S) float32 bias gathered once per
  stack from that vector (never (B, H, T, S)), whose gradient PyTorch sums per distance and then
  per bucket (see `FLEX_TABLE_GRAD` for why, and for the per-distance alternative). Padding and
  causality are block masks, built once per stack (see `fold_masks`). Flex has no dropout: calls with dropout > 0
  go to ``sdpa`` with the bias densified, logged once. Bias-free calls use ``flash``.
  Compilation: outside torch.compile, one compiled wrapper (`_flex_compiled`) serves every layer and
  step. Lengths enter its graph only as tensor shapes (the bias table has the constant size
  2 max_distance + 1), so on CUDA dynamo compiles it for the first shape, once more with dynamic
  lengths at the first new length (automatic dynamic shapes), then reuses that graph for every
  length; a new dtype, head count, head size or mask kind (none / padding / causal) compiles once
  more. On CPU (tests, forward only) each length compiles its own static graph. Inside a
  torch.compile'd model the call is traced into the model's graph instead.
- ``triton``: our tiled Triton kernel (`triton_rpe_attention`) for biased calls: the bias read per
  clamped distance from the (H, 2 M + 1) vector inside the kernel (no (T, S) tensor in forward or
  backward), padding and causality as in-kernel masks, attention dropout from a Philox stream
  seeded by PyTorch's generator, and the table's gradient reduced per distance in its backward.
  Bias-free calls with padded keys (cross-attention over a padded source) run on the same kernels
  without the bias: no unpadding (varlen flash packs the real keys with a sort and copies, 2.8 ms
  of host time per call at B16 T=S=1024 on an H200) and no mask read past each row's last key. The
  bias-free Triton yardstick at these tiles ran that padded call in 1.07 ms against 2.37 for SDPA's
  masked kernel and 3.01 for varlen flash (2026-11-26, BENCHMARKS.md). Unpadded bias-free calls use
  ``flash`` (1.08 ms against the yardstick's 1.23). Calls it cannot take (no triton, CPU tensors
  without TRITON_INTERPRET=1 at import, a dense bias, cached decoding with queries offset from the keys,
  fp64) go to ``sdpa``, logged once. Not in `AUTO_TABLE` yet: its kernels alone beat SDPA's on an
  H200, and the eager T5-base step (B32 x 512/128) went from slower than ``sdpa`` (2026-11-26) to
  even with it (2026-11-27: 76.9 ms against 76.8), and 7% faster with one loop at 512 tokens (71.6
  ms; its default there since, `triton_rpe_attention.far_loops_pay`). The recipes compile the model:
  there the T5-base trainer ran 1.21x as fast on it as on sdpa (H200, 2026-11-28, bench_train.py's
  variants side by side: 100.6 against 121.4 ms per update). The sm90 row waits for its CUDA tests
  (the compiled packed gradients against eager: `scripts/gpu_check.sh`'s triton_gpu_tests step).
- ``cudnn``: cuDNN's fused attention kernels for biased calls (`cudnn_attention`; the optional
  ``nvidia-cudnn-frontend`` package): the stack's (1, H, T, S) bias built once from the per-distance
  vector, its gradient returned by cuDNN summed over the batch and reduced per distance by
  `distance_grad`; padding as each sample's count of keys (right padding, checked on the device),
  causality and dropout in cuDNN's kernels. The library option for the relative bias's gradient (PyTorch's
  own cuDNN path takes no trainable bias). Bias-free calls with padded keys (cross-attention over a
  padded source) run on cuDNN's kernels without a bias (its padding mask: no unpadding); other bias-free
  calls use ``flash``; calls it cannot take (no frontend, CPU tensors, fp32, a key count that is not a
  multiple of 8, a dense bias, cached decoding) go to ``sdpa`` (``flash`` if bias-free), logged once. Not
  measured yet: not in `AUTO_TABLE`.
- ``auto``: reads `AUTO_TABLE` (device, dtype, dropout, bias kind, length -> backend); each distinct
  choice is logged once. On CPU and on sm90 (H100, H200): ``sdpa`` (as measured by
  benchmarks/bench_model.py).

Masks: ``key_padding_mask`` (B, S) bool, True at padded keys; ``causal`` lets query i see keys
j <= i (queries and keys aligned at the start; used only when T == S).

`DISPATCH_COUNTS` counts the kernels each call actually ran (tests use it to fail when a fast path
was silently skipped).
"""
import collections
import importlib.util
import logging
from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F

import fused_ops

from .relative_position_bias import RelativeBias

logger = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("auto", "torch", "fused", "sdpa", "flash", "flex", "triton", "cudnn")
# auto sends biased calls to flex only beyond one flex block (128) of queries (keys: as many in
# self-attention). Shorter calls (incremental decoding, short batches) stay on sdpa: flex gains
# little there, and under torch.compile a one-block BlockMask specializes the graph (a size-1
# dimension) and inductor switches to its decoding kernel below 128 queries; each would be one
# more class of compiled graphs (AstT5Model's docstring counts them).
FLEX_MIN_QUERIES = 129
# How `flex` gets the bucket table's gradient when one is needed (training):
# - "dense": the score_mod reads a (1, H, T, S) float32 bias built once per stack from the
#   per-distance vector; the kernel's gradient lands per element (contention: the batch), and
#   PyTorch's index backward sums it per distance. This is the form measured on the H100 (1.52 ms).
# - "distance": the score_mod reads the (H, 2 M + 1) vector itself; the kernel's backward then
#   atomically adds into 2 M + 1 addresses per head (most pairs of a long sequence share the two
#   saturated ends). Not measured yet; bench_attention.py's `flex-distance` row measures it.
# Without autograd (evaluation) flex always reads the vector: no (T, S) tensor at all.
FLEX_TABLE_GRAD = "dense"
_LOGGED = set()  # texts already logged by log_once
DISPATCH_COUNTS = collections.Counter()  # kernel name -> calls that ran it (eager calls only)


def _count(kernel: str) -> None:
    """Record that ``kernel`` ran. Skipped while torch.compile traces: a global that changes on
    every call would become a guard of the compiled graph and force a recompile per step."""
    if not torch.compiler.is_compiling():
        DISPATCH_COUNTS[kernel] += 1


class AutoRule(NamedTuple):
    """One row of `AUTO_TABLE`: the first row whose conditions all hold decides."""

    device: str  # "cpu" | "cuda"
    bias: str  # "relative" | "none" | "any"
    dropout: str  # "zero" | "positive" | "any"
    dtype: str  # "half" (fp16/bf16) | "any"
    min_sm: int  # minimum CUDA capability major*10+minor (0: any)
    min_queries: int  # minimum query length
    backend: str
    evidence: str
    max_sm: int = 0  # maximum CUDA capability (0: any), for a row measured on one generation only


# (device capability, dtype, dropout, bias kind, length) -> backend, from the T5-base step that `auto`
# serves (benchmarks/bench_model.py: every backend side by side in one run, the step's own mix of biased
# self-attention and bias-free, padded cross-attention) and from the attention calls alone
# (benchmarks/bench_attention.py). A backend that loses there must leave this table.
#
# sm90, measured on an H200 (2026-11-26, `GPU_CHECK_STEPS=headline bash scripts/gpu_check.sh`, bf16,
# BENCHMARKS.md "The headline group on an H200"): SDPA everywhere. The step (B32 x 512/128, eager):
# sdpa 87.8 ms, flash 93.3 (its one difference: varlen flash for the padded cross-attention), triton
# 108.9, flex 121.0 at dropout 0; sdpa 96.7, triton 100.2 at 0.1. Alone, at B16 H12 T=S=1024 D64:
# padded bias-free calls 2.37 ms on SDPA's masked kernel against 3.01 on varlen flash (whose unpadding
# costs the host 2.8 ms), unpadded 0.71 against 1.08. The triton kernels' GPU time beats SDPA's there
# (padded: 1.34 ms in a CUDA graph against 2.18), not the host's time to issue a call (2.03 ms against
# 0.84), which the eager step pays 24 times per pass: a likely reason, not yet profiled. The next run (H200,
# 2026-11-27, after the bias gradient's fix and the host work; BENCHMARKS.md "The fix on the GPU"), B32 x
# 512/128 eager: sdpa 76.8 ms, triton 76.9, triton with one loop 71.6 (the triton default at 512 since), flash
# 85.1, flex 98.2 at dropout 0; sdpa 87.4, triton 83.8, one loop 81.0 at 0.1. The compiled trainer (what
# the recipes run; H200, 2026-11-28, bench_train.py B64 x 512/114, four trainers in the same interleaved
# blocks): sdpa 121.4 ms per update, triton 100.6 (1.21x); the eager step that day: sdpa 83.1 ms, triton
# 82.6 at dropout 0 (the repeats spread by 10%), sdpa 86.1, triton 75.6 at 0.1. The row stays sdpa until the
# triton backend's CUDA tests pass on a GPU (a failed CUDA graph capture in another test stopped them
# that day): then biased calls go to triton (BENCHMARKS.md, "The variants side by side").
# Other GPUs are not measured; their rows come from the issue's H100 figures, taken before the H200's
# step: the attention alone (B16 H12 T=S=1024 D64 bf16, fwd+bwd incl. bias grad) eager 6.60 ms, fused
# 4.53 (p=0) / 4.73 (p=0.1), SDPA with the bias as mask 2.62, Flex with the bias 1.52; the compiled
# step (B64 x 512/114) with flex for the biased calls 103.4 ms against sdpa 112.6.
_SM90_STEP = ("measured on an H200 (2026-11-26, bench_model.py, T5-base step B32 x 512/128 bf16 eager): "
              "sdpa 87.8 ms vs flash 93.3, triton 108.9, flex 121.0 at dropout 0; 96.7 vs triton 100.2 at 0.1")
AUTO_TABLE = (
    AutoRule("cpu", "any", "any", "any", 0, 0, "sdpa",
             "CPU: bench_model.py measures sdpa >= the eager reference"),
    AutoRule("cuda", "any", "any", "half", 90, 0, "sdpa", "sm90: " + _SM90_STEP, max_sm=90),
    AutoRule("cuda", "relative", "zero", "half", 80, FLEX_MIN_QUERIES, "flex",
             "biased, no dropout, GPUs other than sm90 (not measured; the H100's figures before the H200's "
             "step): Flex 1.52 ms vs SDPA-with-mask 2.62 ms vs fused 4.53 ms; compiled step 103.4 ms vs sdpa 112.6"),
    AutoRule("cuda", "any", "any", "any", 0, 0, "sdpa",
             "bias-free (" + _SM90_STEP + "), dropout > 0 (Flex has none), 128 queries or fewer, fp32 or "
             "pre-sm80: SDPA 2.62 ms vs fused 4.73 ms at p=0.1 on an H100"),
)


def log_once(message: str, *args) -> None:
    """Log ``message % args`` at INFO the first time this exact text is seen in the process."""
    if torch.compiler.is_compiling():
        return  # logging would break the graph; eager calls (and the first eager run) log it
    text = message % args if args else message
    if text not in _LOGGED:
        _LOGGED.add(text)
        logger.info(text)


# looked up once at import (cheap, imports nothing), so that torch.compile traces no importlib call
_HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
_HAS_TORCH_VARLEN = importlib.util.find_spec("torch.nn.attention.varlen") is not None
_CAPABILITIES = {}  # CUDA device index -> major * 10 + minor


def flash_attn_installed() -> bool:
    """Whether the optional flash-attn package can be imported (checked without importing it)."""
    return _HAS_FLASH_ATTN


def torch_varlen_available() -> bool:
    """Whether this PyTorch has the flash varlen kernel (torch.nn.attention.varlen, no dropout)."""
    return _HAS_TORCH_VARLEN


def _capability(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _CAPABILITIES:
        major, minor = torch.cuda.get_device_capability(index)
        _CAPABILITIES[index] = major * 10 + minor
    return _CAPABILITIES[index]


def auto_choice(device: torch.device, dtype: torch.dtype, dropout_p: float, has_bias: bool,
                q_len: int) -> Tuple[str, str]:
    """The backend `AUTO_TABLE` gives these inputs, and the row's evidence."""
    sm = _capability(device)
    half = dtype in (torch.float16, torch.bfloat16)
    for rule in AUTO_TABLE:
        if (rule.device == device.type
                and rule.bias in ("any", "relative" if has_bias else "none")
                and rule.dropout in ("any", "positive" if dropout_p > 0 else "zero")
                and rule.dtype in ("any", "half" if half else "")
                and sm >= rule.min_sm and (rule.max_sm == 0 or sm <= rule.max_sm)
                and q_len >= rule.min_queries):
            return rule.backend, rule.evidence
    return "sdpa", "no row of AUTO_TABLE matched"


def _mask_value(dtype: torch.dtype) -> float:
    """A large finite negative for masked logits: fully masked rows stay finite (no NaN)."""
    return torch.finfo(dtype).min


def _boolean_mask(key_padding_mask, causal, q_len, k_len, device) -> Optional[torch.Tensor]:
    """True where attention is forbidden: (B, 1, 1, S), (1, 1, T, S) or (B, 1, T, S); or None."""
    masked = None
    if key_padding_mask is not None:
        masked = key_padding_mask[:, None, None, :]
    if causal:
        future = torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu_(1)[None, None]
        masked = future if masked is None else masked | future
    return masked


def _additive_mask(masked: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    if masked is None:
        return None
    return torch.zeros(masked.shape, dtype=dtype, device=masked.device).masked_fill_(masked, _mask_value(dtype))


def _softmax_attention(q, k, v, bias, masked, dropout_p, scale, backend):
    """Explicit scores -> fused_ops.softmax_dropout (``torch`` or ``fused``) -> weighted sum."""
    _count(backend)
    scores = torch.matmul(q * scale if scale != 1.0 else q, k.transpose(-1, -2))  # (B, H, T, S)
    mask = _additive_mask(masked, torch.float32 if scores.dtype != torch.float64 else scores.dtype)
    probs = fused_ops.softmax_dropout(scores, dropout_p, training=dropout_p > 0.0, bias=bias,
                                      mask=mask, backend=backend)
    return torch.matmul(probs, v)


def _masked_sdpa(q, k, v, attn_mask, dropout_p, scale):
    """SDPA with a mask; on CUDA without the cuDNN kernel (its Hopper mask bugs, module docstring)."""
    if attn_mask.dtype != torch.bool and attn_mask.dtype != q.dtype:
        attn_mask = attn_mask.to(q.dtype)  # never an fp32 mask with half q
    if not q.is_cuda:
        _count("sdpa")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _count("sdpa-masked-no-cudnn")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


def _sdpa(q, k, v, bias, masked, dropout_p, scale, causal):
    """PyTorch SDPA; bias and masks folded into one float mask (bool when there is no bias)."""
    if bias is None and masked is None:
        _count("sdpa")
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=False)
    if bias is None:
        if causal and masked.size(0) == 1:  # causal only: let SDPA pick its causal kernels
            _count("sdpa")
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=True)
        attn_mask = ~masked
    else:
        attn_mask = bias.to(q.dtype)
        if masked is not None:
            attn_mask = attn_mask.masked_fill(masked, _mask_value(q.dtype))
    return _masked_sdpa(q, k, v, attn_mask, dropout_p, scale)


def _flash(q, k, v, key_padding_mask, causal, dropout_p, scale):
    """Bias-free attention with flash kernels; None when none can take these inputs.

    Padded keys (cross-attention over a padded source) are dropped and the unpadded keys run
    through a varlen kernel, so padding does not push the call onto a masked kernel.
    """
    half = q.dtype in (torch.float16, torch.bfloat16)
    if q.is_cuda and half and flash_attn_installed():
        from .flash_attn_adapter import flash_attn_bshd

        if key_padding_mask is None or not causal:
            log_once("attention backend flash: using the flash-attn package")
            _count("flash-attn")
            return flash_attn_bshd(q, k, v, key_padding_mask, causal, dropout_p, scale)
    if key_padding_mask is not None:
        if q.is_cuda and half and not causal and dropout_p == 0.0 and torch_varlen_available():
            from .flash_attn_adapter import torch_varlen_bshd

            log_once("attention backend flash: padded keys -> PyTorch's varlen flash kernel")
            _count("torch-varlen")
            return torch_varlen_bshd(q, k, v, key_padding_mask, scale)
        return None  # PyTorch's flash SDPA takes no mask
    if not q.is_cuda and dropout_p > 0.0:
        return None  # PyTorch's CPU flash kernel has no dropout ("No available kernel")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    log_once("attention backend flash: using PyTorch's built-in flash SDPA kernel")
    _count("sdpa-flash")
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=causal)
    except RuntimeError as e:
        raise RuntimeError(f"attention_backend='flash' cannot run on these inputs ({q.device.type}, {q.dtype}): "
                           f"{e}; use 'auto' or 'sdpa'") from e


# ---------------------------------------------------------------------------------------- flex
def _flex_attention_call(q, k, v, per_distance, dense_bias, block_mask, scale):
    """flex_attention with the relative bias read per clamped distance (``per_distance``: (H, 2 M + 1))
    or per element (``dense_bias``: (1, H, T, S)), or neither. M is a constant of the model
    (max_distance), so no length enters the graph as a value."""
    from torch.nn.attention.flex_attention import flex_attention

    if dense_bias is not None:
        def dense_score_mod(score, b, h, q_idx, kv_idx):
            return score + dense_bias[0, h, q_idx, kv_idx]

        return flex_attention(q, k, v, score_mod=dense_score_mod, block_mask=block_mask, scale=scale)
    if per_distance is None:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    max_distance = (per_distance.size(1) - 1) // 2

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + per_distance[h, torch.clamp(kv_idx - q_idx, -max_distance, max_distance) + max_distance]

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


_FLEX_COMPILED = {}  # device type -> the compiled wrapper


def _flex_compiled(device_type: str):
    """The one compiled wrapper of `_flex_attention_call` shared by every layer (eager models).

    CUDA: dynamo's automatic dynamic shapes (a second length compiles one dynamic graph that
    serves all later lengths). CPU: static shapes, one graph per length (torch 2.13's CPU flex
    template fails to build dynamic shapes), up to dynamo's recompile limit.

    Every kind of call is a graph of its own, a static one first on CUDA: mask kind (padding,
    causal, none), the bias read per element (training) or per distance (no gradient), grad mode. A
    run that trains and validates the encoder and decoder on flex (auto on an A100) counts 2 mask
    kinds x 2 bias forms x 2 (static, then dynamic), 8 by this count (not measured on a GPU): torch's
    default recompile limit for this one function, past which ``fullgraph=True`` raises
    (FailOnRecompileLimitHit) instead of running eagerly. So the limit is raised to the model's
    (`ast_t5_model.MIN_RECOMPILE_LIMIT`) when the wrapper is made.
    """
    if device_type not in _FLEX_COMPILED:
        from ast_t5.models.ast_t5_model import MIN_RECOMPILE_LIMIT, ensure_recompile_limit

        ensure_recompile_limit(MIN_RECOMPILE_LIMIT)
        _FLEX_COMPILED[device_type] = torch.compile(_flex_attention_call, fullgraph=True,
                                                    dynamic=None if device_type == "cuda" else False)
    return _FLEX_COMPILED[device_type]


def flex_block_mask(key_padding_mask: Optional[torch.Tensor], causal: bool, q_len: int, k_len: int,
                    device: torch.device):
    """The BlockMask of padded keys and/or the future, or None when nothing is masked."""
    if key_padding_mask is None and not causal:
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    if key_padding_mask is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
        batch = None
    else:
        pad = key_padding_mask

        def mask_mod(b, h, q_idx, kv_idx):
            keep = ~pad[b, kv_idx]
            return keep & (q_idx >= kv_idx) if causal else keep
        batch = pad.size(0)
    return create_block_mask(mask_mod, batch, None, q_len, k_len, device=device)


_LAST_BLOCK_MASK = [None, None]  # [key, BlockMask]: the paper's per-layer tables share one mask


def tensor_version(t: torch.Tensor) -> Optional[int]:
    """``t``'s version counter (bumped by every in-place change), or None for a tensor made under
    torch.inference_mode, which has none: then nothing derived from it is kept for later calls."""
    return None if t.is_inference() else t._version


def _shared_block_mask(key_padding_mask, causal, q_len, k_len, device):
    """`flex_block_mask`, reused while the same padding tensor comes back (eager only: the layers
    of one forward pass each fold their own table but share the padding mask)."""
    if torch.compiler.is_compiling():
        return flex_block_mask(key_padding_mask, causal, q_len, k_len, device)
    version = None if key_padding_mask is None else tensor_version(key_padding_mask)
    if key_padding_mask is not None and version is None:  # an inference tensor: nothing kept
        return flex_block_mask(key_padding_mask, causal, q_len, k_len, device)
    key = (key_padding_mask, version, causal, q_len, k_len, str(device))
    cached_key = _LAST_BLOCK_MASK[0]
    if cached_key is not None and cached_key[0] is key[0] and cached_key[1:] == key[1:]:
        return _LAST_BLOCK_MASK[1]
    mask = flex_block_mask(key_padding_mask, causal, q_len, k_len, device)
    _LAST_BLOCK_MASK[0], _LAST_BLOCK_MASK[1] = key, mask
    return mask


def _per_distance_unsupported(bias) -> Tuple[Optional[RelativeBias], Optional[str]]:
    """The per-distance bias of a call, and why the per-distance kernels (flex, triton) cannot
    take it (or None)."""
    rel = bias.rel if isinstance(bias, FoldedBias) else bias
    if not isinstance(rel, RelativeBias):
        return None, "a dense bias tensor has no per-distance form"
    if rel.query_offset != 0:
        return rel, "a cached decoding step (queries offset from the keys)"
    return rel, None


def _flex_unsupported(q, k, v, bias) -> Optional[str]:
    """Why a biased call cannot run on flex, or None."""
    rel, reason = _per_distance_unsupported(bias)
    if reason is not None:
        return reason
    if not q.is_cuda and torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v, rel.per_distance)):
        return "FlexAttention has no backward on CPU"
    if not q.is_cuda and torch.compiler.is_compiling():
        # torch 2.13's CPU flex template finds no kernel when the bias is computed in the same
        # graph (NoValidChoicesError); the eager wrapper, which takes it as an input, works
        return "CPU FlexAttention inside a torch.compile'd model"
    return None


def _flex(q, k, v, bias: "FoldedBias", scale):
    _count("flex")
    wide = torch.float64 if bias.rel.per_distance.dtype == torch.float64 else torch.float32  # fp64: tests
    per_distance, dense = None, None
    if _needs_table_grad(bias.rel) and FLEX_TABLE_GRAD == "dense":
        dense = bias.flex_dense(wide)
    else:  # contiguous: the score_mod reads it as a plain buffer
        per_distance = bias.rel.per_distance.to(wide).contiguous()
    call = _flex_attention_call if torch.compiler.is_compiling() else _flex_compiled(q.device.type)
    return call(q, k, v, per_distance, dense, bias.block_mask(q.device), scale)


def _triton_unsupported(q, k, v, bias) -> Optional[str]:
    """Why a biased call cannot run on the triton kernel, or None."""
    rel, reason = _per_distance_unsupported(bias)
    if reason is not None:
        return reason
    from . import triton_rpe_attention

    return triton_rpe_attention.unsupported_reason(q, k, v, rel.per_distance)


def _cudnn_unsupported(q, k, v, bias) -> Optional[str]:
    """Why a biased call cannot run on cuDNN's kernels, or None."""
    _, reason = _per_distance_unsupported(bias)
    if reason is not None:
        return reason
    from . import cudnn_attention

    return cudnn_attention.unsupported_reason(q, k, v)


def _cudnn(q, k, v, bias: "FoldedBias", dropout_p, scale, packed_qkv=None):
    from .cudnn_attention import cudnn_attention

    _count("cudnn")
    dense, seq_len_kv = bias.cudnn_inputs()
    return cudnn_attention(q, k, v, dense, seq_len_kv=seq_len_kv, causal=bias.causal, dropout_p=dropout_p,
                           scale=scale, packed=packed_qkv)


_CUDNN_PADDING = [None]  # (key padding mask, its version, each sample's count of keys) of the last bias-free call


def _cudnn_nobias(q, k, v, key_padding_mask, causal, dropout_p, scale, packed_qkv=None):
    """A bias-free call with padded keys on cuDNN's kernels (its padding mask: no unpadding, no mask tensor). The
    keys' counts are kept for the next call with the same, unchanged mask (a decoder's cross-attention layers
    share the encoder's mask; not under torch.compile)."""
    from .cudnn_attention import cudnn_attention, seq_len_from_padding

    _count("cudnn-nobias")
    version = None if torch.compiler.is_compiling() else tensor_version(key_padding_mask)
    kept = _CUDNN_PADDING[0]
    if version is not None and kept is not None and kept[0] is key_padding_mask and kept[1] == version:
        seq_len_kv = kept[2]
    else:
        seq_len_kv = seq_len_from_padding(key_padding_mask)
        if version is not None:
            _CUDNN_PADDING[0] = (key_padding_mask, version, seq_len_kv)
    return cudnn_attention(q, k, v, None, seq_len_kv=seq_len_kv, causal=causal, dropout_p=dropout_p, scale=scale,
                           packed=packed_qkv)


_NOBIAS_PADDING = [None]  # (key padding mask, its version, SharedInputs) of the last bias-free triton call


def _triton_nobias(q, k, v, key_padding_mask, causal, dropout_p, scale, packed_qkv=None):
    """A bias-free call with padded keys on the triton kernels (no bias read, no table gradient).
    The mask's kernel inputs (`triton_rpe_attention.SharedInputs`: uint8 mask, each row's end of keys,
    padding counts) are kept for the next call with the same, unchanged mask tensor: a decoder's
    layers pass the encoder's one mask to their cross-attention, so its stack builds them once.
    (Not under torch.compile, where inductor fuses them into the graph.)"""
    from .triton_rpe_attention import SharedInputs, triton_rpe_attention

    _count("triton-nobias")
    shared = None
    version = None if torch.compiler.is_compiling() else tensor_version(key_padding_mask)
    if version is not None:
        kept = _NOBIAS_PADDING[0]
        if kept is not None and kept[0] is key_padding_mask and kept[1] == version:
            shared = kept[2]
        else:
            shared = SharedInputs(key_padding_mask)
            _NOBIAS_PADDING[0] = (key_padding_mask, version, shared)
    return triton_rpe_attention(q, k, v, None, shared=shared, causal=causal,
                                key_padding_mask=key_padding_mask if shared is None else None,
                                dropout_p=dropout_p, scale=scale, packed=packed_qkv)


def _triton(q, k, v, bias: "FoldedBias", dropout_p, scale, packed_qkv=None):
    from .triton_rpe_attention import triton_rpe_attention

    _count("triton-rpe")
    shared = bias.triton_inputs()  # None under torch.compile
    return triton_rpe_attention(q, k, v, bias.rel.per_distance, shared=shared, causal=bias.causal,
                                key_padding_mask=bias.key_padding_mask if shared is None else None,
                                dropout_p=dropout_p, scale=scale, packed=packed_qkv)


def _needs_table_grad(rel: RelativeBias) -> bool:
    return torch.is_grad_enabled() and rel.per_distance.requires_grad


class FoldedBias:
    """A stack's relative bias and masks, prepared once for all its layers (see `fold_masks`).

    Holds the bias per distance and the masks for ``flex`` and, when a call may end up on a dense
    kernel (``auto`` while dropout is unknown), the folded dense mask as well. The block mask is
    shared by the layers: in eager mode built on first use; inside torch.compile built here, where
    the stack folds its masks, outside the layers. (Built inside a layer under activation
    checkpointing, create_block_mask's torch-function mode is a side effect the checkpoint cannot
    trace: dynamo then gave up on the whole stack, which ran eagerly. And no traced code mutates
    this object.)
    """

    def __init__(self, rel: RelativeBias, key_padding_mask, causal: bool, dense: Optional[torch.Tensor],
                 flex: bool = True, block_mask=None, cudnn: bool = False,
                 dtype: Optional[torch.dtype] = None):
        self.rel = rel
        self.key_padding_mask = key_padding_mask
        self.causal = causal
        self.dense = dense
        self._block_mask = block_mask  # given: built by the stack (`stack_block_mask`)
        self._has_block_mask = block_mask is not None
        if flex and block_mask is None and torch.compiler.is_compiling():
            self._block_mask = flex_block_mask(key_padding_mask, causal, rel.q_len, rel.k_len,
                                               rel.per_distance.device)
            self._has_block_mask = True
        self._triton_inputs = None
        self._flex_dense = None
        if flex and FLEX_TABLE_GRAD == "dense" and _needs_table_grad(rel) and rel.per_distance.is_cuda:
            # built here, once per stack, outside any layer's activation checkpoint
            self._flex_dense = rel.dense().float()
        self._cudnn_inputs = None
        if cudnn:
            from . import cudnn_attention

            if cudnn_attention.stack_may_run(rel.per_distance.device, dtype, rel.k_len):
                # built here, once per stack, like the flex bias above (not for a stack whose calls fall back)
                self._cudnn_inputs = self._make_cudnn_inputs()

    def varying_tensors(self) -> list:
        """The tensors held here whose sizes follow the batch and the lengths: what
        ``model.compile_scope=layers`` marks dynamic with a layer call's own tensor arguments (left to
        torch's automatic dynamic shapes, the key padding mask's batch size made one more graph of the
        encoder layer at the first new batch size)."""
        dense = self.dense.varying_tensors() if isinstance(self.dense, TappedMask) else [self.dense]
        return [t for t in (self.key_padding_mask, *dense, *(self._cudnn_inputs or ())) if torch.is_tensor(t)]

    def _make_cudnn_inputs(self) -> tuple:
        from .cudnn_attention import seq_len_from_padding

        seq_len_kv = None if self.key_padding_mask is None else seq_len_from_padding(self.key_padding_mask)
        return self.rel.dense(), seq_len_kv

    def cudnn_inputs(self) -> tuple:
        """What the ``cudnn`` backend's calls share: the (1, H, T, S) bias of the per-distance vector (in its
        dtype: each call casts it, so that the layers' gradients add up in that dtype) and each sample's count
        of keys ((B,) int32, None without padding); built with the stack's other inputs when it was made for
        ``cudnn``, else now."""
        if self._cudnn_inputs is None:
            return self._make_cudnn_inputs()
        return self._cudnn_inputs

    def triton_inputs(self):
        """The `triton_rpe_attention.SharedInputs` of this stack's layers (padding counts and bias
        rows built by the first layer's call, reused by the others); None under torch.compile, where
        no traced code mutates this object (each call builds its own, inductor fuses them)."""
        if torch.compiler.is_compiling():
            return None
        if self._triton_inputs is None:
            from .triton_rpe_attention import SharedInputs

            self._triton_inputs = SharedInputs(self.key_padding_mask)
        return self._triton_inputs

    def flex_dense(self, dtype) -> torch.Tensor:
        """The (1, H, T, S) bias flex reads when the table needs a gradient (FLEX_TABLE_GRAD)."""
        if self._flex_dense is not None and self._flex_dense.dtype == dtype:
            return self._flex_dense
        return self.rel.dense().to(dtype)

    def block_mask(self, device):
        if torch.compiler.is_compiling() and not self._has_block_mask:
            return flex_block_mask(self.key_padding_mask, self.causal, self.rel.q_len, self.rel.k_len, device)
        if not self._has_block_mask:
            self._block_mask = _shared_block_mask(self.key_padding_mask, self.causal, self.rel.q_len,
                                                  self.rel.k_len, device)
            self._has_block_mask = True
        return self._block_mask

    def dense_mask(self, dtype) -> Union[torch.Tensor, "TappedMask"]:
        """(1 or B, H, T, S) bias with the masks folded in, a `TappedMask` when it takes a gradient
        (built now if not held; kept for the next layers only outside autograd and compile, where
        caching cannot upset activation checkpointing)."""
        if self.dense is not None:
            return self.dense
        dense = _fold_dense(self.rel.dense(), self.key_padding_mask, self.causal, dtype)
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            self.dense = dense
        return dense


BiasLike = Union[torch.Tensor, RelativeBias, FoldedBias, "TappedMask"]


def resolve_backend(backend: str, device: torch.device, has_bias: bool, dtype: torch.dtype = torch.float32,
                    dropout_p: float = 0.0, q_len: int = 0) -> str:
    """The backend a call will start from: ``auto`` resolved by `AUTO_TABLE`; ``flash`` with a
    bias, and ``flex`` with dropout, -> ``sdpa``; bias-free ``flex``/``triton`` -> ``flash`` (`attention`
    keeps bias-free ``triton`` calls with padded keys on the triton kernels before asking this)."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
    if backend == "auto":
        choice, evidence = auto_choice(device, dtype, dropout_p, has_bias, q_len)
        log_once("attention backend auto: %s attention on %s %s, dropout %s -> %s (%s)",
                 "biased" if has_bias else "bias-free", device.type, str(dtype).replace("torch.", ""),
                 "> 0" if dropout_p > 0 else "0", choice, evidence)
        return choice
    if backend == "flash" and has_bias:
        log_once("attention backend flash: biased attention (relative positions) -> sdpa")
        return "sdpa"
    if backend in ("flex", "triton", "cudnn") and not has_bias:
        return "flash"
    if backend == "flex" and dropout_p > 0:
        log_once("attention backend flex: FlexAttention has no dropout; calls with attention dropout -> sdpa")
        return "sdpa"
    return backend


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention runs in for activations like ``x``: autocast's when it is on."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _fold_dense(bias, key_padding_mask, causal, dtype):
    """The dense bias with the masks folded in: a `TappedMask` when a (1, H, T, S) bias takes a
    gradient (training), else the tensor."""
    if torch.is_grad_enabled() and bias.requires_grad and bias.size(0) == 1:
        folded = _fold_dense(bias.detach(), key_padding_mask, causal, dtype)
        # the layers' shares are summed in float32 (a bf16 model's table: rounded once, after the sum)
        return TappedMask(bias if bias.dtype in (torch.float32, torch.float64) else bias.float(), folded)
    if dtype is not None:
        bias = bias.to(dtype)
    masked = _boolean_mask(key_padding_mask, causal, bias.size(-2), bias.size(-1), bias.device)
    if masked is not None:
        bias = bias.masked_fill(masked, _mask_value(bias.dtype))
    if bias.is_cuda and not torch.compiler.is_compiling():
        bias = _rows_aligned(bias)
    return bias


SDPA_MASK_ALIGNMENT = 8  # elements: SDPA's memory-efficient kernel reads masks whose rows are this far apart


def _rows_aligned(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` as a view of a buffer whose last dimension is padded to a multiple of
    `SDPA_MASK_ALIGNMENT`: eager SDPA pads any other mask in every call before its memory-efficient
    kernel reads it (a copy of the whole mask per layer, and the copy's backward), so a stack's mask
    is made aligned once (`fold_masks`; CUDA only, outside torch.compile, where inductor lays the
    mask out aligned itself). Unchanged when already aligned."""
    pad = -mask.size(-1) % SDPA_MASK_ALIGNMENT
    if pad == 0:
        return mask
    return F.pad(mask, (0, pad))[..., :mask.size(-1)]


@torch.library.custom_op("ast_t5::sum_over_batch", mutates_args=())
def sum_over_batch(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``grad`` (B, ...) summed over its first dimension into ``dtype``, keeping it: (1, ...). An op
    of its own, which torch.compile runs where the graph calls it and fuses with nothing
    (`TappedMask`)."""
    return grad.sum(0, keepdim=True, dtype=dtype).contiguous()


@sum_over_batch.register_fake
def _(grad, dtype):
    return grad.new_empty((1, *grad.shape[1:]), dtype=dtype)


class _BiasGradTap(torch.autograd.Function):
    """(bias (1, H, T, S), folded mask (1 or B, H, T, S) built from it, detached, batch) -> the
    folded mask, expanded to the batch; backward: the mask's gradient summed over the batch, at once,
    by `sum_over_batch`, is the bias's."""

    @staticmethod
    def forward(ctx, bias, folded, batch):
        ctx.dtype = bias.dtype
        if folded.size(0) != batch:
            return folded.expand(batch, *folded.shape[1:])
        return folded.view_as(folded)

    @staticmethod
    def backward(ctx, grad):
        if grad.size(0) == 1:
            return grad.to(ctx.dtype), None, None
        return torch.ops.ast_t5.sum_over_batch(grad, ctx.dtype), None, None


class TappedMask:
    """A stack's dense mask (the (1, H, T, S) bias with its padding and causal masks folded in) for
    layers whose bias takes a gradient: each call reads the same folded tensor, and its gradient
    reaches the bias summed over the batch by that call, at once (`_BiasGradTap`).

    Why: with the folded mask a plain tensor of the graph, its gradient is the sum of the layers'
    (B, H, T, S) gradients (SDPA's memory-efficient kernel returns the mask's gradient at full
    size), masked, then summed over the batch. Eager autograd adds them up one by one (a pass that
    reads two and writes one, 11 times for 12 layers), then masks the sum (one more): about 24 passes
    over a layer's gradient that this skips (4.8 GB at T5-base's B32 x 512, the eager step's
    shape). Under torch.compile inductor made one kernel of the adds, the masking and the batch sum
    (5.6 GB per B64 x 512 update in its estimate; 4.8 GB read by the 12 sums instead). Each layer's
    gradient is read once, by `sum_over_batch`, an opaque op: written in the graph, inductor merged
    the per-layer sums back into one kernel at the end (BENCHMARKS.md, "The GPU's heuristics, and the
    traffic of inductor's kernels"). The compiled update's peak memory is the same either way
    (inductor's memory planning already ran that kernel where freed activations made room).

    The bias's gradient is the sum of SDPA's gradients of the mask, whose masked entries hold 0
    (probability 0) on every row with a key to attend to; the folded tensor's masking (masked_fill)
    zeroed them again, a full pass this sum skips. The two differ only where a loss depends on the
    output of a row whose every key is masked (causal queries before a left padding's end, a sample
    of padding only): uniform attention there, whose mask gradient the sum keeps. Such rows are
    padding, which the model's losses never read. Build it with `fold_masks`; `attention` takes it
    as the ``bias``.
    """

    def __init__(self, bias: torch.Tensor, mask: torch.Tensor):
        self.bias = bias
        self.mask = mask

    def varying_tensors(self) -> list:
        """The tensors whose sizes follow the batch and lengths (`FoldedBias.varying_tensors`)."""
        return [self.mask, self.bias]

    def for_call(self, batch: int) -> torch.Tensor:
        """The folded mask of one attention call of ``batch`` samples, tapped (`_BiasGradTap`).

        Under torch.compile a (1, H, T, S) mask is expanded to the batch before SDPA sees it, so that
        its gradient arrives here per sample (inductor aligns the mask's strides for SDPA and keeps
        expanded dimensions expanded). Eager calls leave it as is: SDPA expands it itself, and
        autograd sums that expansion's gradient over the batch in the call's own backward (while an
        expanded mask whose S is not a multiple of 8 SDPA would pad at full size, B copies)."""
        expand = self.mask.size(0) == 1 and torch.compiler.is_compiling()
        return _BiasGradTap.apply(self.bias, self.mask, batch if expand else self.mask.size(0))


def stack_block_mask(backend: str, key_padding_mask: Optional[torch.Tensor], causal: bool, q_len: int,
                     k_len: int, device: torch.device, dtype: torch.dtype, dropout_p: float):
    """The flex BlockMask for the layers of a stack that fold their own bias (the paper's per-layer
    tables), built once by the stack, outside the layers, when it is being compiled and its biased
    calls will run on flex; else None (each `FoldedBias` builds its own, as it needs).

    Pass it to `fold_masks` (``block_mask=``). Inside a layer under activation checkpointing,
    create_block_mask cannot be traced (see `FoldedBias`)."""
    if not torch.compiler.is_compiling():
        return None
    if backend == "auto":
        backend = auto_choice(device, dtype, dropout_p, True, q_len)[0]
    if backend != "flex" or dropout_p > 0:
        return None
    return flex_block_mask(key_padding_mask, causal, q_len, k_len, device)


def fold_masks(backend: str, bias: Optional[Union[torch.Tensor, RelativeBias]],
               key_padding_mask: Optional[torch.Tensor], causal: bool,
               dtype: Optional[torch.dtype] = None, dropout_p: Optional[float] = None,
               block_mask=None) -> Tuple[Optional[BiasLike], Optional[torch.Tensor], bool]:
    """Prepare a stack's bias and masks once, for every layer, in the form its backend takes.

    - ``torch``/``sdpa``/``flash`` (and ``auto`` on CPU): padding and causal masks folded into one
      dense (1 or B, H, T, S) bias, cast to ``dtype`` with masked entries at its lowest finite value;
      a `TappedMask` holding it when the bias takes a gradient (each layer's share of the gradient
      then reaches the bias summed over the batch at once).
    - ``fused``: the dense bias, masks unchanged (the kernel broadcasts them itself).
    - ``flex``: a `FoldedBias` (bias per distance + block mask); no dense bias is built.
    - ``triton``: a `FoldedBias` (bias per distance + the masks the kernel applies itself).
    - ``cudnn``: a `FoldedBias` holding the (1, H, T, S) bias and each sample's count of keys, built here
      once for every layer.
    - ``auto``: the form of the backend `AUTO_TABLE` gives for ``dropout_p`` (the model's stacks
      always say it). When the caller does not say (``dropout_p=None``), on CUDA: with autograd on
      (training, perhaps with attention dropout) a `FoldedBias` that also holds the dense mask,
      built here once for all layers; with autograd off (evaluation, no dropout) a `FoldedBias`
      without it; on CPU the dense bias.

    Args:
        bias: a `RelativeBias` (from RelativePositionBias) or a dense (1 or B, H, T, S) tensor.
        dtype: the attention's compute dtype (see `compute_dtype`).
        dropout_p: the layers' attention dropout in this pass (0.0 in eval), if the caller knows it.
        block_mask: the flex BlockMask of these masks, if the caller built it (`stack_block_mask`).
    Returns:
        (bias, key_padding_mask, causal) to pass to `attention`.
    """
    if bias is None:
        return bias, key_padding_mask, causal
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
    device = bias.device
    if isinstance(bias, RelativeBias) and backend == "triton":
        return FoldedBias(bias, key_padding_mask, causal, None, flex=False), None, False
    if isinstance(bias, RelativeBias) and backend == "cudnn":
        return FoldedBias(bias, key_padding_mask, causal, None, flex=False, cudnn=True, dtype=dtype), None, False
    if isinstance(bias, RelativeBias) and backend == "auto" and dropout_p is not None:
        # the caller knows the dropout: prepare exactly the form of the backend the table gives
        choice, _ = auto_choice(device, dtype or bias.dtype, dropout_p, True, bias.q_len)
        if choice in ("flex", "triton"):
            return FoldedBias(bias, key_padding_mask, causal, None, flex=choice == "flex",
                              block_mask=block_mask if choice == "flex" else None), None, False
        backend = choice  # a dense kernel: the bias is densified below
    if isinstance(bias, RelativeBias) and (backend == "flex" or (backend == "auto" and device.type == "cuda")):
        dense = None
        if backend == "auto" and torch.is_grad_enabled():
            dense = _fold_dense(bias.dense(), key_padding_mask, causal, dtype)
        return FoldedBias(bias, key_padding_mask, causal, dense, block_mask=block_mask), None, False
    if isinstance(bias, RelativeBias):
        bias = bias.dense()
    if backend == "fused":
        return bias, key_padding_mask, causal
    return _fold_dense(bias, key_padding_mask, causal, dtype), None, False


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
              bias: Optional[BiasLike] = None,
              key_padding_mask: Optional[torch.Tensor] = None, causal: bool = False,
              dropout_p: float = 0.0, scale: float = 1.0, backend: str = "auto",
              packed_qkv: Optional[torch.Tensor] = None,
              packed_kv: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Multi-head attention core.

    Args:
        q: (B, H, T, D) queries; k, v: (B, H, S, D). float32/float16/bfloat16 (float64: torch/sdpa).
        bias: optional additive bias: a (1 or B, H, T, S) tensor, a `RelativeBias`, or the
            `FoldedBias` or `TappedMask` that `fold_masks` makes (it carries the masks; pass no
            others with it).
        key_padding_mask: optional (B, S) bool, True at padded keys.
        causal: forbid keys after the query (requires T == S).
        dropout_p: attention-probability dropout (pass 0.0 in eval mode).
        scale: multiplier of q k^T (T5 uses 1.0; the paper's model head_dim ** -0.5).
        backend: one of ATTENTION_BACKENDS.
        packed_qkv: optional (B, T, 3, H, D) self-attention projection that q, k, v are the
            ``permute(2, 0, 3, 1, 4).unbind(0)`` of: the triton and cudnn backends then return their
            gradients as one tensor of that shape (no stack and copy in the backward); others ignore it.
        packed_kv: likewise, the (B, S, 2, H, D) key and value projection that k, v are unpacked
            from (cross-attention; not with packed_qkv).
    Returns:
        (B, H, T, D) tensor in q's dtype.
    """
    if causal and q.size(2) != k.size(2):
        raise ValueError(f"causal attention needs as many queries as keys, got {q.size(2)} and {k.size(2)}")
    if packed_qkv is not None and packed_kv is not None:
        raise ValueError("pass packed_qkv (self-attention) or packed_kv (keys and values), not both")
    packed_qkv = packed_kv if packed_qkv is None else packed_qkv  # the triton backend tells them by shape
    if isinstance(bias, TappedMask):
        bias = bias.for_call(q.size(0))
    if backend == "triton" and bias is None and key_padding_mask is not None:
        from . import triton_rpe_attention

        reason = triton_rpe_attention.unsupported_reason(q, k, v, None)
        if reason is None:
            return _triton_nobias(q, k, v, key_padding_mask, causal, dropout_p, scale, packed_qkv)
        log_once("attention backend triton: %s -> flash for bias-free calls with padded keys", reason)
    if backend == "cudnn" and bias is None and key_padding_mask is not None:
        from . import cudnn_attention

        reason = cudnn_attention.unsupported_reason(q, k, v)
        if reason is None:
            return _cudnn_nobias(q, k, v, key_padding_mask, causal, dropout_p, scale, packed_qkv)
        log_once("attention backend cudnn: %s -> flash for bias-free calls with padded keys", reason)
    backend = resolve_backend(backend, q.device, bias is not None, q.dtype, dropout_p, q.size(2))
    if backend == "flex":
        reason = _flex_unsupported(q, k, v, bias)
        if reason is not None:
            log_once("attention backend flex: %s -> sdpa for those calls", reason)
            backend = "sdpa"
    if backend == "triton":
        reason = _triton_unsupported(q, k, v, bias)
        if reason is not None:
            log_once("attention backend triton: %s -> sdpa for those calls", reason)
            backend = "sdpa"
    if backend == "cudnn":
        reason = _cudnn_unsupported(q, k, v, bias)
        if reason is not None:
            log_once("attention backend cudnn: %s -> sdpa for those calls", reason)
            backend = "sdpa"
    if isinstance(bias, RelativeBias):
        if backend in ("flex", "triton", "cudnn"):
            bias = FoldedBias(bias, key_padding_mask, causal, None, flex=backend == "flex",
                              cudnn=backend == "cudnn", dtype=q.dtype)
            key_padding_mask, causal = None, False
        else:
            bias = bias.dense()
    if isinstance(bias, FoldedBias):
        if backend == "flex":
            return _flex(q, k, v, bias, scale)
        if backend == "triton":
            return _triton(q, k, v, bias, dropout_p, scale, packed_qkv)
        if backend == "cudnn":
            return _cudnn(q, k, v, bias, dropout_p, scale, packed_qkv)
        bias = bias.dense_mask(q.dtype)
        if isinstance(bias, TappedMask):
            bias = bias.for_call(q.size(0))
    if backend == "flash":
        out = _flash(q, k, v, key_padding_mask, causal, dropout_p, scale)
        if out is not None:
            return out
        log_once("attention backend flash: padded keys with dropout or causality, no varlen kernel, or "
                 "dropout on CPU -> sdpa for those calls")
        backend = "sdpa"
    masked = _boolean_mask(key_padding_mask, causal, q.size(2), k.size(2), q.device)
    if backend == "sdpa":
        return _sdpa(q, k, v, bias, masked, dropout_p, scale, causal)
    # torch or fused (an explicit "fused" raises where the kernel cannot run; auto never picks it)
    return _softmax_attention(q, k, v, bias, masked, dropout_p, scale, backend)
