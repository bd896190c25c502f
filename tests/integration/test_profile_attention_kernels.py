"""benchmarks/profile_attention_kernels.py: reading Nsight Compute's CSV pages, labelling the kernels
by condition, and the whole run against a stand-in ncu (the real one needs a GPU whose counters the
driver lets it read; gpu_check's attention group runs it there)."""
import json
import os
import stat
import sys
import textwrap

import pytest
import torch

from tests.conftest import load_benchmark

profile = load_benchmark("profile_attention_kernels")

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
COLUMNS = ["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
           "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "smsp__average_warp_latency_per_inst_issued.ratio", "launch__registers_per_thread",
           "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
           STALL.format("long_scoreboard"), STALL.format("wait"), STALL.format("barrier")]
UNITS = ["nsecond", "%", "%", "%", "", "register/thread", "%", "%", "", "", ""]
# (kernel name, duration ns, ..., stalls) per condition, in profile.CONDITIONS' order: triton p0, the bias
# as whole tiles, flash, triton p0.1, one loop per kernel
BY_CONDITION = [
    [("_fwd_kernel", "612,345", 40.5, 35.0, 30.1, 6.5, 128, 22.0, 20.0, 0.5, 2.5, 1.0),
     ("_bwd_dkdv_kernel", "900,000", 41.0, 36.0, 20.0, 7.0, 244, 25.0, 24.0, 0.3, 1.5, 3.0),
     ("_bwd_dq_kernel", "1,100,000", 30.0, 28.0, 18.0, 9.0, 241, 18.0, 17.0, 4.0, 1.0, 2.0)],
    [("_fwd_kernel", "610,000", 40.0, 35.0, 30.0, 6.5, 128, 22.0, 20.0, 0.5, 2.5, 1.0),
     ("_bwd_dkdv_kernel", "1,000,000", 45.0, 50.0, 20.0, 6.0, 255, 30.0, 29.0, 0.4, 1.0, 3.5),
     ("_bwd_dq_kernel", "400,000", 30.0, 28.0, 18.0, 9.0, 230, 18.0, 17.0, 4.0, 1.0, 2.0)],
    [("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>, false>(flash::Flash_fwd_params)",
      "200,000", 70.0, 60.0, 40.0, 3.0, 255, 65.0, 60.0, 0.2, 1.0, 0.5),
     ("void flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64>>(flash::Flash_bwd_params)",
      "20,000", 10.0, 9.0, 50.0, 5.0, 32, 0.0, 0.0, 3.0, 1.0, 0.1)],
    [("_fwd_kernel", "700,000", 38.0, 33.0, 30.0, 7.5, 128, 20.0, 19.0, 0.5, 3.0, 1.0),
     ("_bwd_dkdv_kernel", "1,200,000", 40.0, 45.0, 20.0, 8.0, 255, 20.0, 19.0, 0.3, 2.0, 3.0),
     ("_bwd_dq_kernel", "1,300,000", 29.0, 40.0, 18.0, 9.5, 255, 15.0, 14.0, 4.5, 1.0, 2.0)],
    [("_fwd_kernel", "611,000", 40.0, 35.0, 30.0, 6.5, 128, 22.0, 20.0, 0.5, 2.5, 1.0),
     ("_bwd_dkdv_kernel", "800,000", 41.0, 36.0, 20.0, 7.0, 250, 28.0, 26.0, 0.3, 1.5, 3.0),
     ("_bwd_dq_kernel", "700,000", 30.0, 28.0, 18.0, 9.0, 247, 25.0, 24.0, 4.0, 1.0, 2.0)],
]
KERNELS = [kernel for condition in BY_CONDITION for kernel in condition]


def raw_page(long_form=False, kernels=KERNELS) -> str:
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream"]
    lines = ["==PROF== Connected to process 1234 (python3)", "==WARNING== some note"]

    def quote(row):
        return ",".join(f'"{cell}"' for cell in row)
    if long_form:
        lines.append(quote(head + ["Section Name", "Metric Name", "Metric Unit", "Metric Value"]))
        for i, (name, *values) in enumerate(kernels):
            for column, unit, value in zip(COLUMNS, UNITS, values):
                lines.append(quote([i, 1234, "python3", "host", name, 1, 7, "Section", column, unit, value]))
        return "\n".join(lines) + "\n"
    lines.append(quote(head + COLUMNS))
    lines.append(quote([""] * len(head) + UNITS))
    for i, (name, *values) in enumerate(kernels):
        lines.append(quote([i, 1234, "python3", "host", name, 1, 7] + list(values)))
    return "\n".join(lines) + "\n"


