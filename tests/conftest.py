"""Shared fixtures: small real corpora (the running interpreter's standard library plus the
bundled samples of other languages) and a tokenizer trained on them in a temporary folder."""
import os
import shutil
import sysconfig

import pytest

STDLIB = sysconfig.get_paths()["stdlib"]
# A fixed handful of real standard-library files nobody here wrote.
STDLIB_FILES = ("json/__init__.py", "json/decoder.py", "json/encoder.py", "textwrap.py",
                "heapq.py", "bisect.py", "fractions.py", "string.py", "colorsys.py", "shlex.py",
                "email/_parseaddr.py", "email/quoprimime.py", "difflib.py", "ast.py")


def bundled_corpus_dir():
    import ast_t5_preprocess

    return os.path.join(os.path.dirname(ast_t5_preprocess.__file__), "default_corpus")


@pytest.fixture(scope="session")
def code_corpus(tmp_path_factory):
    """A directory with real Python files and one sample of every other language."""
    root = tmp_path_factory.mktemp("corpus")
    for rel in STDLIB_FILES:
        dst = root / "py" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(STDLIB, rel), dst)
    shutil.copytree(bundled_corpus_dir(), root / "other")
    return root


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, code_corpus):
    """A small sentencepiece tokenizer (vocab 1200, 32 sentinels) trained on ``code_corpus``."""
    from ast_t5_preprocess.inputs import iter_documents, read_document, ReadLimits
    from ast_t5_preprocess.tokenizer import train_sentencepiece

    out = tmp_path_factory.mktemp("tok")
    texts = [t for d in iter_documents([str(code_corpus)])
             for _, t, _ in [read_document(d, ReadLimits())] if t]
    train_sentencepiece(texts, str(out), vocab_size=1200, num_sentinels=32)
    return out
