"""bench_model.py's comparison of `auto` with every single attention backend in the T5 training
step (the GPU figure of "auto within 3% of the best backend"), exercised on the CPU at a tiny shape."""
import argparse
import json
import math

import pytest
import torch

from tests.conftest import load_benchmark

pytest.importorskip("transformers")
SIZES = dict(embed_dim=64, ffn_dim=128, num_heads=4, head_dim=16, encoder_layers=2, decoder_layers=2)


def _compare(backends, dropouts=(0.0,), on_dropout=None, compile_backend=None, hf=True, **options):
    bench_model = load_benchmark("bench_model")
    args = argparse.Namespace(gpu_steps=1, gpu_repeats=2, warmup=1, peak_tflops=0.0)
    return bench_model, bench_model.compare_backends(
        args, torch.device("cpu"), "t5_v11_tiny", bench_model.Shape(512, 4, 64, 16), list(dropouts),
        list(backends), None, hf, on_dropout=on_dropout, compile_backend=compile_backend, **options, **SIZES)


def test_backends_that_ran_auto_s_kernels_are_named_and_still_timed():
    saved = []  # what --json holds after each dropout (a run cut by its time limit keeps those)
    bench_model, out = _compare(("sdpa", "flex"), dropouts=(0.0, 0.1),
                                on_dropout=lambda figures: saved.append(json.loads(json.dumps(figures))))
    assert [sorted(f["by_dropout"]) for f in saved] == [["dropout 0"], ["dropout 0", "dropout 0.1"]]
    assert saved[-1] == json.loads(json.dumps(out))  # the JSON gpu_check embeds
    assert bench_model.failed_models(out) == []
    for dropout in ("dropout 0", "dropout 0.1"):
        rows = out["by_dropout"][dropout]["rows"]
        assert set(rows) == {"ours[auto]", "ours[sdpa]", "ours[flex]", "hf"}
        # on the CPU every biased and bias-free call runs SDPA (flex has no backward there; triton
        # is left out: under TRITON_INTERPRET=1, set by other tests, it would run interpreted):
        # 2 encoder + 2 decoder self-attention + 2 cross-attention calls per step
        assert rows["ours[auto]"]["kernels"] == {"sdpa": 6} and rows["ours[auto]"]["same_kernels_as"] is None
        for name in ("ours[sdpa]", "ours[flex]"):
            assert rows[name]["same_kernels_as"] == "ours[auto]" and rows[name]["kernels"] == {"sdpa": 6}
            assert len(rows[name]["repeats_ms"]) == 2 and rows[name]["ms"] > 0  # timed all the same
        result = out["by_dropout"][dropout]
        fastest = min(rows[n]["ms"] for n in ("ours[sdpa]", "ours[flex]"))
        assert math.isclose(result["auto_vs_best"], rows["ours[auto]"]["ms"] / fastest - 1)
        assert rows["hf"]["kernels"] == {} and rows["hf"]["same_kernels_as"] is None
        assert out["by_dropout"][dropout]["ours_auto_over_hf_speed"] > 0


def test_a_backend_with_other_kernels_is_timed_and_auto_compared_with_it():
    _, out = _compare(("torch",))
    result = out["by_dropout"]["dropout 0"]
    rows = result["rows"]
    assert rows["ours[torch]"]["kernels"] == {"torch": 6} and rows["ours[torch]"]["same_kernels_as"] is None
    assert result["best_single"] == "ours[torch]"
    assert math.isclose(result["auto_vs_best"], rows["ours[auto]"]["ms"] / rows["ours[torch]"]["ms"] - 1)
    assert out["flops_per_step"] > 0 and rows["ours[auto]"]["mfu_percent"] is None  # no known peak on CPU


