"""scripts/compile_cache.py: torch.compile's and Triton's caches packed on one machine, loaded on the next."""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from ..conftest import load_script

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "compile_cache.py")
CHILD = """
import json, torch
from torch._dynamo.utils import counters
def f(x, w):
    return torch.nn.functional.gelu(x @ w).sum(-1).softmax(-1)
torch.compile(f)(torch.randn(8, 16), torch.randn(16, 16))
inductor = counters["inductor"]
print(json.dumps({"hit": inductor["fxgraph_cache_hit"], "miss": inductor["fxgraph_cache_miss"]}))
"""


def _compile_in_child(cache_dir):
    # inductor's C++ without SIMD code: what is checked is the cache, and scalar C++ compiles faster
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TRITON_CACHE_DIR=str(cache_dir / "triton"),
               TORCHINDUCTOR_VEC_ISA_OK="0")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_graphs_compiled_on_one_machine_load_from_the_archive_on_the_next(tmp_path):
    """A process compiles a graph into one cache folder; packed and unpacked into an empty folder,
    another process loads it from there and compiles none."""
    assert _compile_in_child(tmp_path / "first") == {"hit": 0, "miss": 1}
    archive = tmp_path / "cache.tar.xz"
    run = [sys.executable, SCRIPT]
    packed = subprocess.run(run + ["pack", str(tmp_path / "first"), str(archive)], capture_output=True, text=True)
    assert packed.returncode == 0 and "compile_cache: packed inductor" in packed.stdout, packed.stdout + packed.stderr
    unpacked = subprocess.run(run + ["unpack", str(archive), str(tmp_path / "next")], capture_output=True, text=True)
    assert unpacked.returncode == 0 and "compile_cache: unpacked" in unpacked.stdout, unpacked.stdout + unpacked.stderr
    assert _compile_in_child(tmp_path / "next") == {"hit": 1, "miss": 0}


def _fake_cache(root, incompressible=0):
    """A cache folder as a GPU host leaves it: inductor's files, a Triton entry of one of its kernels,
    one of a kernel of ours (``incompressible`` random bytes in its binary), lock files."""
    files = {
        "fxgraph/ab/fkey/entry": b"graph" * 100,
        "aotautograd/cd/akey/entry": b"aot" * 100,
        "5h/c5hy.py": b"kernel source",
        "5h/c5hy.best_config": b"{}",
        "locks/fkey.lock": b"",
        "triton/AAAA/__grp__triton_poi_fused_add_0.json": b"{}",
        "triton/AAAA/triton_poi_fused_add_0.cubin": b"\0" * 64,
        "triton/BBBB/__grp___attn_fwd.json": b"{}",
        "triton/BBBB/_attn_fwd.cubin": os.urandom(incompressible) or b"\1" * 64,
        "triton/BBBB/_attn_fwd.json": b"{}",
    }
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _names(archive):
    with tarfile.open(archive, "r:xz") as tar:
        return [m.name for m in tar.getmembers() if m.isfile()]


def test_pack_keeps_inductors_files_and_our_kernels_not_inductors_kernels_or_locks(tmp_path, capsys):
    cc = load_script("compile_cache")
    archive = tmp_path / "c.tar.xz"
    manifest = cc.pack(str(_fake_cache(tmp_path / "cache")), str(archive), 2**20)
    names = _names(archive)
    assert names[0] == cc.MANIFEST
    assert sorted(names[1:]) == ["5h/c5hy.best_config", "5h/c5hy.py", "aotautograd/cd/akey/entry",
                                 "fxgraph/ab/fkey/entry", "triton/BBBB/__grp___attn_fwd.json",
                                 "triton/BBBB/_attn_fwd.cubin", "triton/BBBB/_attn_fwd.json"]
    assert manifest["contents"] == "inductor + triton" and manifest["files"] == 7
    assert manifest["torch"] == __import__("torch").__version__
    assert not (tmp_path / "c.tar.xz.tmp").exists()
    assert "compile_cache: packed inductor + triton: 7 files" in capsys.readouterr().out


def test_over_the_cap_the_triton_entries_go_first_then_everything(tmp_path, capsys):
    cc = load_script("compile_cache")
    cache = str(_fake_cache(tmp_path / "cache", incompressible=200_000))
    archive = tmp_path / "c.tar.xz"
    manifest = cc.pack(cache, str(archive), 100_000)  # our kernel's 200 KB do not fit; inductor's files do
    assert manifest["contents"] == "inductor" and not any(n.startswith("triton/") for n in _names(archive))
    assert "inductor + triton is 0.2 MiB packed, over 0.1 MiB" in capsys.readouterr().out
    archive.unlink()
    assert cc.pack(cache, str(archive), 100) is None and not archive.exists()
    out = capsys.readouterr().out
    assert out.rstrip().endswith("compile_cache: nothing packed") and out.count(" packed, over ") == 3
    shutil.rmtree(os.path.join(cache, "triton"))  # no kernel of ours: one attempt, not the same one twice
    assert cc.pack(cache, str(archive), 100) is None
    assert capsys.readouterr().out.count(" packed, over ") == 1
    assert cc.pack(str(tmp_path / "absent"), str(archive), 2**20) is None and not archive.exists()


def test_unpack_skips_an_archive_of_other_versions_and_refuses_unsafe_members(tmp_path, capsys):
    cc = load_script("compile_cache")
    archive = tmp_path / "c.tar.xz"
    cc.pack(str(_fake_cache(tmp_path / "cache")), str(archive), 2**20)
    assert cc.unpack(str(archive), str(tmp_path / "same"))["files"] == 7
    assert (tmp_path / "same" / "fxgraph" / "ab" / "fkey" / "entry").read_bytes() == b"graph" * 100
    capsys.readouterr()

    def archive_with(manifest, extra=()):
        path = tmp_path / "other.tar.xz"
        with tarfile.open(path, "w:xz") as tar:
            for name, data in ((cc.MANIFEST, json.dumps(manifest).encode()), *extra):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return str(path)

    old = dict(cc.versions(), torch="2.0.0")
    assert cc.unpack(archive_with(old, [("fxgraph/x", b"1")]), str(tmp_path / "old")) is None
    assert "compile_cache: skipped" in capsys.readouterr().out and not (tmp_path / "old").exists()
    with pytest.raises(ValueError, match="unsafe member '../evil'"):
        cc.unpack(archive_with(cc.versions(), [("../evil", b"1")]), str(tmp_path / "evil"))
    assert not (tmp_path / "evil").exists() and not (tmp_path / "evil").with_name("evil").exists()
    (tmp_path / "junk.tar.xz").write_bytes(b"not an archive")
    assert cc.main(["unpack", str(tmp_path / "junk.tar.xz"), str(tmp_path / "j")]) == 1
    assert cc.main(["unpack", str(tmp_path / "absent.tar.xz"), str(tmp_path / "j")]) == 0
    assert "the caches start empty" in capsys.readouterr().out
