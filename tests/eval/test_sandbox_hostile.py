"""ast_t5.eval.sandbox against hostile programs: files, network, signals, spawning, secrets.

Each attack runs in the full sandbox and with only one layer ("namespaces": guard off, skipped
where namespaces are unavailable; "guard": no namespaces), and, where that is harmless, in a
"control" sandbox with neither, to show the attack really works and the test could fail.
The network tests only ever use a listener on 127.0.0.1.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ast_t5.eval.sandbox import run_program
from .test_sandbox import leftover_processes

PROTECTED = ["full", "namespaces", "landlock", "no-namespaces", "guard"]
SECRET = "ast-t5-test-secret-7f3a9c"

CANARY_ATTACK = """
import os, shutil, pathlib
target = {path!r}
attempts = [
    lambda: os.remove(target),
    lambda: os.unlink(target),
    lambda: pathlib.Path(target).unlink(),
    lambda: os.rename(target, target + ".moved"),
    lambda: open(target, "w").write("overwritten"),
    lambda: os.truncate(target, 0),
    lambda: os.chmod(target, 0),
    lambda: shutil.rmtree(os.path.dirname(target)),
    lambda: (os.symlink(target, "link"), os.remove(os.path.realpath("link"))),
]
for attempt in attempts:
    try:
        attempt()
    except Exception:
        pass
print("ATTEMPTED", len(attempts))
"""


@pytest.fixture
def canary(tmp_path):
    folder = tmp_path / "canary_dir"
    folder.mkdir()
    path = folder / "canary.txt"
    path.write_text("alive")
    return path


def canary_intact(path) -> bool:
    return path.exists() and path.read_text() == "alive" and os.access(path, os.R_OK)


@pytest.mark.parametrize("mode", PROTECTED)
def test_files_outside_the_sandbox_survive(make_config, canary, mode):
    result = run_program(CANARY_ATTACK.format(path=str(canary)), make_config(mode))
    assert "ATTEMPTED 9" in result.stdout, result.stderr
    assert canary_intact(canary)


def test_control_canary_is_destroyed(make_config, canary):
    run_program(CANARY_ATTACK.format(path=str(canary)), make_config("control"))
    assert not canary_intact(canary)


NETWORK_ATTACK = """
import socket
for attempt in (lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1),
                lambda: socket.socket().connect(("127.0.0.1", {port}))):
    try:
        conn = attempt()
        print("CONNECTED")
    except Exception as exc:
        print("blocked:", type(exc).__name__)
"""


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))  # loopback only
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def connection_arrived(server) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@pytest.mark.parametrize("mode", PROTECTED)
def test_network_is_unreachable(make_config, listener, mode):
    program = NETWORK_ATTACK.format(port=listener.getsockname()[1])
    result = run_program(program, make_config(mode))
    assert result.stdout.count("blocked:") == 2, result.stderr
    assert not connection_arrived(listener)


def test_control_network_connects(make_config, listener):
    program = NETWORK_ATTACK.format(port=listener.getsockname()[1])
    result = run_program(program, make_config("control"))
    assert "CONNECTED" in result.stdout
    assert connection_arrived(listener)


@pytest.fixture
def victim():
    """A harmless process to attack: sleeps, with the secret in its environment."""
    env = dict(os.environ, AST_T5_VICTIM_SECRET=SECRET)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    yield proc
    proc.kill()
    proc.wait()


SIGNAL_ATTACK = """
import os, signal

def probe_evaluator():  # signal 0 only checks reachability: the evaluator must be out of reach
    os.kill({evaluator}, 0)

def fresh_pidfd_kill():  # fresh copies of built-in modules carry the unguarded functions
    import importlib.machinery, importlib.util
    def fresh(name):
        return importlib.util.module_from_spec(importlib.machinery.BuiltinImporter.find_spec(name))
    fresh("_signal").pidfd_send_signal(fresh("posix").pidfd_open({pid}), signal.SIGKILL)

attempts = [
    lambda: os.kill({pid}, signal.SIGKILL),
    lambda: os.killpg(os.getpgid({pid}), signal.SIGKILL),
    lambda: signal.pidfd_send_signal(os.pidfd_open({pid}), signal.SIGKILL),
    probe_evaluator,
    fresh_pidfd_kill,
]
sent = 0
for attempt in attempts:
    try:
        attempt()
        sent += 1
    except Exception:
        pass
