"""Child side of the code-execution sandbox: runs one untrusted program (DESIGN.md section 9).

Started by ast_t5.eval.sandbox as a plain script, ``python -I -B sandbox_child.py WORKDIR
REPORT_FD LAYERS`` with a JSON job on stdin (LAYERS: the runner's layers wanted, comma-separated
from ``guard``, ``landlock``, ``seccomp``), after the parent's preexec function has set the
resource limits and (where allowed) moved the process into new namespaces. It imports only the
standard library, never ast_t5 or fairseq.

Two processes, so that the verdict is never the program's to give:

* the **judge** (this process, or PID 1 of a new PID namespace) never runs a line of the
  program. It forks the **runner**, which confines itself (below) and executes the program. In
  ``test`` mode the judge then runs the benchmark's own tests (trusted text: the prompt and the
  test code) in its own interpreter; every name the tests take from the program (the entry point,
  or functions the prompt does not define) is a proxy that asks the runner over a pipe to call
  the function. Arguments and return values cross the pipe as JSON of exact built-in types only
  (`encode`/`decode`): an object of another type, e.g. a float subclass whose comparisons are
  always true, cannot be returned at all. The judge writes the verdict, one JSON line with the
  isolation report, to REPORT_FD, which the runner closes before the program starts. An exit
  status, a printed line or anything the program writes cannot make a pass; only tests that ran
  to the end in the judge can. In ``script`` mode (containment tests, `Sandbox.run`) the verdict
  is that the program's top level finished without an exception, as the runner reports it.
* the **runner**, before the program runs: closes REPORT_FD; restricts itself with Landlock where
  the kernel has it (writes only beneath WORKDIR, no TCP, no signals or ptrace to processes
  outside, no device nodes, no links from outside); installs a seccomp filter on x86_64 (the
  kernel refuses signals, ptrace, process creation and execution, leaving the process group,
  device nodes, links, mounts, namespaces, io_uring, bpf and the like); and installs the guard: a
  PEP 578 audit hook that refuses process creation, signals, sockets, ctypes, links, writes and
  deletions outside WORKDIR (by any path form: relative to a directory descriptor, ``..``,
  symbolic links), opening directories outside WORKDIR (the only way to a ``dir_fd``),
  device files and other processes' /proc entries, and raising resource limits, plus
  replacements for a few unaudited functions (``os._exit``, ``os.setsid``, ``os.pidfd_open``,
  ...). Audit hooks cannot be removed; the replaced functions can be recovered (a fresh copy of
  a built-in module), which is why the verdict and the kernel layers do not depend on them.
"""
import ast
import builtins
import importlib
import json
import os
import stat
import sys
import time
import traceback

SIGNAL_EXIT_BASE = 128  # shell convention: exit status 128 + n means "killed by signal n"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NO_NEW_PRIVS = 38
SIGKILL = 9
PROC_MOUNT_FLAGS = 0x1 | 0x2 | 0x4 | 0x8  # MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
PROGRAM_FILENAME = "<sandboxed program>"
PROMPT_FILENAME = "<prompt>"
TESTS_FILENAME = "<tests>"
MAX_MESSAGE_BYTES = 64 << 20  # the largest reply the judge reads from the runner
READ_CHUNK_BYTES = 1 << 16
TEXT_CHARS = 200  # longest piece of program-controlled text quoted in a verdict
RUNNER_EXIT_WAIT_S = 0.5  # after the verdict, how long the judge waits for the runner to end
# Events refused outright: process creation, signals, networking, ctypes, links, introspection
# of every live object, and raising resource limits.
DENIED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
    "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "resource.setrlimit", "resource.prlimit", "sys.addaudithook",
    "os.link", "os.symlink",
})
# Events that change the file system: (index of a path argument, index of its dir_fd or None).
PATH_EVENTS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "shutil.rmtree": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.truncate": ((0, None),), "os.utime": ((0, 3),),
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
# Device files a program may open (reading randomness, writing to /dev/null).
ALLOWED_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"})

