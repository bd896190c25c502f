"""The GPU-speed features, checked on the CPU through fairseq's real Trainer: bf16 weights with
fp32 master weights, model.compile (bucketed lengths, no recompilation per batch, same losses as
eager, with activation checkpointing and incremental decoding), the criterion's host-sync-free
logging and its fused cross-entropy switch, and bench_train.py's CPU mode."""
import argparse
import json
import logging
import math
import os
import sys

import pytest
import torch

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH_DIR))
import bench_train  # noqa: E402

TINY = ("common.cpu=true", "common.log_interval=1000000", "++model.attention_dropout=0.0")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return bench_train.write_task_dir(str(tmp_path_factory.mktemp("task")), 512)


def _train(task_dir, overrides, batches):
    _, _, trainer, _ = bench_train.build_trainer("tiny", task_dir, list(TINY) + list(overrides))
    losses = [float(trainer.train_step([b])["loss"]) for b in batches]
    return trainer, losses


def _batches(lengths, batch=3, tgt_len=12):
    """One batch per source length (rows cropped from one long random batch)."""
    full = bench_train.make_batches(len(lengths), batch, max(lengths), tgt_len, 512)
    out = []
    for b, n in zip(full, lengths):
        src = b["net_input"]["src_tokens"][:, :n].clone()
        src[:, -1] = 2
        b["net_input"]["src_tokens"], b["net_input"]["src_lengths"] = src, src.ne(1).sum(1)
        out.append(b)
    return out


def test_bf16_keeps_fp32_master_weights_and_tracks_fp32_training(task_dir):
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    batches = _batches([40, 40, 40, 40])
    fast = ["lr_scheduler.warmup_updates=2"]
    fp32, loss32 = _train(task_dir, fast + ["common.bf16=false"], batches)
    bf16, loss16 = _train(task_dir, fast + ["common.bf16=true"], batches)
    assert all(p.dtype == torch.bfloat16 for p in bf16.model.parameters())
    opt = bf16.optimizer
    assert isinstance(opt, FP16Optimizer) and opt.scaler is None  # bf16: no loss scaling
    masters = opt.fp32_params
    assert all(p.dtype == torch.float32 for p in masters)
    # the bf16 weights are the fp32 master weights rounded, not an independent copy
    for p, m in zip(bf16.model.parameters(), masters):
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
    _, _, _, initial = bench_train.build_trainer("tiny", task_dir, list(TINY))
    moved = [float((p.detach() - initial[n]).abs().max()) for n, p in fp32.model.named_parameters()]
    assert max(moved) > 1e-3  # the updates did change the weights
    for a, b in zip(loss16, loss32):
        assert abs(a - b) <= 0.02 * abs(b)
    # Adam normalizes each element's step, so elements whose gradient is near zero may step either
    # way; compare whole updates: the bf16 run's update is close to the fp32 run's in norm
    for m, (name, p) in zip(masters, fp32.model.named_parameters()):
        update32 = p.detach() - initial[name]
        gap = torch.linalg.vector_norm(m.detach() - p.detach()) / torch.linalg.vector_norm(update32)
        assert gap < 0.15, (name, float(gap))


