"""scripts/gpu_check.sh: usage errors, its plan under a budget, and resuming a call on a warm machine.

Only its dry run (GPU_CHECK_DRY_RUN=1) runs here: it plans every step as a GPU call would, charging
each step its whole limit, and writes figures.json, without running any step or touching the tree.
"""
import json
import os
import subprocess

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_check.sh")


def gpu_check(out, **env):
    """The script with ``env`` over this process's environment, less the GPU_CHECK_* settings of a
    gpu_check call that may be running this very test (its other_tests step)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    env = dict(inherited, **{k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", SCRIPT, str(out)], env=env, capture_output=True, text=True)


def plan(tmp_path, **env):
    """A dry run: its exit status, the steps' statuses in order and what it printed."""
    out = tmp_path / "out"
    proc = gpu_check(out, GPU_CHECK_DRY_RUN=1, GPU_CHECK_STATE=tmp_path / "state", **env)
    with open(out / "figures.json", encoding="utf-8") as f:
        steps = json.load(f)["steps"]
    return proc.returncode, [(name, s["exit"]) for name, s in steps.items()], proc.stdout, steps


def test_usage_errors_exit_2_before_any_work(tmp_path):
    proc = gpu_check(tmp_path / "out", GPU_CHECK_STEPS="attention bogus")
    assert proc.returncode == 2 and "unknown step 'bogus'" in proc.stderr
    assert "groups: all attention train headline;" in proc.stderr and "recipe" in proc.stderr
    assert not os.listdir(tmp_path / "out")  # nothing ran
    proc = gpu_check(tmp_path / "out", GPU_CHECK_BUDGET_S="9m")
    assert proc.returncode == 2 and "whole number of seconds" in proc.stderr
    proc = subprocess.run(["bash", SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_each_group_runs_its_issues_steps_in_order_of_need(tmp_path):
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="attention", GPU_CHECK_BUDGET_S=10000)
    assert rc == 0 and steps == [(name, "planned") for name in (
        "build", "cudnn_gpu_tests", "cudnn_attention", "bench_attention", "bench_model", "bench_model_compiled",
        "attention_profile", "triton_tiles", "attention_tests", "bench_attention_lengths")]
    # the attention tables time each row in a CUDA graph too (graph ms beside ms); the tile sweep does not
    commands = {line.split()[1]: line for line in out.splitlines() if line.startswith("== ")}
    # the compiled step: auto against triton at the layers scope, its own JSON, Hugging Face left out
    assert ("--gpu-compile --gpu-compile-scope layers --gpu-backends triton --gpu-dropouts 0 --gpu-no-hf "
            in commands["bench_model_compiled"] and "/model_compiled.json" in commands["bench_model_compiled"])
    assert " --graph " in commands["bench_attention"] and " --graph " in commands["bench_attention_lengths"]
    # cuDNN's kernels: its CUDA tests, then its rows beside the triton backend's (CUDA graphs too), no dropout
    assert "test_cudnn_attention.py -k test_gpu_" in commands["cudnn_gpu_tests"]
    assert ("--lengths 1024 512 --dropouts 0 --backends cudnn cudnn-nondeterministic triton sdpa-prebuilt "
            "triton-baseline flash-nobias cudnn-nobias triton-nobias --graph --json " in commands["cudnn_attention"]
            and "/attention_cudnn.json" in commands["cudnn_attention"])
    assert "--graph" not in commands["triton_tiles"]
    rc, steps, *_ = plan(tmp_path, GPU_CHECK_STEPS="train", GPU_CHECK_BUDGET_S=10000)
    assert rc == 0 and [name for name, _ in steps] == ["build", "triton_gpu_tests", "bench_train_variants", "recipe",
                                                      "bench_train", "bias_grad", "optimizer", "host_overhead",
                                                      "compile_scope", "other_tests", "norm_ffn"]
    # a step named twice (a group and itself) runs once, in the script's order
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="norm_ffn train build", GPU_CHECK_BUDGET_S=10000)
    assert [name for name, _ in steps] == ["build", "triton_gpu_tests", "bench_train_variants", "recipe",
                                          "bench_train", "bias_grad", "optimizer", "host_overhead", "compile_scope",
                                          "other_tests", "norm_ffn"]
    commands = {line.split()[1]: line for line in out.splitlines() if line.startswith("== ")}
    # on the training backend (triton once triton_gpu_tests passed: planned here), against the cudnn backend
    # (first: a cut run keeps it) and inductor's autotuning
    assert ("bench_train.py --device cuda --no-hf --backend triton --versus ++model.attention_backend=cudnn "
            "--versus ++model.compile_mode=max-autotune-no-cudagraphs --json " in commands["bench_train_variants"]
            and "/train_variants.json" in commands["bench_train_variants"])
    # headline: the triton backend's CUDA tests (what the sm90 row of AUTO_TABLE waits for), then the
    # steps that measure the two issues' targets, issue 11's first, in the script's order
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="headline", GPU_CHECK_BUDGET_S=10000)
    assert rc == 0 and [name for name, _ in steps] == ["build", "triton_gpu_tests", "recipe", "bench_train",
                                                      "cudnn_gpu_tests", "cudnn_attention", "bench_model"]
    commands = {line.split()[1]: line for line in out.splitlines() if line.startswith("== ")}
    assert "test_triton_rpe_attention.py -k test_gpu_" in commands["triton_gpu_tests"]
    # the recipe and bench_train's trainer run on the triton backend once those tests pass (a dry run plans it so)
    assert "--override ++model.attention_backend=triton " in commands["recipe"]
    assert "--profile --backend triton --json " in commands["bench_train"]
    # at the budget the next lent session runs it with, charging every step its whole cap (the worst case):
    # build, the tests and the recipe fit, the rest waits for a resumed call
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="headline", GPU_CHECK_BUDGET_S=520)
    assert steps == [("build", "planned"), ("triton_gpu_tests", "planned"), ("recipe", "planned"),
                     ("bench_train", "skipped"), ("cudnn_gpu_tests", "skipped"), ("cudnn_attention", "skipped"),
                     ("bench_model", "skipped")]
    # the attention test files leave out the triton file's test_gpu_ tests when that step ran them
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="triton_gpu_tests attention_tests", GPU_CHECK_BUDGET_S=1000)
    assert "tests/fused_ops -k not test_gpu_" in out
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="attention_tests", GPU_CHECK_BUDGET_S=1000)
    assert "tests/fused_ops\n" in out and "not test_gpu_" not in out
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="recipe", GPU_CHECK_BUDGET_S=400)
    # without the tests in this call or an earlier one: the default backend; GPU_CHECK_TRAIN_BACKEND chooses
    assert "--timeout 365 " in out and "--override ++model.attention_backend=auto " in out
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="recipe bench_train", GPU_CHECK_TRAIN_BACKEND="sdpa",
                             GPU_CHECK_BUDGET_S=1000)
    assert "--override ++model.attention_backend=sdpa " in out and "--backend sdpa " in out
    rc, steps, *_ = plan(tmp_path, GPU_CHECK_BUDGET_S=10000)  # all: both groups, the train one's first two first
    assert len(steps) == 20 and [name for name, _ in steps[:10]] == ["build", "triton_gpu_tests",
                                                                     "bench_train_variants", "recipe",
                                                                     "bench_train", "cudnn_gpu_tests",
                                                                     "cudnn_attention", "bias_grad",
                                                                     "optimizer", "bench_attention"]
    assert steps[-1][0] == "norm_ffn"


