"""End-to-end tests of `ast-t5-preprocess`: outputs readable by fairseq, splits, dedup, shards,
resume after SIGKILL, workers, and pathological input."""
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ast_t5_preprocess.cli import main
from ast_t5_preprocess.formats import IndexedReader, ast_rows, check_ast_item
from ast_t5_preprocess.tokenizer import load_tokenizer

from ..conftest import STDLIB

TOKENIZER_FILES = ("spm.model", "spm.vocab", "dict.txt", "tokenizer.json", "spm.sample.jsonl")  # what train-spm writes
SMALL = ["--vocab-size", "1200", "--num-sentinels", "32", "--no-progress", "--max-tokens", "256"]


def run_cli(*args):
    assert main(["run", *map(str, args), *SMALL]) == 0


def tree_digest(root):
    """Hash of every output file by relative path, to compare whole runs."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def check_outputs(out):
    """Every dataset is readable by fairseq and every AST item is valid."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    manifest = json.load(open(os.path.join(out, "manifest.json")))
    tok = load_tokenizer(out)
    total = 0
    for lang in manifest["data_weights"]:
        ntypes = sum(1 for _ in open(os.path.join(out, lang, "node_types.txt")))
        for split in ("train", "valid", "test"):
            prefix = os.path.join(out, lang, split)
            if not os.path.exists(prefix + ".bin"):
                continue
            toks, asts = MMapIndexedDataset(prefix), MMapIndexedDataset(prefix + ".ast")
            assert len(toks) == len(asts) == manifest["languages"][lang][f"{split}_segments"]
            for i in range(len(toks)):
                t = toks[i].numpy()
                assert t[-1] == tok.sp.eos_id() and len(t) <= manifest["options"]["max_tokens"]
                assert t[:-1].max() < tok.spm_vocab_size
                check_ast_item(ast_rows(asts[i].numpy()), len(t), ntypes)
            total += len(toks)
    return manifest, total


def test_multi_language_corpus_end_to_end(code_corpus, tmp_path):
    out = tmp_path / "out"
    run_cli(code_corpus, "-o", out, "--valid-ratio", "0.2", "--test-ratio", "0.2")
    manifest, total = check_outputs(str(out))
    langs = manifest["languages"]
    assert {"python", "java", "cpp", "csharp", "c", "go", "javascript", "typescript", "rust", "text"} <= set(langs)
    assert total == sum(s["segments"] for s in langs.values())
    py = langs["python"]
    assert py["files_kept"] == 14 and py["files_split"] > 0
    # AST-aware cuts break far fewer nodes than fixed-length cuts on the same files
    assert py["broken_nodes_ast"] * 1.8 < py["broken_nodes_naive"]
    assert abs(sum(manifest["data_weights"].values()) - 1) < 1e-9
    assert manifest["grammars"]["python"] == "0.25.0"
    # the tokens of a file decode back to the file, byte for byte
    tok = load_tokenizer(str(out))
    decoded = "".join(tok.decode(t[:-1]) for t in IndexedReader(str(out / "rust" / "train")))
    assert decoded == open(os.path.join(code_corpus, "other/rust/matrix.rs")).read()


def test_dedup_and_decontamination(code_corpus, tmp_path):
    corpus = tmp_path / "c"
    shutil.copytree(code_corpus / "py" / "json", corpus / "a")
    shutil.copytree(code_corpus / "py" / "json", corpus / "b")  # exact copies, other paths
    bench = tmp_path / "bench.txt"
    text = open(corpus / "a" / "encoder.py").read()
    bench.write_text(text[1000:3000])
    run_cli(corpus, "-o", tmp_path / "out", "--exclude-benchmark", bench, "--num-shards", "2")
    stats = json.load(open(tmp_path / "out" / "manifest.json"))["languages"]["python"]
    assert stats["skipped_duplicate"] == 2 and stats["skipped_decontaminated"] == 2
    assert stats["files_kept"] == 2 and stats["files_seen"] == 6


def test_sharded_runs_merge_to_the_same_bytes(code_corpus, tmp_path):
    run_cli(code_corpus, "-o", tmp_path / "all", "--num-shards", "3")
    shutil.copytree(tmp_path / "all", tmp_path / "tok_only",
                    ignore=lambda d, names: [n for n in names if n not in TOKENIZER_FILES])
    for sid in (2, 0, 1):  # any order, as independent jobs
        run_cli(code_corpus, "-o", tmp_path / "tok_only", "--num-shards", "3", "--shard-id", sid)
    assert main(["merge", str(code_corpus), "-o", str(tmp_path / "tok_only"), *SMALL, "--num-shards", "3"]) == 0
    assert tree_digest(tmp_path / "all") == tree_digest(tmp_path / "tok_only")