def test_a_model_whose_first_step_fails_is_left_out_with_its_error(monkeypatch):
    """One model failing (an OOM, a Triton error: not RuntimeErrors) must not cost the others'
    figures, auto's comparison among them included."""
    errors = pytest.importorskip("triton.runtime.errors")
    bench_model = load_benchmark("bench_model", "bench_model_errors")
    real_make_step = bench_model.make_step

    def make_step(model, *args):
        if str(getattr(getattr(model, "cfg", None), "attention_backend", "")) != "torch":
            return real_make_step(model, *args)

        def step():
            raise errors.OutOfResources(245760, 232448, "shared memory")
        return step

    monkeypatch.setattr(bench_model, "make_step", make_step)
    args = argparse.Namespace(gpu_steps=1, gpu_repeats=2, warmup=1, peak_tflops=0.0)
    out = bench_model.compare_backends(args, torch.device("cpu"), "t5_v11_tiny", bench_model.Shape(512, 4, 64, 16),
                                       [0.0], ["sdpa", "torch"], None, True, **SIZES)
    result = out["by_dropout"]["dropout 0"]
    rows = result["rows"]
    assert rows["ours[torch]"] == {"error": "OutOfResources: " + str(errors.OutOfResources(245760, 232448,
                                                                                          "shared memory"))}
    assert result["best_single"] == "ours[sdpa]" and rows["ours[sdpa]"]["ms"] > 0 and rows["hf"]["ms"] > 0
    assert math.isclose(result["auto_vs_best"], rows["ours[auto]"]["ms"] / rows["ours[sdpa]"]["ms"] - 1)
    assert bench_model.failed_models(out) == ["dropout 0: ours[torch]"]  # --device cuda then exits 1


def test_the_comparison_runs_every_model_compiled_as_the_recipes_train():
    """--gpu-compile: ours with model.compile (here the quick aot_eager backend), Hugging Face
    through torch.compile; the kernels recorded are those of our first, eager forward."""
    _, out = _compare(("sdpa",), compile_backend="aot_eager")
    assert out["compiled"] == "aot_eager"
    rows = out["by_dropout"]["dropout 0"]["rows"]
    assert set(rows) == {"ours[auto]", "ours[sdpa]", "hf"} and all(r["ms"] > 0 for r in rows.values())
    assert rows["ours[auto]"]["kernels"] == {"sdpa": 6} and rows["ours[sdpa]"]["same_kernels_as"] == "ours[auto]"
    assert out["compile_scope"] == "model"


def test_the_compiled_comparison_takes_the_compile_scope_and_can_leave_hugging_face_out(monkeypatch):
    """gpu_check's bench_model_compiled: every one of our models compiled with compile_scope=layers
    (a third of the compile time), Hugging Face neither compiled nor timed."""
    from ast_t5.models import AstT5Model

    built, compiled = [], []
    real_build = AstT5Model.build.__func__
    monkeypatch.setattr(AstT5Model, "build",
                        classmethod(lambda cls, cfg, *a: built.append(cfg) or real_build(cls, cfg, *a)))
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: compiled.append(a[0] if a else None) or real_compile(*a, **k))
    _, out = _compare(("sdpa",), compile_backend="aot_eager", hf=False, compile_scope="layers")
    assert out["compiled"] == "aot_eager" and out["compile_scope"] == "layers"
    rows = out["by_dropout"]["dropout 0"]["rows"]
    assert set(rows) == {"ours[auto]", "ours[sdpa]"} and all(r["ms"] > 0 for r in rows.values())
    assert rows["ours[auto]"]["kernels"] == {"sdpa": 6} and rows["ours[sdpa]"]["same_kernels_as"] == "ours[auto]"
    assert all(rows[name]["compile_s"] > 0 for name in rows)  # each model's first-step compile, logged
    assert "ours_auto_over_hf_speed" not in out["by_dropout"]["dropout 0"]
    ours = [cfg for cfg in built if cfg.compile]
    assert len(ours) == 2 and all(cfg.compile_scope == "layers" and cfg.compile_backend == "aot_eager" for cfg in ours)
    # our two models compiled their layer calls (the layers scope), nothing else was compiled
    assert [getattr(f, "__name__", None) for f in compiled] == ["_call_layer", "_call_layer"]


