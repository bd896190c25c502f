"""scripts/check_gpu_codegen.py: the training step compiled through inductor's GPU code generation on a CPU."""
import os
import subprocess
import sys

import pytest
import torch

from ..conftest import load_script

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "check_gpu_codegen.py")


# One process runs the script's three checks that compile the tiny model (a minute each alone, most of it
# the process's start and inductor's first compile), as a user runs it: without TRITON_INTERPRET, so that the
# backends' kernels are compiled rather than interpreted. Each section of its output is one `main` call.
DRIVER = """import contextlib, importlib.util, sys
spec = importlib.util.spec_from_file_location("check_gpu_codegen", sys.argv[1])
codegen = sys.modules["check_gpu_codegen"] = importlib.util.module_from_spec(spec)  # as `python SCRIPT` finds it
spec.loader.exec_module(codegen)
runs = {
    "sdpa": ["--archs", "t5_v11_tiny", "--shapes", "2x64/16", "3x80/20", "--optimizer"],
    "kernels": ["--archs", "t5_v11_tiny", "--backends", "triton", "cudnn", "--shapes", "2x832/20",
                "--traffic", "3", "--bandwidth", "2"],
    # the script's context that puts the triton backend's kernels in the graphs on a CPU, replaced by nothing:
    # the backend falls back to SDPA
    "fallback": ["--archs", "t5_v11_tiny", "--backends", "triton", "--shapes", "1x64/8"],
}
for name, argv in runs.items():
    if name == "fallback":
        codegen.triton_kernels_as_on_sm90 = contextlib.nullcontext
    print(f"=== {name}", flush=True)
    print(f"=== {name}", file=sys.stderr, flush=True)
    print(f"=== {name} exit status {codegen.main(argv)}", flush=True)
"""


@pytest.fixture(scope="module")
def compiled():
    """Each section's exit status and output lines, by name."""
    pytest.importorskip("triton", reason="inductor's Triton code generation needs triton installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", DRIVER, SCRIPT], capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    sections, name = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("=== "):
            words = line.split()
            if len(words) == 2:
                name, sections[words[1]] = words[1], [None, []]
            else:
                sections[name][0] = int(words[-1])
        elif name is not None:
            sections[name][1].append(line)
    assert set(sections) == {"sdpa", "kernels", "fallback"}, proc.stdout + proc.stderr[-3000:]
    # each section's log, which the driver's markers open on stderr too
    sections["stderr"] = dict(part.partition("\n")[::2] for part in ("\n" + proc.stderr).split("\n=== ")[1:])
    return sections


def test_a_tiny_model_compiles_for_a_gpu_and_says_so(compiled):
    status, out = compiled["sdpa"]
    assert status == 0, out
    lines = [line for line in out if line.startswith(("ok", "FAIL"))]
    # --optimizer: the compiled adamw_scale step generated kernels too (else the configuration fails)
    assert len(lines) == 1 and lines[0].startswith("ok   t5_v11_tiny sdpa scope=model + compiled optimizer: "), out
    assert int(lines[0].split(": ")[1].split()[0]) > 0  # kernels generated
    assert out[-1] == "check_gpu_codegen: every configuration compiled"
    assert "inductor's GPU code generation on the CPU, nothing run" in out[0]


def test_the_triton_backend_compiles_its_own_kernels_into_the_graphs_for_a_gpu(compiled):
    """--backends triton: the backend's three kernels are user-defined Triton kernels of the compiled
    graphs, which inductor generates the GPU launches of (sm90's tiles, the far loops past 768 tokens),
    not SDPA, which the backend falls back to on a CPU."""
    status, out = compiled["kernels"]
    assert status == 0, out
    (line,) = [line for line in out if line.startswith("ok   t5_v11_tiny triton scope=model: ")]
    # each launch of the three kernels compiled for sm90 by Triton with inductor's signature (its fp64
    # scalars among them: a kernel that let them promote its row maxima failed to compile on an H200)
    assert int(line.split(" launches of ours compiled for sm90")[0].rsplit("(", 1)[1]) >= 3, line
    # no pass over memory per call before the kernels: the outputs they write are reinplaced (with
    # permuted strides they were copied first) and the output's gradient arrives contiguous (dynamo's
    # backward of an autograd.Function copies it otherwise): 6 copies here before 2026-11-27
    assert "copies made for them: 0)" in line, line
    log = compiled["stderr"]["kernels"]
    assert "cannot run in this process" not in log, log[-2000:]
    assert "cannot run in this process" in compiled["stderr"]["fallback"]  # the warning this looks for


