"""Tests of the ``cudnn`` attention backend (ast_t5/modules/cudnn_attention.py).

cuDNN runs on a GPU only. On the CPU these tests run every other part of the backend (the custom ops,
their fake implementations and gradients, padding, causality, dropout's seeding, the bias's gradient
reduced per distance, torch.compile, a model's training step) with `cudnn_attention.ReferenceExecutor`,
the graphs' contract written in PyTorch, in place of cuDNN; and they check the graphs' descriptions
with cudnn-frontend itself, which validates a described graph without a GPU. The GPU tests (marked
``cuda``; `scripts/gpu_check.sh`'s cudnn steps) run cuDNN and fail if its kernels did not run.
"""
import re
import sys

import pytest
import torch

from ast_t5.modules import attention_backends as ab
from ast_t5.modules import cudnn_attention as ca
from ast_t5.modules.relative_position_bias import RelativePositionBias

from ..conftest import load_benchmark, tiny_model_pair

CUDA = torch.cuda.is_available()


def requires_cuda(test):
    """GPU test: marked ``cuda``, skipped without CUDA or without the frontend (an optional dependency)."""
    test = pytest.mark.skipif(CUDA and ca.cudnn_frontend() is None,
                              reason=f"nvidia-cudnn-frontend is not importable: {ca.import_error()}")(test)
    return pytest.mark.cuda(pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (cuDNN's kernels)")(test))


needs_frontend = pytest.mark.skipif(ca.cudnn_frontend() is None,
                                    reason=f"nvidia-cudnn-frontend is not importable ({ca.import_error()}); "
                                           "scripts/install.sh installs it")


@pytest.fixture
def reference_executor():
    previous = ca.set_executor(ca.ReferenceExecutor())
    try:
        yield
    finally:
        ca.set_executor(previous)


def make(B=3, H=4, T=16, S=16, D=8, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(device, dtype).requires_grad_() for n in (T, S, S))
    torch.manual_seed(seed)
    table = RelativePositionBias(H, 8, 6, bidirectional=True).to(device, torch.float64 if dtype == torch.float64
                                                                  else torch.float32)
    with torch.no_grad():
        table.embedding.weight.normal_()
    return q, k, v, table


def right_padding(B, S, device="cpu"):
    lengths = torch.tensor([S - (5 * b) % max(1, S // 2) for b in range(B)])
    return (torch.arange(S)[None, :] >= lengths[:, None]).to(device)


def run(backend, q, k, v, table, pad, causal, dropout_p=0.0, scale=0.5):
    """One call as a model's stack makes it (`fold_masks`, then `attention`), and the gradients of a fixed
    linear function of its output with respect to q, k, v and the bucket table."""
    rel = table(q.size(2), k.size(2))
    folded, fpad, fcausal = ab.fold_masks(backend, rel, pad, causal, dtype=q.dtype, dropout_p=dropout_p)
    out = ab.attention(q, k, v, bias=folded, key_padding_mask=fpad, causal=fcausal, dropout_p=dropout_p,
                       scale=scale, backend=backend)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    return out, torch.autograd.grad((out * weights).sum(), [q, k, v, table.embedding.weight])


# ------------------------------------------------------------------------------ CPU: the plumbing
@pytest.mark.parametrize("T,S,padded,causal", [(16, 16, True, False), (16, 16, False, True), (24, 16, True, False),
                                               (16, 16, False, False)])
def test_backend_matches_the_torch_backend(reference_executor, T, S, padded, causal):
    """Output and the gradients of q, k, v and the bucket table (through the stack's dense bias, its per-call
    cast and `distance_grad`) equal the eager reference backend's, in float64."""
    q, k, v, table = make(T=T, S=S)
    pad = right_padding(3, S) if padded else None
    ab.DISPATCH_COUNTS.clear()
    out, grads = run("cudnn", q, k, v, table, pad, causal)
    assert ab.DISPATCH_COUNTS["cudnn"] == 1 and ab.DISPATCH_COUNTS["sdpa"] == 0, dict(ab.DISPATCH_COUNTS)
    ref, ref_grads = run("torch", q, k, v, table, pad, causal)
    assert (out - ref).abs().max() < 1e-12
    for name, got, want in zip(("q", "k", "v", "table"), grads, ref_grads):
        assert (got - want).abs().max() < 1e-11 * (want.abs().max() + 1), name
    assert out.permute(0, 2, 1, 3).is_contiguous()  # (B, T, H, D) memory: merging the heads is a view


def test_the_custom_ops_pass_torchs_checks_and_gradcheck(reference_executor):
    """torch.library.opcheck (schema, fake implementations against the real outputs' shapes and strides,
    autograd registration, AOT dispatch) on both ops, and gradcheck of the forward op in float64 with
    padding, causality and dropout: the backward must use the forward's dropout mask (the same seed)."""
    B, H, T, D = 2, 2, 8, 4
    q, k, v, _ = make(B=B, H=H, T=T, S=T, D=D)
    bias = torch.randn(1, H, T, T, dtype=torch.float64, requires_grad=True)
    seq_len_kv = torch.tensor([8, 5], dtype=torch.int32)
    seed = torch.tensor([1234], dtype=torch.int64)
    packed_qkv = torch.randn(B, T, 3, H, D, dtype=torch.float64, requires_grad=True)
    packed_kv = torch.randn(B, T, 2, H, D, dtype=torch.float64, requires_grad=True)
    calls = [((q, k, v, None), (seq_len_kv, seed, 0.3, 0.5, True)), ((q, k, v, None), (None, None, 0.0, 1.0, False)),
             ((None, None, None, packed_qkv), (seq_len_kv, seed, 0.3, 0.5, True)),
             ((q, None, None, packed_kv), (None, None, 0.0, 1.0, False))]
    for operands, rest in calls:
        args = (*operands, bias, *rest)
        torch.library.opcheck(torch.ops.ast_t5.cudnn_attention_fwd.default, args)
        out, stats = torch.ops.ast_t5.cudnn_attention_fwd(*args)
        for bias_grad in (True, False):
            backward_args = (torch.randn_like(out), *operands, out, stats, bias, *rest, bias_grad)
            torch.library.opcheck(torch.ops.ast_t5.cudnn_attention_bwd.default,
                                  tuple(t.detach() if torch.is_tensor(t) else t for t in backward_args))
        given = [t for t in (*operands, bias) if t is not None]

        def forward(*tensors):
            it = iter(tensors)
            return torch.ops.ast_t5.cudnn_attention_fwd(*[None if t is None else next(it) for t in operands],
                                                        next(it), *rest)[0]
        assert torch.autograd.gradcheck(forward, tuple(given))


@pytest.mark.parametrize("kind", ["qkv", "kv"])
def test_a_packed_projection_gets_its_gradient_as_one_tensor(reference_executor, kind):
    """With the (B, T, 3, H, D) self-attention projection (or the (B, S, 2, H, D) key and value projection) that
    q, k, v are views of, the backward writes their gradients into one tensor of its shape: the projection's
    gradient as is, no stack of three tensors; the same values as the unpacked call's."""
    B, H, T, D = 3, 4, 16, 8
    torch.manual_seed(0)
    table = make(B=B, H=H, T=T, S=T, D=D)[3]
    packed = torch.randn(B, T, 3 if kind == "qkv" else 2, H, D, dtype=torch.float64, requires_grad=True)
    q_alone = torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True)
    pad = right_padding(B, T)

    def call(packed_arg):
        views = packed.permute(2, 0, 3, 1, 4).unbind(0)
        q, k, v = views if kind == "qkv" else (q_alone, *views)
        folded, _, _ = ab.fold_masks("cudnn", table(T, T), pad, False, dtype=q.dtype, dropout_p=0.0)
        return ab.attention(q, k, v, bias=folded, scale=0.5, backend="cudnn",
                            **{"packed_qkv" if kind == "qkv" else "packed_kv": packed_arg})

    grad_out = torch.randn(B, H, T, D, dtype=torch.float64)
    out = call(packed)
    got = torch.autograd.grad(out, [packed, q_alone, table.embedding.weight], grad_out, allow_unused=True)
    ref_out = call(None)
    want = torch.autograd.grad(ref_out, [packed, q_alone, table.embedding.weight], grad_out, allow_unused=True)
    assert (out - ref_out).abs().max() < 1e-12
    for name, g, w in zip(("packed", "q", "table"), got, want):
        if kind == "qkv" and name == "q":
            assert g is None and w is None
            continue
        assert (g - w).abs().max() < 1e-11 * (w.abs().max() + 1), name
    ops = []
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))
    for packed_arg in (None, packed):
        ops.clear()
        out = call(packed_arg)
        with Record():
            torch.autograd.grad(out, [packed], grad_out)
        stacked = [op for op in ops if "stack" in op or "cat" in op]
        assert bool(stacked) == (packed_arg is None), ops  # unpacked, autograd stacks the views' gradients


def test_dropout_is_seeded_from_torchs_generator(reference_executor):
    """With attention dropout, the same torch seed gives the same output and gradients, another seed others,
    and the expected output over draws is the dropout-free one's (each probability kept with 1 - p, scaled)."""
    q, k, v, table = make()

    def seeded(seed, p=0.25):
        torch.manual_seed(seed)
        return run("cudnn", q, k, v, table, None, False, dropout_p=p)

    (a, grads_a), (b, grads_b), (c, _) = seeded(1), seeded(1), seeded(2)
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(grads_a, grads_b))
    assert (a - c).abs().max() > 1e-3
    mean = torch.stack([seeded(s)[0] for s in range(200)]).mean(0)
    plain, _ = run("cudnn", q, k, v, table, None, False)
    assert (mean - plain).abs().mean() < 0.1 * plain.abs().mean()


def test_compiled_attention_is_one_graph_with_the_ops_and_matches_eager(reference_executor):
    """Under torch.compile (fullgraph) the call traces into one graph holding the forward op (its fake
    implementation stands in while tracing); output and gradients equal the eager call's."""
    q, k, v, table = make(T=16, S=16)
    pad = right_padding(3, 16)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    def call(q, k, v):
        folded, _, _ = ab.fold_masks("cudnn", table(16, 16), pad, False, dtype=q.dtype, dropout_p=0.0)
        return ab.attention(q, k, v, bias=folded, scale=0.5, backend="cudnn")

    def with_grads(fn):
        out = fn(q, k, v)
        return out, torch.autograd.grad(out.sin().sum(), [q, k, v, table.embedding.weight])

    torch._dynamo.reset()
    out, grads = with_grads(torch.compile(call, backend=backend, fullgraph=True))
    ref, ref_grads = with_grads(call)
    assert len(graphs) == 1 and "ast_t5.cudnn_attention_fwd" in graphs[0], graphs
    assert (out - ref).abs().max() < 1e-12
    for got, want in zip(grads, ref_grads):
        assert (got - want).abs().max() < 1e-11 * (want.abs().max() + 1)


def test_a_models_training_step_on_the_backend_matches_the_torch_backend(reference_executor):
    """A tiny T5 v1.1 (padded source, causal biased decoder self-attention, bias-free cross-attention over the
    padded source): loss and every parameter's gradient as with the eager reference backend; every attention
    call ran on the backend."""
    d, model, reference = tiny_model_pair("cudnn")
    model, reference = model.double(), reference.double()
    src = torch.randint(4, len(d), (3, 24))
    src[1, -7:] = d.pad()
    prev = torch.randint(4, len(d), (3, 16))
    ab.DISPATCH_COUNTS.clear()
    loss = model(src, None, prev)[0].logsumexp(-1).mean()
    layers = len(model.encoder.layers) + len(model.decoder.layers)
    # biased self-attention on cuDNN with the bias, the cross-attention over the padded source without it
    assert ab.DISPATCH_COUNTS["cudnn"] == layers, dict(ab.DISPATCH_COUNTS)
    assert ab.DISPATCH_COUNTS["cudnn-nobias"] == len(model.decoder.layers), dict(ab.DISPATCH_COUNTS)
    loss.backward()
    ref = reference(src, None, prev)[0].logsumexp(-1).mean()
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-12
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad - p_ref.grad).abs().max() < 1e-10 * (p_ref.grad.abs().max() + 1), name


