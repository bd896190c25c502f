"""Biased attention on cuDNN's fused attention kernels: the ``cudnn`` attention backend.

cuDNN (through NVIDIA's cudnn-frontend Python package, ``nvidia-cudnn-frontend``, an optional GPU
dependency) runs scaled dot-product attention with an additive bias as one fused kernel per direction,
written for each GPU generation (Hopper's warpgroup matrix products among them), and returns the
bias's gradient already summed over the batch (dBias, (1, H, T, S)). That is the library option for
T5's relative bias in training: PyTorch's own cuDNN path takes a bias only without a gradient, so
SDPA sends a trainable bias to its memory-efficient kernel, and FlexAttention's backward adds the
gradient of a bias read per distance by atomics. Our Triton kernels (`triton_rpe_attention`) have to
beat it in `benchmarks/bench_attention.py`.

How a call maps onto cuDNN:
- Bias: the (1, H, T, S) tensor of the stack's per-distance table (`RelativeBias.dense`, built once
  per stack by `attention_backends.FoldedBias`), cast to q's dtype per call, so that the layers'
  gradients add up in float32 before `distance_grad` reduces them per distance. cuDNN wants its rows
  16-byte aligned: S a multiple of 8 (what `unsupported_reason` checks; ``model.compile`` pads every
  length to a multiple of 16).
- Padding: cuDNN's padding mask, each sample's count of keys (``seq_len_kv``); keys from that count
  on are masked. So the padding must be right padding, each row's real keys first, which is how the
  collaters pad (``left_pad=False``); a device-side assertion checks it without a host sync. Queries
  are not masked (their count is T): the rows of padded queries are never read by a loss.
- No bias (the backend's bias-free calls with padded keys): the same graphs without the bias port.
- Packed projections: q, k, v are read through their strides; given the (B, T, 3, H, D) projection they
  are views of (or the (B, S, 2, H, D) one of k, v), cuDNN writes their gradients through the strides of
  one tensor of its layout, the projection's gradient as is.
- Causal: cuDNN's diagonal band with right bound 0 (queries and keys aligned at the start).
- Dropout: cuDNN's Philox stream, seeded per call with a seed drawn on the device from PyTorch's
  generator, the same seed and offset for the backward.
- Graphs: cuDNN compiles a graph per shape. One forward and one backward graph per (batch, heads,
  lengths, head sizes, dtype, strides, masks, dropout, scale) are described, built at their first
  call and kept (`GRAPHS`; `BUILD_SECONDS` sums their build time); the shapes a run meets are bounded
  by its batches (``model.compile`` buckets the lengths).
- torch.compile: the two directions are custom ops (``ast_t5::cudnn_attention_fwd`` and ``_bwd``),
  opaque to inductor, with fake implementations giving the outputs' shapes and strides.

What runs the graphs is the module's executor (`set_executor`): `CudnnExecutor` on CUDA;
`ReferenceExecutor`, the same contract written in PyTorch, lets the CPU tests run every other part of
the backend (the custom ops and their gradients, padding, causality, dropout's seeding, the bias's
gradient, torch.compile) without a GPU. The graphs' descriptions themselves are checked on the CPU
too: cudnn-frontend validates a described graph without a GPU (`describe_forward`,
`describe_backward`), and every keyword they pass is one of its compiled bindings' parameters. What
only a GPU can show (plans, kernels, speed) is in ``tests/ast_t5/test_cudnn_attention.py``'s CUDA
tests and ``scripts/gpu_check.sh``.
"""
import logging
import os
import time
from typing import Dict, NamedTuple, Optional, Tuple

import torch

logger = logging.getLogger(__name__)

GRAPHS: Dict[tuple, "_Built"] = {}  # graph key -> the built graph (`_graph_key`)
BUILD_SECONDS = [0.0]  # time spent building the graphs of GRAPHS
_HANDLES = {}  # CUDA device index -> cudnn handle
_CUDNN = []  # [module] or [None, error text], once imported
MAX_HEAD_DIM = 128
# cuDNN's deterministic backward (no order-dependent float additions: a run repeats bit for bit, as with the
# other backends); AST_T5_CUDNN_DETERMINISTIC=0 lets cuDNN pick its faster plans too (bench_attention.py's
# cudnn-nondeterministic row)
DETERMINISTIC = os.environ.get("AST_T5_CUDNN_DETERMINISTIC", "1") != "0"