def source_page(blocks: int) -> str:
    header = '"Address","Source","Warp Stall Sampling (All Samples)","stall_wait","Instructions Executed"'
    out = []
    for b in range(blocks):
        out.append(header)
        out.append(f'"0x10","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24","{10 + b}","1","640"')
        out.append(f'"0x20","MUFU.EX2 R3, R3","{90 + b}","40","6400"')
        out.append('"0x30","FADD R4, R4, R5","0","0","6400"')
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("long_form", [False, True], ids=["raw page", "long form"])
def test_the_counters_of_each_kernel_are_read_and_labelled_by_condition(long_form):
    results = profile.label_results(profile.parse_results(raw_page(long_form)))
    assert [r["kernel"] for r in results] == [k[0] for k in KERNELS]
    assert [(r["condition"], r["kind"]) for r in results] == [
        ("triton p0", "forward"), ("triton p0", "dK/dV"), ("triton p0", "dQ"),
        ("triton-tiles p0", "forward"), ("triton-tiles p0", "dK/dV"), ("triton-tiles p0", "dQ"),
        ("flash-nobias p0", "flash_fwd_kernel"), ("flash-nobias p0", "flash_bwd_dot_do_o_kernel"),
        ("triton p0.1", "forward"), ("triton p0.1", "dK/dV"), ("triton p0.1", "dQ"),
        ("triton-one-loop p0", "forward"), ("triton-one-loop p0", "dK/dV"), ("triton-one-loop p0", "dQ")]
    fwd = profile.summarize(results[0])
    assert fwd["duration_us"] == pytest.approx(612.345)  # nanoseconds with a thousands separator
    assert (fwd["sm_throughput_pct"], fwd["issue_active_pct"], fwd["occupancy_pct"]) == (40.5, 35.0, 30.1)
    assert (fwd["cycles_per_issue"], fwd["registers"]) == (6.5, 128)
    assert fwd["tensor_pct"] == 22.0 and len(fwd["tensor_pipes_pct"]) == 2  # the largest tensor-pipe figure
    assert list(fwd["stalls"].items()) == [("wait", 2.5), ("barrier", 1.0), ("long_scoreboard", 0.5)]
    assert list(profile.summarize(results[2])["stalls"])[0] == "long_scoreboard"
    assert fwd["bound"] == "latency (wait)" and profile.summarize(results[2])["bound"] == "latency (long_scoreboard)"
    assert profile.bound(dict(fwd, tensor_pct=75.0)) == "tensor pipe"
    assert profile.bound(dict(fwd, issue_active_pct=85.0)) == "instruction issue"
    assert profile.bound(dict(fwd, stalls={"selected": 1.0})) == "unknown"
    # a figure ncu did not report stays None, not 0
    del results[1]["metrics"]["launch__registers_per_thread"]
    assert profile.summarize(results[1])["registers"] is None


def test_kernels_past_the_known_conditions_and_flash_attention_3_names_are_labelled():
    fa3 = ("cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<CollectiveMainloopFwdSm90<2, "
           "cute::tuple<>>>>>")
    assert profile.kernel_kind(fa3) == "FlashAttnFwdSm90"
    names = ["_bwd_dq_kernel", "_fwd_kernel", fa3, "cutlass::device_kernel<flash::FlashAttnBwdSm90<>>", "_fwd_kernel"]
    labelled = profile.label_results([{"kernel": name, "metrics": {}} for name in names],
                                     conditions=(("triton", 0.0), ("flash-nobias", 0.0)))
    assert [r["condition"] for r in labelled] == ["unknown", "triton p0", "flash-nobias p0", "flash-nobias p0",
                                                  "unknown"]
    assert profile.parse_results("no csv here\n") == []


