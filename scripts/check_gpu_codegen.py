"""Compile the model's training step through inductor's GPU code generation, on a machine without a GPU.

A graph that inductor cannot lower for a GPU fails only on a GPU. On 2026-11-27 the relative bias's
gradient joined its pieces with a `cat`, which inductor 2.11 lowers on a GPU as a pointwise kernel;
its tiling heuristic then failed ("The argument '((-1)) + 384' is not comparable"), and with it
every compiled training step on the H200, while every CPU test passed: the C++ backend that compiles
for CPU tensors takes other paths. This script has inductor generate Triton kernels for CPU
tensors instead (its ``cpu_backend="triton"``, with the GPU's lowering of small cats forced), and
stubs the two calls that need a Triton GPU driver: the backend's hash, and the compile of each
kernel's source. The graphs are traced, partitioned, lowered, scheduled and fused as they would be
for a GPU, and each kernel's source is generated; no kernel runs, so the losses and gradients are
garbage, and only the compilation is checked. Where inductor's heuristics ask whether a node is on a
CPU (what to store rather than recompute, loop reordering for fusion) they get a GPU's answer, and
SDPA on CPU tensors is one opaque op standing for the GPU's flash or memory-efficient kernel
(`sdpa_as_on_a_gpu`), not the CPU's kernels or math decomposition; the triton attention backend, which
falls back to SDPA on a CPU, is put in the graphs as on sm90 by ``--backends triton``, and the cudnn
backend's custom ops by ``--backends cudnn`` (`cudnn_as_on_a_gpu`). ``--traffic``
adds the memory traffic of inductor's kernels in one step, from its own per-kernel estimates.

Run it with the GPU host's torch (2.11 on 2026-11-27: a virtualenv with ``torch==2.11.0`` and this
checkout installed by ``PYTHON=<its python> bash scripts/install.sh``) before spending device time:

    python scripts/check_gpu_codegen.py                # both tiny families, sdpa (auto on sm90), whole forward
    python scripts/check_gpu_codegen.py --backends sdpa torch --scopes model layers --checkpoint
    python scripts/check_gpu_codegen.py --archs t5_v11_base --shapes 2x512/114
    python scripts/check_gpu_codegen.py --backends triton --optimizer   # gpu_check's bench_train variants
    python scripts/check_gpu_codegen.py --backends triton --attention-dropout 0.1 --checkpoint   # fine-tuning
    python scripts/check_gpu_codegen.py --backends cudnn --archs t5_v11_base --shapes 2x512/114  # cuDNN's ops

Each configuration compiles the model as ``model.compile=true`` does in the trainer (padded length
buckets, dynamic shapes, the chosen ``compile_scope``) and runs a forward and backward per shape in
bf16; about 35 s per configuration for the tiny models on one CPU core. ``--backends triton`` puts
the triton backend's own kernels in the graphs as user-defined Triton kernels at sm90's tiles
(`triton_kernels_as_on_sm90`; on a CPU the backend would otherwise fall back to SDPA, and the check
fails if it did); run it without TRITON_INTERPRET. ``--optimizer`` adds an ``adamw_scale`` step with
``optimizer.compiled=true`` after each training step (fp32 masters, a gradient factor folded in).
One line per configuration; exit status 0 when every one compiled, 1 when one failed (its error's
last line printed), 2 on a usage error or where this torch cannot generate GPU code on the CPU.
"""
import argparse
import collections
import contextlib
import importlib.util
import logging
import os
import re
import sys
import time
from typing import Dict, Iterator, List, Optional, Tuple

import torch

DEFAULT_SHAPES = ("4x96/32", "2x200/70")  # two lengths apart (model.compile_pad_multiple 16: 96/32, 208/80)


class CodegenUnavailable(RuntimeError):
    """This torch cannot generate GPU kernels on this machine (no triton, or the stubs do not fit)."""