# Landlock (<linux/landlock.h>); the system call numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE, FS_REMOVE_DIR, FS_REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
FS_MAKE_CHAR, FS_MAKE_DIR, FS_MAKE_REG, FS_MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the program tries something the guard refuses."""


class NotBuiltinError(TypeError):
    """A value that is not of an exact built-in type was to cross the sandbox boundary."""


class CandidateError(RuntimeError):
    """Raised in the tests when a call into the program failed in a way no built-in names."""


# ---------------------------------------------------------------------------------------------
# Values across the boundary: exact built-in types only.

def encode(value):
    """A JSON-able form of `value`; raises NotBuiltinError for anything but exact built-ins."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str or kind is float:
        return value
    if kind is list:
        return [encode(item) for item in value]
    if kind is tuple:
        return {"tuple": [encode(item) for item in value]}
    if kind is dict:
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [encode(item) for item in value]}
    if kind is bytes or kind is bytearray:
        return {kind.__name__: value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if kind is range:
        return {"range": [value.start, value.stop, value.step]}
    raise NotBuiltinError(f"{kind.__module__}.{kind.__qualname__}")


def decode(data):
    """The value `encode` made `data` from; raises ValueError for anything else."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is str or kind is float:
        return data
    if kind is list:
        return [decode(item) for item in data]
    if kind is not dict or len(data) != 1:
        raise ValueError("malformed value")
    (tag, body), = data.items()
    if tag == "tuple":
        return tuple(decode(item) for item in _as_list(body))
    if tag == "dict":
        pairs = [_as_list(pair) for pair in _as_list(body)]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("malformed value")
        return {decode(key): decode(value) for key, value in pairs}
    if tag in ("set", "frozenset"):
        items = [decode(item) for item in _as_list(body)]
        return set(items) if tag == "set" else frozenset(items)
    if tag in ("bytes", "bytearray") and type(body) is str:
        raw = bytes.fromhex(body)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "complex" and _as_list(body) and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    if tag == "range" and _as_list(body) and len(body) == 3:
        return range(*(int(part) for part in body))
    raise ValueError(f"malformed value tagged {str(tag)[:20]!r}")


def _as_list(data):
    if type(data) is not list:
        raise ValueError("malformed value")
    return data


def _dumps(message) -> bytes:
    return (json.dumps(message, ensure_ascii=True) + "\n").encode("ascii")


def _quote(text) -> str:
    """Program-controlled text, shortened and quoted, for a verdict written by the judge."""
    text = str(text)
    return repr(text[:TEXT_CHARS] + ("..." if len(text) > TEXT_CHARS else ""))


# ---------------------------------------------------------------------------------------------
# The guard (runner only).

def _refuse(name):
    def refused(*args, **kwargs):
        raise SandboxViolation(f"{name} is not allowed in the sandbox")
    return refused


def _within(path, root):
    return path == root or path.startswith(root + os.sep)


def _inside(path, dir_fd, root):
    """True when `path` (relative to `dir_fd` or the cwd) resolves to a place inside `root`.

    A relative path is also checked from `root` itself, the shallowest directory a descriptor
    can name (directories outside cannot be opened), so that ``..`` cannot climb out whichever
    directory it is taken from.
    """
    if isinstance(path, int):
        return True  # an already open descriptor: the open itself was checked
    path = os.fsdecode(path)
    if dir_fd is not None and dir_fd != -1 and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    if not os.path.isabs(path) and not _within(os.path.normpath(os.path.join(root, path)), root):
        return False
    return _within(os.path.realpath(path), root)


def _foreign_proc(real_path, own_proc):
    """True for /proc/<pid>/... of another process (its environ, memory, command line, ...)."""
    parts = real_path.split(os.sep)
    return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own_proc


def _check_open(args, root, own_proc):
    path, mode, flags = args
    if path is None or isinstance(path, int):
        return
    if isinstance(flags, int) and flags >= 0:
        writing = bool(flags & WRITE_FLAGS)
    else:
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
    name = os.fsdecode(path)
    real = os.path.realpath(name)
    if real in ALLOWED_DEVICES:
        return
    if writing and not _inside(path, None, root):
        raise SandboxViolation(f"writing {name!r} (outside the sandbox directory) is not allowed")
    if _foreign_proc(real, own_proc):
        raise SandboxViolation(f"reading {name!r} (another process) is not allowed")
    try:
        info = os.stat(real)
    except OSError:
        return  # created by this open (inside, as checked above), or failing anyway
    if stat.S_ISDIR(info.st_mode):
        if not _within(real, root):
            raise SandboxViolation(f"opening the directory {name!r} (outside the sandbox "
                                   "directory) is not allowed")
    elif not stat.S_ISREG(info.st_mode):
        raise SandboxViolation(f"opening {name!r} (a device or special file) is not allowed")
    elif writing and info.st_nlink > 1:
        raise SandboxViolation(f"writing {name!r} (a file with several links) is not allowed")


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
        del sys.modules[name]  # the launcher's, for mount/prctl/landlock; never the program's
    sys.addaudithook(_make_audit_hook(root, own_proc))


# ---------------------------------------------------------------------------------------------
# Kernel layers (runner only).

def _landlock(libc, ctypes, workdir):
    """Restrict this process with Landlock; returns the ABI version used (0: not available)."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                  ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        return 0
    handled = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR
               | FS_MAKE_REG | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM)
    for version, right in ((2, FS_REFER), (3, FS_TRUNCATE), (5, FS_IOCTL_DEV)):
        if abi >= version:
            handled |= right

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64),
                    ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneathAttr(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net, size = NET_BIND_TCP | NET_CONNECT_TCP, 16
    if abi >= 6:
        attr.scoped, size = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24
    ruleset = syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0))
    if ruleset < 0:
        return 0
    try:
        inside = handled & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK | FS_MAKE_SYM | FS_IOCTL_DEV)
        file_rights = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
        for path, rights in ((workdir, inside), (os.devnull, file_rights)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneathAttr(rights, fd)
                if syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                           ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    return 0
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return 0
        if syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            return 0
    finally:
        os.close(ruleset)
    return abi


# seccomp (x86_64): system calls the runner never needs, refused by the kernel.
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
EPERM, ENOSYS = 1, 38
CLONE_THREAD = 0x00010000
BPF_LD_W_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SYS_CLONE, SYS_CLONE3 = 56, 435
# Signals, ptrace and other processes' memory; process creation and execution; escaping the
# process group; device nodes and links; namespaces, mounts; kernel interfaces a test program
# has no use for (io_uring could bypass this filter, bpf, keys, modules, perf, userfaultfd).
SECCOMP_DENIED_X86_64 = {
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
    "setsid": 112, "setpgid": 109, "mknod": 133, "mknodat": 259, "link": 86, "linkat": 265,
    "symlink": 88, "symlinkat": 266, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
    "request_key": 249, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168,
    "acct": 163, "settimeofday": 164, "clock_settime": 227, "sethostname": 170,
    "setdomainname": 171, "iopl": 172, "ioperm": 173, "syslog": 103, "quotactl": 179,
    "personality": 135,
}


def _seccomp_program():
    """The BPF filter: foreign architectures, x32 calls and the denied calls get EPERM;
    clone only makes threads; clone3 reports ENOSYS (glibc then falls back to clone)."""
    import struct

    def op(code, k, jt=0, jf=0):
        return struct.pack("HBBI", code, jt, jf, k)

    deny = op(BPF_RET, SECCOMP_RET_ERRNO | EPERM)
    allow = op(BPF_RET, SECCOMP_RET_ALLOW)
    program = [op(BPF_LD_W_ABS, 4), op(BPF_JEQ, AUDIT_ARCH_X86_64, 1, 0), deny,
               op(BPF_LD_W_ABS, 0), op(BPF_JGE, X32_SYSCALL_BIT, 0, 1), deny,
               op(BPF_JEQ, SYS_CLONE3, 0, 1), op(BPF_RET, SECCOMP_RET_ERRNO | ENOSYS),
               op(BPF_JEQ, SYS_CLONE, 0, 4), op(BPF_LD_W_ABS, 16),
               op(BPF_JSET, CLONE_THREAD, 1, 0), deny, allow]
    for number in sorted(set(SECCOMP_DENIED_X86_64.values())):
        program += [op(BPF_JEQ, number, 0, 1), deny]
    program.append(allow)
    return b"".join(program), len(program)


def _seccomp(libc, ctypes):
    """Install the filter (x86_64 only); True if it is in force."""
    if os.uname().machine != "x86_64":
        return False
    code, length = _seccomp_program()
    buffer = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(length, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def _confine(workdir, wanted):
    """Apply the runner's layers before the program runs; returns what is active."""
    active = {"guard": "guard" in wanted, "landlock": 0, "seccomp": False}
    try:
        if not wanted & {"landlock", "seccomp"}:
            raise ImportError("no kernel layer wanted")  # and ctypes is never loaded here
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if "landlock" in wanted:
            active["landlock"] = _landlock(libc, ctypes, workdir)
        if "seccomp" in wanted:
            active["seccomp"] = _seccomp(libc, ctypes)
    except (OSError, AttributeError, ImportError):
        pass
    if active["guard"]:
        install_guard(workdir)
    return active


# ---------------------------------------------------------------------------------------------
# The runner: executes the program and answers the judge's calls.

def _exception_text(exc):
    return f"{type(exc).__name__}: {exc}"


def _runner(job, workdir, layers, requests_fd, replies_fd):
    """Child process: confine, run the program, serve calls; never returns."""
    replies = os.fdopen(replies_fd, "wb", buffering=0)
    requests = os.fdopen(requests_fd, "rb")
    send = replies.write
    write_flush = sys.stdout.flush
    exit_now = os._exit  # kept before the guard replaces it
    send(_dumps({"layers": _confine(workdir, layers)}))
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    sys.argv = [PROGRAM_FILENAME]
    try:
        exec(compile(job["program"], PROGRAM_FILENAME, "exec"), namespace)
        loaded = {"loaded": True}
    except SystemExit as exc:
        loaded = {"loaded": False, "error": "SystemExit", "message": repr(exc.code)}
    except BaseException as exc:  # noqa: B902  (the program's own failure, reported)
        traceback.print_exc()
        loaded = {"loaded": False, "error": type(exc).__name__, "message": str(exc)}
    try:
        write_flush()
        sys.stderr.flush()
    except Exception:
        pass
    send(_dumps(loaded))
    if job["mode"] == "test" and loaded["loaded"]:
        for line in requests:
            try:
                reply = _serve(json.loads(line), namespace)
            except Exception as exc:  # noqa: B902  (a broken request or reply: reported)
                reply = {"error": "CandidateError", "message": _exception_text(exc)}
            try:
                write_flush()
            except Exception:
                pass
            send(_dumps(reply))
    exit_now(0)


def _serve(request, namespace):
    if request["op"] == "bind":
        kinds = {}
        for name in request["names"]:
            if name not in namespace:
                kinds[name] = {"kind": "missing"}
            elif isinstance(namespace[name], type(os)):
                kinds[name] = {"kind": "module", "module": namespace[name].__name__}
            elif callable(namespace[name]):
                kinds[name] = {"kind": "callable"}
            else:
                try:
                    kinds[name] = {"kind": "value", "value": encode(namespace[name])}
                except (NotBuiltinError, RecursionError) as exc:
                    kinds[name] = {"kind": "unsendable", "type": str(exc)[:TEXT_CHARS]}
        return {"names": kinds}
    function = namespace.get(request["name"])
    if function is None:
        return {"error": "NameError", "message": f"name {request['name']!r} is not defined"}
    args = [decode(arg) for arg in request["args"]]
    kwargs = {key: decode(value) for key, value in request["kwargs"].items()}
    try:
        result = function(*args, **kwargs)
    except BaseException as exc:  # noqa: B902  (the candidate's failure, reported)
        return {"error": type(exc).__name__, "message": str(exc)}
    try:
        reply = {"result": encode(result)}
    except NotBuiltinError as exc:
        return {"error": "NotBuiltinError", "message": str(exc)}
    except RecursionError:
        return {"error": "NotBuiltinError", "message": "a value nested too deeply"}
    mutable = (list, dict, set, bytearray)
    reply["args"] = {str(i): encode(arg) for i, arg in enumerate(args) if type(arg) in mutable}
    return reply


# ---------------------------------------------------------------------------------------------
# The judge: runs the tests, writes the verdict.

class _Channel:
    """The judge's end of the pipes to the runner."""

    def __init__(self, requests_fd, replies_fd):
        self._requests_fd = requests_fd
        self._replies_fd = replies_fd
        self._buffer = bytearray()

    def send(self, message):
        data = _dumps(message)
        while data:
            data = data[os.write(self._requests_fd, data):]

    def receive(self):
        end = self._buffer.find(b"\n")
        while end < 0:
            if len(self._buffer) > MAX_MESSAGE_BYTES:
                raise CandidateError("the program sent more than "
                                     f"{MAX_MESSAGE_BYTES >> 20} MiB in one reply")
            chunk = os.read(self._replies_fd, READ_CHUNK_BYTES)
            if not chunk:
                raise CandidateError("the program's process ended (or closed its channel) "
                                     "before it answered")
            newline = chunk.find(b"\n")
            end = -1 if newline < 0 else len(self._buffer) + newline
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise CandidateError("the program sent an unreadable reply") from None
        if type(message) is not dict:
            raise CandidateError("the program sent an unreadable reply")
        return message


def _raise_from_reply(name, reply):
    error = str(reply.get("error"))
    message = str(reply.get("message", ""))
    if error == "NotBuiltinError":
        raise CandidateError(
            f"{name} returned an object of type {_quote(message)}; only exact built-in types "
            "(int, float, str, list, dict, ...; no subclasses) are accepted")
    exc_type = getattr(builtins, error, None)
    if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
        raise CandidateError(f"calling {name} raised {_quote(error)}: {_quote(message)}")
    try:
        exc = exc_type(message)
    except Exception:  # an exception type whose constructor wants other arguments
        raise CandidateError(f"calling {name} raised {error}: {_quote(message)}") from None
    exc.candidate_call = name
    raise exc


class _Proxy:
    """Stands in the tests for a function of the program; each call crosses the pipe."""

    def __init__(self, channel, name):
        self._channel = channel
        self._name = name

    def __repr__(self):
        return f"<function {self._name} (in the sandboxed program)>"

    def __call__(self, *args, **kwargs):
        try:
            request = {"op": "call", "name": self._name, "args": [encode(a) for a in args],
                       "kwargs": {str(k): encode(v) for k, v in kwargs.items()}}
        except NotBuiltinError as exc:
            raise CandidateError(f"the tests pass a {exc} to {self._name}, which cannot cross "
                                 "the sandbox boundary") from None
        self._channel.send(request)
        reply = self._channel.receive()
        if "result" not in reply:
            _raise_from_reply(self._name, reply)
        try:
            result = decode(reply["result"])
            updated = {int(i): decode(v) for i, v in dict(reply.get("args", {})).items()}
        except (ValueError, TypeError, RecursionError):
            raise CandidateError(f"{self._name} sent a malformed value") from None
        for index, value in updated.items():
            _update_in_place(args[index] if 0 <= index < len(args) else None, value)
        return result


def _update_in_place(original, value):
    """Mirror a mutation the candidate made to a mutable argument."""
    if type(original) is not type(value) or original == value:
        return
    if type(original) in (list, bytearray):
        original[:] = value
    else:  # dict or set
        original.clear()
        original.update(value)


def _stdlib_module(name):
    """True for the name of a standard-library module (the judge may import it itself)."""
    return isinstance(name, str) and name.split(".")[0] in sys.stdlib_module_names


def _names_from_program(tests_tree, namespace, entry_points):
    """Names the tests take from the program: entry points, and free names nothing defines."""
    loaded, bound = set(), set()
    for node in ast.walk(tests_tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    free = loaded - bound - set(namespace) - set(dir(builtins))
    return sorted(free | set(entry_points))


def _test_failure(exc, tests):
    """The judge's reason for an exception raised while the tests ran."""
    if getattr(exc, "candidate_call", None):
        return f"calling {exc.candidate_call} raised {type(exc).__name__}: {_quote(exc)}"
    if isinstance(exc, CandidateError):
        return str(exc)
    line_number = None
    for frame, number in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == TESTS_FILENAME:
            line_number = number
    where = ""
    if line_number is not None:
        lines = tests.splitlines()
        source = lines[line_number - 1].strip() if line_number <= len(lines) else ""
        where = f" at tests line {line_number}: {source[:TEXT_CHARS]}"
    message = f" ({str(exc)[:TEXT_CHARS]})" if str(exc) else ""
    return f"test failed with {type(exc).__name__}{where}{message}"


def _judge_tests(job, channel):
    """Run the trusted tests against the program; returns (passed, reason)."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        prompt = compile(job.get("trusted", ""), PROMPT_FILENAME, "exec")
    except (SyntaxError, ValueError):
        prompt = None  # a prompt that is not a module on its own: the program supplies all
    try:
        tests_tree = ast.parse(job["tests"], TESTS_FILENAME)
        tests = compile(tests_tree, TESTS_FILENAME, "exec")
    except (SyntaxError, ValueError) as exc:
        return False, f"the benchmark's tests do not compile: {exc}"
    try:
        if prompt is not None:
            exec(prompt, namespace)
        names = _names_from_program(tests_tree, namespace, job.get("entry_points", ()))
        channel.send({"op": "bind", "names": names})
        kinds = channel.receive().get("names")
        if type(kinds) is not dict:
            raise CandidateError("the program sent an unreadable reply")
        for name in names:
            kind = kinds.get(name, {}).get("kind") if type(kinds.get(name)) is dict else None
            if kind == "callable":
                namespace[name] = _Proxy(channel, name)
            elif name in job.get("entry_points", ()):
                return False, f"the program does not define the function {name}"
            elif kind == "value":
                namespace[name] = decode(kinds[name].get("value"))
            elif kind == "module" and _stdlib_module(kinds[name].get("module")):
                namespace[name] = importlib.import_module(kinds[name]["module"])
            elif kind == "unsendable":
                return False, (f"the tests use {name}, an object of type "
                               f"{_quote(kinds[name].get('type'))}: not a built-in type")
        exec(tests, namespace)
    except CandidateError as exc:
        return False, str(exc)
    except (Exception, SystemExit) as exc:  # noqa: B902  (the tests failed)
        return False, _test_failure(exc, job["tests"])
    return True, ""


def _judge(job, report, channel):
    """Decide the verdict; the report (isolation and verdict) goes to the parent."""
    try:
        report.update(channel.receive().get("layers", {}))
        loaded = channel.receive()
        if loaded.get("loaded") is not True:
            error = str(loaded.get("error"))
            if error == "SystemExit":
                reason = ("the program raised SystemExit("
                          f"{str(loaded.get('message'))[:TEXT_CHARS]}); not a pass")
            else:
                reason = f"the program raised {_quote(error)}: {_quote(loaded.get('message'))}"
            return False, reason
        if job["mode"] == "script":
            return True, ""
        return _judge_tests(job, channel)
    except CandidateError as exc:
        return False, str(exc)
    except Exception as exc:  # noqa: B902  (e.g. MemoryError reading a reply)
        return False, f"the sandbox judge failed: {type(exc).__name__}"


def _reap(pid):
    """The runner's exit status (128 + n: killed by signal n), waiting RUNNER_EXIT_WAIT_S."""
    deadline = time.monotonic() + RUNNER_EXIT_WAIT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else SIGNAL_EXIT_BASE - code
        if time.monotonic() > deadline:
            os.kill(pid, SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.002)


# ---------------------------------------------------------------------------------------------
# Start-up.

def _pid_one_setup(ctypes):
    """In the new PID namespace: die with the parent; mount a private /proc. True if mounted."""
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


def main(argv):
    """Entry point; see the module docstring for the arguments."""
    workdir, report_fd, layers = argv[1], int(argv[2]), set(argv[3].split(","))
    job = json.loads(sys.stdin.buffer.read())
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    except OSError:
        pass  # stdin stays at the end of the job: reading it gives EOF all the same
    os.chdir(workdir)
    report = _namespace_report(workdir)
    if report["pidns"]:
        import ctypes  # for mount and prctl; the guard drops it before the program

        _fork_into_pid_namespace(report_fd)
        report["private_proc"] = _pid_one_setup(ctypes)
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    sys.stdout.flush()
    runner_pid = os.fork()
    if runner_pid == 0:
        for fd in (report_fd, requests_write, replies_read):
            os.close(fd)
        try:
            _runner(job, workdir, layers, requests_read, replies_write)
        finally:
            os._exit(1)
    os.close(requests_read)
    os.close(replies_write)
    passed, reason = _judge(job, report, _Channel(requests_write, replies_read))
    report["verdict"] = {"passed": passed, "reason": reason}
    os.close(requests_write)  # the runner's request loop ends, and with it the runner
    report["runner_exit"] = _reap(runner_pid)
    os.write(report_fd, _dumps(report))
    os.close(report_fd)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
