"""``ast-t5-preprocess plan``: which document goes to which shard, and how many bytes each shard
job will read, before a cluster job is sized. Same walk and same assignment as ``run`` (units.py):
record files are split into units (Parquet row groups, JSONL files, Arrow files) placed by size,
source files by a hash of their path. Directory files are only stat'ed; record files are streamed
once (bounded memory) to count their records and bytes of code."""
import json
import os
import sys
from collections import Counter
from typing import Optional, Sequence

from .inputs import input_bytes, iter_documents
from .units import Assignment


def document_bytes(doc) -> int:
    if doc.content is None:
        return doc.src_bytes
    if isinstance(doc.content, bytes):
        return len(doc.content)
    return len(doc.content.encode("utf-8", "surrogatepass"))


def make_plan(inputs: Sequence[str], num_shards: int, language: Optional[str] = None,
              exclude_dirs: Sequence[str] = (), columns=None, assignment_path: Optional[str] = None) -> dict:
    """Per-shard counts: ``{"shards": [{"files", "bytes", "skipped", "units", "input_bytes"}...],
    ...}``: ``bytes`` of code, ``input_bytes`` of the files the shard job reads (its record units
    and its source files; they sum to the input); with ``assignment_path``, also write one JSON
    line per document: shard, key, bytes, where, unit."""
    assignment = Assignment(list(_units(inputs, language, exclude_dirs)), num_shards)
    files, nbytes, skipped, read = Counter(), Counter(), Counter(), Counter()
    units = Counter(assignment.shards)
    for u, sid in zip(assignment.units, assignment.shards):
        read[sid] += u.size
    out = None
    if assignment_path:
        tmp = f"{assignment_path}.tmp.{os.getpid()}"
        out = open(tmp, "w", encoding="utf-8")
    try:
        for doc in iter_documents(inputs, language, exclude_dirs, columns):
            sid = assignment.shard_of_document(doc)
            files[sid] += 1
            if doc.unit is None:  # a source file (record units are counted above)
                read[sid] += doc.src_bytes
            if doc.skip:
                skipped[sid] += 1
                size = 0
            else:
                size = document_bytes(doc)
                nbytes[sid] += size
            if out is not None:
                out.write(json.dumps(dict(shard=sid, key=doc.key, bytes=size, where=doc.where,
                                          skip=doc.skip, unit=doc.unit), sort_keys=True) + "\n")
    except BaseException:
        if out is not None:
            out.close()
            os.remove(tmp)
        raise
    if out is not None:
        out.close()
        os.replace(tmp, assignment_path)
    shards = [dict(shard=i, files=files[i], bytes=nbytes[i], skipped=skipped[i], units=units[i],
                   input_bytes=read[i]) for i in range(num_shards)]
    return dict(num_shards=num_shards, shards=shards, files=sum(files.values()),
                bytes=sum(nbytes.values()), units=len(assignment.units),
                input_bytes=input_bytes(inputs, language, exclude_dirs))


def _units(inputs, language, exclude_dirs):
    from .units import iter_record_units

    return iter_record_units(inputs, language, exclude_dirs)


def print_plan(plan: dict, file=None) -> None:
    """One row per shard: record units, documents, skipped, MB of code, MB of input its job
    reads, and that as a multiple of the mean (how even the split is)."""
    file = file or sys.stdout
    shards = plan["shards"]
    mean = sum(s["input_bytes"] for s in shards) / max(1, len(shards))
    print(f"{'shard':>5}  {'files':>9}  {'skipped':>7}  {'MB':>10}  {'units':>6}  {'input MB':>10}  "
          f"{'x mean':>6}", file=file)
    for s in shards:
        ratio = s["input_bytes"] / mean if mean else 0.0
        print(f"{s['shard']:>5}  {s['files']:>9}  {s['skipped']:>7}  {s['bytes'] / 1e6:>10.2f}  "
              f"{s['units']:>6}  {s['input_bytes'] / 1e6:>10.2f}  {ratio:>6.2f}", file=file)
    largest = max((s["input_bytes"] for s in shards), default=0)
    print(f"total: {plan['files']} documents, {plan['bytes'] / 1e6:.2f} MB of code in "
          f"{plan['num_shards']} shard(s); {plan['input_bytes'] / 1e6:.2f} MB of input files "
          f"(largest shard reads {largest / 1e6:.2f} MB, {largest / mean if mean else 0:.2f} x mean). "
          f"Each shard job reads only its own part: {plan['units']} record-file unit(s) (Parquet row "
          "groups, .jsonl files, Arrow files) placed by size, largest first; source files by a hash "
          "of their path", file=file)