# ------------------------------------------------------------------------------- CPU: the fallbacks
def test_cpu_tensors_fall_back_to_sdpa_with_the_reason_logged(caplog):
    """With cuDNN as the executor (the default), CPU tensors cannot run: the call runs on sdpa, once logged."""
    q, k, v, table = make(dtype=torch.float32)
    ab._LOGGED.clear()
    ab.DISPATCH_COUNTS.clear()
    with caplog.at_level("INFO", logger=ab.logger.name):
        out, _ = run("cudnn", q, k, v, table, right_padding(3, 16), False)
    assert ab.DISPATCH_COUNTS["cudnn"] == 0 and ab.DISPATCH_COUNTS["sdpa"] == 1
    assert "attention backend cudnn: cuDNN attention runs on CUDA tensors, not cpu -> sdpa" in caplog.text
    ref, _ = run("sdpa", q, k, v, table, right_padding(3, 16), False)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("shape,why", [(dict(S=12), "12 keys"), (dict(D=12), "head sizes 12 and 12")])
def test_calls_cudnn_cannot_take_fall_back(reference_executor, shape, why):
    q, k, v, _ = make(**shape)
    assert why in ca.unsupported_reason(q, k, v)
    q, k, v, table = make(**shape)
    ab.DISPATCH_COUNTS.clear()
    run("cudnn", q, k, v, table, None, False)
    assert ab.DISPATCH_COUNTS["cudnn"] == 0 and ab.DISPATCH_COUNTS["sdpa"] == 1