def test_the_cudnn_backends_ops_are_in_the_graphs_for_a_gpu_without_copies(compiled):
    """--backends cudnn: the reference executor stands in for cuDNN, so the compiled graphs hold the backend's
    custom ops as on a GPU (a CPU call would fall back to SDPA), with no copy made for them (q, k, v read as the
    packed projection's views, its gradient written whole)."""
    status, out = compiled["kernels"]
    assert status == 0, out
    (line,) = [line for line in out if line.startswith("ok   t5_v11_tiny cudnn scope=model: ")]
    # forward and backward op per biased layer (2 + 2), and per padded cross-attention (2 decoder layers)
    assert int(line.split(" calls of cuDNN's ops")[0].rsplit("(", 1)[1]) == 12, line
    assert "copies made for them: 0)" in line, line


def test_a_triton_backend_that_fell_back_fails_the_check(compiled):
    """Without the kernels in the graphs (here: the backend left to refuse CPU tensors, so it runs SDPA)
    the triton configuration fails with that reason instead of passing on SDPA's kernels."""
    status, out = compiled["fallback"]
    assert status == 1, out
    (fail,) = [line for line in out if line.startswith("FAIL")]
    assert fail.startswith("FAIL t5_v11_tiny triton scope=model: RuntimeError: the triton backend's kernels "), fail
    assert "are not in the compiled graphs" in fail


def test_traffic_of_a_training_step_lists_the_largest_kernels(compiled):
    """--traffic on the tiny model's step: a total, its time at the bandwidth, and the largest kernels,
    largest first, each its launches times its estimate (here after each of the two backends' lines)."""
    _, out = compiled["kernels"]
    starts = [i for i, line in enumerate(out) if line.startswith("     inductor's kernels in one step at 2x832/20: ")]
    assert len(starts) == 2, out
    for at in starts:
        total = float(out[at].split(": ")[1].split(" GB")[0])
        milliseconds = float(out[at].split("kernels, ")[1].split(" ms at 2 TB/s")[0])
        assert total > 0 and milliseconds == pytest.approx(total / 2, abs=1e-3)
        rows = out[at + 1:at + 4]
        sizes = [float(row.split()[0]) for row in rows]
        assert len(rows) == 3 and sizes == sorted(sizes, reverse=True) and sum(sizes) <= total + 1e-4, rows
        for row in rows:  # "G GB = N x M MB  name"
            words = row.split()
            assert words[-1].startswith("triton_")
            assert float(words[0]) == pytest.approx(int(words[3]) * float(words[5]) / 1e3, abs=1e-4), row


