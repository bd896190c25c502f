"""Child side of the code-execution sandbox: runs one untrusted program (DESIGN.md section 9).

Started by ast_t5.eval.sandbox as a plain script,
``python -I -B sandbox_child.py WORKDIR REPORT_FD GUARD`` with the program text on stdin, after
the parent's preexec function has set the resource limits and (where allowed) moved the process
into new namespaces. It imports only the standard library, never ast_t5 or fairseq. Before any
untrusted code runs it:

1. reads the program from stdin and points stdin at /dev/null;
2. changes into WORKDIR again (to enter the tmpfs the parent may have mounted over it);
3. when a new PID namespace is pending for its children, forks: the child is PID 1 there, mounts
   a fresh read-only /proc (other processes, their environments included, become invisible) and
   dies with its parent; the parent only waits and passes the exit status on;
4. writes the isolation report (one JSON line) to REPORT_FD and closes it;
5. if GUARD is "1", installs the guard: a PEP 578 audit hook that refuses process creation,
   signals, sockets, ctypes, writes and deletions outside WORKDIR, reading other processes'
   /proc entries and raising resource limits, plus replacements for a few unaudited functions
   (``os._exit``, ``os.setsid``, ``os.pidfd_open``, ...). Audit hooks cannot be removed.

The program then runs as ``__main__``. A SystemExit raised by it (``exit()``, ``sys.exit(0)``)
is a failure (exit status EXIT_CALLED_EXIT), so a program cannot skip its own tests and pass.
The guard is defence in depth only; the boundary is the operating system.
"""
import builtins
import json
import os
import sys

