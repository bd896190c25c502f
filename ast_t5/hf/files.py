"""Writing an output directory atomically: build it under a temporary name, then rename.

An interrupted export or import leaves at most a ``.<name>.tmp-<pid>`` directory beside the
target (removed on the next run's failure path or by hand), never a half-written target that a
later step would load.
"""
import contextlib
import os
import shutil


class OutputExistsError(FileExistsError):
    """The output directory exists and is not empty (pass overwrite=True / --force)."""


@contextlib.contextmanager
def atomic_directory(out_dir: str, overwrite: bool = False):
    """Yield a fresh temporary directory that becomes ``out_dir`` when the block succeeds."""
    out_dir = os.path.abspath(out_dir)
    occupied = os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir))
    if occupied and not overwrite:
        raise OutputExistsError(f"{out_dir} exists and is not empty (use --force to replace it)")
    parent, name = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
        old = None
        if os.path.exists(out_dir):
            old = os.path.join(parent, f".{name}.old-{os.getpid()}")
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old:
            shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.remove(old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