def test_each_failure_is_one_line_and_the_exit_status_says_so(monkeypatch, capsys):
    codegen = load_script("check_gpu_codegen")
    calls = []

    def check(arch, backend, scope, checkpoint, shapes, seed=0, optimizer=False, attention_dropout=0.0,
              estimate_bytes=False):
        calls.append((arch, backend, scope, checkpoint, shapes) + ((attention_dropout,) if attention_dropout else ()))
        if backend == "torch":
            raise ValueError("first line\nThe argument '((-1)) + 384' is not comparable.")
        return 12, 0.5, codegen.GeneratedKernels()

    monkeypatch.setattr(codegen, "check", check)
    rc = codegen.main(["--archs", "t5_v11_tiny", "--backends", "sdpa", "torch", "--scopes", "layers",
                       "--checkpoint", "--shapes", "1x8/4"])
    out = capsys.readouterr().out
    assert rc == 1
    assert calls == [("t5_v11_tiny", "sdpa", "layers", True, [(1, 8, 4)]),
                     ("t5_v11_tiny", "torch", "layers", True, [(1, 8, 4)])]
    assert "ok   t5_v11_tiny sdpa scope=layers checkpointed: 12 kernels generated in 0.5 s" in out
    assert ("FAIL t5_v11_tiny torch scope=layers checkpointed: ValueError: The argument '((-1)) + 384' is not "
            "comparable.") in out
    assert "check_gpu_codegen: 1 of 2 configurations failed" in out

    def unavailable(*args, **kwargs):
        raise codegen.CodegenUnavailable("triton is not installed: inductor cannot generate Triton kernels")

    monkeypatch.setattr(codegen, "check", check)
    del calls[:]
    assert codegen.main(["--archs", "t5_v11_tiny", "--attention-dropout", "0.1", "--shapes", "1x8/4"]) == 0
    assert calls == [("t5_v11_tiny", "sdpa", "model", False, [(1, 8, 4)], 0.1)]
    assert "ok   t5_v11_tiny sdpa scope=model attention dropout 0.1: 12 kernels" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        codegen.main(["--attention-dropout", "1.5"])
    assert "--attention-dropout must be in [0, 1)" in capsys.readouterr().err

    monkeypatch.setattr(codegen, "check", unavailable)
    assert codegen.main(["--archs", "t5_v11_tiny"]) == 2
    assert "check_gpu_codegen: triton is not installed" in capsys.readouterr().err


def test_a_failure_reads_as_its_innermost_reason():
    """Inductor wraps Triton's compilation error, which wraps the reason: the line names the outer
    type and the innermost one's message, without torch's hints."""
    codegen = load_script("check_gpu_codegen")
    try:
        try:
            try:
                raise AssertionError("Loop-carried variable m_i has initial type fp32 but is re-assigned to fp64")
            except AssertionError as inner:
                raise ValueError("at 60:24:\n    m_i = ...\n    ^") from inner
        except ValueError as middle:
            raise RuntimeError("CompilationError: at 60:24\n\nSet TORCHDYNAMO_VERBOSE=1 for the stack") from middle
    except RuntimeError as e:
        line = codegen.error_line(e)
    assert line == ("RuntimeError <- AssertionError: Loop-carried variable m_i has initial type fp32 but is "
                    "re-assigned to fp64")
    assert codegen.error_line(KeyError("x")) == "KeyError: 'x'"


@pytest.mark.parametrize("shape", ["4x96", "0x8/4", "ax8/4"])
def test_a_bad_shape_is_a_usage_error(shape, capsys):
    codegen = load_script("check_gpu_codegen")
    with pytest.raises(SystemExit) as exit_info:
        codegen.main(["--shapes", shape])
    assert exit_info.value.code == 2
    assert "a shape is BATCHxSOURCE/TARGET with positive numbers" in capsys.readouterr().err


def _codegen_or_skip():
    pytest.importorskip("triton", reason="inductor's Triton code generation needs triton installed")
    return load_script("check_gpu_codegen")


def test_the_kernels_are_generated_with_the_gpus_heuristics_not_the_cpus():
    """A tanh read by two reductions: inductor on a CPU stores it once for both (a kernel of its own
    writing it, the CPU's "realize heavy ops on reuse" rule); for a GPU each reduction recomputes it
    where it reads x. The check must generate what the GPU gets."""
    codegen = _codegen_or_skip()

    def two_sums(x):
        y = torch.tanh(x)
        return (y * y).sum(0), (y + 1).sum(1)

    with codegen.gpu_codegen_on_cpu() as kernels:
        torch.compile(two_sums)(torch.randn(256, 512))
    assert len(kernels) == 2 and all("tanh" in name for name in kernels), list(kernels)


def test_the_traffic_is_inductors_estimate_per_kernel_times_its_launches():
    codegen = _codegen_or_skip()

    def double(x):
        return x * 2

    with codegen.gpu_codegen_on_cpu(estimate_bytes=True) as kernels:
        compiled = torch.compile(double)
        x = torch.randn(1024, 1024)
        for _ in range(3):
            compiled(x)
    ((total, launches, each, name),) = kernels.traffic()
    assert name.startswith("triton_poi_fused_mul") and launches == 3
    assert each == pytest.approx(2 * 1024 * 1024 * 4 / 1e9)  # one fp32 read and one write of x
    assert total == pytest.approx(3 * each)
    kernels.launches.clear()
    assert kernels.traffic() == []


