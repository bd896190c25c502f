"""ast_t5.eval.sandbox: results, limits (time, memory, files, output) and exit tricks."""
import ctypes
import os
import subprocess
import time

import pytest

from ast_t5.eval.sandbox import (FAILED, OUTPUT_TAIL_BYTES, PASSED, TIMED_OUT, Sandbox,
                                 SandboxConfig, run_program)

SLACK_S = 1.5  # start-up, kill and clean-up on a loaded 2-core machine


def leftover_processes(marker: str):
    """Pids of live processes whose command line mentions `marker` (a run's directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_passing_and_failing_programs(make_config):
    sandbox = Sandbox(make_config("full"))
    ok = sandbox.run("print('hello')\n")
    assert ok.status == PASSED and ok.passed and ok.returncode == 0
    assert ok.stdout == "hello\n" and ok.detail == ""
    bad = sandbox.run("assert 1 + 1 == 3, 'arithmetic'\n")
    assert bad.status == FAILED and not bad.passed
    assert bad.detail == "the program raised 'AssertionError': 'arithmetic'"
    syntax = sandbox.run("def f(:\n")
    assert syntax.status == FAILED and "SyntaxError" in syntax.detail


def test_child_imports_neither_ast_t5_nor_fairseq(make_config):
    program = ("import sys\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] in "
               "('ast_t5', 'fairseq', 'torch')))\n"
               "print(sys.flags.isolated)\n")
    result = run_program(program, make_config("full"))
    assert result.passed, result.stderr
    assert result.stdout.split() == ["[]", "1"]


def test_isolation_is_reported(isolation):
    assert {"rlimits", "process-group-kill", "temp-dir", "minimal-env", "guard"} <= isolation
    unguarded = run_program("pass\n", SandboxConfig(use_namespaces=False, guard=False,
                                                    landlock=False))
    assert "guard" not in unguarded.isolation and "netns" not in unguarded.isolation
    assert not any(name.startswith("landlock") for name in unguarded.isolation)


def unshare_supported() -> bool:
    """Checked without the sandbox's code: can a child enter new net, mount and PID namespaces?"""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = 0x40000000 | 0x00020000 | 0x20000000  # CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID

    def enter():
        if libc.unshare(flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare")

    try:
        subprocess.run(["true"], preexec_fn=enter, check=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def test_namespaces_active_where_supported(isolation):
    """Guards against namespace tests silently skipping on a machine that supports them."""
    if not unshare_supported():
        pytest.skip("this machine forbids unshare(); the sandbox falls back to the guard")
    assert {"netns", "readonly-fs", "tmpfs-workdir", "pidns", "private-proc"} <= isolation


def landlock_abi() -> int:
    """Checked without the sandbox's code: the kernel's Landlock ABI version (0: none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(0, libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


def test_kernel_layers_active_where_supported(isolation):
    """Guards against Landlock or seccomp silently failing to apply on a machine that has them."""
    abi = landlock_abi()
    expected = {name for version, name in ((1, "landlock-fs"), (4, "landlock-net"),
                                           (6, "landlock-signals")) if abi >= version}
    if os.uname().machine == "x86_64":
        expected.add("seccomp")
    if not expected:
        pytest.skip("no Landlock and no x86_64 seccomp filter on this machine")
    assert expected <= isolation


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxConfig(memory_mb=-1)


@pytest.mark.parametrize("mode", ["full", "guard"])
@pytest.mark.parametrize("program", [
    "while True:\n    pass\n",
    "import time\ntime.sleep(1000)\n",
    "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n",
], ids=["busy-loop", "sleep", "ignore-sigterm"])
def test_endless_programs_are_killed_on_time(make_config, mode, program):
    config = make_config(mode, timeout_s=1.0)
    start = time.monotonic()
    result = run_program(program, config)
    elapsed = time.monotonic() - start
    assert result.status == TIMED_OUT
    assert elapsed < config.timeout_s + SLACK_S
    assert leftover_processes(str(make_config.runs)) == []
    assert os.listdir(make_config.runs) == []  # the temporary directory is gone too


@pytest.mark.parametrize("mode", ["full", "guard"])
@pytest.mark.parametrize("program", [
    "x = bytearray(8 << 30)\n",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n",
    "x = [0] * (10 ** 10)\n",
], ids=["one-block", "growing", "list"])
def test_huge_allocations_fail_without_hurting_the_host(make_config, mode, program):
    result = run_program(program, make_config(mode, memory_mb=256))
    assert result.status == FAILED
    assert "MemoryError" in result.detail


@pytest.mark.parametrize("mode", ["full", "guard"])
def test_huge_file_is_cut_by_the_file_size_limit(make_config, mode):
    program = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (64 << 20))\n"
    result = run_program(program, make_config(mode, max_file_mb=4, memory_mb=512))
    assert result.status == FAILED
    assert "File too large" in result.detail
    assert os.listdir(make_config.runs) == []


def test_many_files_fill_only_the_small_workdir(make_config, isolation):
    if "tmpfs-workdir" not in isolation:
        pytest.skip("no tmpfs working directory here")
    program = ("for i in range(100):\n"
               "    with open(f'part{i}', 'wb') as f:\n"
               "        f.write(b'x' * (3 << 20))\n")
    result = run_program(program, make_config("full", workdir_mb=8, max_file_mb=4))
    assert result.status == FAILED
    assert "No space left" in result.detail


@pytest.mark.parametrize("mode", ["full", "guard"])
def test_output_flood_is_capped(make_config, mode):
    program = "import sys\nfor _ in range(1000):\n    sys.stdout.write('y' * (1 << 20))\n"
    result = run_program(program, make_config(mode, max_file_mb=2))
    assert result.status == FAILED  # the 2 MiB capture is full: the write fails
    assert len(result.stdout) <= OUTPUT_TAIL_BYTES


@pytest.mark.parametrize("exit_call", [
    "import sys\nsys.exit(0)",
    "raise SystemExit(0)",
    "exit()",
    "quit(0)",
    "import os\nos._exit(0)",
    "import posix\nposix._exit(0)",
    "import atexit, os\natexit.register(os._exit, 0)",
    "import threading, os\nt = threading.Thread(target=os._exit, args=(0,))\nt.start()\nt.join()",
], ids=["sys.exit", "SystemExit", "exit", "quit", "os._exit", "posix._exit", "atexit", "thread"])
def test_exit_tricks_never_skip_the_tests(make_config, exit_call):
    program = exit_call + "\nassert False, 'the tests ran and failed'\n"
    result = run_program(program, make_config("full"))
    assert result.status == FAILED, result


def test_exit_status_zero_is_not_a_pass_even_unprotected(make_config):
    """os._exit(0) ends the unprotected program cleanly, yet no verdict means no pass."""
    result = run_program("import os\nos._exit(0)\nassert False\n", make_config("control"))
    assert result.returncode == 0 and result.status == FAILED
    assert result.detail == "the program's process ended (or closed its channel) before it answered"
    assert run_program("pass\n", make_config("control")).status == PASSED