def cudnn_frontend():
    """The ``cudnn`` module of nvidia-cudnn-frontend, or None when it cannot be imported (`import_error`).

    On CUDA, PyTorch loads its libcudnn first: the frontend then finds that library by name instead of
    looking for a pip wheel's copy."""
    if not _CUDNN:
        try:
            if torch.cuda.is_available():
                torch.backends.cudnn.version()
            import cudnn

            if not hasattr(cudnn, "pygraph"):
                raise ImportError(f"the module named cudnn ({getattr(cudnn, '__file__', '?')}) is not NVIDIA's "
                                  "cudnn-frontend (no pygraph)")
            _CUDNN.append(cudnn)
        except Exception as e:  # an absent or broken install: the backend falls back, with this reason
            _CUDNN.extend([None, f"{type(e).__name__}: {e}"])
    return _CUDNN[0]


def import_error() -> Optional[str]:
    """Why `cudnn_frontend` is None (None when it imported)."""
    cudnn_frontend()
    return _CUDNN[1] if len(_CUDNN) > 1 else None


# ------------------------------------------------------------------------------- the executors
class ReferenceExecutor:
    """The contract of the cuDNN graphs, in PyTorch (float32 arithmetic, float64 for float64 inputs), on
    any device and in any float dtype: what the CPU tests run the backend with (`set_executor`). Dropout
    keeps each probability where a uniform draw from a generator seeded with ``seed`` is at least
    ``dropout_p`` (not cuDNN's stream: the same mask in the forward and the backward is what matters to
    the rest of the backend)."""

    device_types = ("cpu", "cuda")
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

    @staticmethod
    def _probabilities(q, k, bias, seq_len_kv, seed, dropout_p, scale, causal):
        """(P, the softmax's probabilities; the dropout's multiplier of each, 0 or 1 / (1 - p), or None;
        each row's log-sum-exp (B, H, T, 1)), in float32 (float64 for float64 inputs)."""
        B, H, T, _ = q.shape
        S = k.size(2)
        wide = torch.float64 if q.dtype == torch.float64 else torch.float32
        scores = torch.matmul(q.to(wide) * scale, k.to(wide).transpose(-1, -2))
        if bias is not None:
            scores = scores + bias.to(wide)
        masked = torch.zeros(B, 1, T, S, dtype=torch.bool, device=q.device)
        if seq_len_kv is not None:
            masked |= (torch.arange(S, device=q.device) >= seq_len_kv.reshape(B, 1, 1, 1))
        if causal:
            masked |= torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(masked, float("-inf"))
        stats = torch.logsumexp(scores, -1, keepdim=True)
        probs = torch.exp(scores - stats).nan_to_num(0.0)  # a row without keys: 0
        multiplier = None
        if dropout_p > 0:
            generator = torch.Generator(device=q.device).manual_seed(int(seed.reshape(-1)[0]))
            keep = torch.rand(probs.shape, generator=generator, device=q.device, dtype=wide) >= dropout_p
            multiplier = keep.to(wide) / (1.0 - dropout_p)
        return probs, multiplier, stats

    def forward(self, q, k, v, bias, seq_len_kv, seed, dropout_p, scale, causal):
        probs, multiplier, stats = self._probabilities(q, k, bias, seq_len_kv, seed, dropout_p, scale, causal)
        if multiplier is not None:
            probs = probs * multiplier
        out = _empty_heads_inner((*q.shape[:3], v.size(-1)), q)
        out.copy_(torch.matmul(probs, v.to(probs.dtype)))
        return out, stats.float()

    def backward(self, grad_out, q, k, v, out, stats, bias, seq_len_kv, seed, dropout_p, scale, causal,
                 bias_grad, dq, dk, dv):
        # written out (the op runs below autograd): O = (P m) V with m the dropout's multiplier; dV = (P m)^T dO,
        # dP = (dO V^T) m, dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK = scale dS^T Q, dBias = dS summed over
        # the batch
        probs, multiplier, _ = self._probabilities(q, k, bias, seq_len_kv, seed, dropout_p, scale, causal)
        wide = probs.dtype
        q_, k_, v_, grad = (t.to(wide) for t in (q, k, v, grad_out))
        kept = probs if multiplier is None else probs * multiplier
        grad_probs = torch.matmul(grad, v_.transpose(-1, -2))
        if multiplier is not None:
            grad_probs = grad_probs * multiplier
        grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-1, keepdim=True))
        grads = (torch.matmul(grad_scores, k_) * scale, torch.matmul(grad_scores.transpose(-1, -2), q_) * scale,
                 torch.matmul(kept.transpose(-1, -2), grad))
        for buffer, grad in zip((dq, dk, dv), grads):
            buffer.copy_(grad)
        return grad_scores.sum(0, keepdim=True).to(bias.dtype) if bias_grad and bias is not None else None


