"""A small two-segmentation corpus for the ablation tests: real standard-library files (Python
with docstrings) plus the bundled samples, segmented AST-aware and at fixed lengths."""
import os
import shutil

import pytest

from tests.conftest import STDLIB, bundled_corpus_dir

# Real standard-library files nobody here wrote; with the split ratios below, Python files land
# in all three splits (the split is a hash of the path, so this list is fixed).
ABLATION_FILES = ("json/__init__.py", "json/decoder.py", "json/encoder.py", "textwrap.py",
                  "heapq.py", "bisect.py", "fractions.py", "string.py", "colorsys.py", "shlex.py",
                  "difflib.py", "ast.py", "calendar.py", "csv.py", "fnmatch.py", "glob.py",
                  "gettext.py", "ipaddress.py", "locale.py", "netrc.py", "numbers.py",
                  "operator.py", "pprint.py", "quopri.py", "random.py", "sched.py", "statistics.py",
                  "stringprep.py", "tabnanny.py", "tokenize.py")
SPLIT_ARGS = ["--max-tokens", "128", "--valid-ratio", "0.15", "--test-ratio", "0.15"]


@pytest.fixture(scope="session")
def ablation_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablation_corpus")
    for rel in ABLATION_FILES:
        dst = root / "py" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(STDLIB, rel), dst)
    shutil.copytree(bundled_corpus_dir(), root / "other")
    return str(root)


@pytest.fixture(scope="session")
def ablation_corpus(tmp_path_factory, ablation_inputs):
    from ast_t5_preprocess.cli import main

    out = tmp_path_factory.mktemp("ablation_bin")
    assert main(["run", ablation_inputs, "-o", str(out), "--vocab-size", "800", "--num-sentinels",
                 "32", "--no-progress", *SPLIT_ARGS]) == 0
    return str(out)
