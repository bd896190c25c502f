"""An older torch than pyproject.toml's bound (2.11) stops both the install and the import with one
line saying what to do; the torch of this run passes both checks."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def old_torch(tmp_path):
    """A stand-in `torch` package of release 2.10 ahead of the real one on the path."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "2.10.1+cu128"\n')
    return dict(os.environ, PYTHONPATH=str(tmp_path))


def test_an_older_torch_stops_the_import_with_what_to_do(old_torch):
    proc = subprocess.run([sys.executable, "-c", "import ast_t5"], env=old_torch, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "ImportError: AST-T5 needs torch >= 2.11, found 2.10.1+cu128: upgrade it" in proc.stderr, proc.stderr


def test_install_sh_stops_before_installing_anything_under_an_older_torch(old_torch):
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "install.sh")],
                          env=dict(old_torch, PYTHON=sys.executable), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "install.sh: AST-T5 needs torch >= 2.11, found 2.10.1+cu128: upgrade it" in proc.stderr, proc.stderr
    assert "Collecting" not in proc.stdout and "Requirement already satisfied" not in proc.stdout  # nothing installed


def test_this_torch_passes_both_checks():
    import torch

    import ast_t5

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert (major, minor) >= ast_t5.MIN_TORCH
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert f'"torch>={ast_t5.MIN_TORCH[0]}.{ast_t5.MIN_TORCH[1]}",' in f.read()