def test_traffic_needs_one_shape(capsys):
    codegen = load_script("check_gpu_codegen")
    with pytest.raises(SystemExit):
        codegen.main(["--shapes", "1x8/4", "2x8/4", "--traffic"])
    assert "--traffic estimates one step: give one shape" in capsys.readouterr().err


def test_sdpa_is_a_gpus_kernel_in_the_graphs():
    """SDPA with a mask that takes a gradient (the relative bias in training): a CPU decomposes it
    into the math path, whose softmax and its backward inductor then generates; a GPU runs one
    memory-efficient attention kernel, which returns the mask's gradient at full (B, H, T, S) size for
    the graph to sum back to the bias's shape. The check must generate what a GPU gets: no softmax
    kernel, and one kernel reducing the full-size mask gradient over the batch."""
    codegen = _codegen_or_skip()
    B, H, T, D = 4, 2, 64, 16

    def step(q, k, v, bias):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias).float().sum()

    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, H, T, T, requires_grad=True)
    with codegen.gpu_codegen_on_cpu(estimate_bytes=True) as kernels:
        torch.compile(step)(q, k, v, bias).backward()
    assert kernels and not any("softmax" in name for name in kernels), list(kernels)
    assert bias.grad is not None and bias.grad.shape == bias.shape
    full = B * H * T * T * 4  # fp32 here: the kernel's mask gradient, read once by the sum over the batch
    assert any(gigabytes * 1e9 >= full for gigabytes, _, _, name in kernels.traffic() if "sum" in name), \
        kernels.traffic()

    # a mask-free call is flash attention: opaque, nothing generated for it
    with codegen.gpu_codegen_on_cpu() as kernels:
        out = torch.compile(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v))(q, k, v)
    assert out.shape == (B, H, T, D) and out.transpose(1, 2).is_contiguous()  # (B, T, H, D) memory, as a GPU's
    assert not any("softmax" in name for name in kernels), list(kernels)


def test_a_stacks_bias_gradient_is_summed_per_layer_not_in_one_kernel_at_the_end():
    """Three SDPA layers sharing a stack's folded mask (bias + padding, (B, H, T, S)), compiled for a
    GPU: each layer's full-size mask gradient goes to `sum_over_batch`, an op inductor cannot fuse, so
    no generated kernel reads several of them. With the folded mask a plain tensor of the graph (as
    before `TappedMask`), inductor made one kernel adding all three and summing over the batch."""
    codegen = _codegen_or_skip()
    from ast_t5.modules import attention_backends as ab
    from ast_t5.modules.relative_position_bias import RelativePositionBias

    B, H, T, D = 4, 2, 64, 16
    module = RelativePositionBias(H, 32, 128, bidirectional=True)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, -5:] = True

    def stack(tapped):
        def step(q, k, v, pad):
            rel = module(T, T)
            if tapped:
                folded = ab.fold_masks("sdpa", rel, pad, False)[0]
            else:
                bias = rel.dense()
                folded = bias.masked_fill(pad[:, None, None, :], ab._mask_value(bias.dtype))
            x = q
            for _ in range(3):
                x = ab.attention(x, k, v, bias=folded, backend="sdpa")
            return x.float().sum()
        return step

    full = B * H * T * T * 4  # bytes of one layer's fp32 (B, H, T, S) mask gradient
    largest = {}
    for tapped in (True, False):
        torch._dynamo.reset()
        module.zero_grad()
        with codegen.gpu_codegen_on_cpu(estimate_bytes=True) as kernels:
            torch.compile(stack(tapped))(q, k, v, pad).backward()
        assert module.embedding.weight.grad is not None
        largest[tapped] = max(gigabytes * 1e9 / launches for gigabytes, launches, _, _ in kernels.traffic())
    assert largest[True] < 2 * full, largest  # no kernel reads two layers' gradients
    assert largest[False] >= 3 * full, largest  # the untapped graph's one kernel read all three