def test_a_step_the_budget_cannot_fit_is_skipped_and_a_shorter_one_after_it_still_runs(tmp_path):
    # recipe (cap 400) leaves 40 s: bench_train (needs 200) is skipped, norm_ffn (needs 30) runs in 40
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="recipe bench_train norm_ffn", GPU_CHECK_BUDGET_S=440)
    assert steps == [("recipe", "planned"), ("bench_train", "skipped"), ("norm_ffn", "planned")]
    assert rc == 1 and "bench_train: skipped (needs 200s, 40s of the budget left)" in out
    assert "norm_ffn (cap 45s, min 30s, limit 40s)" in out
    # the recipe stops its own training 35 s before its step's limit, to report what it has
    assert "bench_recipe.py --device cuda --timeout 365 " in out
    rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="recipe", GPU_CHECK_BUDGET_S=300)
    assert "--timeout 265 " in out and steps == [("recipe", "planned")]


def test_resume_leaves_out_what_an_earlier_call_finished_but_reruns_a_step_the_budget_cut(tmp_path):
    (tmp_path / "state").write_text(
        "build 0 21 60 60\n"  # name exit seconds limit cap
        "recipe 124 120 120 260\n"  # cut by the budget (limit < cap): run again
        "bench_train 124 240 240 240\n"  # timed out at its own cap: a rerun would too
        "other_tests 1 200 360 360\n"  # failed: the failure stands, not rerun
    )
    rc, steps, out, figures = plan(tmp_path, GPU_CHECK_STEPS="train", GPU_CHECK_RESUME=1, GPU_CHECK_BUDGET_S=1900)
    assert steps == [("build", "earlier"), ("triton_gpu_tests", "planned"), ("bench_train_variants", "planned"),
                     ("recipe", "planned"),
                     ("bench_train", "earlier"),
                     ("bias_grad", "planned"), ("optimizer", "planned"),
                     ("host_overhead", "planned"), ("compile_scope", "planned"), ("other_tests", "earlier"),
                     ("norm_ffn", "planned")]
    assert [figures[n]["earlier_exit"] for n in ("build", "bench_train", "other_tests")] == [0, 124, 1]
    assert "build: finished in an earlier call" in out
    # the earlier failures still count: the call does not report them as passed
    assert rc == 1 and "failed or skipped: bench_train (in the earlier call), other_tests (in the earlier call)" in out
    (tmp_path / "state").write_text("build 0 21 60 60\n")
    rc, steps, *_ = plan(tmp_path, GPU_CHECK_STEPS="build norm_ffn", GPU_CHECK_RESUME=1)
    assert rc == 0 and steps == [("build", "earlier"), ("norm_ffn", "planned")]
    # without GPU_CHECK_RESUME the record is not read
    rc, steps, *_ = plan(tmp_path, GPU_CHECK_STEPS="train", GPU_CHECK_BUDGET_S=2600)
    assert all(status == "planned" for _, status in steps)
    # the recipe of a resumed call runs on triton when the earlier call's triton tests passed, not when they failed
    for tests_exit, backend in (0, "triton"), (1, "auto"):
        (tmp_path / "state").write_text(f"build 0 21 60 60\ntriton_gpu_tests {tests_exit} 50 180 180\n")
        rc, steps, out, _ = plan(tmp_path, GPU_CHECK_STEPS="headline", GPU_CHECK_RESUME=1, GPU_CHECK_BUDGET_S=400)
        assert steps[:3] == [("build", "earlier"), ("triton_gpu_tests", "earlier"), ("recipe", "planned")]
        assert f"--override ++model.attention_backend={backend} " in out