def test_the_hottest_instructions_come_first_per_kernel_block():
    blocks = profile.hot_instructions(source_page(2), top=2)
    assert len(blocks) == 2
    hot = blocks[1]["instructions"]
    assert [h["source"] for h in hot] == ["MUFU.EX2 R3, R3", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24"]
    assert hot[0]["Warp Stall Sampling (All Samples)"] == 91 and hot[0]["stall_wait"] == 40
    assert "FADD" not in json.dumps(blocks)  # cut at top=2
    # a page whose header has no sampling column keeps its first rows, in order, so its columns can be read
    plain = profile.hot_instructions('"Address","Source","Instructions Executed"\n"0x10","FADD R1","5"\n'
                                     '"0x20","FMUL R2","9"\n', top=5)
    assert [h["source"] for h in plain[0]["instructions"]] == ["FADD R1", "FMUL R2"]


FAKE_NCU = textwrap.dedent('''\
    import json, os, re, sys
    args = sys.argv[1:]
    log = os.environ["FAKE_NCU_LOG"]
    with open(log, "a") as f:
        f.write(json.dumps(args) + "\\n")
    if args == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2025.3.1.0 (build 1)")
    elif args == ["--help"]:
        print("  --kernel-name-base arg\\n  --print-kernel-base arg\\n  --page arg\\n  --print-units arg")
    elif "--import" in args:  # the page of the report of condition i: FAKE_NCU_DIR/<page>-<i>.csv
        page = args[args.index("--page") + 1]
        index = re.search(r"attention-(\\d+)\\.ncu-rep$", args[args.index("--import") + 1]).group(1)
        print(open(os.path.join(os.environ["FAKE_NCU_DIR"], f"{page}-{index}.csv")).read(), end="")
    else:
        if os.environ.get("FAKE_NCU_FAIL") == args[args.index("--workload") + 1]:
            print(os.environ.get("FAKE_NCU_FAIL_MESSAGE") or
                  "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
                  "Performance Counters on the target device 0.")
            sys.exit(1)
        open(args[args.index("--export") + 1] + ".ncu-rep", "w").close()
''')


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    ncu = tmp_path / "ncu"
    ncu.write_text(f"#!{sys.executable}\n" + FAKE_NCU)
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    for i, kernels in enumerate(BY_CONDITION):
        (tmp_path / f"raw-{i}.csv").write_text(raw_page(kernels=kernels))
        (tmp_path / f"source-{i}.csv").write_text(source_page(len(kernels)))
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "calls"))
    monkeypatch.setenv("FAKE_NCU_DIR", str(tmp_path))
    monkeypatch.delenv("FAKE_NCU_FAIL", raising=False)
    return ncu


def test_a_run_profiles_the_workload_with_the_bounding_sections_and_writes_every_kernel(tmp_path, fake_ncu, capsys):
    out = tmp_path / "profile.json"
    assert profile.main(["--ncu", str(fake_ncu), "--json", str(out), "--hot", "1"]) == 0
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    runs = [c for c in calls if "--export" in c]
    assert [r[r.index("--workload") + 1] for r in runs] == ["0", "1", "2", "3", "4"]  # one ncu run per condition
    run = runs[0]
    assert run[run.index("--profile-from-start") + 1] == "off" and run[run.index("--clock-control") + 1] == "none"
    assert run[run.index("--kernel-name-base") + 1] == "demangled"
    assert run[run.index("--kernel-name") + 1] == profile.KERNEL_FILTER
    assert {run[i + 1] for i, a in enumerate(run) if a == "--section"} >= {"WarpStateStats", "SourceCounters",
                                                                            "SpeedOfLight", "Occupancy"}
    target = run[run.index(sys.executable):]  # after ncu's options, the sections last
    assert target[1].endswith("profile_attention_kernels.py") and target[2:4] == ["--workload", "0"]
    assert target[target.index("--length") + 1] == "1024"
    imports = [c for c in calls if "--import" in c]
    assert all(c[c.index("--print-kernel-base") + 1] == "demangled" for c in imports)
    assert all(c[c.index("--print-units") + 1] == "base" for c in imports)  # values in base units, unscaled
    payload = json.loads(out.read_text())
    assert payload["triton"]["FAR_LOOPS"] == profile_tra().FAR_LOOPS and len(payload["triton"]["tiles"]) == 8
    assert payload["ncu"]["version"].startswith("Version 2025.3.1")
    assert [(k["condition"], k["kind"]) for k in payload["kernels"]] == [
        ("triton p0", "forward"), ("triton p0", "dK/dV"), ("triton p0", "dQ"),
        ("triton-tiles p0", "forward"), ("triton-tiles p0", "dK/dV"), ("triton-tiles p0", "dQ"),
        ("flash-nobias p0", "flash_fwd_kernel"), ("flash-nobias p0", "flash_bwd_dot_do_o_kernel"),
        ("triton p0.1", "forward"), ("triton p0.1", "dK/dV"), ("triton p0.1", "dQ"),
        ("triton-one-loop p0", "forward"), ("triton-one-loop p0", "dK/dV"), ("triton-one-loop p0", "dQ")]
    assert payload["errors"] == {}
    assert [h["source"] for h in payload["kernels"][0]["hot_instructions"]] == ["MUFU.EX2 R3, R3"]
    assert len(payload["all_metrics"]) == len(KERNELS)
    printed = capsys.readouterr().out
    assert "triton p0.1" in printed and "wait 3.00" in printed  # the table, with the stall breakdown


