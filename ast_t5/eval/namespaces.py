"""Linux namespaces for the code-execution sandbox (DESIGN.md section 9).

`NamespaceIsolator.apply` runs in the sandbox's preexec function, i.e. in the forked child just
before it execs the interpreter. Best effort, in this order:

1. ``unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID)``: a network namespace with nothing but
   a downed loopback (no route to any address, 127.0.0.1 included), a private mount table, and a
   PID namespace for the children of the interpreter (sandbox_child.py forks into it). Without
   root, the same is retried inside a new user namespace (unprivileged user namespaces), mapping
   the caller's uid/gid to 0.
2. Mount propagation is made private first, so nothing below can leak back to the host; then
   every mount is made read-only, nosuid and nodev (``mount_setattr(AT_RECURSIVE)``, Linux 5.12+)
   except for a few harmless device nodes (/dev/null, ...), and a size-capped tmpfs is mounted on
   the working directory, the only writable place.

When a step is refused (no privilege, a seccomp filter, an old kernel) it is skipped silently:
sandbox_child.py reports which mechanisms ended up active and the sandbox records them. There is
no logging here on purpose: between fork and exec, taking the logging lock could deadlock.
"""
import ctypes
import ctypes.util
import os
from typing import Optional

# <linux/sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# <linux/mount.h>
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
# mount_setattr has the same number on every architecture (unified syscall table, Linux 5.12).
SYS_MOUNT_SETATTR = 442
# Device nodes stay usable after every mount gets MOUNT_ATTR_NODEV; disks, /dev/mem and the like
# do not (as root, a read-only mount alone would not stop writes to a device node).
HARMLESS_DEVICES = (b"/dev/null", b"/dev/zero", b"/dev/random", b"/dev/urandom")


class _MountAttr(ctypes.Structure):
    """struct mount_attr from <linux/mount.h>."""

    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class NamespaceIsolator:
    """Moves the calling process into fresh namespaces; build it in the parent, apply in the child.

    Everything that could take a lock or load a library (dlopen, symbol lookup, formatting the
    tmpfs options, the uid maps) is prepared in ``__init__``, so that ``apply`` only makes
    system calls.
    """

    def __init__(self, workdir: str, workdir_mb: int):
        libc_name = ctypes.util.find_library("c") or "libc.so.6"
        libc = ctypes.CDLL(libc_name, use_errno=True)
        self._unshare = libc.unshare
        self._mount = libc.mount
        self._syscall = libc.syscall
        self._workdir = os.fsencode(workdir)
        self._tmpfs_options = b"size=%dm,mode=0700" % workdir_mb
        self._uid_map = b"0 %d 1" % os.getuid()
        self._gid_map = b"0 %d 1" % os.getgid()
        self._lockdown = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                                    0, 0, 0)
        self._allow_device = _MountAttr(0, MOUNT_ATTR_NODEV, 0, 0)

    def apply(self) -> None:
        """Enter new namespaces and lock the file system down; never raises."""
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
        if self._unshare(flags) != 0:
            if self._unshare(flags | CLONE_NEWUSER) != 0:
                return
            self._map_ids()
        if self._mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            return  # never change mounts whose changes could propagate to the host
        self._mount_setattr(b"/", AT_RECURSIVE, self._lockdown)
        for device in HARMLESS_DEVICES:  # bind each over itself, then allow just that node
            if self._mount(device, device, None, MS_BIND, None) == 0:
                self._mount_setattr(device, 0, self._allow_device)
        self._mount(b"tmpfs", self._workdir, b"tmpfs", MS_NOSUID | MS_NODEV, self._tmpfs_options)

    def _mount_setattr(self, path: bytes, flags: int, attr: _MountAttr) -> int:
        return self._syscall(
            SYS_MOUNT_SETATTR, AT_FDCWD, path, flags, ctypes.byref(attr), ctypes.sizeof(attr)
        )

    def _map_ids(self) -> None:
        """Map the caller's uid/gid to 0 in a new user namespace (else no file can be created)."""
        for path, data in (
            ("/proc/self/setgroups", b"deny"),
            ("/proc/self/uid_map", self._uid_map),
            ("/proc/self/gid_map", self._gid_map),
        ):
            try:
                fd = os.open(path, os.O_WRONLY)
            except OSError:
                continue
            try:
                os.write(fd, data)
            except OSError:
                pass
            finally:
                os.close(fd)


def make_isolator(workdir: str, workdir_mb: int) -> Optional[NamespaceIsolator]:
    """A ready isolator, or None where libc cannot be loaded (non-Linux, static builds)."""
    try:
        return NamespaceIsolator(workdir, workdir_mb)
    except (OSError, AttributeError):
        return None


def host_namespace_ids() -> dict:
    """The caller's network and mount namespace ids, to compare with the child's report."""
    ids = {}
    for name in ("net", "mnt"):
        try:
            ids[name] = os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            ids[name] = None
    return ids