def test_workers_give_identical_output(code_corpus, tmp_path):
    run_cli(code_corpus, "-o", tmp_path / "w1")
    run_cli(code_corpus, "-o", tmp_path / "w2", "--workers", "2")
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2")


def assert_sigkill_then_rerun_matches(corpus, tmp_path):
    """Run ``corpus`` in 6 shards once uninterrupted; run it again, kill -9 it once the second
    shard is complete, rerun the same command: the output must be byte-identical."""
    args = [sys.executable, "-m", "ast_t5_preprocess", "run", str(corpus), *SMALL, "--num-shards", "6"]
    subprocess.run(args + ["-o", str(tmp_path / "ref")], check=True, capture_output=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen(args + ["-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(out / "shards" / "shard-00001-of-00006" / "shard.json"):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(out / "manifest.json"), "killed too late to test resuming"
    subprocess.run(args + ["-o", str(out)], check=True, capture_output=True)
    assert tree_digest(out) == tree_digest(tmp_path / "ref")


def test_resume_after_sigkill_gives_identical_output(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(os.path.join(STDLIB, "email"), corpus, ignore=shutil.ignore_patterns("__pycache__"))
    assert_sigkill_then_rerun_matches(corpus, tmp_path)


def test_fuzz_random_and_pathological_files(tmp_path):
    rng = random.Random(1234)
    corpus = tmp_path / "fuzz"
    corpus.mkdir()
    for i in range(40):
        ext = rng.choice([".py", ".java", ".c", ".js", ".rs", ".md", ".go", ".cs", ".ts"])
        (corpus / f"rand{i}{ext}").write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))))
    patho = {
        "deep.py": "x = " + "(" * 20000 + "1" + ")" * 20000 + "\n",
        "deep.js": "a = " + "[" * 5000 + "]" * 5000 + ";\n",
        "crlf.py": "def f():\r\n\treturn 1\r\n",
        "bom.py": "\ufeffprint(1)\n",
        "unicode.py": "def 变量(ñ):\n    return ñ * '🙂'\n",
        "broken.py": "def f(:\n  return [\n",
        "nul.c": "int x;\x00\n",
        "spaces.py": "\n\n    \n",
        "marker.py": "x = '\u2581'\n",
        "long.py": "x = 1\n" * 3000,
    }
    for name, text in patho.items():
        (corpus / name).write_text(text, encoding="utf-8")
    good = corpus / "good.py"
    shutil.copyfile(os.path.join(STDLIB, "textwrap.py"), good)
    out = tmp_path / "out"
    run_cli(corpus, "-o", out, "--max-line-length", "100000", "--max-mean-line-length", "100000",
            "--parse-error-policy", "flat", "--max-error-ratio", "0.5")
    manifest, total = check_outputs(str(out))
    totals = manifest["totals"]
    skipped = sum(v for k, v in totals.items() if k.startswith("skipped_"))
    assert totals["files_seen"] == 51 == totals["files_kept"] + skipped
    assert totals["skipped_unrepresentable"] == 1 and totals["skipped_binary"] >= 1
    assert manifest["languages"]["python"]["files_kept"] >= 6


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    def one_line_error(argv, text):
        assert main(argv) == 2  # the one exit code of every one-line error
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ast-t5-preprocess: error:") and text in err[0], err

    one_line_error(["run", str(tmp_path / "missing"), "-o", str(tmp_path / "o")], "input not found")
    one_line_error(["run", str(tmp_path), "-o", str(tmp_path / "o"), "--num-shards", "2", "--shard-id", "2"],
                   "--shard-id")
    one_line_error(["run", str(tmp_path), "-o", str(tmp_path / "o"), "--language", "cobol"],
                   "unknown --language 'cobol'")
    one_line_error(["run", str(tmp_path), "-o", str(tmp_path / "o"), "--vocab-size", "100"],
                   "--vocab-size must be >= 261")
    one_line_error(["run", str(tmp_path), "-o", str(tmp_path / "o"), "--vocab-size", "300",
                    "--num-sentinels", "400"], "--num-sentinels (400) must be smaller")
    one_line_error(["run", str(tmp_path), "-o", str(tmp_path / "o"), "--exclude-benchmark", "mbpp"],
                   "mbpp=PATH")
    assert not os.path.exists(tmp_path / "o")
    (tmp_path / "a.py").write_text("x = 1\n")
    rc = main(["run", str(tmp_path), "-o", str(tmp_path / "o"), "--num-shards", "2", "--shard-id", "0"])
    assert rc == 2 and "train-spm" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["run", str(tmp_path / "empty"), "-o", str(tmp_path / "o2")]) == 2
    assert "no readable source files" in capsys.readouterr().err


def test_help_documents_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "ast_t5_preprocess", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for word in ("run", "train-spm", "merge", "--shard-id"):
        assert word in out.stdout
