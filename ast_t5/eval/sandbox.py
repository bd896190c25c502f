"""Run untrusted generated programs in a separate, limited process (DESIGN.md section 9).

Every program runs in a fresh ``python -I -B`` interpreter (isolated mode: no user site, no
PYTHON* variables, no script directory on sys.path), started by `Sandbox.run` / `Sandbox.run_tests`
as follows:

* a new session (``start_new_session=True``): the child leads its own process group, and the whole
  group is killed with SIGKILL when the program ends or its wall-clock timeout expires;
* a preexec function sets the resource limits (RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE,
  RLIMIT_CORE=0, and RLIMIT_NPROC when not root: root ignores it) and, where allowed, moves the
  child into new network, mount and PID namespaces with a read-only file system
  (see namespaces.py);
* the working directory is a fresh temporary directory, removed afterwards (a size-capped tmpfs
  when mount namespaces work; elsewhere the parent measures it while the program runs and kills
  the program when it holds more than ``workdir_mb`` or MAX_WORKDIR_ENTRIES entries); the
  environment holds only PATH, locale, HOME/TMPDIR and thread-count variables, so no secret of the
  caller is inherited;
* stdin, stdout and stderr are anonymous temporary files (RLIMIT_FSIZE caps the output, and no pipe
  can fill up and block); only the last OUTPUT_TAIL_BYTES of each are kept;
* inside, sandbox_child.py splits into a judge, which runs no program code, and a runner, which
  confines itself (Landlock where the kernel has it, then the guard) and runs the program.

**The verdict is the judge's, never the program's exit status.** `run_tests` passes only when the
judge, in its own process, ran the benchmark's tests to the end against the program's functions
(called over a pipe, values restricted to exact built-in types) and wrote a passing verdict to a
descriptor the runner closed before the program started. Exit status 0 without that verdict is a
failure. `run` (a program without separate tests, as in the containment tests) passes when the
program's top level finishes, as the runner reports it: that verdict the program could forge.
The failure reason (`ExecResult.detail`) is always written by the judge or by this module; the
program's own output is only in `stdout` / `stderr`. The result says which mechanisms were active
(`ExecResult.isolation`).

Limits of the design. The guard is not a security boundary (Python code can reach around the
functions it replaces, e.g. through a fresh copy of a built-in module); audit hooks, Landlock,
namespaces and resource limits are enforced by the interpreter's C code or the kernel. Without
namespaces and without Landlock (kernels before 5.13, or where a container forbids it) the guard
is what stops writes, networking and signals, so evaluate untrusted models unprivileged or in a
container. As root, RLIMIT_NPROC does not apply and a process may raise its own hard limits: the
guard refuses fork and setrlimit, the PID namespace and the group kill contain what escapes, and
no cgroup caps the sum over parallel runs (each run is capped by RLIMIT_AS). Files that the
evaluating user can read stay readable (read-only, and with no network to send them anywhere but
the results file). Linux only.
"""
import functools
import json
import logging
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Optional, Sequence, Tuple

from .namespaces import host_namespace_ids, make_isolator
from .sandbox_child import SIGNAL_EXIT_BASE

logger = logging.getLogger(__name__)

CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
PASSED, FAILED, TIMED_OUT = "passed", "failed", "timed out"
DEFAULT_TIMEOUT_S = 3.0  # spec 11.1/11.2: the original ran every program with a 3 s timeout
DEFAULT_MEMORY_MB = 1024  # RLIMIT_AS; the interpreter itself needs about 30 MB of address space
DEFAULT_MAX_FILE_MB = 16  # RLIMIT_FSIZE: the largest file, stdout/stderr captures included
DEFAULT_WORKDIR_MB = 64  # size of the working directory (tmpfs, or measured by the parent)
MAX_WORKDIR_ENTRIES = 4096  # files and directories a program may create (measured by the parent)
WORKDIR_CHECK_S = 0.05  # how often the parent measures the working directory
GROUP_EXIT_WAIT_S = 1.0  # longest wait for the killed process group to disappear
MIB = 1 << 20
MAX_OPEN_FILES = 64  # RLIMIT_NOFILE; a test program needs a handful
CPU_GRACE_S = 1  # RLIMIT_CPU = ceil(timeout) + grace: a backstop, the wall-clock timeout acts first
NPROC_MARGIN = 64  # non-root only: RLIMIT_NPROC = this user's current tasks + margin
OUTPUT_TAIL_BYTES = 8192  # how much of the end of stdout/stderr a result keeps
DETAIL_CHARS = 600  # longest failure detail kept in a result
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
BASE_MECHANISMS = ("rlimits", "process-group-kill", "temp-dir", "workdir-cap", "minimal-env")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one program; all sizes in MiB."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    max_file_mb: int = DEFAULT_MAX_FILE_MB
    workdir_mb: int = DEFAULT_WORKDIR_MB
    use_namespaces: bool = True  # False: rlimits and the guard only (as without privileges)
    guard: bool = True  # False only in tests that show what the guard prevents
    landlock: bool = True  # False only in tests that show what Landlock prevents
    seccomp: bool = True  # False only in tests that show what the seccomp filter prevents
    temp_root: Optional[str] = None  # parent of the per-run temporary directories

    def __post_init__(self):
        if self.timeout_s <= 0 or min(self.memory_mb, self.max_file_mb, self.workdir_mb) <= 0:
            raise ValueError(f"sandbox limits must be positive: {self}")


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one program: status is PASSED (the judge's verdict), FAILED or TIMED_OUT."""

    status: str
    detail: str  # why it failed, in the sandbox's words (never the program's); empty when passed
    returncode: Optional[int]  # the program's process (128 + n: signal n); None if unknown
    elapsed_s: float
    stdout: str  # the last OUTPUT_TAIL_BYTES
    stderr: str
    isolation: Tuple[str, ...]  # mechanisms that were active, see Sandbox.run

    @property
    def passed(self) -> bool:
        return self.status == PASSED


class Sandbox:
    """Runs programs under one `SandboxConfig`; thread-safe, so a thread pool can share it."""

    def __init__(self, config: SandboxConfig = SandboxConfig()):
        self.config = config
        self._host_ns = host_namespace_ids()
        self._nproc = None if os.geteuid() == 0 else _count_user_tasks() + NPROC_MARGIN

    def run(self, program: str) -> ExecResult:
        """Execute `program` (Python source); it passes when its top level finishes.

        Never raises for the program's faults. This verdict comes from the process that ran the
        program, so a hostile program could forge it: score benchmarks with `run_tests`.
        Isolation names: rlimits, process-group-kill, temp-dir, workdir-cap, minimal-env
        (always), netns, readonly-fs, tmpfs-workdir, pidns, private-proc (namespaces, where
        permitted), landlock-fs, landlock-net, landlock-signals (Landlock, by kernel ABI),
        seccomp (x86_64), guard.
        """
        return self._run_job({"mode": "script", "program": program})

    def run_tests(self, program: str, tests: str, trusted: str = "",
                  entry_points: Sequence[str] = ()) -> ExecResult:
        """Execute `program`, then judge it by `tests` run outside it (see the module docstring).

        Args:
            program: the untrusted code (e.g. prompt + completion), run by the runner.
            tests: the benchmark's test code, run by the judge; it passes when it finishes.
            trusted: code the judge runs before the tests (the prompt: helper functions the
                tests use are taken from here, not from the program).
            entry_points: names the tests always take from the program (e.g. HumanEval's
                entry point, whose stub the prompt also defines); other names the tests use and
                neither `trusted` nor the tests define come from the program too.
        """
        return self._run_job({"mode": "test", "program": program, "tests": tests,
                              "trusted": trusted, "entry_points": list(entry_points)})

    def _run_job(self, job: dict) -> ExecResult:
        root = tempfile.mkdtemp(prefix="ast_t5_sandbox_", dir=self.config.temp_root)
        workdir = os.path.join(root, "work")
        os.mkdir(workdir, 0o700)
        try:
            return self._run_in(job, workdir)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def _run_in(self, job: dict, workdir: str) -> ExecResult:
        config = self.config
        isolator = make_isolator(workdir, config.workdir_mb) if config.use_namespaces else None
        preexec = functools.partial(_limit_child, config, isolator, self._nproc)
        job = {key: _encodable(value) for key, value in job.items()}
        with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, \
                tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as report:
            stdin.write(json.dumps(job, ensure_ascii=True).encode("ascii"))
            stdin.seek(0)
            argv = [sys.executable, "-I", "-B", CHILD_SCRIPT, workdir, str(report.fileno()),
                    _layers_wanted(config)]
            start = time.monotonic()
            proc = subprocess.Popen(
                argv, stdin=stdin, stdout=out, stderr=err, cwd=workdir, env=_child_env(workdir),
                preexec_fn=preexec, start_new_session=True, pass_fds=(report.fileno(),),
            )
            stopped = _wait_then_kill_group(proc, config, workdir)
            elapsed = time.monotonic() - start
            report_data = _read_report(report)
            isolation = _mechanisms(report_data, self._host_ns)
            return _make_result(proc.returncode, report_data.get("runner_exit"), stopped,
                                report_data.get("verdict"), elapsed, config, _tail(out),
                                _tail(err), isolation)


def run_program(program: str, config: SandboxConfig = SandboxConfig()) -> ExecResult:
    """Convenience wrapper: `Sandbox(config).run(program)`."""
    return Sandbox(config).run(program)


def probe_isolation(config: SandboxConfig = SandboxConfig()) -> Tuple[str, ...]:
    """Run an empty program and return the active isolation mechanisms; raise if it fails."""
    result = run_program("pass\n", config)
    if not result.passed:
        raise RuntimeError(f"the sandbox cannot run an empty program: {result.detail}")
    return result.isolation


def _set_limit(which: int, soft: int, hard: Optional[int] = None) -> None:
    hard = soft if hard is None else hard
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def _limit_child(config: SandboxConfig, isolator, nproc: Optional[int]) -> None:
    """preexec function (runs in the child between fork and exec); an error here aborts the run."""
    if isolator is not None:
        isolator.apply()
    _set_limit(resource.RLIMIT_AS, config.memory_mb * MIB)
    cpu_s = math.ceil(config.timeout_s) + CPU_GRACE_S
    _set_limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)  # soft: SIGXCPU, hard: SIGKILL
    _set_limit(resource.RLIMIT_FSIZE, config.max_file_mb * MIB)
    _set_limit(resource.RLIMIT_NOFILE, MAX_OPEN_FILES)
    _set_limit(resource.RLIMIT_CORE, 0)
    if nproc is not None:
        _set_limit(resource.RLIMIT_NPROC, nproc)