print("SENT", sent)
"""


@pytest.mark.parametrize("mode", ["full", "namespaces", "landlock", "seccomp", "no-namespaces"])
def test_cannot_signal_other_processes(make_config, victim, mode):
    """The victim stands in for the evaluator (same user); the guard alone cannot stop the
    fresh-module route (README: what the sandbox does not guarantee)."""
    program = SIGNAL_ATTACK.format(pid=victim.pid, evaluator=os.getpid())
    result = run_program(program, make_config(mode))
    assert "SENT 0" in result.stdout, (result.stdout, result.stderr)
    time.sleep(0.1)
    assert victim.poll() is None


def test_control_victim_is_killed(make_config, victim):
    program = f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)\n"
    run_program(program, make_config("control"))
    assert victim.wait(timeout=5) == -signal.SIGKILL


SPAWN_ATTACK = """
import os, subprocess, multiprocessing, pty
attempts = [
    lambda: os.fork(),
    lambda: subprocess.Popen(["sleep", "30"]),
    lambda: os.system("sleep 30 &") == 0 or os.fork(),  # a status of 127: nothing started
    lambda: multiprocessing.Process(target=print).start(),
    lambda: os.posix_spawn("/bin/sleep", ["sleep", "30"], {}),
    lambda: pty.fork(),
    lambda: os.execv("/bin/true", ["true"]),
]
spawned = 0
for attempt in attempts:
    try:
        attempt()
        spawned += 1
    except Exception:
        pass
print("SPAWNED", spawned, flush=True)
while True:  # fork bomb: must stop at the first fork
    os.fork()
"""


@pytest.mark.parametrize("mode", ["full", "seccomp", "no-namespaces", "guard"])
def test_process_creation_is_refused(make_config, mode):
    start = time.monotonic()
    result = run_program(SPAWN_ATTACK, make_config(mode))
    assert time.monotonic() - start < make_config(mode).timeout_s
    assert "SPAWNED 0" in result.stdout, (result.stdout, result.stderr)
    refused_by = "Operation not permitted" if mode == "seccomp" else "os.fork"
    assert result.status == "failed" and refused_by in result.detail, result.detail
    assert leftover_processes(str(make_config.runs)) == []


def test_escaped_children_die_with_the_pid_namespace(make_config):
    """Guard off: a child that leaves the process group still dies with the namespace."""
    program = ("import os, time\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "    time.sleep(30)\n"
               "print('parent done')\n")
    result = run_program(program, make_config("namespaces"))
    assert "parent done" in result.stdout
    deadline = time.monotonic() + 2
    while leftover_processes(str(make_config.runs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftover_processes(str(make_config.runs)) == []


SECRET_HUNT = """
import os
found = sum({secret!r} in value for value in os.environ.values())
scanned = 0
for pid in os.listdir("/proc"):
    if pid.isdigit():
        scanned += 1
        try:
            with open(f"/proc/{{pid}}/environ", "rb") as handle:
                found += {secret!r}.encode() in handle.read()
        except Exception:
            pass
print("SCANNED", scanned, "FOUND", found)
"""


@pytest.mark.parametrize("mode", ["full", "namespaces", "no-namespaces", "guard"])
def test_secrets_stay_hidden(make_config, monkeypatch, victim, mode):
    monkeypatch.setenv("AST_T5_TEST_SECRET", SECRET)
    result = run_program(SECRET_HUNT.format(secret=SECRET), make_config(mode))
    assert "SCANNED" in result.stdout and "FOUND 0" in result.stdout, result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_control_secret_is_found(make_config, monkeypatch, victim):
    monkeypatch.setenv("AST_T5_TEST_SECRET", SECRET)
    result = run_program(SECRET_HUNT.format(secret=SECRET), make_config("control"))
    assert "FOUND 0" not in result.stdout and "FOUND" in result.stdout


PATH_FORM_ATTACK = """
import os
target = {path!r}
folder, name = os.path.split(target)

def fresh(module):
    import importlib.machinery, importlib.util
    return importlib.util.module_from_spec(importlib.machinery.BuiltinImporter.find_spec(module))

def write_fd(fd):
    os.write(fd, b"overwritten")

def dir_fd_outside():
    write_fd(os.open(name, os.O_WRONLY | os.O_TRUNC, dir_fd=os.open(folder, os.O_RDONLY)))

def dir_fd_o_path():
    write_fd(os.open(name, os.O_WRONLY | os.O_TRUNC, dir_fd=os.open(folder, os.O_PATH)))