def test_every_compiled_model_compiles_its_own_graphs_however_many_are_compared(monkeypatch, caplog):
    """--gpu-compile with the default backends: at compile_scope layers every model compiles the same
    module-level layer call (2 graphs each), so 8 models per dropout over two dropouts went past torch's
    recompile limit (16), after which later models ran eagerly under a compiled row's name, with no
    compile time and twice the kernels. Each dropout now starts from a reset with a limit that fits its
    models. (The triton structures' models run the triton model's code here, where its kernels fall back
    to sdpa, so they may run its graphs: no compile of their own, noted in their rows. On a GPU the kernels'
    settings are read in the traced code, and each gets its own.) The JSON also holds each dropout's
    compiles before its timing (a time limit may cut it). Here with torch's limit, and the model's
    floor, lowered to 2: 2 and 3 models per dropout (4 and 6 graphs) go past it as the 8 models did
    past 16, in a third of the compile time."""
    import torch._dynamo.config as dynamo_config

    from ast_t5.models import ast_t5_model

    tra = pytest.importorskip("ast_t5.modules.triton_rpe_attention")
    monkeypatch.setattr(tra, "unsupported_reason", lambda *args: "kernels not run by this test")
    monkeypatch.setattr(ast_t5_model, "MIN_RECOMPILE_LIMIT", 2)
    # dynamo's own patch, not monkeypatch: under torch 2.11 cache_size_limit is an alias of recompile_limit, and
    # monkeypatch's undo of either leaves recompile_limit reading "does not exist" for the rest of the process
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    saved = []
    backends = ("sdpa", "triton-bits")
    def keep(figures):
        saved.append(json.loads(json.dumps(figures)))

    with dynamo_config.patch(**{limit: 2}):
        _, out = _compare(backends, dropouts=(0.0, 0.1), compile_backend="aot_eager", hf=False,
                          compile_scope="layers", on_dropout=keep)
    for dropout, result in out["by_dropout"].items():
        rows = result["rows"]
        assert len(rows) == (2 if dropout == "dropout 0" else 3), rows
        for name, row in rows.items():
            if name == "ours[triton-bits]":
                assert bool(row["compile_s"]) != ("compile_note" in row), (dropout, name, row)
            else:
                assert row["compile_s"] > 0 and "compile_note" not in row, (dropout, name, row)
            # the eager first forward's calls: 2 encoder, 2 x 2 decoder (flex runs the encoder's at dropout 0)
            assert sum(row["kernels"].values()) == 6, (dropout, name, row)
    # dynamo's warning when a function hits the limit (our own INFO line saying the bench raised the limit
    # is caught too where an earlier test set the root logger to INFO)
    assert "hit config." not in caplog.text
    # after each dropout's compiles, then after its timing
    assert [(sorted(f["by_dropout"]), [r.get("partial") is not None for r in f["by_dropout"].values()])
            for f in saved] == [(["dropout 0"], [True]), (["dropout 0"], [False]),
                                (["dropout 0", "dropout 0.1"], [False, True]),
                                (["dropout 0", "dropout 0.1"], [False, False])]
    assert all("ms" not in r for r in saved[0]["by_dropout"]["dropout 0"]["rows"].values())


def test_gpu_only_options_without_cuda_are_a_usage_error():
    bench_model = load_benchmark("bench_model")
    for argv in (["--json", "x.json"], ["--gpu-compile"], ["--gpu-no-hf"],
                 ["--device", "cuda", "--gpu-compile-scope", "layers"]):
        with pytest.raises(SystemExit) as exc:
            bench_model.parse_args(argv)
        assert exc.value.code == 2
    assert bench_model.parse_args(["--device", "cuda", "--json", "x.json"]).json == "x.json"
    args = bench_model.parse_args(["--device", "cuda", "--gpu-compile", "--gpu-compile-scope", "layers", "--gpu-no-hf"])
    assert (args.gpu_compile, args.gpu_compile_scope, args.gpu_no_hf) == (True, "layers", True)