@pytest.mark.parametrize("T,S,causal", [(16, 24, False), (16, 16, True)])
def test_bias_free_calls_with_padded_keys_run_on_the_backend(reference_executor, T, S, causal):
    """Cross-attention over a padded source: cuDNN's padding mask without a bias (no unpadding); output and
    gradients as the torch backend's; a layer after the first reuses the keys' counts of the same mask."""
    q, k, v, _ = make(T=T, S=S)
    pad = right_padding(3, S)
    ab.DISPATCH_COUNTS.clear()
    out = ab.attention(q, k, v, key_padding_mask=pad, causal=causal, scale=0.5, backend="cudnn")
    assert ab.DISPATCH_COUNTS["cudnn-nobias"] == 1 and ab.DISPATCH_COUNTS["sdpa"] == 0, dict(ab.DISPATCH_COUNTS)
    kept = ab._CUDNN_PADDING[0][2]
    ab.attention(q, k, v, key_padding_mask=pad, causal=causal, scale=0.5, backend="cudnn")
    assert ab._CUDNN_PADDING[0][2] is kept
    ref = ab.attention(q, k, v, key_padding_mask=pad, causal=causal, scale=0.5, backend="torch")
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, [q, k, v], grad), torch.autograd.grad(ref, [q, k, v], grad)):
        assert (got - want).abs().max() < 1e-11
    assert (out - ref).abs().max() < 1e-12