class _Built(NamedTuple):
    graph: object  # the built cudnn pygraph
    ports: dict  # name -> its tensor in the graph
    workspace: int  # bytes


class CudnnExecutor:
    """Runs the graphs on cuDNN (CUDA tensors only), building each at its first call (`GRAPHS`)."""

    device_types = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16)

    def forward(self, q, k, v, bias, seq_len_kv, seed, dropout_p, scale, causal):
        B, H, T, _ = q.shape
        out = _empty_heads_inner((B, H, T, v.size(-1)), q)
        stats = torch.empty((B, H, T, 1), dtype=torch.float32, device=q.device)
        tensors = dict(q=q, k=k, v=v, o=out, stats=stats, **_mask_tensors(q, seq_len_kv, seed))
        if bias is not None:
            tensors["bias"] = bias
        key = ("fwd", *_graph_key(tensors, dropout_p, scale, causal))
        _execute(_built(key, tensors, lambda: describe_forward(tensors, dropout_p, scale, causal,
                                                               handle=_handle(q.device))), tensors)
        return out, stats

    def backward(self, grad_out, q, k, v, out, stats, bias, seq_len_kv, seed, dropout_p, scale, causal,
                 bias_grad, dq, dk, dv):
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        dbias = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device) if bias_grad and bias is not None \
            else None
        tensors = dict(q=q, k=k, v=v, o=out, dO=grad_out, stats=stats, dQ=dq, dK=dk, dV=dv,
                       **_mask_tensors(q, seq_len_kv, seed))
        if bias is not None:
            tensors["bias"] = bias
        if dbias is not None:
            tensors["dBias"] = dbias
        shape = _graph_key(tensors, dropout_p, scale, causal)
        deterministic = DETERMINISTIC and shape not in _NO_DETERMINISTIC

        def build(deterministic):
            return _built(("bwd", deterministic, *shape), tensors, lambda: describe_backward(
                tensors, dropout_p, scale, causal, handle=_handle(q.device), deterministic=deterministic))
        try:
            built = build(deterministic)
        except GraphUnavailable as e:
            if not deterministic:
                raise
            _NO_DETERMINISTIC.add(shape)  # and not asked again for this shape
            logger.warning("attention backend cudnn: no deterministic backward for q %s, k %s (%s): cuDNN's "
                           "non-deterministic one runs", tuple(q.shape), tuple(k.shape), str(e).splitlines()[0][:200])
            built = build(False)
        _execute(built, tensors)
        return dbias


_EXECUTOR = [CudnnExecutor()]


def set_executor(executor) -> object:
    """Make ``executor`` run the graphs (a `CudnnExecutor` by default; tests: a `ReferenceExecutor`);
    returns the previous one."""
    previous, _EXECUTOR[0] = _EXECUTOR[0], executor
    return previous


def executor():
    return _EXECUTOR[0]


def _empty_heads_inner(shape, like: torch.Tensor) -> torch.Tensor:
    """An uninitialized (B, H, L, D) tensor in (B, L, H, D) memory (as the projections lay out q, k, v
    and the output projection reads the heads: merging them is then a view)."""
    B, H, L, D = shape
    return torch.empty((B, L, H, D), dtype=like.dtype, device=like.device).permute(0, 2, 1, 3)


def _mask_tensors(q: torch.Tensor, seq_len_kv: Optional[torch.Tensor], seed: Optional[torch.Tensor]) -> dict:
    """The graphs' padding and dropout inputs: each sample's count of queries (all T) and keys, (B, 1,
    1, 1) int32; the Philox seed and offset, (1, 1, 1, 1) int64."""
    found = {}
    if seq_len_kv is not None:
        B, T = q.size(0), q.size(2)
        found["seq_len_q"] = torch.full((B, 1, 1, 1), T, dtype=torch.int32, device=q.device)
        found["seq_len_kv"] = seq_len_kv.reshape(B, 1, 1, 1)
    if seed is not None:
        found["seed"] = seed.reshape(1, 1, 1, 1)
        found["offset"] = torch.zeros((1, 1, 1, 1), dtype=torch.int64, device=q.device)
    return found