@pytest.mark.parametrize("scope", ["model", "layers"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_training_matches_eager_without_recompiling_per_batch(task_dir, checkpointing, scope):
    from ast_t5.models.ast_t5_model import _compiled_graph_count

    batches = _batches([50, 60, 57])  # three lengths, each padded to 64 by model.compile_pad_multiple 16
    extra = [f"++model.checkpoint_activations={str(checkpointing).lower()}"]
    _, eager = _train(task_dir, extra, batches)
    torch._dynamo.reset()  # the layers' graphs of an earlier test would serve this model's layers too
    before = _compiled_graph_count()
    compiled, losses = _train(task_dir, extra + ["++model.compile=true", "++model.compile_backend=aot_eager",
                                                 f"++model.compile_scope={scope}"], batches[:1])
    model = compiled.model
    assert model.compile_seconds > 0  # a graph was compiled (and logged) inside Trainer.train_step
    graphs = _compiled_graph_count()
    # model: one graph for encoder, decoder and head (no graph break); layers: one per layer class,
    # each reused by every layer of its stack
    assert graphs - before == (1 if scope == "model" else 2)
    assert model.encoder.layer_call is None and model.decoder.layer_call is None  # set only inside the step
    losses += [float(compiled.train_step([b])["loss"]) for b in batches[1:]]
    assert _compiled_graph_count() == graphs  # other lengths in the same bucket: no new graph
    for a, b in zip(losses, eager):
        assert math.isclose(a, b, rel_tol=1e-4), (losses, eager)


@pytest.mark.parametrize("scope", ["model", "layers"])
@pytest.mark.parametrize("dynamic", [True, False])
def test_the_first_compiled_graph_is_already_dynamic_in_batch_and_lengths(dynamic, scope, caplog):
    """model.compile_dynamic (default): batches of other sizes and length buckets reuse the first
    graph; false: torch compiles the first graph for the first batch's exact shape, and again, with
    dynamic shapes, at the first change. With compile_scope=layers, so for each of the two layer
    classes (encoder, decoder). The wait of the first update is announced before it, once."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model
    from ast_t5.models.ast_t5_model import _compiled_graph_count

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}")
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0, compile=True,
                                       compile_backend="aot_eager", compile_dynamic=dynamic,
                                       compile_scope=scope).train()
    before = _compiled_graph_count()
    with caplog.at_level(logging.INFO, logger="ast_t5.models.ast_t5_model"):
        for rows, src_len, tgt_len in [(4, 40, 10), (6, 100, 30), (3, 70, 20), (6, 40, 10)]:
            src = torch.randint(4, len(d), (rows, src_len))
            src[0, -5:] = d.pad()
            prev = torch.randint(4, len(d), (rows, tgt_len))
            model(src, torch.full((rows,), src_len), prev)[0].float().mean().backward()
    assert _compiled_graph_count() - before == (1 if dynamic else 2) * (1 if scope == "model" else 2)
    announced = [r.getMessage() for r in caplog.records if "compiling the training forward" in r.getMessage()]
    assert announced == [f"torch.compile (backend aot_eager, compile_scope {scope}): compiling the training forward "
                         "and backward in this update (T5-base: minutes on a first run; the time is logged when done)"]
    # the last forwards compiled nothing: the inputs are no longer marked (host time per step)
    assert model._mark_inputs is False


@pytest.mark.parametrize("scope", ["model", "layers"])
def test_compiled_model_decodes_incrementally_like_its_training_forward(scope):
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(60):
        d.add_symbol(f"w{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0,
                                       compile=True, compile_backend="aot_eager", compile_scope=scope).eval()
    src = torch.randint(4, len(d), (2, 9))
    prev = torch.cat([torch.full((2, 1), d.eos()), torch.randint(4, len(d), (2, 4))], dim=1)
    full = model(src, None, prev)[0].detach()  # compiled (a forward with gradients), padded and cropped back
    assert model.compile_seconds > 0 and full.shape == (2, 5, len(d))
    with torch.no_grad():
        enc = model.encoder(src)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            steps.append(out)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


# --- model.compile with the GPU's attention dispatch, emulated on the CPU -------------------------
_GRAPHS = []  # one entry per graph the counting backend received: its number of flex calls


def _counting_backend(gm, example_inputs):
    """A torch.compile backend that records each graph (and its flex calls), then runs it as traced."""
    _GRAPHS.append(sum(1 for n in gm.graph.nodes if "flex_attention" in str(n.target)))
    return gm.forward


@pytest.fixture
def gpu_dispatch_on_cpu(monkeypatch):
    """`auto` as it decides on an A100 in bf16 (biased calls of more than 128 queries -> flex; on
    sm90 it picks sdpa, measured there, 2026-11-26), with
    FlexAttention allowed where torch refuses it on CPU: its backward (torch's math implementation,
    correct but slow; the CUDA kernels are tested on a GPU) and inside a traced model. What this
    checks is what dynamo sees of our code: the graphs, their guards, and the gradients."""
    import torch._dynamo.config as dynamo_config
    import torch.nn.attention.flex_attention as flex_module
    from torch._dynamo import register_backend

    from ast_t5.modules import attention_backends as ab

    if not hasattr(flex_module, "_validate_device"):
        pytest.fail("torch.nn.attention.flex_attention._validate_device is gone: update this fixture")
    monkeypatch.setattr(flex_module, "_validate_device", lambda q, k, v: None)
    monkeypatch.setattr(ab, "_flex_unsupported", lambda q, k, v, bias: ab._per_distance_unsupported(bias)[1])
    monkeypatch.setattr(ab, "_capability", lambda device: 80)
    table_choice = ab.auto_choice
    monkeypatch.setattr(ab, "auto_choice", lambda device, dtype, dropout_p, has_bias, q_len: table_choice(
        torch.device("cuda"), torch.bfloat16, dropout_p, has_bias, q_len))
    if "ast_t5_test_counting" not in torch._dynamo.list_backends(exclude_tags=()):
        register_backend(_counting_backend, name="ast_t5_test_counting")
    _GRAPHS.clear()
    torch._dynamo.reset()
    # the model raises this; restored by hand (pytest's monkeypatch deletes, on undo, a module
    # attribute served by __getattr__, which hides it in torch's config module)
    recompile_limit = dynamo_config.recompile_limit
    try:
        yield ab
    finally:
        dynamo_config.recompile_limit = recompile_limit
        torch._dynamo.reset()


def test_compiled_training_with_the_gpu_dispatch_keeps_few_graphs_and_eager_gradients(gpu_dispatch_on_cpu):
    """On a GPU, `auto` runs biased attention on flex inside the compiled forward, whose block masks
    are built in the graph. Their guards (one block or more) and grad mode made torch compile a new
    graph per length class and per train/eval switch, until its recompile limit (8) sent new shapes
    to eager mode for the rest of the run. Now: one graph per length class over a run's mix of lengths
    (none more on a second pass), validation forwards are not compiled, flex really ran in the
    traced graphs, and loss and gradients equal the eager reference."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model
    from ast_t5.models.ast_t5_model import MIN_RECOMPILE_LIMIT

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    kwargs = dict(arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0)
    model = AstT5Model.from_dictionary(d, attention_backend="auto", compile=True,
                                       compile_backend="ast_t5_test_counting", **kwargs).train()
    reference = AstT5Model.from_dictionary(d, attention_backend="torch", **kwargs).train()
    reference.load_state_dict(model.state_dict())

    def batch(rows, src_len, tgt_len):
        g = torch.Generator().manual_seed(src_len * 1000 + tgt_len)
        src = torch.randint(4, len(d), (rows, src_len), generator=g)
        src[1, -(src_len // 3):] = d.pad()
        return src, torch.randint(4, len(d), (rows, tgt_len), generator=g)

    # (batch, source, target) as a pre-training run mixes them: short and long sources, targets on
    # both sides of 128, and the batch size varying with the length (max_tokens)
    shapes = [(32, 60, 20), (16, 256, 90), (16, 300, 128), (8, 450, 170), (32, 128, 45), (8, 512, 190),
              (16, 200, 50), (32, 100, 33), (8, 500, 150), (16, 180, 60)]
    graphs_after_pass = []
    for _ in range(2):
        for rows, src_len, tgt_len in shapes:
            src, prev = batch(rows, src_len, tgt_len)
            model(src, None, prev)[0].float().logsumexp(-1).mean().backward()
        graphs_after_pass.append(len(_GRAPHS))
    first_pass = graphs_after_pass[0]
    # one graph per class: source <= 128 or longer x target <= 128 or longer (no target here
    # outgrows a source of 128 or less), by their flex calls none, the encoder's, both stacks'; no
    # static graph for the first batch's shape (model.compile_dynamic: it was a fourth). With flex at
    # 128 queries (one block) there was a class more per stack, and the no-gradient forwards added
    # their own graphs.
    assert sorted(_GRAPHS) == [0, 2, 4], _GRAPHS
    assert graphs_after_pass[1] == first_pass  # the second pass over the same lengths compiled nothing
    assert max(_GRAPHS) == 4  # flex ran in the graphs of long batches (2 encoder + 2 decoder layers)
    assert torch._dynamo.config.recompile_limit >= MIN_RECOMPILE_LIMIT

    model.eval()
    with torch.no_grad():  # validation: eager, no new graph (short lengths: no CPU flex compile)
        src, prev = batch(8, 64, 30)
        model(src, None, prev)
    assert len(_GRAPHS) == first_pass

    model.train()
    src, prev = batch(8, 320, 140)  # source and target on flex, in a graph compiled above
    model.zero_grad()
    loss = model(src, None, prev)[0].float().logsumexp(-1).mean()
    loss.backward()
    expected = reference(src, None, prev)[0].float().logsumexp(-1).mean()
    expected.backward()
    assert len(_GRAPHS) == first_pass
    assert abs(loss.item() - expected.item()) < 1e-5
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad - p_ref.grad).abs().max() <= 1e-4 * (p_ref.grad.abs().max() + 1e-6), name


class _Traced(Exception):
    pass


def _trace_only_backend(gm, example_inputs):
    """Records the graph's activation-checkpoint and flex calls, then stops (on the CPU the traced
    graph cannot run flex inside a checkpoint: torch's math fallback of the flex backward is not
    deterministic under recomputation; the CUDA test runs it)."""
    _GRAPHS.append([str(n.target) for n in gm.graph.nodes
                    if "checkpoint" in str(n.target) or "flex_attention" in str(n.target)])
    raise _Traced()


@pytest.mark.parametrize("arch", ["t5_v11_tiny", "ast_t5_paper_tiny"])
def test_checkpointed_training_forward_with_the_gpu_dispatch_traces_as_one_graph(gpu_dispatch_on_cpu, arch):
    """model.checkpoint_activations with model.compile on a GPU: the layers' flex calls run inside
    activation checkpoints. create_block_mask, called inside a checkpointed layer, enters a
    torch-function mode, a side effect the checkpoint cannot trace: dynamo gave up on the whole
    encoder and decoder loops, which then ran eagerly. The stacks now build block masks outside
    the layers (shared bias: `FoldedBias`; per-layer tables: `stack_block_mask`), so the whole
    training forward is one graph (fullgraph=True raises at any graph break)."""
    from fairseq.data import Dictionary
    from torch._dynamo.exc import BackendCompilerFailed

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch=arch, attention_backend="auto", dropout=0.0, attention_dropout=0.0,
                                       checkpoint_activations=True).train()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, len(d), (8, 320), generator=g)
    src[1, -100:] = d.pad()
    prev = torch.randint(4, len(d), (8, 192), generator=g)
    compiled = torch.compile(model._eager_forward, backend=_trace_only_backend, fullgraph=True)
    with pytest.raises(BackendCompilerFailed) as raised:
        compiled(src, None, prev)
    assert isinstance(raised.value.inner_exception, _Traced), raised.value  # traced to the end: no graph break
    (calls,) = _GRAPHS
    layers = len(model.encoder.layers) + len(model.decoder.layers)
    assert sum("checkpoint" in c for c in calls) == layers, calls  # every layer checkpointed in the graph
    assert gpu_dispatch_on_cpu.auto_choice(src.device, torch.float32, 0.0, True, 320)[0] == "flex"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (flex backward, inductor's flex kernels)")
def test_checkpointed_compiled_model_with_flex_on_gpu_is_one_graph_and_matches_eager():
    """The GPU half of the test above: inductor's flex kernels inside activation checkpoints."""
    from .test_model_attention import check_flex_in_a_compiled_model_on_gpu

    check_flex_in_a_compiled_model_on_gpu(checkpointing=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (inductor's CUDA kernels, bf16 autocast)")
@pytest.mark.parametrize("scope,checkpointing,backend", [("model", False, "sdpa"), ("layers", False, "sdpa"),
                                                        ("layers", True, "sdpa"), ("layers", False, "triton")])
def test_compiled_model_on_gpu_matches_eager_in_its_graphs(scope, checkpointing, backend):
    """model.compile as the recipes run it on sm90 (inductor, bf16 autocast, SDPA: `auto`'s choice), with
    either compile_scope: loss and gradients as in eager, one graph for the whole forward or one per
    layer class, none more for a new batch shape. And the triton backend as gpu_check's
    bench_model_compiled times it (compile_scope layers): its kernels run inside the layers' graphs."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model
    from ast_t5.models.ast_t5_model import _compiled_graph_count

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    torch._dynamo.reset()
    kwargs = dict(arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0, head_dim=16,
                  checkpoint_activations=checkpointing)
    # SDPA, auto's choice on sm90, named so that the graph count holds on other GPUs too (where auto
    # switches biased calls between sdpa and flex at 128 queries: one graph class more)
    if backend == "triton":
        pytest.importorskip("triton", reason="the triton backend needs Triton")
    model = AstT5Model.from_dictionary(d, compile=True, compile_scope=scope, attention_backend=backend,
                                       **kwargs).cuda().train()
    reference = AstT5Model.from_dictionary(d, attention_backend="sdpa", **kwargs).cuda().train()
    reference.load_state_dict(model.state_dict())
    before = _compiled_graph_count()
    for rows, src_len, tgt_len in [(4, 200, 136), (3, 100, 40)]:
        src = torch.randint(4, len(d), (rows, src_len), device="cuda")
        src[1, -(src_len // 3):] = d.pad()
        prev = torch.randint(4, len(d), (rows, tgt_len), device="cuda")
        losses = []
        for m in (model, reference):
            m.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(src, None, prev)[0].float().logsumexp(-1).mean()
            loss.backward()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) < 2e-2 * abs(losses[1]), losses
        for (name, p), r in zip(model.named_parameters(), reference.parameters()):
            assert torch.isfinite(p.grad).all(), name
            assert (p.grad - r.grad).abs().max() <= 5e-2 * r.grad.abs().max() + 1e-3, name
        assert _compiled_graph_count() - before == (1 if scope == "model" else 2)  # the second shape: none new
    if backend == "triton":  # the fast path ran, compiled: our kernels on the GPU in a compiled step
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(src, None, prev)[0].float().logsumexp(-1).mean().backward()
            torch.cuda.synchronize()
        names = " ".join(e.key for e in prof.key_averages())
        assert "_fwd_kernel" in names and "_bwd_dq_kernel" in names, names
        assert _compiled_graph_count() - before == 2


def test_recompile_limit_is_raised_but_never_lowered():
    import torch._dynamo.config as dynamo_config

    from ast_t5.models.ast_t5_model import ensure_recompile_limit

    saved = dynamo_config.recompile_limit
    try:
        dynamo_config.recompile_limit = 8
        ensure_recompile_limit(16)
        assert dynamo_config.recompile_limit == 16
        dynamo_config.recompile_limit = 64
        ensure_recompile_limit(16)
        assert dynamo_config.recompile_limit == 64
    finally:
        dynamo_config.recompile_limit = saved


@pytest.mark.parametrize("scope", ["model", "layers"])
def test_compile_mode_reaches_torch_compile_and_needs_inductor(scope, monkeypatch):
    """model.compile_mode: torch.compile gets the mode (none for default) with the scope's function;
    a mode with a backend that has none is refused when the model is built."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}")
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append((fn.__name__, kw)) or fn)  # runs eagerly
    src, prev = torch.randint(4, len(d), (2, 20)), torch.randint(4, len(d), (2, 6))
    for mode in ("default", "max-autotune-no-cudagraphs"):
        model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", compile=True, compile_scope=scope,
                                           compile_mode=mode).train()
        model(src, torch.full((2,), 20), prev)[0].float().sum().backward()
    name = "_call_layer" if scope == "layers" else "_eager_forward"
    assert calls == [(name, {"backend": "inductor", "mode": None}),
                     (name, {"backend": "inductor", "mode": "max-autotune-no-cudagraphs"})]
    with pytest.raises(ValueError, match="max-autotune-no-cudagraphs needs model.compile_backend=inductor"):
        AstT5Model.from_dictionary(d, arch="t5_v11_tiny", compile=True, compile_backend="aot_eager",
                                   compile_mode="max-autotune-no-cudagraphs")
    with pytest.raises(ValueError, match="model.compile_mode must be one of"):
        AstT5Model.from_dictionary(d, arch="t5_v11_tiny", compile=True, compile_mode="reduce-overhead")


def _criterion_and_sample(task_dir, **kwargs):
    from ast_t5.criterions.span_cross_entropy import SpanCrossEntropyCriterion
    from ast_t5.models import AstT5Model

    cfg = bench_train.compose("tiny", [f"task.data={task_dir}"])
    from fairseq import tasks
    task = tasks.setup_task(cfg.task)
    model = AstT5Model.from_dictionary(task.dictionary, arch="t5_v11_tiny", dropout=0.0,
                                       attention_dropout=0.0)
    sample = bench_train.make_batches(1, 3, 20, 8, 512)[0]
    sample["language"] = torch.tensor([0, 0, 0])
    return SpanCrossEntropyCriterion(task, **kwargs), model, sample


def test_criterion_logs_device_tensors_and_the_right_accuracy(task_dir):
    from fairseq import metrics

    crit, model, sample = _criterion_and_sample(task_dir)
    _, _, log = crit(model, sample)
    assert crit.last_path == "eager"
    for key in ("n_masked", "n_correct", "lang_tokens:python"):
        assert torch.is_tensor(log[key]), key  # no .item() inside the update
    with torch.no_grad():
        predicted = model(**sample["net_input"])[0].argmax(-1)
    target = sample["target"]
    masked = target.ne(1) & target.ne(2) & target.lt(crit.first_sentinel)
    expected = 100.0 * float((predicted.eq(target) & masked).sum()) / float(masked.sum())
    with metrics.aggregate() as agg:
        crit.reduce_metrics([log, log])
        values = agg.get_smoothed_values()
    assert values["masked_accuracy"] == round(expected, 2)
    assert values["share_python"] == 1.0
    assert not any(k.startswith("_") for k in values)


def test_fused_cross_entropy_demanded_without_cuda_is_one_line_error(task_dir):
    crit, model, sample = _criterion_and_sample(task_dir, fused_cross_entropy="liger")
    with pytest.raises(RuntimeError, match="fused_cross_entropy=liger cannot run: .*CUDA"):
        crit(model, sample)
    with pytest.raises(ValueError, match="label_smoothing=0"):
        _criterion_and_sample(task_dir, fused_cross_entropy="liger", label_smoothing=0.1)


def _liger_importable():
    from ast_t5.criterions.span_cross_entropy import liger_fused_linear_ce
    return liger_fused_linear_ce()[0] is not None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused cross-entropy runs on CUDA only")
@pytest.mark.skipif(torch.cuda.is_available() and not _liger_importable(),
                    reason="liger-kernel is not installed (optional: pip install liger-kernel)")
def test_fused_cross_entropy_runs_on_cuda_and_matches_eager(task_dir):
    crit, model, sample = _criterion_and_sample(task_dir)  # auto
    from fairseq import utils
    model = model.cuda()
    sample = utils.move_to_cuda(sample)
    loss, _, log = crit(model, sample)
    assert crit.last_path == "liger", "liger-kernel is installed but the fused path did not run"
    eager, _, elog = type(crit)(crit.task, fused_cross_entropy="eager")(model, sample)
    torch.testing.assert_close(loss, eager, rtol=1e-4, atol=1e-3)
    assert int(log["n_correct"]) == int(elog["n_correct"])


@pytest.fixture
def restored_logging():
    """bench_train.main configures logging for a script (root handler on this test's stdout,
    quieter package loggers); put it back so later tests log as before."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    names = ("fairseq", "ast_t5", "fused_ops", "transformers", "hydra", "ast_t5.models.ast_t5_model")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for n, lvl in levels.items():
        logging.getLogger(n).setLevel(lvl)


def test_bench_train_cpu_mode(tmp_path, restored_logging):
    out = tmp_path / "train.json"
    assert bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "1", "--warmup", "1",
                             "--profile", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    for side in ("ours", "hf"):
        assert figures[side]["tokens_per_s"] > 0 and math.isfinite(figures[side]["loss_last"])
    # warm-up, the block of ours alone written before Hugging Face's run, the interleaved block
    assert figures["ours"]["num_updates"] == 3 and figures["ours"]["ce_path"] == "eager"
    assert "partial" not in figures
    assert figures["ratio_tokens_per_s"] > 0 and figures["flops_per_update"] > 0
    budget = figures["profile"]["seconds"]
    assert {"forward", "backward", "optimizer", "data_make", "trainer_rest"} <= set(budget)
    assert all(v >= 0 for v in budget.values())


def test_bench_train_sorts_the_gpu_kernels_of_an_update_by_kind(caplog):
    """--profile on CUDA: the share of the GPU's busy time per kind of kernel, from kernel names as
    cuBLAS, FlashAttention, SDPA, inductor, our triton backend, liger and PyTorch's eager ops name
    them; a kernel of no known kind is named, not hidden."""
    kind = bench_train.kernel_kind
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1") == "matrix products"
    assert kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT") == "matrix products"
    assert kind("triton_tem_fused_mm_4") == "matrix products"
    for name in ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>",
                 "fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "_bwd_dq_kernel", "_fwd_kernel_0",
                 "triton_tem_fused_flex_attention_0", "fused_ops::softmax_dropout_forward_kernel<bf16, 32, 32>"):
        assert kind(name) == "attention", name
    assert kind("_cross_entropy_kernel") == "loss (cross-entropy)"
    # eager cross-entropy's log-softmax (cuDNN-less PyTorch names it LogSoftMax), liger's gradient scaling
    assert kind("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, float, "
                "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>") == "loss (cross-entropy)"
    assert kind("element_mul_kernel") == "loss (cross-entropy)"
    # inductor's fused kernels named after SDPA's ops (the mask built for it, its bias gradient reduced):
    # inductor's, not attention
    for name in ("triton_poi_fused__scaled_dot_product_efficient_attention__to_copy_expand_masked_fill_1",
                 "triton_red_fused__scaled_dot_product_efficient_attention_backward_sum_14"):
        assert kind(name) == "inductor fused (pointwise, reductions)", name
    assert kind("triton_unknown_template_3") == "inductor templates and other Triton kernels"
    assert kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") \
        == "optimizer"
    assert kind("Memcpy HtoD (Pageable -> Device)") == kind("Memset (Device)") == "copies and fills"
    assert kind("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3") == "inductor fused (pointwise, reductions)"
    assert kind("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>") == "copies and fills"
    assert kind("triton_poi_fused_add_mul_7") == "inductor fused (pointwise, reductions)"
    assert kind("triton_per_fused_add_pow_sum_12") == "inductor fused (pointwise, reductions)"
    assert kind("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>") \
        == "eager pointwise and reductions"
    assert kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert kind("my_custom_kernel") == "other"

    kernels = [("sm90_xmma_gemm_a", 0.0, 600.0), ("_fwd_kernel", 700.0, 200.0),
               ("triton_poi_fused_add_1", 950.0, 100.0), ("my_custom_kernel", 1100.0, 100.0)]
    kinds = bench_train.kernel_kinds(kernels)
    assert kinds["largest"] == {"matrix products": [["sm90_xmma_gemm_a", 0.6, 1]],
                                "attention": [["_fwd_kernel", 0.2, 1]],
                                "inductor fused (pointwise, reductions)": [["triton_poi_fused_add_1", 0.1, 1]],
                                "other": [["my_custom_kernel", 0.1, 1]]}
    # each kind's largest kernels by their time summed over runs, at most `top` of them
    many = [("triton_poi_fused_a", 0.0, 30.0), ("triton_poi_fused_b", 40.0, 50.0), ("triton_poi_fused_a", 100.0, 30.0),
            ("triton_red_fused_c", 140.0, 10.0), ("triton_per_fused_d", 160.0, 5.0)]
    assert bench_train.kernel_kinds(many, top=3)["largest"] == {"inductor fused (pointwise, reductions)": [
        ["triton_poi_fused_a", 0.06, 2], ["triton_poi_fused_b", 0.05, 1], ["triton_red_fused_c", 0.01, 1]]}
    assert kinds["shares"] == {"matrix products": 0.6, "attention": 0.2, "inductor fused (pointwise, reductions)": 0.1,
                               "other": 0.1}
    assert list(kinds["shares"]) == ["matrix products", "attention", "inductor fused (pointwise, reductions)",
                                     "other"]
    assert kinds["busy_ms"] == 1.0 and kinds["span_ms"] == 1.2 and kinds["kernels"] == 4
    assert abs(kinds["busy_of_span"] - 1 / 1.2) < 1e-12 and kinds["other"] == ["my_custom_kernel"]
    assert bench_train.kernel_kinds([]) == {}

    # what a profile gives in this torch: (name, start, duration) of each event on a device type
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    # the profile of the second call only (the first carries the profiler's start-up)
    calls = []

    def call():
        calls.append(len(calls))
        with torch.profiler.record_function("a-range"):  # not an op: a range over the ops it holds
            return torch.ones(64, 64).mm(torch.ones(64, 64)) if len(calls) == 2 else torch.ones(8).add(1)
    prof = bench_train.profile_second_call(call, torch.device("cpu"), [ProfilerActivity.CPU])
    assert calls == [0, 1]
    events = bench_train.device_events(prof, DeviceType.CPU)
    names = {name for name, _, _ in events}
    assert "aten::mm" in names and "aten::add" not in names, names
    assert not any(name == "a-range" or name.startswith("ProfilerStep") for name in names), names
    assert all(isinstance(start, float) and duration >= 0 for _, start, duration in events)
    assert bench_train.device_events(prof, DeviceType.CUDA) == []

    # the log line of --profile
    profile_figures = {"seconds": dict.fromkeys(("forward", "backward", "optimizer", "data_copy", "data_make",
                                                 "trainer_rest", "train_step"), 0.001),
                       "host_syncs": None, "matmul_flops_per_s": 1e12, "copy_bytes_per_s": 1e9,
                       "gpu_kernel_kinds": kinds}
    profile_figures["floors"] = dict(profile_figures["seconds"])
    with caplog.at_level(logging.INFO, logger="bench_train"):
        bench_train.report_profile(argparse.Namespace(repeats=1), {}, profile_figures)
    assert ("GPU time by kind of kernel in one update (4 kernels, 1.0 ms busy in a 1.2 ms span: 83%): matrix products "
            "60.0%, attention 20.0%, inductor fused (pointwise, reductions) 10.0%, other 10.0%") in caplog.text
    assert "largest kernels of no known kind: my_custom_kernel" in caplog.text
    assert "  largest matrix products: sm90_xmma_gemm_a 0.60 ms x1" in caplog.text
    assert "  largest other:" not in caplog.text  # named on the line above


def test_bench_train_writes_its_comparison_before_the_profile(tmp_path, restored_logging, monkeypatch):
    """The profile runs last and may be cut by gpu_check's time limit: the JSON already holds the
    comparison with Hugging Face then (rewritten with the profile when it finishes)."""
    out = tmp_path / "train.json"

    def cut(*args, **kwargs):
        assert json.loads(out.read_text())["ours"]["tokens_per_s"] > 0  # written before the profile began
        raise TimeoutError("cut by the step's time limit")
    monkeypatch.setattr(bench_train, "profile_update", cut)
    with pytest.raises(TimeoutError):
        bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "1", "--warmup", "1", "--profile",
                          "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures["ratio_tokens_per_s"] > 0 and "profile" not in figures


def test_bench_train_writes_ours_alone_before_building_hugging_face_s_model(tmp_path, restored_logging,
                                                                          monkeypatch):
    """Hugging Face's compile may not fit gpu_check's time limit (minutes on a GPU host): the JSON already
    holds our figures, from one block right after our warm-up, marked partial."""
    out = tmp_path / "train.json"

    def cut(*args, **kwargs):
        raise TimeoutError("cut by the step's time limit")
    monkeypatch.setattr(bench_train, "setup_hf", cut)
    with pytest.raises(TimeoutError):
        bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "1", "--warmup", "1", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures["ours"]["tokens_per_s"] > 0 and figures["ours"]["num_updates"] == 2
    assert "hf" not in figures and "ratio_tokens_per_s" not in figures and "before Hugging Face" in figures["partial"]


def test_bench_train_times_variants_beside_ours_in_the_same_blocks(tmp_path, restored_logging, capsys):
    """--versus: each variant is a trainer of its own with the overrides after ours', warmed up and then
    timed in the same interleaved blocks as ours; the JSON holds its figures and its ratio over ours."""
    out = tmp_path / "train.json"
    assert bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "2", "--warmup", "1", "--no-hf",
                             "--versus", "++model.attention_backend=torch", "--versus", " +optimizer.compiled=true ",
                             "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    ours, (torch_attention, compiled) = figures["ours"], figures["variants"]
    assert ours["attention_backend"] == "auto" and not ours["optimizer_compiled"]
    assert torch_attention["overrides"] == "++model.attention_backend=torch"
    assert torch_attention["attention_backend"] == "torch" and not torch_attention["optimizer_compiled"]
    assert compiled["overrides"] == "+optimizer.compiled=true"
    assert compiled["optimizer_compiled"] and compiled["attention_backend"] == "auto"
    # ours: warm-up, its block alone, one block beside each variant after that one's warm-up, two blocks
    # with all; each variant: warm-up, its block beside ours, two blocks
    assert ours["num_updates"] == 6
    for v in (torch_attention, compiled):
        assert v["num_updates"] == 4
        assert len(v["blocks"]) == 2 and math.isfinite(v["loss_last"])
        assert v["speedup_vs_ours"] == pytest.approx(ours["seconds_per_update"] / v["seconds_per_update"])
        assert v["tokens_per_s"] > 0 and v["flops_per_update"] == figures["flops_per_update"]
    assert "hf" not in figures and "partial" not in figures
    assert "ours + +optimizer.compiled=true / ours: " in capsys.readouterr().out
    for bad in (["--versus", " "], ["--versus", "a=1", "--versus", "a=1"]):
        with pytest.raises(SystemExit):
            bench_train.parse_args(bad)


def test_bench_train_keeps_each_variant_s_first_block_if_a_time_limit_cuts_the_run(tmp_path, restored_logging,
                                                                                 monkeypatch):
    """With --versus the JSON is written with ours alone after its warm-up, then again after each
    variant's warm-up with one block of it beside ours: a run cut during the next compile keeps those."""
    out = tmp_path / "train.json"
    calls = []
    real = bench_train.setup_ours

    def setup(args, device, data_dir, extra=()):
        calls.append(list(extra))
        if len(calls) == 3:  # the second variant's build: the time limit strikes
            raise KeyboardInterrupt
        return real(args, device, data_dir, extra)

    monkeypatch.setattr(bench_train, "setup_ours", setup)
    with pytest.raises(KeyboardInterrupt):
        bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "1", "--warmup", "1", "--no-hf",
                          "--versus", "++model.attention_backend=torch", "--versus", "+optimizer.compiled=true",
                          "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures["partial"].startswith("ours alone") and figures["ours"]["tokens_per_s"] > 0
    (v,) = figures["variants"]
    assert v["overrides"] == "++model.attention_backend=torch" and v["speedup_vs_ours"] > 0
    assert v["partial"] == "one block beside ours right after its warm-up"


def test_a_variant_that_fails_is_listed_with_its_error_and_the_others_still_run(tmp_path, restored_logging, capsys):
    """--versus: a variant that raises while it is built (here a backend that does not exist) is logged
    and listed in "failed_variants" with its error, and the next variant is still timed beside ours."""
    out = tmp_path / "train.json"
    assert bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "1", "--warmup", "1", "--no-hf",
                             "--versus", "++model.attention_backend=nonexistent",
                             "--versus", "+optimizer.compiled=true", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    (failed,) = figures["failed_variants"]
    assert failed["overrides"] == "++model.attention_backend=nonexistent"
    assert "nonexistent" in failed["failed"] and "\n" not in failed["failed"], failed
    (ran,) = figures["variants"]
    assert ran["overrides"] == "+optimizer.compiled=true" and ran["speedup_vs_ours"] > 0
    assert "partial" not in figures and figures["ours"]["tokens_per_s"] > 0
    log = capsys.readouterr().out
    assert "ours + ++model.attention_backend=nonexistent: failed before its timing (" in log, log
    assert "ours + +optimizer.compiled=true / ours: " in log


def test_a_variant_whose_warm_up_raises_is_listed_and_the_comparison_still_ends(tmp_path, restored_logging,
                                                                                monkeypatch):
    """A variant that builds but fails in its warm-up (the compile, or out of memory, on a GPU) is listed
    with the error's first line; ours is still timed to the end and written."""
    out = tmp_path / "train.json"
    real, calls = bench_train._warm_up, []

    def warm_up(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:  # the variant's
            raise RuntimeError("InductorError: ValueError: The argument '((-1)) + 384' is not comparable\n(traceback)")
        return real(*args, **kwargs)

    monkeypatch.setattr(bench_train, "_warm_up", warm_up)
    assert bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "1", "--warmup", "1", "--no-hf",
                             "--versus", "++model.compile_scope=layers", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["failed_variants"] == [{"overrides": "++model.compile_scope=layers", "failed":
                                           "RuntimeError: InductorError: ValueError: The argument '((-1)) + 384' "
                                           "is not comparable"}]
    assert "variants" not in figures and figures["ours"]["num_updates"] == 3 and "partial" not in figures


def test_bench_train_refuses_to_compare_models_with_different_dropout(tmp_path, restored_logging, capsys):
    """Hugging Face T5 has one dropout rate: a model with another attention dropout would not do
    the same work, so the comparison stops with one line before any timing."""
    out = tmp_path / "train.json"
    assert bench_train.main(["--device", "cpu", "--updates", "1", "--repeats", "1", "--warmup", "1",
                             "--override", "++model.attention_dropout=0.1", "--json", str(out)]) == 2
    assert "one dropout_rate" in capsys.readouterr().out and not out.exists()


def test_a_compilation_says_how_many_graphs_inductor_loaded_from_its_cache(tmp_path, monkeypatch, caplog):
    """A second model of the same shapes (a rerun, or bench_train.py after bench_recipe.py on one
    machine) loads the first one's graphs from inductor's on-disk cache, and the compile log says so:
    its seconds are a load, not a compilation. Real inductor (CPU kernels), in a fresh cache folder."""
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}")
    src, prev = torch.randint(4, len(d), (2, 20)), torch.randint(4, len(d), (2, 6))
    models = []
    with caplog.at_level(logging.INFO, logger="ast_t5.models.ast_t5_model"):
        for seed in (0, 1):  # other weights, the same shapes: the same graphs
            torch.manual_seed(seed)
            torch._dynamo.reset()
            model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0,
                                               encoder_layers=1, decoder_layers=1,  # fewer kernels to compile
                                               compile=True, compile_backend="inductor").train()
            model(src, torch.full((2,), 20), prev)[0].float().mean().backward()
            models.append(model)
    first, second = models
    assert first.compile_cache_hits == 0 and first.compile_cache_misses >= 2  # forward and backward graphs
    assert second.compile_cache_hits == first.compile_cache_misses and second.compile_cache_misses == 0
    logged = [r.getMessage() for r in caplog.records if "new graph" in r.getMessage()]
    assert len(logged) == 2
    assert logged[0].endswith(f"; inductor's cache: 0 of {first.compile_cache_misses} graphs loaded")
    assert logged[1].endswith(f"; inductor's cache: {second.compile_cache_hits} of {second.compile_cache_hits} "
                              "graphs loaded")