EXIT_CALLED_EXIT = 3  # the program raised SystemExit: counted as a failure by the parent
SIGNAL_EXIT_BASE = 128  # shell convention: exit status 128 + n means "killed by signal n"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SIGKILL = 9
PROC_MOUNT_FLAGS = 0x1 | 0x2 | 0x4 | 0x8  # MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
PROGRAM_FILENAME = "<sandboxed program>"
# Events refused outright: process creation, signals, networking, ctypes, introspection of every
# live object (which could find references the guard dropped), and raising resource limits.
DENIED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
    "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "resource.setrlimit", "resource.prlimit", "sys.addaudithook",
})
# Events that change the file system: (index of a path argument, index of its dir_fd or None).
PATH_EVENTS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "shutil.rmtree": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)), "os.link": ((1, 3),), "os.symlink": ((1, 2),),
    "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
    "os.truncate": ((0, None),), "os.utime": ((0, 3),),
}
# Unaudited functions that could end the process with status 0, escape the process group,
# signal other processes, create device nodes or start processes without an audit event.
REPLACED_FUNCTIONS = {
    "os": ("_exit", "setsid", "setpgid", "pidfd_open", "mknod", "mkfifo", "unshare", "setns"),
    "posix": ("_exit", "setsid", "setpgid", "pidfd_open", "mknod", "mkfifo", "unshare", "setns"),
    "_posixsubprocess": ("fork_exec",),
    "signal": ("pidfd_send_signal",),
}
# Re-importing a module could bring back what the guard replaced or removed.
NO_REIMPORT = frozenset({"posix", "_posixsubprocess", "signal", "_signal", "ctypes", "_ctypes"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the program tries something the guard refuses."""


def _refuse(name):
    def refused(*args, **kwargs):
        raise SandboxViolation(f"{name} is not allowed in the sandbox")
    return refused


def _inside(path, dir_fd, root):
    """True when `path` (relative to `dir_fd` or the cwd) resolves to a place inside `root`."""
    if isinstance(path, int):
        return True  # an already open descriptor: the open itself was checked
    path = os.fsdecode(path)
    if dir_fd is not None and dir_fd != -1 and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.realpath(path).startswith(root + os.sep)


def _foreign_proc(path, own_proc):
    """True for /proc/<pid>/... of another process (its environ, memory, ...)."""
    if isinstance(path, int) or "proc" not in os.fsdecode(path):
        return False
    parts = os.path.realpath(os.fsdecode(path)).split(os.sep)
    return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own_proc


def _check_open(args, root, own_proc):
    path, mode, flags = args
    if path is None:
        return
    if isinstance(flags, int) and flags >= 0:
        writing = bool(flags & WRITE_FLAGS)
    else:
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
    if writing and not _inside(path, None, root) and os.fsdecode(path) != os.devnull:
        raise SandboxViolation(f"writing {path!r} (outside the sandbox directory) is not allowed")
    if _foreign_proc(path, own_proc):
        raise SandboxViolation(f"reading {path!r} (another process) is not allowed")


def _make_audit_hook(root, own_proc):
    """The audit hook; it raises SandboxViolation (ImportError for imports) to refuse an event."""
    def hook(event, args):
        if event in DENIED_EVENTS:
            raise SandboxViolation(f"{event} is not allowed in the sandbox")
        if event == "import":
            if args[0] in NO_REIMPORT or args[0].startswith("ctypes."):
                raise ImportError(f"importing {args[0]} is not allowed in the sandbox")
        elif event == "open":
            _check_open(args, root, own_proc)
        elif event in PATH_EVENTS:
            for path_index, fd_index in PATH_EVENTS[event]:
                dir_fd = args[fd_index] if fd_index is not None else None
                if not _inside(args[path_index], dir_fd, root):
                    raise SandboxViolation(f"{event} outside the sandbox directory is not allowed")
    return hook


def install_guard(root):
    """Install the guard for a program confined to directory `root`; cannot be undone."""
    import _posixsubprocess  # noqa: F401  (imported now so that its replacement sticks)
    import signal  # noqa: F401

    root = os.path.realpath(root)
    own_proc = os.path.realpath("/proc/self").rsplit(os.sep, 1)[-1]
    for module_name, names in REPLACED_FUNCTIONS.items():
        module = sys.modules[module_name]
        for name in names:
            if hasattr(module, name):
                setattr(module, name, _refuse(f"{module_name}.{name}"))
    for name in [m for m in sys.modules if m.startswith(("ctypes", "_ctypes"))]:
        del sys.modules[name]  # the launcher's, for mount/prctl; never the program's
    sys.addaudithook(_make_audit_hook(root, own_proc))


def _pid_one_setup():
    """In the new PID namespace: die with the parent; mount a private /proc. True if mounted."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    return libc.mount(b"proc", b"/proc", b"proc", PROC_MOUNT_FLAGS, None) == 0


def _fork_into_pid_namespace(report_fd):
    """Fork; return in the child (PID 1 of the new namespace); the parent exits with its status."""
    pid = os.fork()
    if pid == 0:
        return
    os.close(report_fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else SIGNAL_EXIT_BASE - code)


def _pid_namespace_pending():
    """True after unshare(CLONE_NEWPID): our children, not we, will be in a new PID namespace."""
    link = "/proc/self/ns/pid_for_children"
    try:
        return os.readlink(link) != os.readlink("/proc/self/ns/pid")
    except FileNotFoundError:
        return os.path.lexists(link)  # the link dangles until the namespace's first process exists
    except OSError:
        return False


def _namespace_report(workdir):
    """Which isolation this process ended up with (compared with the host by the parent)."""
    def ns(name):
        try:
            return os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            return None

    return {
        "net": ns("net"),
        "mnt": ns("mnt"),
        "pidns": _pid_namespace_pending(),
        "readonly_root": bool(os.statvfs("/").f_flag & os.ST_RDONLY),
        "workdir_tmpfs": os.path.ismount(workdir),
    }


def _run_program(source):
    """Execute the program as __main__; its SystemExit becomes exit status EXIT_CALLED_EXIT."""
    code = compile(source, PROGRAM_FILENAME, "exec")
    sys.argv = [PROGRAM_FILENAME]
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        sys.stdout.flush()
        sys.stderr.write(f"SandboxExit: the program raised SystemExit({exc.code!r}); not a pass\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_CALLED_EXIT) from None


def main(argv):
    """Entry point; see the module docstring for the arguments."""
    workdir, report_fd, guard = argv[1], int(argv[2]), argv[3] == "1"
    source = sys.stdin.buffer.read()
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    except OSError:
        pass  # stdin stays at the end of the program text: reading it gives EOF all the same
    os.chdir(workdir)
    report = _namespace_report(workdir)
    if report["pidns"]:
        _fork_into_pid_namespace(report_fd)
        report["private_proc"] = _pid_one_setup()
    report["guard"] = guard
    os.write(report_fd, (json.dumps(report) + "\n").encode())
    os.close(report_fd)
    if guard:
        install_guard(workdir)
    _run_program(source)


if __name__ == "__main__":
    main(sys.argv)