def _graph_key(tensors: dict, dropout_p: float, scale: float, causal: bool) -> tuple:
    """What a built graph is specific to: every tensor's shape, strides and dtype, and the constants."""
    layout = tuple((name, tuple(t.shape), tuple(t.stride()), t.dtype) for name, t in sorted(tensors.items()))
    device = next(iter(tensors.values())).device
    return (str(device), layout, float(dropout_p), float(scale), bool(causal))


def _handle(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _HANDLES:
        with torch.cuda.device(index):
            _HANDLES[index] = cudnn_frontend().create_handle()
    return _HANDLES[index]


class GraphUnavailable(RuntimeError):
    """cuDNN has no plan for a described graph (these shapes, masks and options on this GPU and cuDNN)."""


_NO_DETERMINISTIC = set()  # graph keys (less direction and determinism) whose deterministic backward cuDNN lacks


def _built(key: tuple, tensors: dict, describe) -> _Built:
    """The built graph of ``key``: kept, or described (``describe()``: graph, ports) and built now."""
    built = GRAPHS.get(key)
    if built is not None:
        return built
    cudnn = cudnn_frontend()
    start = time.perf_counter()
    graph, ports = describe()
    try:
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
    except Exception as e:
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in sorted(tensors.items()))
        raise GraphUnavailable(f"cuDNN cannot build its {key[0]} attention graph for {shapes}: {e}; use "
                               f"model.attention_backend=triton or sdpa") from e
    built = GRAPHS[key] = _Built(graph, ports, int(graph.get_workspace_size()))
    seconds = time.perf_counter() - start
    BUILD_SECONDS[0] += seconds
    logger.info("attention backend cudnn: built a %s graph (%d in all, %.1f s) for q %s, k %s", key[0],
                len(GRAPHS), seconds, tuple(tensors["q"].shape), tuple(tensors["k"].shape))
    return built


def _execute(built: _Built, tensors: dict) -> None:
    """Run a built graph on ``tensors`` (their names are its ports), on PyTorch's current stream."""
    cudnn = cudnn_frontend()
    device = next(iter(tensors.values())).device
    handle = _handle(device)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    workspace = torch.empty(max(built.workspace, 1), dtype=torch.uint8, device=device)
    built.graph.execute({built.ports[name]: t for name, t in tensors.items()}, workspace, handle=handle)


# --------------------------------------------------------------------------- the descriptions
_DATA_TYPES = {torch.float16: "HALF", torch.bfloat16: "BFLOAT16", torch.float32: "FLOAT",
               torch.int32: "INT32", torch.int64: "INT64"}


def _port(graph, name: str, t: torch.Tensor):
    """The graph's tensor for ``t``: its sizes, strides and dtype (described from them, not through DLPack,
    so that the description is the same for a CPU tensor in the tests)."""
    data_type = getattr(frontend_data_type(), _DATA_TYPES[t.dtype])
    return graph.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=data_type)


def frontend_data_type():
    return cudnn_frontend().data_type