def test_the_triton_structure_models_run_the_triton_backend_with_their_structure_switched(monkeypatch):
    """``triton-fused``, ``triton-one-loop``, ``triton-far`` and ``triton-bits``: the triton backend with
    triton_rpe_attention.BACKWARD = "fused" (one loop per kernel, as measured), with FAR_LOOPS = "none" (the
    triton model runs the default, the far loops of the backward past 4 (M + tile)), with the far loops from
    2 (M + tile) on (FAR_LOOPS_MIN_LENGTH 2), and with DROPOUT_MASK = "bits" (with dropout only: without, its
    kernels are the triton model's), during their own steps only (the other models keep the defaults),
    compared with auto like any single backend. triton-one-loop is not among the default rows (at the
    default 512 tokens the triton model's kernels are the same)."""
    tra = pytest.importorskip("ast_t5.modules.triton_rpe_attention")
    bench_model = load_benchmark("bench_model", "bench_model_fused")
    assert {"triton-fused", "triton-one-loop", "triton-far", "triton-bits"} <= set(bench_model.SINGLE_BACKENDS)
    defaults = bench_model.DEFAULT_GPU_BACKENDS
    assert "triton-far" in defaults and "triton-one-loop" not in defaults
    backends = ["sdpa", "triton", "triton-fused", "triton-one-loop", "triton-far", "triton-bits"]
    # the order compare_backends makes steps in, per dropout
    order = ["ours[auto]", *[f"ours[{b}]" for b in backends if b != "triton-bits"],
             "ours[auto]", *[f"ours[{b}]" for b in backends]]
    real_make_step, made, seen = bench_model.make_step, [], []

    def make_step(model, *args):
        name = order[len(made)]
        made.append(name)
        step = real_make_step(model, *args)

        def run():
            seen.append((name, tra.BACKWARD, tra.FAR_LOOPS, tra.DROPOUT_MASK, tra.FAR_LOOPS_MIN_LENGTH))
            return step()
        return run

    monkeypatch.setattr(bench_model, "make_step", make_step)
    # the settings are what this test checks, not the kernels: the triton models fall back to sdpa here
    # even where an earlier test of the process left Triton's interpreter on (its kernels at this shape,
    # with dropout, took minutes)
    monkeypatch.setattr(tra, "unsupported_reason", lambda *args: "kernels not run by this test")
    args = argparse.Namespace(gpu_steps=1, gpu_repeats=2, warmup=1, peak_tflops=0.0)
    out = bench_model.compare_backends(args, torch.device("cpu"), "t5_v11_tiny", bench_model.Shape(512, 4, 64, 16),
                                       [0.0, 0.1], backends, None, False, **SIZES)  # hf=False
    assert made == order
    rows = out["by_dropout"]["dropout 0"]["rows"]
    assert set(rows) == set(order[:6]) and all(rows[name]["ms"] > 0 for name in order[:6])
    assert set(out["by_dropout"]["dropout 0.1"]["rows"]) == set(order[6:])
    by_model = {}
    for name, *settings in seen:
        by_model.setdefault(name, set()).add(tuple(settings))
    default = (tra.BACKWARD, tra.FAR_LOOPS, tra.DROPOUT_MASK, tra.FAR_LOOPS_MIN_LENGTH)
    assert by_model["ours[triton-fused]"] == {("fused", "none", default[2], default[3])}
    assert by_model["ours[triton-one-loop]"] == {("split", "none", default[2], default[3])}
    assert by_model["ours[triton-far]"] == {("split", "backward", default[2], 2)} and default[3] == 4
    assert by_model["ours[triton-bits]"] == {("split", default[1], "bits", default[3])}
    assert by_model["ours[triton]"] == by_model["ours[auto]"]  # the module's defaults: FAR_LOOPS "backward"
    assert by_model["ours[auto]"] == by_model["ours[sdpa]"] == {default}  # the module's defaults


def test_the_fused_backward_model_is_left_out_where_the_split_backward_would_run(monkeypatch, caplog):
    """On a GPU the fused backward was not built for, its model would time the split backward under the
    fused name: it is left out, with the reason logged."""
    tra = pytest.importorskip("ast_t5.modules.triton_rpe_attention")
    monkeypatch.setattr(tra, "fused_backward_unfit", lambda device, head_dim: "not sm80 at head size 64")
    bench_model = load_benchmark("bench_model", "bench_model_unfit")
    args = argparse.Namespace(gpu_steps=1, gpu_repeats=2, warmup=0, peak_tflops=0.0)  # no warm-up: allowed
    with caplog.at_level("WARNING"):
        out = bench_model.compare_backends(args, torch.device("cpu"), "t5_v11_tiny",
                                           bench_model.Shape(512, 4, 64, 16), [0.0], ["sdpa", "triton-fused"],
                                           None, False, **SIZES)
    assert set(out["by_dropout"]["dropout 0"]["rows"]) == {"ours[auto]", "ours[sdpa]"}
    assert "triton-fused left out: not sm80 at head size 64" in caplog.text

