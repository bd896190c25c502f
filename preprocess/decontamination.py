"""Exclude files that overlap benchmark texts (decontamination).

A file is contaminated when it shares a run of ``NGRAM`` consecutive whitespace-separated words
with any benchmark text (the rule GPT-3 used, with 13-grams). Benchmark texts come from plain
text files or JSONL files (every string field of every record is taken).
"""
import json
from typing import Iterable, List, Set

from .inputs import stable_hash

NGRAM = 13  # GPT-3's decontamination n-gram length


def _ngram_hashes(text: str, n: int = NGRAM) -> Set[int]:
    words = text.split()
    return {stable_hash(" ".join(words[i:i + n])) for i in range(len(words) - n + 1)}


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
                        rec = json.loads(line)
                        texts.extend(v for v in rec.values() if isinstance(v, str))
            else:
                texts.append(f.read())
    return texts


class Decontaminator:
    def __init__(self, benchmark_texts: Iterable[str], n: int = NGRAM):
        self.n = n
        self.hashes: Set[int] = set()
        for t in benchmark_texts:
            self.hashes |= _ngram_hashes(t, n)

    def __bool__(self) -> bool:
        return bool(self.hashes)

    def contaminated(self, text: str) -> bool:
        words = text.split()
        n = self.n
        return any(stable_hash(" ".join(words[i:i + n])) in self.hashes
                   for i in range(len(words) - n + 1))