def _new_graph(dtype: torch.dtype, handle):
    cudnn = cudnn_frontend()
    kwargs = dict(io_data_type=getattr(cudnn.data_type, _DATA_TYPES[dtype]),
                  intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    if handle is not None:
        kwargs["handle"] = handle
    return cudnn.pygraph(**kwargs)


def _mask_kwargs(graph, ports: dict, tensors: dict, dropout_p: float, causal: bool) -> dict:
    """The keywords of the masks and dropout, shared by both directions."""
    cudnn = cudnn_frontend()
    kwargs = {}
    if "seq_len_kv" in tensors:
        for name in ("seq_len_q", "seq_len_kv"):
            ports[name] = _port(graph, name, tensors[name])
        kwargs.update(use_padding_mask=True, seq_len_q=ports["seq_len_q"], seq_len_kv=ports["seq_len_kv"])
    if causal:
        kwargs.update(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
    if dropout_p > 0:
        for name in ("seed", "offset"):
            ports[name] = _port(graph, name, tensors[name])
        kwargs["dropout"] = (float(dropout_p), ports["seed"], ports["offset"])
    return kwargs


def describe_forward(tensors: dict, dropout_p: float, scale: float, causal: bool, handle=None) -> tuple:
    """The forward graph of ``tensors`` (q, k, v, the bias if any, o, stats and the mask inputs of
    `_mask_tensors`), validated: (graph, ports). No GPU needed until it is built."""
    q = tensors["q"]
    graph = _new_graph(q.dtype, handle)
    ports = {name: _port(graph, name, tensors[name]) for name in ("q", "k", "v", "bias") if name in tensors}
    kwargs = _mask_kwargs(graph, ports, tensors, dropout_p, causal)
    o, stats = graph.sdpa(name="ast_t5_attention", q=ports["q"], k=ports["k"], v=ports["v"], generate_stats=True,
                          attn_scale=float(scale), bias=ports.get("bias"), **kwargs)
    o.set_output(True).set_dim(list(tensors["o"].shape)).set_stride(list(tensors["o"].stride()))
    stats.set_output(True).set_data_type(frontend_data_type().FLOAT)
    ports.update(o=o, stats=stats)
    graph.validate()
    return graph, ports


def describe_backward(tensors: dict, dropout_p: float, scale: float, causal: bool, handle=None,
                      deterministic: Optional[bool] = None) -> tuple:
    """The backward graph of ``tensors`` (q, k, v, o, dO, stats, the bias if any, dQ, dK, dV, dBias if the bias
    takes a gradient, and the mask inputs), validated: (graph, ports). ``deterministic`` (default
    `DETERMINISTIC`): cuDNN's deterministic backward, so that a run repeats bit for bit, as the other backends'
    do."""
    q = tensors["q"]
    graph = _new_graph(q.dtype, handle)
    ports = {name: _port(graph, name, tensors[name]) for name in ("q", "k", "v", "o", "dO", "stats", "bias")
             if name in tensors}
    kwargs = _mask_kwargs(graph, ports, tensors, dropout_p, causal)
    if "dBias" in tensors:
        ports["dBias"] = _port(graph, "dBias", tensors["dBias"])
        kwargs["dBias"] = ports["dBias"]
    dq, dk, dv = graph.sdpa_backward(name="ast_t5_attention_backward", q=ports["q"], k=ports["k"], v=ports["v"],
                                     o=ports["o"], dO=ports["dO"], stats=ports["stats"], attn_scale=float(scale),
                                     bias=ports.get("bias"),
                                     use_deterministic_algorithm=DETERMINISTIC if deterministic is None
                                     else deterministic, **kwargs)
    for name, port in (("dQ", dq), ("dK", dk), ("dV", dv)):
        port.set_output(True).set_dim(list(tensors[name].shape)).set_stride(list(tensors[name].stride()))
        ports[name] = port
    graph.validate()
    return graph, ports


# ------------------------------------------------------------------------------ the custom ops
def _operands(q, k, v, packed):
    """q, k, v of an op's call: given, or views of ``packed``, a (B, T, 3, H, D) self-attention projection (q,
    k, v None), or a (B, S, 2, H, D) key and value projection (k, v None)."""
    if packed is None:
        return q, k, v
    views = packed.permute(2, 0, 3, 1, 4).unbind(0)
    return views if packed.size(2) == 3 else (q, *views)


@torch.library.custom_op("ast_t5::cudnn_attention_fwd", mutates_args=())
def _forward_op(q: Optional[torch.Tensor], k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                packed: Optional[torch.Tensor], bias: Optional[torch.Tensor], seq_len_kv: Optional[torch.Tensor],
                seed: Optional[torch.Tensor], dropout_p: float, scale: float,
                causal: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, T, Dv) in (B, T, H, Dv) memory, stats (B, H, T, 1) float32: each row's log-sum-exp)."""
    q, k, v = _operands(q, k, v, packed)
    return executor().forward(q, k, v, bias, seq_len_kv, seed, dropout_p, scale, causal)


@_forward_op.register_fake
def _(q, k, v, packed, bias, seq_len_kv, seed, dropout_p, scale, causal):
    q, k, v = _operands(q, k, v, packed)
    B, H, T, _ = q.shape
    return _empty_heads_inner((B, H, T, v.size(-1)), q), q.new_empty((B, H, T, 1), dtype=torch.float32)


def _gradient_buffers(q, k, v, packed):
    """(dq, dk, dv, dpacked): the gradients' buffers, dq, dk, dv in (B, L, H, D) memory, or with ``packed``
    views of one tensor of its shape (dpacked), which cuDNN writes through their strides: the projection's
    gradient as is, with no stack of three tensors into it."""
    if packed is None:
        return (*(_empty_heads_inner(t.shape, t) for t in (q, k, v)), None)
    dpacked = torch.empty(packed.shape, dtype=packed.dtype, device=packed.device)
    views = dpacked.permute(2, 0, 3, 1, 4).unbind(0)
    if packed.size(2) == 3:
        return (*views, dpacked)
    return (_empty_heads_inner(q.shape, q), *views, dpacked)


@torch.library.custom_op("ast_t5::cudnn_attention_bwd", mutates_args=())
def _backward_op(grad_out: torch.Tensor, q: Optional[torch.Tensor], k: Optional[torch.Tensor],
                 v: Optional[torch.Tensor], packed: Optional[torch.Tensor], out: torch.Tensor, stats: torch.Tensor,
                 bias: Optional[torch.Tensor], seq_len_kv: Optional[torch.Tensor], seed: Optional[torch.Tensor],
                 dropout_p: float, scale: float, causal: bool,
                 bias_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dpacked, dbias): the gradients of the forward's inputs, an empty tensor for each input it had
    not (q, k, v views of ``packed``: its gradient, of its shape, instead); dbias (1, H, T, S), summed over the
    batch, or empty without ``bias_grad``."""
    q_, k_, v_ = _operands(q, k, v, packed)
    dq, dk, dv, dpacked = _gradient_buffers(q_, k_, v_, packed)
    dbias = executor().backward(grad_out, q_, k_, v_, out, stats, bias, seq_len_kv, seed, dropout_p, scale, causal,
                                bias_grad, dq, dk, dv)
    return _backward_outputs(q, k, v, packed, out, dq, dk, dv, dpacked, dbias)


def _backward_outputs(q, k, v, packed, out, dq, dk, dv, dpacked, dbias) -> tuple:
    """The backward op's outputs: each gradient, or an empty tensor where the forward had no such input (or the
    bias no gradient)."""
    given = ((dq, q), (dk, k), (dv, v), (dpacked, packed), (dbias, dbias))
    return tuple(grad if input_ is not None else out.new_empty(0) for grad, input_ in given)  # no shared output


@_backward_op.register_fake
def _(grad_out, q, k, v, packed, out, stats, bias, seq_len_kv, seed, dropout_p, scale, causal, bias_grad):
    q_, k_, v_ = _operands(q, k, v, packed)
    dq, dk, dv, dpacked = _gradient_buffers(q_, k_, v_, packed)
    dbias = bias.new_empty(bias.shape) if bias_grad and bias is not None else None
    return _backward_outputs(q, k, v, packed, out, dq, dk, dv, dpacked, dbias)


def _setup_context(ctx, inputs, output):
    q, k, v, packed, bias, seq_len_kv, seed, dropout_p, scale, causal = inputs
    out, stats = output
    ctx.save_for_backward(q, k, v, packed, out, stats, bias, seq_len_kv, seed)
    ctx.constants = (dropout_p, scale, causal)


def _backward(ctx, grad_out, grad_stats):
    q, k, v, packed, out, stats, bias, seq_len_kv, seed = ctx.saved_tensors
    bias_grad = ctx.needs_input_grad[4] and bias is not None
    dq, dk, dv, dpacked, dbias = torch.ops.ast_t5.cudnn_attention_bwd(grad_out, q, k, v, packed, out, stats, bias,
                                                                      seq_len_kv, seed, *ctx.constants, bias_grad)
    grads = [g if t is not None else None for g, t in zip((dq, dk, dv, dpacked), (q, k, v, packed))]
    return (*grads, dbias if bias_grad else None, None, None, None, None, None)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------- the call
def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why the executor cannot take this call, or None."""
    if q.device.type not in executor().device_types:
        return f"cuDNN attention runs on CUDA tensors, not {q.device.type}"
    if isinstance(executor(), CudnnExecutor) and cudnn_frontend() is None:
        return f"the cudnn-frontend package (pip install nvidia-cudnn-frontend) cannot be imported: {import_error()}"
    if q.dtype not in executor().dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"cuDNN attention takes float16 or bfloat16, not {q.dtype}"
    if q.size(-1) != k.size(-1) or q.size(-1) > MAX_HEAD_DIM or v.size(-1) > MAX_HEAD_DIM \
            or q.size(-1) % 8 or v.size(-1) % 8:
        return f"head sizes {q.size(-1)} and {v.size(-1)} (cuDNN: multiples of 8 up to {MAX_HEAD_DIM})"
    if k.size(2) % 8:
        return f"{k.size(2)} keys (cuDNN's rows must be 16-byte aligned: a multiple of 8 keys)"
    return None


def stack_may_run(device: torch.device, dtype: Optional[torch.dtype], k_len: int) -> bool:
    """Whether a stack's calls on ``device`` in ``dtype`` (None: not known) over ``k_len`` keys can run on the
    executor, as far as that decides (`unsupported_reason` has the last word per call): whether to build the
    stack's cuDNN inputs at all, not for stacks whose calls will all fall back."""
    if device.type not in executor().device_types or k_len % 8:
        return False
    if isinstance(executor(), CudnnExecutor) and cudnn_frontend() is None:
        return False
    return dtype is None or dtype in executor().dtypes


def seq_len_from_padding(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """(B,) int32 count of each sample's keys, from a (B, S) mask (True at padded keys) that must be right
    padding: checked on the device (a device-side assertion, no host sync)."""
    real = ~key_padding_mask.bool()
    count = real.sum(1, dtype=torch.int32)
    position = torch.arange(1, real.size(1) + 1, dtype=torch.int32, device=real.device)
    end = torch.where(real, position, 0).amax(1).to(torch.int32)  # one past each row's last real key
    torch._assert_async((count == end).all(), "cudnn attention: key padding must be right padding (each row's "
                                              "real keys first); use another model.attention_backend")
    return count


def cudnn_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor], *,
                    seq_len_kv: Optional[torch.Tensor] = None, causal: bool = False, dropout_p: float = 0.0,
                    scale: float = 1.0, packed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention with an additive bias on cuDNN's fused kernels (module docstring).

    Args:
        q: (B, H, T, D); k, v: (B, H, S, D) and (B, H, S, Dv); float16 or bfloat16, last dimension contiguous.
        bias: (1, H, T, S), any float dtype (cast to q's; its gradient comes back in its own dtype), or None:
            bias-free attention (the backend's bias-free calls with padded keys).
        seq_len_kv: optional (B,) int32 count of each sample's keys (`seq_len_from_padding`): keys from it
            on are masked.
        causal: keys after the query are masked (T == S).
        dropout_p: attention-probability dropout (0 in eval).
        scale: multiplier of q k^T.
        packed: the (B, T, 3, H, D) self-attention projection that q, k, v are the ``permute(2, 0, 3, 1,
            4).unbind(0)`` of, or the (B, S, 2, H, D) key and value projection of k, v: cuDNN then reads them
            from it and writes their gradients into one tensor of its shape, the projection's gradient as is
            (otherwise autograd stacks the three into the projection's layout, a copy).
    Returns:
        (B, H, T, Dv) in q's dtype, in (B, T, H, Dv) memory.
    """
    reason = unsupported_reason(q, k, v)
    if reason is not None:
        raise RuntimeError(f"cudnn attention cannot run: {reason}")
    B, H, T, _ = q.shape
    S = k.size(2)
    if bias is not None and bias.shape != (1, H, T, S):
        raise ValueError(f"bias must be (1, {H}, {T}, {S}), got {tuple(bias.shape)}")
    if causal and T != S:
        raise ValueError(f"causal attention needs as many queries as keys, got {T} and {S}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if packed is not None:
        n = packed.size(2) if packed.dim() == 5 else 0
        expected = {3: (B, T, 3, H, q.size(-1)), 2: (B, S, 2, H, k.size(-1))}.get(n)
        if packed.shape != expected or packed.stride(-1) != 1 or k.shape != v.shape \
                or (n == 3 and k.shape != q.shape):
            raise ValueError(f"packed must be the (B, T, 3, H, D) projection that q, k, v {tuple(q.shape)} are "
                             f"unpacked from, or the (B, S, 2, H, D) one of k, v {tuple(k.shape)}, got "
                             f"{tuple(packed.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    seed = torch.randint(0, 2 ** 62, (1,), dtype=torch.int64, device=q.device) if dropout_p > 0 else None
    kind = 0 if packed is None else packed.size(2)
    out, _ = torch.ops.ast_t5.cudnn_attention_fwd(None if kind == 3 else q, None if kind else k, None if kind else v,
                                                  packed, None if bias is None else bias.to(q.dtype).contiguous(),
                                                  seq_len_kv, seed,
                                                  float(dropout_p), float(scale), bool(causal))
    return out
