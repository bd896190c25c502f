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


def load_benchmark(name: str, module_name: str = ""):
    """A script of benchmarks/ (not a package) loaded as a module, e.g. load_benchmark("bench_recipe")."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(module_name or name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_script(name: str):
    """A script of scripts/ loaded as a module, e.g. load_script("check_gpu_codegen")."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def build_tiny_checkpoint(out_dir, tokenizer_dir, arch="t5_v11_tiny", seed=0):
    """A randomly initialized tiny model saved as a weights-only fairseq checkpoint, with the
    tokenizer files beside it (the layout ast-t5-import-hf writes). Returns the directory."""
    import torch

    from ast_t5.data.text_codec import TextCodec
    from ast_t5.generation.checkpoints import save_weights_checkpoint
    from ast_t5.models import AstT5Model

    codec = TextCodec.from_dir(str(tokenizer_dir))
    torch.manual_seed(seed)
    model = AstT5Model.from_dictionary(codec.dictionary(), arch=arch, dropout=0.0,
                                       attention_dropout=0.0)
    codec.write(str(out_dir))
    save_weights_checkpoint(os.path.join(str(out_dir), "checkpoint.pt"), model.cfg,
                            model.state_dict(), codec)
    return out_dir


@pytest.fixture(scope="session")
def tiny_checkpoint_dir(tmp_path_factory, tokenizer_dir):
    """A tiny random T5 v1.1 checkpoint directory (checkpoint.pt + tokenizer files)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_ckpt"), tokenizer_dir)


def tiny_model_pair(backend: str, reference_backend: str = "torch", device: str = "cpu", symbols: int = 40,
                    **kwargs):
    """(dictionary, model on ``backend``, the same weights on ``reference_backend``): a T5 v1.1 tiny model of a
    ``symbols``-word dictionary, both in training mode, for comparing an attention backend's step with the
    reference's (``kwargs``: more model options, e.g. head_dim)."""
    import torch
    from fairseq.data import Dictionary

    from ast_t5.models import AstT5Model

    dictionary = Dictionary()
    for i in range(symbols):
        dictionary.add_symbol(f"tok{i}")
    torch.manual_seed(0)
    kwargs = dict(dict(arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0), **kwargs)
    model = AstT5Model.from_dictionary(dictionary, attention_backend=backend, **kwargs).to(device).train()
    reference = AstT5Model.from_dictionary(dictionary, attention_backend=reference_backend, **kwargs).to(device)
    reference.load_state_dict(model.state_dict())
    return dictionary, model, reference.train()


def synthetic_seq2seq_pair(i, rng):
    """Source: a small Python function (tabs, CRLF, unicode); target: a one-line 'summary'."""
    name = f"{rng.choice(['alpha', 'beta', 'gamma', 'delta', 'kappa', 'sigma'])}_{i % 7}"
    source = f"def {name}(x):\r\n\t# é {i}\n    return x + {i % 5}\n"
    return {"source": source, "target": f"{name} returns x + {i % 5}", "extra": i}


@pytest.fixture(scope="session")
def seq2seq_data(tmp_path_factory):
    """A fine-tuning set in the documented format: <dir>/{train,valid,test}.jsonl, 64/8/4 pairs."""
    import json
    import random

    root = tmp_path_factory.mktemp("seq2seq")
    for split, n, seed in (("train", 64, 0), ("valid", 8, 1), ("test", 4, 2)):
        rng = random.Random(seed)
        with open(root / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps(synthetic_seq2seq_pair(i, rng), ensure_ascii=False) + "\n")
    return root


@pytest.fixture(autouse=True, scope="session")
def torch_single_thread():
    """Tiny models: intra-op threads only add overhead, and on a shared 2-core machine a busy
    neighbour makes OpenMP spin-waiting 100x slower. Applies to the whole test session."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def isolated_root_logging():
    """Remove the root-logger handlers a test left behind (``logging.basicConfig`` in a command's
    main, or fairseq_cli's at import): they hold that test's captured stream, closed once it ends,
    and a later test's records would fail to write to it."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