def _count_user_tasks() -> int:
    """Threads of this user now (RLIMIT_NPROC counts threads); 0 where /proc is unreadable."""
    uid, count = os.getuid(), 0
    try:
        entries = [e for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.stat().st_uid == uid:
                count += len(os.listdir(os.path.join(entry.path, "task")))
        except OSError:
            continue  # the process ended meanwhile
    return count


def _child_env(workdir: str) -> dict:
    """A minimal environment: nothing of the caller's (tokens, keys) reaches the program."""
    return {
        "PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir,
        "TMPDIR": workdir, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _layers_wanted(config: SandboxConfig) -> str:
    names = [name for name in ("guard", "landlock", "seccomp") if getattr(config, name)]
    return ",".join(names) or "none"


def _encodable(value):
    """Strings as the child can compile them: lone surrogates become U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="replace").decode("utf-8")
    if isinstance(value, list):
        return [_encodable(item) for item in value]
    return value


def _workdir_over(workdir: str, limit_bytes: int) -> bool:
    """True when `workdir` holds more than `limit_bytes` of disk or MAX_WORKDIR_ENTRIES entries."""
    used, entries, pending = 0, 0, [workdir]
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entries > MAX_WORKDIR_ENTRIES:
                        return True
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError:
            continue
    return used > limit_bytes


def _wait_unreaped(pid: int, timeout_s: float, workdir: str, limit_bytes: int) -> Optional[str]:
    """Wait until `pid` exits without reaping it; None if it did, else "timeout" or "disk".

    While waiting, the working directory is measured every WORKDIR_CHECK_S (a tmpfs inside a
    mount namespace is invisible from here, and capped by its own size).
    """
    deadline = time.monotonic() + timeout_s
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        poller = None
        if pidfd is not None:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            wait_s = min(left, WORKDIR_CHECK_S)
            if poller is not None:
                if poller.poll(math.ceil(wait_s * 1000)):
                    return None
            else:  # Linux < 5.3
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                    return None
                time.sleep(wait_s)
            if _workdir_over(workdir, limit_bytes):
                return "disk"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _wait_then_kill_group(proc: subprocess.Popen, config: SandboxConfig,
                          workdir: str) -> Optional[str]:
    """Wait for the program, then SIGKILL its whole process group; why it was stopped, if so."""
    stopped = _wait_unreaped(proc.pid, config.timeout_s, workdir, config.workdir_mb * MIB)
    try:
        # The leader is not reaped yet, so its process-group id cannot have been reused.
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    # The runner is the leader's child: give the kernel a moment to finish killing it.
    deadline = time.monotonic() + GROUP_EXIT_WAIT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.005)
    return stopped


def _tail(handle: IO[bytes]) -> str:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - OUTPUT_TAIL_BYTES))
    return handle.read().decode("utf-8", errors="replace")


def _read_report(handle: IO[bytes]) -> dict:
    handle.seek(0)
    report = {}
    for line in handle.read().decode("utf-8", errors="replace").splitlines():
        try:
            report.update(json.loads(line))
        except ValueError:
            logger.warning("unreadable sandbox isolation report line: %r", line[:200])
    return report


def _mechanisms(report: dict, host_ns: dict) -> Tuple[str, ...]:
    active = list(BASE_MECHANISMS)
    if report.get("net") and report["net"] != host_ns.get("net"):
        active.append("netns")
    if report.get("mnt") and report["mnt"] != host_ns.get("mnt") and report.get("readonly_root"):
        active.append("readonly-fs")
    for key, name in (("workdir_tmpfs", "tmpfs-workdir"), ("pidns", "pidns"),
                      ("private_proc", "private-proc")):
        if report.get(key):
            active.append(name)
    landlock = report.get("landlock") if isinstance(report.get("landlock"), int) else 0
    for abi, name in ((1, "landlock-fs"), (4, "landlock-net"), (6, "landlock-signals")):
        if landlock >= abi:
            active.append(name)
    if report.get("seccomp") is True:
        active.append("seccomp")
    if report.get("guard") is True:
        active.append("guard")
    return tuple(active)


def _exit_text(returncode: int) -> str:
    if returncode < 0 or returncode > SIGNAL_EXIT_BASE:
        signum = -returncode if returncode < 0 else returncode - SIGNAL_EXIT_BASE
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            pass
    return f"exit status {returncode}"


def _make_result(returncode: int, runner_exit: Optional[int], stopped: Optional[str],
                 verdict: Optional[dict], elapsed_s: float, config: SandboxConfig, stdout: str,
                 stderr: str, isolation: Tuple[str, ...]) -> ExecResult:
    """`returncode`: the sandbox's leader (the judge); `runner_exit`: the program's process."""
    if not isinstance(runner_exit, int):
        runner_exit = None
    if stopped == "timeout":
        status, detail = TIMED_OUT, f"timed out after {config.timeout_s:g} s"
    elif stopped == "disk":
        status, detail = FAILED, (f"the working directory exceeded {config.workdir_mb} MiB or "
                                  f"{MAX_WORKDIR_ENTRIES} entries")
    elif not isinstance(verdict, dict):
        status, detail = FAILED, f"no verdict from the sandbox ({_exit_text(returncode)})"
    elif verdict.get("passed") is True and returncode == 0:
        status, detail = PASSED, ""
    else:
        reason = str(verdict.get("reason") or _exit_text(returncode))
        status, detail = FAILED, reason[:DETAIL_CHARS]
    return ExecResult(status, detail, runner_exit, elapsed_s, stdout, stderr, isolation)