def test_a_dry_run_leaves_the_record_of_finished_steps_alone(tmp_path):
    (tmp_path / "state").write_text("build 0 21 60 60\n")
    plan(tmp_path, GPU_CHECK_STEPS="train")
    assert (tmp_path / "state").read_text() == "build 0 21 60 60\n"


def _fake_call(tmp_path, real_imports=False):
    """A copy of the scripts (a call links ast_t5_preprocess in its tree) and a python whose benchmarks
    write a stand-in JSON ({"benchmark": its script} to its --json; the rest is real python, and the
    import check before the steps too with ``real_imports``: about 10 s a call); returns
    call(out, **env) -> (process, figures.json), the state, JSON and compile cache folders in tmp_path."""
    import shutil
    import sys

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("gpu_check.sh", "gpu_summary.py", "compile_cache.py"):
        shutil.copy(os.path.join(os.path.dirname(SCRIPT), name), repo / "scripts" / name)
    fake = tmp_path / "python"
    stand_in_imports = "" if real_imports else (
        '  " -c import fairseq ") exit 0 ;;\n'
        '  " - ") cat > /dev/null; echo "gpu_check imports: (stand-in)" ;;\n')
    fake.write_text(f"""#!/usr/bin/env bash
case " $* " in
  *" benchmarks/"*" --json "*)
    prev=""; for a in "$@"; do
      case $a in benchmarks/*) script=$a ;; esac
      if [ "$prev" = --json ]; then printf '{{"benchmark": "%s"}}' "$script" > "$a"; fi
      prev=$a
    done ;;
{stand_in_imports}  *) exec {sys.executable} "$@" ;;
esac
""")
    fake.chmod(0o755)
    env = dict(PYTHON=fake, GPU_CHECK_STATE=tmp_path / "state", GPU_CHECK_JSON_DIR=tmp_path / "json",
               TORCHINDUCTOR_CACHE_DIR=tmp_path / "cache", GPU_CHECK_COMPILE_CACHE=tmp_path / "carried.tar.xz")
    script = str(repo / "scripts" / "gpu_check.sh")

    def call(out, **extra):
        inherited = {k: v for k, v in os.environ.items()
                     if not k.startswith(("GPU_CHECK_", "TORCHINDUCTOR_", "TRITON_CACHE"))}
        proc = subprocess.run(["bash", script, str(out)], capture_output=True, text=True,
                              env=dict(inherited, **{k: str(v) for k, v in {**env, **extra}.items()}))
        with open(out / "figures.json", encoding="utf-8") as f:
            return proc, json.load(f)
    return call


