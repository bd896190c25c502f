"""Carry torch.compile's and Triton's on-disk caches from one GPU session to the next.

A lent GPU session has 15 minutes of device time, and compiling spends a third of it: T5-base's
training step took 78-136 s to compile on an H200 (the recipe, bench_train, the triton backend),
Hugging Face's model 96 s, and the triton backend's ~45 attention kernels compile at their first
launch. The next session starts on a fresh machine, with empty caches, and compiles the same
graphs again. `scripts/gpu_check.sh` therefore points inductor and Triton at one cache folder,
fills it from ``.device/compile_cache.tar.xz`` when the call carries one, and packs it into
``OUTDIR/compile_cache.tar.xz`` at the end; copied into ``.device/`` on the CPU machine, the next
call carries it (``.device`` travels with every call; the archive is capped at 15 MiB, which the 16
MiB a returned file may have and the 64 MiB a call carries both allow).

What is packed: inductor's cache (compiled graphs, with their Triton kernels bundled into them,
since ``bundle_triton_into_fx_graph_cache`` is on; AOTAutograd's cache; autotuning results), and
the Triton cache's entries of kernels that inductor did not generate (ours, compiled by Triton's
JIT at launch); the Triton entries of inductor's own kernels (named ``triton_*``) are left out,
since a graph loaded from inductor's cache writes its bundled kernels back. If that is over the
cap, the Triton entries are left out too, then inductor's.

A hit needs the same torch and Triton versions (inductor's and Triton's cache keys hold both;
this script skips an archive made under other versions), and for inductor's graphs the same GPU
model (its key holds the device's name): an H200's graphs miss on an H100, while Triton's kernels,
keyed by architecture (sm90 for both), still hit. A stale entry (the code changed since) is never
used, only carried. The model's compile log says how many graphs came from the cache
("inductor's cache: N of M graphs loaded").

    python scripts/compile_cache.py pack CACHE_DIR ARCHIVE [--max-mib 15]
    python scripts/compile_cache.py unpack ARCHIVE CACHE_DIR

Exit status 0 (packed, unpacked, or skipped with the reason printed), 1 when the archive is
unreadable or holds a path outside the folder, 2 on a usage error.
"""
import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from typing import Dict, List, Optional, Tuple

try:
    from lzma import LZMAError
except ImportError:  # a Python built without liblzma: tarfile then raises CompressionError, a TarError
    LZMAError = tarfile.TarError

MANIFEST = "compile_cache.json"
UNPACKED = ".unpacked"  # gpu_check.sh's mark of a folder already filled on this machine
XZ_PRESET = 1  # about 40 MB/s on one core, 11x on Triton's cache (presets 3 and 6: 13x and 16x, 3x and 12x slower)


def versions() -> Dict[str, str]:
    """The versions a cache entry is only valid under, and the GPU's name (none without CUDA)."""
    import torch

    found = {"torch": torch.__version__, "triton": "", "device": ""}
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        found["device"] = torch.cuda.get_device_name()
    return found


def _triton_entries(cache_dir: str) -> Dict[str, str]:
    """Folder (relative to ``cache_dir``) -> kernel name, for each Triton cache entry (a folder
    holding Triton's ``__grp__<kernel>.json``) anywhere under ``cache_dir``."""
    entries = {}
    for root, _, files in os.walk(cache_dir):
        for name in files:
            if name.startswith("__grp__") and name.endswith(".json"):
                entries[os.path.relpath(root, cache_dir)] = name[len("__grp__"):-len(".json")]
    return entries


def _groups(cache_dir: str) -> Tuple[List[str], List[str]]:
    """(inductor's files, the Triton entries' files of kernels inductor did not generate), as paths
    relative to ``cache_dir``; lock files and Triton entries of inductor's kernels left out."""
    entries = _triton_entries(cache_dir)
    inductor, triton = [], []
    for root, _, files in os.walk(cache_dir):
        rel_root = os.path.relpath(root, cache_dir)
        kernel = entries.get(rel_root)
        for name in sorted(files):
            if name.endswith((".lock", ".tmp")) or name in (MANIFEST, UNPACKED):
                continue
            path = os.path.normpath(os.path.join(rel_root, name))
            if kernel is None:
                inductor.append(path)
            elif not kernel.startswith("triton_"):  # inductor's kernels travel bundled in its graphs
                triton.append(path)
    return sorted(inductor), sorted(triton)


