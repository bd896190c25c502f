"""Corpus-pipeline throughput, measured side by side on the same files in one run.

Prints, in MB of source per second:
  * raw tree-sitter parse, sentencepiece encode, and the floor (parse + encode, summed times);
  * the full pipeline (read, parse, tokenize, align, segment, write, merge-free shard) with one
    worker and with two, and the ratios against the targets of DESIGN.md section 8
    (one worker >= 0.6 x floor; two workers >= 1.7 x one).

    python benchmarks/bench_preprocess.py                 # the whole standard library, ~30 MB
    python benchmarks/bench_preprocess.py --max-mb 10     # a quicker, noisier run
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

from ast_t5_preprocess.driver import DEFAULT_CORPUS_EXCLUDES, default_corpus
from ast_t5_preprocess.inputs import ReadLimits, iter_documents, read_document
from ast_t5_preprocess.parsing import CodeParser
from ast_t5_preprocess.pipeline import PipelineOptions
from ast_t5_preprocess.shards import run_shard
from ast_t5_preprocess.tokenizer import train_sentencepiece


def select_documents(max_mb):
    """Readable code files of the default corpus, in walk order, up to max_mb."""
    docs, texts, total = [], [], 0
    for doc in iter_documents(default_corpus(), None, DEFAULT_CORPUS_EXCLUDES):
        data, text, skip = read_document(doc, ReadLimits())
        if skip or doc.language == "text":
            continue
        docs.append(doc)
        texts.append((doc.language, data, text))
        total += len(data)
        if total >= max_mb * 1e6:
            break
    return docs, texts, total / 1e6


def time_floor(texts, tok):
    parsers = {}
    t0 = time.perf_counter()
    for lang, data, _ in texts:
        parsers.setdefault(lang, CodeParser(lang)).parser.parse(data)
    t_parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _, _, text in texts:
        tok.sp.encode(text)
    return t_parse, time.perf_counter() - t0


def time_pipeline(docs, workdir, spm_model, num_sentinels, workers):
    out = os.path.join(workdir, f"w{workers}")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    ctx_args = (spm_model, num_sentinels, PipelineOptions(), None)
    run_shard([], None, out, 0, 1, ctx_args, workers, "bench", progress=False,
              documents=docs)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-mb", type=float, default=30.0,
                    help="MB of source code to use (30: about the whole standard library); small "
                         "runs understate scaling, since worker start-up and the last chunk weigh more")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=2, help="best of this many timings (2)")
    args = ap.parse_args(argv)
    docs, texts, mb = select_documents(args.max_mb)
    print(f"files: {len(docs)}, {mb:.2f} MB (standard library of Python {sys.version.split()[0]} + samples)")
    with tempfile.TemporaryDirectory() as work:
        tok = train_sentencepiece((t for _, _, t in texts), work, args.vocab_size, 256, num_threads=2)
        spm = os.path.join(work, "spm.model")
        best = lambda f: min(f() for _ in range(args.repeats))
        t_parse = best(lambda: time_floor(texts, tok)[0])
        t_enc = best(lambda: time_floor(texts, tok)[1])
        t_one = best(lambda: time_pipeline(docs, work, spm, 256, 1))
        t_two = best(lambda: time_pipeline(docs, work, spm, 256, 2))
    floor = mb / (t_parse + t_enc)
    one, two = mb / t_one, mb / t_two
    print(f"tree-sitter parse        {mb / t_parse:8.2f} MB/s")
    print(f"sentencepiece encode     {mb / t_enc:8.2f} MB/s")
    print(f"floor (parse + encode)   {floor:8.2f} MB/s")
    print(f"pipeline, 1 worker       {one:8.2f} MB/s   {one / floor:.2f} x floor   (target >= 0.60)")
    print(f"pipeline, 2 workers      {two:8.2f} MB/s   {two / one:.2f} x 1 worker (target >= 1.70)")
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