class GeneratedKernels(list):
    """The names of the kernels inductor generated, in order; ``compiled``: for each user-defined
    kernel compiled for a GPU (`gpu_codegen_on_cpu`'s ``compile_ours_for``), one dict per launch
    configuration inductor gave it (num_warps, num_stages, shared memory bytes); ``copies``: the
    copies the graphs made for user-defined kernels (`_CopiesForUserKernels`), once counted."""

    def __init__(self):
        super().__init__()
        self.compiled: Dict[str, List[dict]] = {}
        self.copies: Optional[int] = None
        self.cudnn_ops = 0  # `cudnn_as_on_a_gpu`: the cudnn backend's op calls in the graphs
        self.gigabytes: Dict[str, float] = {}  # inductor's estimate of what one launch reads and writes
        self.launches: collections.Counter = collections.Counter()  # launches of each kernel, as run

    @property
    def launches_compiled(self) -> int:
        return sum(map(len, self.compiled.values()))

    def traffic(self) -> List[Tuple[float, int, float, str]]:
        """(GB in all, launches, GB per launch, name) for each of inductor's kernels launched since
        ``launches`` was last cleared, largest first. Our own kernels are not inductor's (no estimate)."""
        rows = [(self.gigabytes[name] * count, count, self.gigabytes[name], name)
                for name, count in self.launches.items() if name in self.gigabytes]
        return sorted(rows, reverse=True)


_VIEW_OPS = ("view", "_unsafe_view", "as_strided", "permute", "transpose", "reshape", "select", "slice", "unsqueeze",
             "expand", "alias")


class _CopiesForUserKernels:
    """Inside: count the copies that compiled graphs make for user-defined Triton kernels (ours), each
    a pass over memory per launch: a clone whose result a kernel reads or writes (through views
    at most; e.g. a gradient made contiguous for the backward kernels), and an output buffer that
    inductor's reinplacing declined, so that it copies the buffer before the kernel writes it."""

    def __enter__(self):
        import torch._inductor.config as inductor_config
        from torch._dynamo.utils import ReinplaceCounters
        from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional

        from torch._inductor.custom_graph_pass import CustomGraphPass

        self.clones, self._functional = 0, triton_kernel_wrapper_functional
        self.cudnn_ops = 0  # calls of the cudnn backend's custom ops in the graphs
        counter = self

        class CountClones(CustomGraphPass):  # a CustomGraphPass: inductor keys its caches by uuid(), no pickling
            def __call__(self, graph):
                counter._count_clones(graph)

            def uuid(self):
                return "ast_t5-check_gpu_codegen-count-clones"

        ReinplaceCounters.clear()
        self._patch = inductor_config.patch(post_grad_custom_post_pass=CountClones())
        self._patch.__enter__()
        return self

    def __exit__(self, *exc):
        self._patch.__exit__(*exc)
        return False

    def _feeds_a_kernel(self, node) -> bool:
        for user in node.users:
            if user.target is self._functional or user.target in _cudnn_ops():
                return True
            name = getattr(getattr(user.target, "overloadpacket", None), "__name__", "")
            if name in _VIEW_OPS and self._feeds_a_kernel(user):
                return True
        return False

    def _count_clones(self, graph) -> None:
        for node in graph.nodes:
            if node.op == "call_function" and node.target in _cudnn_ops():
                self.cudnn_ops += 1
            if (node.op == "call_function" and node.target is torch.ops.aten.clone.default
                    and self._feeds_a_kernel(node)):
                self.clones += 1

    def count(self) -> int:
        """Clones feeding our kernels, plus the output buffers of user-defined kernels that reinplacing
        declined (inductor's counter of them, by trigger where this torch keeps one)."""
        from torch._dynamo.utils import ReInplaceTrigger, ReinplaceCounters

        values = getattr(ReinplaceCounters, "_values", None)
        declined = (values.get(f"missed_tensors_{ReInplaceTrigger.TRITON_OPS.name}", 0) if values is not None
                    else ReinplaceCounters.get_total_missed())
        return self.clones + declined


def _cudnn_ops() -> tuple:
    """The cudnn backend's custom ops (`cudnn_attention`), as they appear in graphs."""
    from ast_t5.modules import cudnn_attention  # noqa: F401 - registers the ops

    return (torch.ops.ast_t5.cudnn_attention_fwd.default, torch.ops.ast_t5.cudnn_attention_bwd.default)


@contextlib.contextmanager
def cudnn_as_on_a_gpu() -> Iterator[None]:
    """The cudnn backend on CPU tensors: its reference executor (the cuDNN graphs' contract in PyTorch) stands
    in for cuDNN, so that the compiled graphs hold its custom ops as on a GPU (with cuDNN as the executor a
    CPU call falls back to SDPA), and `_CopiesForUserKernels` counts the copies made for them."""
    from ast_t5.modules import cudnn_attention

    previous = cudnn_attention.set_executor(cudnn_attention.ReferenceExecutor())
    try:
        yield
    finally:
        cudnn_attention.set_executor(previous)