def test_bias_free_calls_go_to_flash_and_cached_decoding_to_sdpa(reference_executor):
    assert ab.resolve_backend("cudnn", torch.device("cpu"), has_bias=False) == "flash"
    q, k, v, table = make(T=1, S=16)
    assert "cached decoding" in ab._cudnn_unsupported(q, k, v, table(1, 16, query_offset=15))
    ab.DISPATCH_COUNTS.clear()
    out = ab.attention(q, k, v, bias=table(1, 16, query_offset=15), backend="cudnn")
    ref = ab.attention(q, k, v, bias=table(1, 16, query_offset=15), backend="torch")
    assert ab.DISPATCH_COUNTS["cudnn"] == 0 and (out - ref).abs().max() < 1e-12


def test_another_module_named_cudnn_is_no_frontend(monkeypatch):
    """A package that installs a module named ``cudnn`` without cudnn-frontend's graph API is reported as such, and
    the backend falls back rather than failing on a missing attribute mid-call."""
    import types

    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))
    monkeypatch.setattr(ca, "_CUDNN", [])
    assert ca.cudnn_frontend() is None and "is not NVIDIA's cudnn-frontend" in ca.import_error()
    monkeypatch.setattr(ca.CudnnExecutor, "device_types", ("cpu", "cuda"))  # past the device check, on any host
    q, k, v, _ = make(dtype=torch.bfloat16)
    assert "the cudnn-frontend package (pip install nvidia-cudnn-frontend) cannot be imported: ImportError: the " \
           "module named cudnn" in ca.unsupported_reason(q, k, v)


def test_a_stack_whose_calls_fall_back_builds_no_cudnn_inputs(reference_executor):
    """fold_masks for a stack that cannot run on cuDNN (12 keys; float32 with cuDNN as the executor) builds neither
    the dense bias nor the keys' counts: a left-padded mask, which the counts' assertion refuses, passes to sdpa."""
    q, k, v, table = make(S=12)
    left = right_padding(3, 12).flip(1)
    folded, _, _ = ab.fold_masks("cudnn", table(16, 12), left, False, dtype=q.dtype, dropout_p=0.0)
    assert folded._cudnn_inputs is None
    ab.DISPATCH_COUNTS.clear()
    out = ab.attention(q, k, v, bias=folded, backend="cudnn")
    ref = ab.attention(q, k, v, bias=table(16, 12), key_padding_mask=left, backend="torch")
    assert ab.DISPATCH_COUNTS["sdpa"] == 1 and (out - ref).abs().max() < 1e-10
    assert ca.stack_may_run(torch.device("cpu"), torch.float64, 16)  # the reference takes any float dtype on CPU
    ca.set_executor(ca.CudnnExecutor())
    assert not ca.stack_may_run(torch.device("cuda"), torch.float32, 16)  # fp32: cuDNN's kernels take half types
    assert ca.stack_may_run(torch.device("cpu"), torch.bfloat16, 16) is False  # CPU


