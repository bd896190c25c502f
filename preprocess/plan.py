"""``ast-t5-preprocess plan``: which document goes to which shard, and how many bytes each shard
will read, before a cluster job is sized. Same walk and same shard hash as ``run``; directory
files are only stat'ed, record files are streamed (bounded memory) to measure their records."""
import json
import os
import sys
from collections import Counter
from typing import Optional, Sequence

from .inputs import input_bytes, iter_documents
from .shards import shard_of


def document_bytes(doc) -> int:
    if doc.content is None:
        return doc.src_bytes
    if isinstance(doc.content, bytes):
        return len(doc.content)
    return len(doc.content.encode("utf-8", "surrogatepass"))


def make_plan(inputs: Sequence[str], num_shards: int, language: Optional[str] = None,
              exclude_dirs: Sequence[str] = (), columns=None, assignment_path: Optional[str] = None) -> dict:
    """Per-shard counts: ``{"shards": [{"files", "bytes", "skipped"}...], ...}``; with
    ``assignment_path``, also write one JSON line per document: shard, key, bytes, where."""
    files, nbytes, skipped = Counter(), Counter(), Counter()
    out = None
    if assignment_path:
        tmp = f"{assignment_path}.tmp.{os.getpid()}"
        out = open(tmp, "w", encoding="utf-8")
    try:
        for doc in iter_documents(inputs, language, exclude_dirs, columns):
            sid = shard_of(doc.key, num_shards)
            files[sid] += 1
            if doc.skip:
                skipped[sid] += 1
                size = 0
            else:
                size = document_bytes(doc)
                nbytes[sid] += size
            if out is not None:
                out.write(json.dumps(dict(shard=sid, key=doc.key, bytes=size, where=doc.where,
                                          skip=doc.skip), sort_keys=True) + "\n")
    except BaseException:
        if out is not None:
            out.close()
            os.remove(tmp)
        raise
    if out is not None:
        out.close()
        os.replace(tmp, assignment_path)
    shards = [dict(shard=i, files=files[i], bytes=nbytes[i], skipped=skipped[i]) for i in range(num_shards)]
    return dict(num_shards=num_shards, shards=shards, files=sum(files.values()),
                bytes=sum(nbytes.values()), input_bytes=input_bytes(inputs, language, exclude_dirs))


def print_plan(plan: dict, file=None) -> None:
    file = file or sys.stdout
    shards = plan["shards"]
    mean = plan["bytes"] / max(1, len(shards))
    print(f"{'shard':>5}  {'files':>9}  {'skipped':>7}  {'MB':>10}  {'x mean':>6}", file=file)
    for s in shards:
        ratio = s["bytes"] / mean if mean else 0.0
        print(f"{s['shard']:>5}  {s['files']:>9}  {s['skipped']:>7}  {s['bytes'] / 1e6:>10.2f}  {ratio:>6.2f}",
              file=file)
    largest = max((s["bytes"] for s in shards), default=0)
    print(f"total: {plan['files']} documents, {plan['bytes'] / 1e6:.2f} MB of code in "
          f"{plan['num_shards']} shard(s) (largest {largest / 1e6:.2f} MB, "
          f"{largest / mean if mean else 0:.2f} x mean); every shard reads all "
          f"{plan['input_bytes'] / 1e6:.2f} MB of input files", file=file)