def dotdot_from_a_subdirectory():
    os.makedirs("a/b/c", exist_ok=True)
    rel = os.path.relpath(target, os.path.realpath("a/b/c"))
    write_fd(os.open(rel, os.O_WRONLY | os.O_TRUNC, dir_fd=os.open("a/b/c", os.O_RDONLY)))

def dotdot_with_a_deeper_cwd():
    top = os.open(".", os.O_RDONLY)
    here = os.getcwd()
    os.makedirs("x/y/z", exist_ok=True)
    os.chdir("x/y/z")
    try:
        write_fd(os.open(os.path.relpath(target, here), os.O_WRONLY | os.O_TRUNC, dir_fd=top))
    finally:
        os.chdir(here)

def hard_link():
    os.link(target, "hard")
    with open("hard", "w") as handle:
        handle.write("overwritten")

def hard_link_fresh_posix():
    fresh("posix").link(target, "hard2")
    with open("hard2", "w") as handle:
        handle.write("overwritten")

def symlink():
    os.symlink(target, "soft")
    with open("soft", "w") as handle:
        handle.write("overwritten")

def parent_command_line():
    proc = os.open("/proc", os.O_RDONLY)
    print("CMDLINE", os.read(os.open(f"{{os.getppid()}}/cmdline", os.O_RDONLY, dir_fd=proc), 99))

for attack in (dir_fd_outside, dir_fd_o_path, dotdot_from_a_subdirectory, dotdot_with_a_deeper_cwd,
               hard_link, hard_link_fresh_posix, symlink, parent_command_line):
    try:
        attack()
        print("DONE", attack.__name__)
    except Exception as exc:
        print("refused", attack.__name__, type(exc).__name__)
print("ATTEMPTED")
"""
PATH_FORM_WRITES = ("dir_fd_outside", "dir_fd_o_path", "dotdot_from_a_subdirectory",
                    "dotdot_with_a_deeper_cwd", "hard_link", "hard_link_fresh_posix", "symlink")


@pytest.mark.parametrize("mode", PROTECTED)
def test_every_path_form_is_checked(make_config, canary, mode):
    result = run_program(PATH_FORM_ATTACK.format(path=str(canary)), make_config(mode))
    assert "ATTEMPTED" in result.stdout, result.stderr
    assert canary_intact(canary), result.stdout
    assert result.stdout.count("refused") >= len(PATH_FORM_WRITES), result.stdout
    assert not any(f"DONE {name}" in result.stdout for name in PATH_FORM_WRITES)
    if mode in ("full", "no-namespaces", "guard"):  # reading /proc: the guard's job
        assert "CMDLINE" not in result.stdout, result.stdout


def test_control_path_forms_reach_the_file(make_config, canary):
    result = run_program(PATH_FORM_ATTACK.format(path=str(canary)), make_config("control"))
    assert "DONE dir_fd_outside" in result.stdout and "DONE hard_link" in result.stdout
    assert not canary_intact(canary)


DEVICE_ATTACK = """
import importlib.machinery, importlib.util, os, stat
fresh = importlib.util.module_from_spec(importlib.machinery.BuiltinImporter.find_spec("posix"))
for make in (lambda: fresh.mkfifo({fifo!r}),
             lambda: fresh.mknod({device!r}, stat.S_IFCHR | 0o600, os.makedev(1, 3))):
    try:
        make()
    except Exception as exc:
        print("refused", type(exc).__name__)
"""


@pytest.mark.parametrize("mode", ["full", "namespaces", "landlock", "seccomp", "no-namespaces"])
def test_no_special_files_outside(make_config, tmp_path, mode):
    fifo, device = tmp_path / "fifo", tmp_path / "device"
    result = run_program(DEVICE_ATTACK.format(fifo=str(fifo), device=str(device)),
                         make_config(mode))
    assert result.stdout.count("refused") == 2, (result.stdout, result.stderr)
    assert not fifo.exists() and not device.exists()


@pytest.mark.parametrize("mode", ["full", "no-namespaces", "guard"])
def test_the_workdir_is_capped(make_config, mode):
    """Without a tmpfs the parent measures the directory and stops the program."""
    program = ("for i in range(1000):\n"
               "    with open(f'part{i}', 'wb') as f:\n"
               "        f.write(b'x' * (2 << 20))\n")
    result = run_program(program, make_config(mode, workdir_mb=8, max_file_mb=4, timeout_s=5))
    assert result.status == "failed"
    assert "No space left" in result.detail or "working directory exceeded 8 MiB" in result.detail
    assert result.elapsed_s < 4