def test_key_padding_must_be_right_padding():
    right = right_padding(3, 16)
    assert ca.seq_len_from_padding(right).tolist() == (~right).sum(1).tolist()
    left = right.flip(1)
    with pytest.raises(RuntimeError, match="right padding"):
        ca.seq_len_from_padding(left)


# --------------------------------------------------------------------- CPU: the graphs' descriptions
def _binding_parameters(name: str) -> set:
    """The parameters of cudnn-frontend's compiled builder ``name`` (sdpa, sdpa_backward), from its signature."""
    signature = getattr(ca.cudnn_frontend()._pybind_module.backend_graph, name).__doc__.splitlines()[0]
    return set(re.findall(r"[(,]\s*(\w+):", signature)) - {"self"}


def _keywords(node) -> set:
    """The keywords a described node was given: its tensor ports and scalars (dropout's flattened parts as
    ``dropout``), and the tensors given as arguments that it writes (dBias)."""
    names = set(node.inputs) | set(node.params) | (set(getattr(node, "outputs", {})) & {"dBias"})
    return {"dropout" if re.fullmatch(r"_?dropout_\w+", n) else n for n in names}


@needs_frontend
@pytest.mark.parametrize("padded,biased", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_graph_descriptions_validate_and_use_only_the_bindings_keywords(padded, biased, causal, dropout_p):
    """Each configuration's forward and backward graphs, described for the q, k, v of a packed (B, T, 3, H, D)
    projection as the model passes them: cudnn-frontend validates them (no GPU needed), every tensor of the
    call is a port of the graph, and every keyword is a parameter of the frontend's compiled builder (which
    cudnn-frontend's Python layer would pass on unchecked)."""
    B, H, T, D = 2, 4, 64, 32
    packed = torch.empty(B, T, 3, H, D, dtype=torch.bfloat16)
    q, k, v = packed.permute(2, 0, 3, 1, 4).unbind(0)
    bias = torch.empty(1, H, T, T, dtype=torch.bfloat16)
    masks = ca._mask_tensors(q, torch.full((B,), T, dtype=torch.int32) if padded else None,
                             torch.zeros(1, dtype=torch.int64) if dropout_p else None)
    out = ca._empty_heads_inner((B, H, T, D), q)
    stats = torch.empty(B, H, T, 1)
    forward = dict(q=q, k=k, v=v, o=out, stats=stats, **masks)
    backward = dict(q=q, k=k, v=v, o=out, dO=out, stats=stats,
                    **{name: ca._empty_heads_inner(t.shape, t) for name, t in (("dQ", q), ("dK", k), ("dV", v))},
                    **masks)
    if biased:
        forward["bias"] = backward["bias"] = bias
        backward["dBias"] = torch.empty_like(bias)
    for describe, tensors, builder in ((ca.describe_forward, forward, "sdpa"),
                                       (ca.describe_backward, backward, "sdpa_backward")):
        graph, ports = describe(tensors, dropout_p, 0.125, causal)
        assert set(ports) == set(tensors)
        node, = graph.nodes
        keywords = _keywords(node)
        assert keywords - _binding_parameters(builder) == set()
        assert ("use_padding_mask" in keywords) == padded and ("diagonal_band_right_bound" in keywords) == causal
        assert ("dropout" in keywords) == (dropout_p > 0) and ("bias" in keywords) == biased
        written = "o" if builder == "sdpa" else "dQ"  # an output laid out as the module allocates it
        assert ports[written].stride == list(tensors[written].stride())


class _FakeGraph:
    """A described graph whose building fails (check_support) when asked to; records nothing else."""

    def __init__(self, fail):
        self.fail = fail

    def build_operation_graph(self):
        pass

    def create_execution_plans(self, modes):
        assert modes, "heuristic modes"

    def check_support(self):
        if self.fail:
            raise RuntimeError("no engine supports this graph")

    def build_plans(self):
        pass

    def get_workspace_size(self):
        return 0


@needs_frontend
def test_the_executor_builds_each_graph_once_and_falls_back_to_a_non_deterministic_backward(monkeypatch, caplog):
    """`CudnnExecutor`'s bookkeeping with the graphs faked (cuDNN needs a GPU): a shape's graphs are built once and
    kept; where cuDNN has no deterministic backward, the non-deterministic one is built and run instead, with one
    warning, and not asked for again; a forward graph cuDNN cannot build is a clear error naming the way out."""
    described, executed = [], []

    def describe_backward(tensors, dropout_p, scale, causal, handle=None, deterministic=None):
        described.append(deterministic)
        return _FakeGraph(fail=deterministic), {}
    monkeypatch.setattr(ca, "describe_backward", describe_backward)
    monkeypatch.setattr(ca, "describe_forward", lambda *a, **k: (_FakeGraph(fail=True), {}))
    monkeypatch.setattr(ca, "_handle", lambda device: None)
    monkeypatch.setattr(ca, "_execute", lambda built, tensors: executed.append(built))
    monkeypatch.setattr(ca, "GRAPHS", {})
    monkeypatch.setattr(ca, "_NO_DETERMINISTIC", set())
    monkeypatch.setattr(ca, "DETERMINISTIC", True)
    q, k, v, _ = make(B=2, H=2, T=16, S=16, D=8, dtype=torch.bfloat16)
    out = ca._empty_heads_inner(q.shape, q)
    stats = torch.empty(2, 2, 16, 1)
    bias = torch.zeros(1, 2, 16, 16, dtype=torch.bfloat16)
    with caplog.at_level("INFO", logger=ca.logger.name):
        for _ in range(2):
            buffers = [ca._empty_heads_inner(t.shape, t) for t in (q, k, v)]
            dbias = ca.CudnnExecutor().backward(out, q, k, v, out, stats, bias, None, None, 0.0, 1.0, False, True,
                                                *buffers)
            assert dbias.shape == bias.shape
    assert described == [True, False] and len(executed) == 2 and executed[0] is executed[1]
    assert caplog.text.count("no deterministic backward") == 1 and len(ca.GRAPHS) == 1
    # the build's log line, which bench_recipe.py counts in a training run's output
    assert load_benchmark("bench_recipe").cudnn_graph_builds(caplog.text)[0] == 1, caplog.text
    with pytest.raises(ca.GraphUnavailable, match="use model.attention_backend=triton or sdpa"):
        ca.CudnnExecutor().forward(q, k, v, bias, None, None, 0.0, 1.0, False)


# ------------------------------------------------------------------------------------------ GPU
def _gpu_inputs(length, padded, seed=0):
    q, k, v, table = make(B=2, H=4, T=length, S=length, D=64, dtype=torch.bfloat16, device="cuda", seed=seed)
    table = RelativePositionBias(4, 32, 128, bidirectional=True).cuda()
    with torch.no_grad():
        table.embedding.weight.normal_()
    return q, k, v, table, right_padding(2, length, "cuda") if padded else None


def _errors(got, ref):
    return [(a.double() - b.double()).abs().max().item() / (b.abs().max().item() or 1.0) for a, b in zip(got, ref)]


@requires_cuda
@pytest.mark.parametrize("length,padded,causal", [(512, True, False), (256, False, True), (1024, True, False),
                                                  (576, True, False)])  # 576 % 128 == 64: cuDNN's bad mask case
def test_gpu_cudnn_within_a_small_multiple_of_torchs_bf16_error(length, padded, causal):
    """cuDNN's kernels ran (a call counted, graphs built), and output and the gradients of q, k, v and the
    bucket table are within a small multiple of PyTorch's own bf16 error against the float32 reference."""
    q, k, v, table, pad = _gpu_inputs(length, padded)
    ab.DISPATCH_COUNTS.clear()
    got = run("cudnn", q, k, v, table, pad, causal, scale=1.0)
    assert ab.DISPATCH_COUNTS["cudnn"] == 1 and ab.DISPATCH_COUNTS["sdpa-masked-no-cudnn"] == 0
    assert isinstance(ca.executor(), ca.CudnnExecutor)
    shapes = {tuple(layout[1]) for key in ca.GRAPHS for layout in key[-4] if layout[0] == "q"}
    assert (2, 4, length, 64) in shapes, shapes  # this call's graphs were built (and so ran)
    wide = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = run("torch", *wide, table, pad, causal, scale=1.0)
    own = run("torch", *[t.detach().requires_grad_() for t in (q, k, v)], table, pad, causal, scale=1.0)
    for name, err, own_err in zip("out dq dk dv dtable".split(), _errors([got[0], *got[1]], [ref[0], *ref[1]]),
                                  _errors([own[0], *own[1]], [ref[0], *ref[1]])):
        assert err <= 4 * own_err + 1e-3, (name, err, own_err)


@requires_cuda
@pytest.mark.parametrize("T,S", [(128, 512), (1024, 1024)])  # a decoder's cross-attention; a long padded call
def test_gpu_bias_free_padded_calls_within_a_small_multiple_of_torchs_bf16_error(T, S):
    """cuDNN's kernels with its padding mask and no bias ran (no unpadding, no SDPA), output and q, k, v gradients
    within a small multiple of PyTorch's own bf16 error against the float32 reference."""
    q, k, v, _ = make(B=2, H=4, T=T, S=S, D=64, dtype=torch.bfloat16, device="cuda")
    pad = right_padding(2, S, "cuda")
    grad = torch.randn(q.shape, device="cuda").bfloat16()

    def call(backend, *x):
        out = ab.attention(*x, key_padding_mask=pad, backend=backend)
        return [out, *torch.autograd.grad(out, x, grad.to(out.dtype))]
    ab.DISPATCH_COUNTS.clear()
    got = call("cudnn", q, k, v)
    assert ab.DISPATCH_COUNTS["cudnn-nobias"] == 1 and sum(ab.DISPATCH_COUNTS.values()) == 1, dict(ab.DISPATCH_COUNTS)
    ref = call("torch", *[t.detach().float().requires_grad_() for t in (q, k, v)])
    own = call("torch", *[t.detach().requires_grad_() for t in (q, k, v)])
    for name, err, own_err in zip("out dq dk dv".split(), _errors(got, ref), _errors(own, ref)):
        assert err <= 4 * own_err + 1e-3, (name, err, own_err)


@requires_cuda
def test_gpu_dropout_is_reproducible_and_drops():
    q, k, v, table, pad = _gpu_inputs(256, True)

    def seeded(seed, p=0.1):
        torch.manual_seed(seed)
        return run("cudnn", q, k, v, table, pad, False, dropout_p=p, scale=1.0)

    (a, grads_a), (b, grads_b) = seeded(5), seeded(5)
    assert torch.equal(a, b)  # the same mask
    if ca._NO_DETERMINISTIC:  # cuDNN had no deterministic backward here (warned): gradients agree to rounding
        assert all((x - y).abs().max() <= 1e-2 * (y.abs().max() + 1e-6) for x, y in zip(grads_a, grads_b))
    else:
        assert all(torch.equal(x, y) for x, y in zip(grads_a, grads_b))
    plain, _ = seeded(5, p=0.0)
    assert (a - plain).abs().max() > 1e-2 and all(torch.isfinite(g).all() for g in grads_a)


@requires_cuda
def test_gpu_compiled_model_with_the_cudnn_backend_matches_eager_in_one_graph():
    """The model compiled, in bf16 autocast as the recipes train: cuDNN's ops are in its one graph (no break),
    and loss and gradients are those of the eager reference backend's step within bf16's tolerance."""
    d, model, reference = tiny_model_pair("cudnn", device="cuda", head_dim=16)
    src = torch.randint(4, len(d), (4, 200), device="cuda")
    src[1, -60:] = d.pad()
    prev = torch.randint(4, len(d), (4, 136), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ab.DISPATCH_COUNTS.clear()
        model(src, None, prev)  # eager: the calls count as cudnn
        assert ab.DISPATCH_COUNTS["cudnn"] > 0, dict(ab.DISPATCH_COUNTS)
        compiled = torch.compile(model)
        loss = compiled(src, None, prev)[0].float().logsumexp(-1).mean()
        ref = reference(src, None, prev)[0].float().logsumexp(-1).mean()
    loss.backward()
    ref.backward()
    assert abs(loss.item() - ref.item()) < 2e-2 * abs(ref.item())
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad - p_ref.grad).abs().max() < 5e-2 * (p_ref.grad.abs().max() + 1e-6), name
    explained = torch._dynamo.explain(lambda: model(src, None, prev)[0])()
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