def test_a_resumed_call_s_figures_hold_the_steps_an_earlier_call_finished(tmp_path):
    """The benchmarks' JSON files live in GPU_CHECK_JSON_DIR, beside the state file: a resumed call
    embeds the figures of the steps the earlier call finished (which it does not rerun) with its own,
    and a call without GPU_CHECK_RESUME starts from none."""
    call = _fake_call(tmp_path)
    no_pack = dict(GPU_CHECK_PACK=0)  # the compile cache has a test of its own
    proc, figures = call(tmp_path / "one", GPU_CHECK_STEPS="optimizer", **no_pack)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert figures["optimizer"] == {"benchmark": "benchmarks/bench_optimizer.py"} and "host_overhead" not in figures
    proc, figures = call(tmp_path / "two", GPU_CHECK_STEPS="optimizer host_overhead", GPU_CHECK_RESUME=1, **no_pack)
    assert figures["steps"]["optimizer"]["exit"] == "earlier" and figures["steps"]["host_overhead"]["exit"] == 0
    assert figures["optimizer"] == {"benchmark": "benchmarks/bench_optimizer.py"}
    assert figures["host_overhead"] == {"benchmark": "benchmarks/bench_host_overhead.py"}
    proc, figures = call(tmp_path / "three", GPU_CHECK_STEPS="host_overhead", **no_pack)  # a fresh start: none kept
    assert "optimizer" not in figures and figures["host_overhead"]["benchmark"].endswith("bench_host_overhead.py")


def test_a_call_fills_the_compile_cache_from_the_carried_archive_once_and_packs_it_for_the_next(tmp_path):
    """The carried archive is unpacked into TORCHINDUCTOR_CACHE_DIR (Triton's cache inside it) once per
    machine, and the folder, with what the call's steps added, is packed into OUTDIR for the next
    session (GPU_CHECK_PACK=0 leaves that out)."""
    import tarfile

    from ..conftest import load_script

    cc = load_script("compile_cache")
    call = _fake_call(tmp_path, real_imports=True)
    first = tmp_path / "first_cache"
    (first / "fxgraph" / "ab").mkdir(parents=True)
    (first / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    cc.pack(str(first), str(tmp_path / "carried.tar.xz"), 2**20)
    proc, _ = call(tmp_path / "one", GPU_CHECK_STEPS="host_overhead", GPU_CHECK_PACK=0)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "cache" / "fxgraph" / "ab" / "entry").read_bytes() == b"graph"
    log = (tmp_path / "one" / "build.log").read_text()
    assert "compile_cache: unpacked 1 files" in log and "compile_cache: packed" not in log
    assert "gpu_check imports: torch " in log  # the real import check ran
    assert not (tmp_path / "one" / "compile_cache.tar.xz").exists()
    (tmp_path / "cache" / "triton" / "K").mkdir(parents=True)  # a kernel of ours that a step compiled
    (tmp_path / "cache" / "triton" / "K" / "__grp___attn_fwd.json").write_text("{}")
    proc, _ = call(tmp_path / "two", GPU_CHECK_STEPS="host_overhead", GPU_CHECK_RESUME=1)
    log = (tmp_path / "two" / "build.log").read_text()
    assert "unpacked" not in log  # the same machine: the folder is already filled
    assert "compile_cache: packed inductor + triton: 2 files" in log
    with tarfile.open(tmp_path / "two" / "compile_cache.tar.xz", "r:xz") as tar:
        names = tar.getnames()
    assert names[0] == cc.MANIFEST and sorted(names[1:]) == ["fxgraph/ab/entry", "triton/K/__grp___attn_fwd.json"]
    assert len(os.listdir(tmp_path / "two")) <= 8  # what a device call brings back