def test_a_run_past_its_time_is_stopped_with_every_process_it_started(tmp_path):
    """ncu profiles a Python process it starts: at the time limit both go, not ncu alone (an orphaned
    workload would keep the GPU busy under the next step's timings)."""
    import time

    pid_file = tmp_path / "child"
    started = time.monotonic()
    assert profile.run_bounded(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], 1.0) is None
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    for _ in range(50):  # the kill is delivered at once; reaping by init may take a moment
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":  # a zombie: dead, not yet reaped
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the profiled process {child} outlived the time limit")
    done = profile.run_bounded(["sh", "-c", "echo out; echo err >&2; exit 3"], 10.0)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_a_run_without_counters_or_without_ncu_says_why(tmp_path, fake_ncu, monkeypatch, capsys):
    out = tmp_path / "profile.json"
    # the tiles' run fails (its workload, not ncu): the others still come back
    monkeypatch.setenv("FAKE_NCU_FAIL", "1")
    monkeypatch.setenv("FAKE_NCU_FAIL_MESSAGE", "==ERROR== The application returned an error code (1).")
    assert profile.main(["--ncu", str(fake_ncu), "--json", str(out)]) == 1
    payload = json.loads(out.read_text())
    assert list(payload["errors"]) == ["triton-tiles p0"] and "error code (1)" in payload["errors"]["triton-tiles p0"]
    assert {k["condition"] for k in payload["kernels"]} == {"triton p0", "flash-nobias p0", "triton p0.1",
                                                          "triton-one-loop p0"}
    assert "error code (1)" in capsys.readouterr().err
    # ncu may not read the counters on this machine: no later condition would, so none is started
    monkeypatch.delenv("FAKE_NCU_FAIL_MESSAGE")
    monkeypatch.setenv("FAKE_NCU_FAIL", "0")
    calls = tmp_path / "calls"
    calls.write_text("")
    assert profile.main(["--ncu", str(fake_ncu), "--json", str(out)]) == 1
    payload = json.loads(out.read_text())
    assert "ERR_NVGPUCTRPERM" in payload["errors"]["triton p0"] and payload["kernels"] == []
    assert all("ncu cannot read the counters here (ERR_NVGPUCTRPERM)" in why
               for label, why in payload["errors"].items() if label != "triton p0")
    assert sum("--export" in json.loads(line) for line in calls.read_text().splitlines()) == 1
    assert "ERR_NVGPUCTRPERM" in capsys.readouterr().err
    # too few triton kernels in a report (a kernel that did not run as itself): exit 1, said so
    monkeypatch.delenv("FAKE_NCU_FAIL")
    (tmp_path / "raw-0.csv").write_text(raw_page(kernels=BY_CONDITION[0][:2]))
    assert profile.main(["--ncu", str(fake_ncu), "--json", str(out)]) == 1
    assert "triton p0: 2 kernels, 3+ expected" in capsys.readouterr().err
    # no time left for the conditions: skipped and listed, exit 124 (timeout(1)'s, which a resumed gpu_check
    # call reruns)
    assert profile.main(["--ncu", str(fake_ncu), "--json", str(out), "--timeout", "10"]) == 124
    assert all(why.startswith("skipped: ") and "of --timeout 10 s left" in why
               for why in json.loads(out.read_text())["errors"].values())
    monkeypatch.delenv("NCU", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = tmp_path / "missing.json"
    assert profile.main(["--ncu", str(tmp_path / "no-such-ncu"), "--json", str(missing)]) == 2
    assert "ncu (Nsight Compute) not found" in json.loads(missing.read_text())["error"]


def profile_tra():
    from ast_t5.modules import triton_rpe_attention

    return triton_rpe_attention


def test_the_workload_runs_a_condition_where_there_is_cuda(capsys):
    # the process ncu profiles: without CUDA it refuses in one line; with it, it runs (the kernels compile)
    rc = profile.main(["--workload", "0", "--length", "256", "--batch", "2", "--heads", "2"])
    if torch.cuda.is_available():
        assert rc == 0
    else:
        assert rc == 2 and "no CUDA device" in capsys.readouterr().err