def _archive(cache_dir: str, paths: List[str], manifest: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=XZ_PRESET) as tar:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
        for path in paths:
            tar.add(os.path.join(cache_dir, path), arcname=path, recursive=False)
    return buf.getvalue()


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def pack(cache_dir: str, archive: str, max_bytes: int) -> Optional[dict]:
    """Write ``archive`` (atomically) from ``cache_dir``, within ``max_bytes``; returns its manifest,
    or None (with the reason printed) when there is nothing to pack or nothing fits."""
    if not os.path.isdir(cache_dir):
        print(f"compile_cache: no cache folder {cache_dir}: nothing packed")
        return None
    inductor, triton = _groups(cache_dir)
    start = time.perf_counter()
    tried = []
    for label, paths in (("inductor + triton", inductor + triton), ("inductor", inductor), ("triton", triton)):
        if not paths or paths in tried:  # nothing, or what an attempt before held already
            continue
        tried.append(paths)
        manifest = dict(versions(), commit=_commit(), created=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                        contents=label, files=len(paths),
                        bytes=sum(os.path.getsize(os.path.join(cache_dir, p)) for p in paths))
        data = _archive(cache_dir, paths, manifest)
        if len(data) <= max_bytes:
            tmp = archive + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, archive)
            print(f"compile_cache: packed {label}: {len(paths)} files, {manifest['bytes'] / 2**20:.1f} MiB -> "
                  f"{len(data) / 2**20:.1f} MiB in {time.perf_counter() - start:.1f} s ({archive})")
            return manifest
        print(f"compile_cache: {label} is {len(data) / 2**20:.1f} MiB packed, over {max_bytes / 2**20:.1f} MiB")
    print("compile_cache: nothing packed" + ("" if inductor or triton else f" ({cache_dir} holds no cache entry)"))
    return None


def unpack(archive: str, cache_dir: str) -> Optional[dict]:
    """Extract ``archive`` into ``cache_dir`` when it was made under this torch and Triton; returns
    its manifest, or None (reason printed) when skipped. Raises ValueError on an unsafe member or
    an archive without a manifest."""
    if not os.path.exists(archive):
        print(f"compile_cache: no {archive}: the caches start empty")
        return None
    with tarfile.open(archive, mode="r:xz") as tar:
        members = tar.getmembers()
        if not members or members[0].name != MANIFEST:
            raise ValueError(f"{archive} is not a compile cache archive (its first member is not {MANIFEST})")
        manifest = json.loads(tar.extractfile(members[0]).read())
        here = versions()
        stale = [f"{k} {manifest.get(k)!r} there, {here[k]!r} here" for k in ("torch", "triton")
                 if manifest.get(k) != here[k]]
        origin = (f"made {manifest.get('created')} on {manifest.get('device') or 'no GPU'} at commit "
                  f"{manifest.get('commit') or '?'}")
        if stale:
            print(f"compile_cache: skipped {archive} ({origin}): " + "; ".join(stale))
            return None
        for member in members[1:]:
            name = os.path.normpath(member.name)
            if not (member.isfile() or member.isdir()) or os.path.isabs(name) or name.split(os.sep)[0] == "..":
                raise ValueError(f"{archive}: unsafe member {member.name!r} (not a plain file under the folder)")
        os.makedirs(cache_dir, exist_ok=True)
        tar.extractall(cache_dir, members=members[1:], filter="data")
    note = "" if manifest.get("device") == here["device"] else (
        f"; made on {manifest.get('device') or 'no GPU'}, this is {here['device'] or 'no GPU'}: inductor's graphs "
        "will miss (its key holds the device), Triton's kernels of the same architecture still hit")
    print(f"compile_cache: unpacked {manifest.get('files')} files ({manifest.get('contents')}) into {cache_dir}, "
          f"{origin}{note}")
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("pack", help="pack CACHE_DIR into ARCHIVE (.tar.xz)")
    a.add_argument("cache_dir")
    a.add_argument("archive")
    a.add_argument("--max-mib", type=float, default=15.0, help="the largest archive to write (MiB)")
    b = sub.add_parser("unpack", help="extract ARCHIVE into CACHE_DIR when torch and Triton match")
    b.add_argument("archive")
    b.add_argument("cache_dir")
    args = p.parse_args(argv)
    try:
        if args.command == "pack":
            pack(args.cache_dir, args.archive, int(args.max_mib * 2**20))
        else:
            unpack(args.archive, args.cache_dir)
    except (ValueError, tarfile.TarError, LZMAError, OSError, EOFError) as e:
        print(f"compile_cache: {args.command} failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