def compile_user_kernel(name: str, source: str, arch: int) -> List[dict]:
    """Compile a user-defined Triton kernel as inductor generated it (``source``: its module, the
    kernel under ``triton_heuristics.user_autotune`` with inductor's signature, specializations and
    launch configurations) for the GPU of compute capability ``arch``, with Triton's own compiler
    (TTIR to cubin, ptxas included), as inductor's `CachingAutotuner` does on a GPU before the first
    launch. Returns one dict per configuration; raises what Triton raised."""
    import tempfile

    import triton
    from torch._inductor.runtime import triton_heuristics
    from triton.backends.compiler import GPUTarget

    captured = {}

    def user_autotune(*args, **kwargs):
        def capture(fn):
            captured.update(kwargs, fn=fn)
            return fn
        return capture

    saved = triton_heuristics.user_autotune
    triton_heuristics.user_autotune = user_autotune
    try:  # Triton reads a kernel's source from its file: load the module from one
        with tempfile.TemporaryDirectory(prefix="ast_t5_codegen_") as tmp:
            path = os.path.join(tmp, f"{name}.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
            spec = importlib.util.spec_from_file_location(f"ast_t5_codegen_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if "fn" not in captured:
                raise RuntimeError(f"{name}: inductor's source has no user_autotune kernel")
            meta, results = captured["triton_meta"], []
            for config in captured.get("configs") or [{"num_warps": 4, "num_stages": 3}]:
                src = triton.compiler.ASTSource(captured["fn"], meta["signature"], dict(meta["constants"]),
                                                meta["configs"][0])
                binary = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={
                    "num_warps": config["num_warps"], "num_stages": config["num_stages"], "debug": True})
                results.append(dict(num_warps=config["num_warps"], num_stages=config["num_stages"],
                                    shared=binary.metadata.shared))
            return results
    finally:
        triton_heuristics.user_autotune = saved


@contextlib.contextmanager
def gpu_codegen_on_cpu(compile_ours_for: Optional[int] = None, estimate_bytes: bool = False
                       ) -> Iterator[GeneratedKernels]:
    """Inside: inductor compiles graphs on CPU tensors as for a GPU (Triton kernels, the GPU's cat
    lowering), with Triton's compiler stubbed (module docstring). Yields the list of the generated
    kernels' names, appended to as inductor generates them (`GeneratedKernels`). SDPA is a GPU's
    kernel there, opaque to inductor (`sdpa_as_on_a_gpu`). With
    ``compile_ours_for`` (a compute capability, e.g. 90) each user-defined kernel (ours, not
    inductor's ``triton_*``) is also compiled for that GPU by Triton (`compile_user_kernel`). With
    ``estimate_bytes`` inductor puts its estimate of each kernel's memory traffic in the source
    (``benchmark_kernel``: it also prints each compiled module's path), kept in the list's
    ``gigabytes``; every run of a generated kernel is counted in its ``launches`` either way.
    Dynamo's caches are reset on leaving, so no graph compiled this way is reused outside."""
    if importlib.util.find_spec("triton") is None:
        raise CodegenUnavailable("triton is not installed: inductor cannot generate Triton kernels")
    import torch._inductor.async_compile as async_compile
    import torch._inductor.config as inductor_config
    import torch._inductor.ir as inductor_ir
    import torch._inductor.scheduler as inductor_scheduler
    import torch.utils._triton as torch_triton

    if not (hasattr(torch_triton, "triton_hash_with_backend") and hasattr(async_compile.AsyncCompile, "triton")
            and hasattr(inductor_config, "cpu_backend") and hasattr(inductor_config, "force_pointwise_cat")
            and hasattr(inductor_config, "benchmark_kernel") and hasattr(inductor_ir, "is_cpu")
            and hasattr(inductor_scheduler.BaseSchedulerNode, "is_cpu")):
        raise CodegenUnavailable(f"torch {torch.__version__} lacks the hooks this check stubs "
                                 "(triton_hash_with_backend, AsyncCompile.triton, cpu_backend, force_pointwise_cat, "
                                 "benchmark_kernel, ir.is_cpu, BaseSchedulerNode.is_cpu)")
    kernels = GeneratedKernels()

    class NotRun:
        """A generated kernel that is never compiled: a launch of it does nothing but count."""

        def __init__(self, name):
            self.name = name

        def run(self, *args, **kwargs):
            kernels.launches[self.name] += 1

    def compile_nothing(self, kernel_name, source_code, *args, **kwargs):
        kernels.append(kernel_name)
        # two graphs (a forward and its backward) may each name a different kernel alike
        label = kernel_name if kernels.count(kernel_name) == 1 else f"{kernel_name} ({kernels.count(kernel_name)})"
        estimate = re.search(r"'kernel_num_gb': ([0-9.e+-]+)", source_code)
        if estimate and kernel_name.startswith("triton_"):
            kernels.gigabytes[label] = float(estimate.group(1))
        if compile_ours_for is not None and not kernel_name.startswith("triton_"):
            kernels.compiled.setdefault(kernel_name, []).extend(
                compile_user_kernel(kernel_name, source_code, compile_ours_for))
        return NotRun(label)

    saved = (torch_triton.triton_hash_with_backend, async_compile.AsyncCompile.triton, inductor_ir.is_cpu,
             inductor_scheduler.BaseSchedulerNode.is_cpu)
    torch_triton.triton_hash_with_backend = lambda: "gpu-codegen-on-cpu"
    async_compile.AsyncCompile.triton = compile_nothing
    # The GPU's heuristics, not the CPU's, where inductor's IR and scheduler ask "is this on a CPU?":
    # which values to store rather than recompute (on a CPU it stores every reused tanh, exp or
    # sigmoid, and takes lower op-count and read limits), and the loop reordering that lets nodes fuse.
    inductor_ir.is_cpu = lambda node: False
    inductor_scheduler.BaseSchedulerNode.is_cpu = lambda node: False
    torch._dynamo.reset()
    try:
        with inductor_config.patch(cpu_backend="triton", force_pointwise_cat=True, fx_graph_cache=False,
                                   compile_threads=1, benchmark_kernel=estimate_bytes), sdpa_as_on_a_gpu():
            yield kernels
    finally:
        (torch_triton.triton_hash_with_backend, async_compile.AsyncCompile.triton, inductor_ir.is_cpu,
         inductor_scheduler.BaseSchedulerNode.is_cpu) = saved
        torch._dynamo.reset()


def _gpu_sdpa_ops():
    """Two opaque ops standing for SDPA's kernels on a GPU, defined once per process: flash attention
    (no mask) and memory-efficient attention (a float mask, whose gradient it returns at full size).
    Their outputs have the strides of torch's own meta functions for those kernels (the output in
    (B, T, H, D) memory, q, k, v gradients the same, the mask's gradient (B, H, T, S) padded to 16
    keys), so the graph around them is laid out as a GPU's. On a CPU they return uninitialized tensors."""
    try:
        return torch.ops.ast_t5_check.efficient_attention.default, torch.ops.ast_t5_check.flash_attention.default
    except (AttributeError, RuntimeError):
        pass
    from torch import Tensor

    def time_major(B, H, T, D, like):  # (B, H, T, D) in (B, T, H, D) memory
        return like.new_empty(B, T, H, D).transpose(1, 2)

    def forward(q, k, v, mask):
        B, H, T, _ = q.shape
        return time_major(B, H, T, v.size(-1), q), q.new_empty(B, H, -(-T // 32) * 32, dtype=torch.float32)

    def backward(q, k, v, mask, mask_grad):
        B, H, T, D = q.shape
        S = k.size(2)
        grad_mask = q.new_empty(B, H, T, -(-S // 16) * 16)[..., :S] if mask_grad else q.new_empty(0)
        return (time_major(B, H, T, D, q), time_major(B, H, S, D, k), time_major(B, H, S, v.size(-1), v),
                grad_mask)

    @torch.library.custom_op("ast_t5_check::efficient_attention", mutates_args=())
    def efficient(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float, causal: bool,
                  scale: float) -> Tuple[Tensor, Tensor]:
        return forward(q, k, v, mask)

    @torch.library.custom_op("ast_t5_check::efficient_attention_backward", mutates_args=())
    def efficient_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, out: Tensor, lse: Tensor,
                           dropout_p: float, causal: bool, scale: float,
                           mask_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        return backward(q, k, v, mask, mask_grad)

    @torch.library.custom_op("ast_t5_check::flash_attention", mutates_args=())
    def flash(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, causal: bool, scale: float) -> Tuple[Tensor, Tensor]:
        return forward(q, k, v, None)

    @torch.library.custom_op("ast_t5_check::flash_attention_backward", mutates_args=())
    def flash_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dropout_p: float,
                       causal: bool, scale: float) -> Tuple[Tensor, Tensor, Tensor]:
        return backward(q, k, v, None, False)[:3]

    efficient.register_fake(lambda q, k, v, mask, *args: forward(q, k, v, mask))
    efficient_backward.register_fake(lambda grad, q, k, v, mask, out, lse, p, c, s, mask_grad:
                                     backward(q, k, v, mask, mask_grad))
    flash.register_fake(lambda q, k, v, *args: forward(q, k, v, None))
    flash_backward.register_fake(lambda grad, q, k, v, *args: backward(q, k, v, None, False)[:3])

    def efficient_setup(ctx, inputs, output):
        q, k, v, mask, dropout_p, causal, scale = inputs
        ctx.save_for_backward(q, k, v, mask, *output)
        ctx.args, ctx.mask_grad = (dropout_p, causal, scale), mask.requires_grad

    def efficient_grad(ctx, grad, grad_lse):
        q, k, v, mask, out, lse = ctx.saved_tensors
        dq, dk, dv, dmask = efficient_backward(grad, q, k, v, mask, out, lse, *ctx.args, ctx.mask_grad)
        return dq, dk, dv, (dmask if ctx.mask_grad else None), None, None, None

    def flash_setup(ctx, inputs, output):
        q, k, v, dropout_p, causal, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.args = (dropout_p, causal, scale)

    def flash_grad(ctx, grad, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        return (*flash_backward(grad, q, k, v, out, lse, *ctx.args), None, None, None)

    efficient.register_autograd(efficient_grad, setup_context=efficient_setup)
    flash.register_autograd(flash_grad, setup_context=flash_setup)
    return torch.ops.ast_t5_check.efficient_attention.default, torch.ops.ast_t5_check.flash_attention.default


@contextlib.contextmanager
def sdpa_as_on_a_gpu() -> Iterator[None]:
    """Inside: ``F.scaled_dot_product_attention`` on CPU tensors is what a GPU runs, one opaque op
    (`_gpu_sdpa_ops`) where a CPU would run its own kernels or, with a mask that takes a gradient
    (the relative bias in training), decompose into the math path, whose softmax kernels inductor then
    generates in the graph. As on a GPU: no mask -> flash attention; a mask -> memory-efficient
    attention, the mask expanded to (B, H, T, S) (a boolean one made additive first), its gradient
    returned at that size and summed back by the graph."""
    import torch.nn.functional as F

    efficient, flash = _gpu_sdpa_ops()
    saved = F.scaled_dot_product_attention
    # closures only, no global of this module: dynamo resolves a traced function's globals by importing
    # its module, which a script loaded from its path (the tests' load_script) is not
    zeros, boolean = torch.zeros, torch.bool

    def as_on_a_gpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
        if query.is_cuda or enable_gqa:
            return saved(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                         scale=scale, enable_gqa=enable_gqa)
        B, H, T, D = query.shape
        scale = D ** -0.5 if scale is None else scale
        if attn_mask is None:
            return flash(query, key, value, float(dropout_p), bool(is_causal), float(scale))[0]
        if attn_mask.dtype == boolean:  # True: attend
            attn_mask = zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~attn_mask, float("-inf"))
        mask = attn_mask.expand(B, H, T, key.size(2))
        return efficient(query, key, value, mask, float(dropout_p), bool(is_causal), float(scale))[0]

    F.scaled_dot_product_attention = as_on_a_gpu
    try:
        yield
    finally:
        F.scaled_dot_product_attention = saved


class _LaunchWhenTraced:
    """One of the triton backend's kernels under `triton_kernels_as_on_sm90`: inside a graph that dynamo
    traces it is the kernel itself (a user-defined Triton kernel of the graph, generated for the GPU
    by inductor); called eagerly (the model's first forward, which runs uncompiled) it launches nothing."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        if torch.compiler.is_compiling():
            return self.kernel[grid]
        return lambda *args, **kwargs: None


class _Sm90Driver:
    """Triton's active driver as dynamo and inductor ask it while they trace a user-defined kernel
    (its target, for the kernel's TTIR and mutation analysis; device and stream indices); nothing else."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


TRITON_BACKEND_KERNELS = ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_dropout_bits_kernel")


@contextlib.contextmanager
def triton_kernels_as_on_sm90() -> Iterator[None]:
    """Inside: the ``triton`` attention backend takes CPU tensors as an H100's (sm90's tiles and length
    rules) and its kernels go into compiled graphs as user-defined Triton kernels, which inductor
    analyzes (which arguments each writes) and generates the launches of for a GPU; called eagerly they
    launch nothing. Without it the backend falls back to SDPA on a CPU, and the check would compile
    SDPA under the triton backend's name. Needs the kernels compiled by Triton's JIT, not its
    interpreter (dynamo traces an interpreted kernel as Python)."""
    from ast_t5.modules import triton_rpe_attention as tra

    if tra.triton is None:
        raise CodegenUnavailable(f"the triton backend's kernels need triton ({tra.TRITON_IMPORT_ERROR})")
    if tra.INTERPRETED:
        raise CodegenUnavailable("the triton backend's kernels were imported under TRITON_INTERPRET=1: dynamo "
                                 "would trace them as Python; run this check without it")
    import torch.utils._triton as torch_triton
    import triton.runtime

    config = triton.runtime.driver
    real_blocks = tra.default_blocks
    saved = {name: getattr(tra, name) for name in TRITON_BACKEND_KERNELS + ("_device_unsupported", "_capability",
                                                                            "default_blocks")}
    saved_has_triton, saved_driver = torch_triton.has_triton, config._active
    try:
        for name in TRITON_BACKEND_KERNELS:
            setattr(tra, name, _LaunchWhenTraced(saved[name]))
        tra._device_unsupported = lambda q: None
        tra._capability = lambda device: 90
        tra.default_blocks = lambda head_dim, device, capability=None, dropout=False, dtype=None: real_blocks(
            head_dim, torch.device("cuda"), 90, dropout, dtype)
        # dynamo takes a JITFunction for a Triton kernel only where it finds a device Triton compiles for
        torch_triton.has_triton = lambda: True
        config.set_active(_Sm90Driver())
        yield
    finally:
        for name, value in saved.items():
            setattr(tra, name, value)
        torch_triton.has_triton = saved_has_triton
        config._active = saved_driver


def _compiled_optimizer_step(model):
    """A callable making one `AdamWScale` (compiled=True) step on fp32 masters of ``model``'s weights
    from its bf16 gradients, with a gradient factor and a new learning rate each time, as the bf16
    recipe's optimizer step does (`ast_t5.optim.mixed_precision`); ``.steps`` counts the calls."""
    from ast_t5.optim.adamw_scale import AdamWScale

    params = [p for p in model.parameters() if p.requires_grad]
    masters = [torch.nn.Parameter(p.detach().float()) for p in params]
    opt = AdamWScale(masters, lr=1e-3, weight_decay=0.01, compiled=True)

    def step():
        for master, p in zip(masters, params):
            master.grad = None if p.grad is None else p.grad.float()
        step.steps += 1
        opt.param_groups[0]["lr"] = 1e-3 / step.steps
        opt.step(grad_factor=torch.tensor(0.5))

    step.steps = 0
    return step


_HINTS = ("Set TORCHDYNAMO_VERBOSE", "For even more developer context")


def error_line(error: BaseException) -> str:
    """One line for a failed configuration: the error's type and its message's last line; when it
    wraps others (inductor wraps Triton's compilation error, which wraps the reason), the innermost's
    too, which is where the reason is ("InductorError <- AssertionError: Loop-carried variable ...")."""
    root, seen = error, {id(error)}
    while (root.__cause__ or root.__context__) is not None and id(root.__cause__ or root.__context__) not in seen:
        root = root.__cause__ or root.__context__
        seen.add(id(root))
    lines = [line for line in str(root).strip().splitlines() if line.strip() and not line.startswith(_HINTS)]
    text = f"{type(root).__name__}: {(lines or [''])[-1].strip()[:300]}"
    return text if root is error else f"{type(error).__name__} <- {text}"


def parse_shape(text: str) -> Tuple[int, int, int]:
    """"BxS/T" (batch, source length, target length) -> (B, S, T)."""
    match = re.fullmatch(r"(\d+)x(\d+)/(\d+)", text)
    if not match or min(map(int, match.groups())) < 1:
        raise argparse.ArgumentTypeError(f"a shape is BATCHxSOURCE/TARGET with positive numbers, e.g. 4x96/32, "
                                         f"not {text!r}")
    return tuple(map(int, match.groups()))


def check(arch: str, backend: str, scope: str, checkpoint: bool, shapes, seed: int = 0,
          optimizer: bool = False, attention_dropout: float = 0.0,
          estimate_bytes: bool = False) -> Tuple[int, float, "GeneratedKernels"]:
    """Compile and run ``arch``'s training step at each shape under `gpu_codegen_on_cpu`, and with
    ``optimizer`` an `AdamWScale` step with ``compiled=True`` after each (fp32 masters of the bf16
    weights, a gradient factor folded in: the bf16 recipe's update). On the triton backend its own
    kernels are also compiled for sm90 by Triton as inductor launches them (`compile_user_kernel`).
    With ``estimate_bytes`` the kernels carry inductor's estimate of their memory traffic, and the
    launches counted are those of the last shape's step (`GeneratedKernels.traffic`). Returns (the
    number of kernels generated, seconds, the `GeneratedKernels`); raises what the compilation raised."""
    from fairseq.data import Dictionary

    from ast_t5.models.ast_t5_model import AstT5Model

    dictionary = Dictionary()
    for i in range(60):
        dictionary.add_symbol(f"tok{i}")
    with contextlib.ExitStack() as stack:
        if backend == "triton":
            stack.enter_context(triton_kernels_as_on_sm90())
        if backend == "cudnn":
            stack.enter_context(cudnn_as_on_a_gpu())
        return _compile_and_run(AstT5Model, dictionary, arch, backend, scope, checkpoint, shapes, seed, optimizer,
                                attention_dropout, estimate_bytes)


def _compile_and_run(model_class, dictionary, arch, backend, scope, checkpoint, shapes, seed, optimizer,
                     attention_dropout, estimate_bytes=False):
    torch.manual_seed(seed)
    model = model_class.from_dictionary(dictionary, arch=arch, dropout=0.0, attention_dropout=attention_dropout,
                                        attention_backend=backend, compile=True, compile_scope=scope,
                                        checkpoint_activations=checkpoint).to(torch.bfloat16)
    model.train()
    step = _compiled_optimizer_step(model) if optimizer else None
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    copies = _CopiesForUserKernels()
    with gpu_codegen_on_cpu(compile_ours_for=90 if backend == "triton" else None,
                            estimate_bytes=estimate_bytes) as kernels, copies:
        for batch, src_len, tgt_len in shapes:
            kernels.launches.clear()  # what is left counted is the last shape's step
            src = torch.randint(4, len(dictionary), (batch, src_len), generator=generator)
            lengths = torch.full((batch,), src_len)
            if batch > 1:  # a padded row, as batches come
                src[-1, src_len - src_len // 4:] = dictionary.pad()
                lengths[-1] = src_len - src_len // 4
            prev = torch.randint(4, len(dictionary), (batch, tgt_len), generator=generator)
            out, _ = model(src, lengths, prev)
            out.float().sum().backward()
            if step is not None:
                before = len(kernels)
                step()
                if step.steps == 1 and len(kernels) == before:
                    raise RuntimeError("the compiled optimizer step generated no Triton kernel: it did not compile")
                model.zero_grad(set_to_none=True)
        if not kernels:
            raise RuntimeError("inductor generated no Triton kernel: the check did not run")
        if backend == "triton":  # the attention itself must be in the graphs, not a fallback
            missing = [name for name in TRITON_BACKEND_KERNELS[:3] if name not in kernels]
            if missing:
                raise RuntimeError(f"the triton backend's kernels {missing} are not in the compiled graphs: "
                                   "its calls fell back or broke the graph")
        kernels.copies = copies.count()
        if backend == "cudnn":
            if not copies.cudnn_ops:
                raise RuntimeError("the cudnn backend's ops are not in the compiled graphs: its calls fell back or "
                                   "broke the graph")
            kernels.cudnn_ops = copies.cudnn_ops
        return len(kernels), time.perf_counter() - start, kernels


def print_traffic(kernels: GeneratedKernels, shape, top: int, bandwidth: float) -> None:
    """The memory traffic of inductor's kernels in the step of ``shape`` (`GeneratedKernels.traffic`):
    total, time at ``bandwidth`` TB/s, and the ``top`` largest kernels."""
    rows = kernels.traffic()
    total = sum(row[0] for row in rows)
    user = sum(count for name, count in kernels.launches.items() if not name.startswith("triton_"))
    unestimated = sorted(name for name in kernels.launches
                         if name.startswith("triton_") and name not in kernels.gigabytes)
    print(f"     inductor's kernels in one step at {shape[0]}x{shape[1]}/{shape[2]}: {total:.3f} GB in "
          f"{sum(row[1] for row in rows)} launches of {len(rows)} kernels, {total / bandwidth:.3f} ms at "
          f"{bandwidth:g} TB/s (not counted: matrix products, attention and other extern ops"
          f"{f', {user} launches of user-defined kernels (ours)' if user else ''}"
          f"{f'; inductor gave no estimate for {len(unestimated)} kernels: ' if unestimated else ''}"
          f"{', '.join(unestimated[:3])}{', ...' if len(unestimated) > 3 else ''})", flush=True)
    for gigabytes, launches, each, name in rows[:top]:
        print(f"     {gigabytes:9.4f} GB = {launches:3d} x {1e3 * each:8.3f} MB  {name}", flush=True)


def main(argv=None) -> int:
    from ast_t5.models.presets import ARCH_PRESETS
    from ast_t5.modules.attention_backends import ATTENTION_BACKENDS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", nargs="+", default=["t5_v11_tiny", "ast_t5_paper_tiny"], choices=sorted(ARCH_PRESETS))
    p.add_argument("--backends", nargs="+", default=["sdpa"], choices=list(ATTENTION_BACKENDS),
                   help="model.attention_backend (default sdpa: what auto runs on sm90)")
    p.add_argument("--scopes", nargs="+", default=["model"], choices=["model", "layers"], help="model.compile_scope")
    p.add_argument("--checkpoint", action="store_true", help="with model.checkpoint_activations")
    p.add_argument("--attention-dropout", type=float, default=0.0, metavar="P",
                   help="model.attention_dropout (default 0, the pre-training recipes'; 0.1: fine-tuning, the paper's)")
    p.add_argument("--optimizer", action="store_true",
                   help="also an adamw_scale step with optimizer.compiled=true after each training step")
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=[parse_shape(s) for s in DEFAULT_SHAPES],
                   metavar="BxS/T", help=f"batches in order (default {' '.join(DEFAULT_SHAPES)})")
    p.add_argument("--traffic", type=int, nargs="?", const=12, default=None, metavar="N",
                   help="with one shape: the memory traffic of inductor's kernels in its step (inductor's estimate "
                        "per kernel x launches), its time at --bandwidth, and the N largest kernels (default 12)")
    p.add_argument("--bandwidth", type=float, default=3.35, metavar="TB/S",
                   help="memory bandwidth for --traffic's time (default 3.35: H100 SXM's HBM3; H200 4.8)")
    args = p.parse_args(argv)
    if args.traffic is not None and len(args.shapes) != 1:
        p.error("--traffic estimates one step: give one shape (--shapes BxS/T)")
    if args.traffic is not None and (args.traffic < 0 or args.bandwidth <= 0):
        p.error("--traffic N needs N >= 0 and --bandwidth a positive number of TB/s")
    if not 0.0 <= args.attention_dropout < 1.0:
        p.error(f"--attention-dropout must be in [0, 1), got {args.attention_dropout}")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    print(f"torch {torch.__version__}: inductor's GPU code generation on the CPU, nothing run", flush=True)
    failed = 0
    for arch in args.archs:
        for backend in args.backends:
            for scope in args.scopes:
                name = (f"{arch} {backend} scope={scope}{' checkpointed' if args.checkpoint else ''}"
                        f"{f' attention dropout {args.attention_dropout:g}' if args.attention_dropout else ''}"
                        f"{' + compiled optimizer' if args.optimizer else ''}")
                try:
                    count, seconds, kernels = check(arch, backend, scope, args.checkpoint, args.shapes,
                                                    optimizer=args.optimizer,
                                                    attention_dropout=args.attention_dropout,
                                                    estimate_bytes=args.traffic is not None)
                except CodegenUnavailable as e:
                    print(f"check_gpu_codegen: {e}", file=sys.stderr)
                    return 2
                except Exception as e:  # noqa: BLE001 - report every configuration's failure, go on
                    failed += 1
                    last = error_line(e)
                    if "active drivers" in last or "compatible backends" in last:
                        last += " (this torch asks Triton for a GPU elsewhere: the stubs do not cover it)"
                    print(f"FAIL {name}: {last}", flush=True)
                    continue
                ours = (f" ({kernels.launches_compiled} launches of ours compiled for sm90 by Triton; copies "
                        f"made for them: {kernels.copies})") if kernels.compiled else ""
                if kernels.cudnn_ops:
                    ours += f" ({kernels.cudnn_ops} calls of cuDNN's ops in the graphs; copies made for them: " \
                            f"{kernels.copies})"
                print(f"ok   {name}: {count} kernels generated{ours} in {seconds:.1f} s", flush=True)
                if args.traffic is not None:
                    print_traffic(kernels, args.shapes[0], args.traffic, args.bandwidth)
    print(f"check_gpu_codegen: {failed} of {len(args.archs) * len(args.backends) * len(args.scopes)} "
          f"configurations failed" if failed else "check_gpu_codegen: every configuration compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
