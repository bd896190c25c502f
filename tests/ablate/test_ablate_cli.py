"""The CPU smoke ablation end to end: two arms, one seed, through fairseq-hydra-train.

It checks the machinery, never a winner: equal training tokens (within 0.1%), identical held-out
problems, the structure of report.md / results.json / plots, resuming a killed arm and not
rerunning finished ones.
"""
import json
import os

import pytest

from tests.ablate.conftest import SPLIT_ARGS

pytestmark = pytest.mark.slow

BUDGET = 130_000  # >= 1000 x the longest segment (128 tokens), so 0.1% is reachable


def ablate(*extra):
    from ast_t5.ablate.cli import main

    return main(list(extra))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, ablation_corpus, ablation_inputs):
    out = str(tmp_path_factory.mktemp("ablation_out"))
    common = ["--recipe", "tiny", "--corpus", ablation_corpus, "--inputs", ablation_inputs,
              "-o", out, "--tokens", str(BUDGET), "--arms", "t5,ast", "--seeds", "1",
              "--problems-per-category", "6", "--random-span-problems", "6", "--curve-points", "3",
              "--finetune-updates", "8", "--device", "cpu"]
    # a "killed" first arm: stopped by updates long before its token budget
    assert ablate(*common, "--override", "optimization.max_update=12") == 2
    t5_dir = os.path.join(out, "runs", "t5", "seed1")
    assert os.path.exists(os.path.join(t5_dir, "checkpoint_last.pt"))
    assert not os.path.exists(os.path.join(t5_dir, "done.json"))
    assert ablate(*common) == 0  # resumes t5 from update 12, trains ast, evaluates, reports
    return out, common


def test_report_structure_and_equal_tokens(smoke_run):
    out, _ = smoke_run
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    assert [a["name"] for a in res["arms"]] == ["t5", "ast"]
    assert res["tokens_equal_within_tolerance"] is True
    tokens = [r["tokens"] for r in res["training"].values()]
    assert all(abs(t - BUDGET) <= 0.001 * BUDGET for t in tokens)
    assert max(tokens) - min(tokens) <= 0.002 * BUDGET
    assert {r["updates"] for r in res["training"].values()} != {0}
    # the same held-out problems for every arm, scored per problem
    n = res["problems"]["subtree"]
    assert n > 0 and res["problems"]["random_span"] > 0 and res["problems"]["downstream_test"] > 0
    for row in res["infilling"].values():
        for arm in ("t5", "ast"):
            for metric in ("exact", "token_acc"):
                cell = row[arm][metric]
                assert cell["ci"][0] <= cell["mean"] <= cell["ci"][1]
    assert {"subtree: function body", "subtree: statement", "subtree: all",
            "random spans: all"} <= set(res["infilling"])
    for arm in ("t5", "ast"):
        curve = res["curves"][arm]["1"]
        assert len(curve) >= 2 and curve[-1]["tokens"] == res["training"][f"{arm}|1"]["tokens"]
        assert all(k in curve[-1] for k in ("valid_loss_ast", "valid_loss_t5"))
        for metric in ("exact", "bleu", "chrf"):
            assert metric in res["downstream"][arm]
    assert res["verdicts"] and all(isinstance(v["tie"], bool) for v in res["verdicts"])
    for png in ("valid_curves.png", "infilling.png"):
        with open(os.path.join(out, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
        report = f.read()
    for heading in ("## Arms and training tokens", "## Validation loss", "## Infilling on held-out code",
                    "## Downstream", "## Verdict", "valid_curves.png"):
        assert heading in report
    assert f"{BUDGET:,}" in report and "tokens consumed" in report
    # intermediate checkpoints are removed once the curves are computed
    assert sorted(f for f in os.listdir(os.path.join(out, "runs", "ast", "seed1"))
                  if f.endswith(".pt")) == ["checkpoint_last.pt"]


def test_killed_arm_resumed_its_token_count(smoke_run):
    out, _ = smoke_run
    with open(os.path.join(out, "runs", "t5", "seed1", "train.log"), encoding="utf-8") as f:
        log = f.read()
    assert "resumed token budget at update 12" in log


def test_finished_arms_are_not_rerun(smoke_run):
    out, common = smoke_run
    logs = [os.path.join(out, "runs", a, "seed1", "train.log") for a in ("t5", "ast")]
    sizes = [os.path.getsize(p) for p in logs]
    assert ablate(*common) == 0
    assert [os.path.getsize(p) for p in logs] == sizes
    # a changed setting is refused, not silently mixed with finished arms
    assert ablate(*common, "--override", "optimization.lr=[0.01]") == 2


def test_bad_requests_fail_with_one_line(ablation_corpus, tmp_path, capsys):
    base = ["--corpus", ablation_corpus, "-o", str(tmp_path / "o")]
    assert ablate(*base, "--arms", "bert") == 2
    assert ablate(*base, "--arms", "ast", "--tokens", "1000") == 2
    assert "too small" in capsys.readouterr().err
    assert ablate(*base, "--arms", "t5", "--tokens", "200000") == 2  # no fixed corpus, no inputs
    assert "--fixed-corpus" in capsys.readouterr().err


def test_fixed_segmenter_cuts_the_same_files_at_fixed_lengths(ablation_corpus, ablation_inputs, tmp_path):
    import numpy as np
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from ast_t5.ablate.cli import compare_corpora
    from ast_t5_preprocess.cli import main

    out = str(tmp_path / "fixed")
    assert main(["run", ablation_inputs, "-o", out, "--spm-model",
                 os.path.join(ablation_corpus, "spm.model"), "--num-sentinels", "32",
                 "--segmenter", "fixed", "--no-progress", *SPLIT_ARGS]) == 0
    compare_corpora(ablation_corpus, out)  # same tokenizer, same files per split
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        assert json.load(f)["options"]["segmenter"] == "fixed"
    full = []
    for d in (ablation_corpus, out):
        ds = MMapIndexedDataset(os.path.join(d, "python", "train"))
        sizes = np.array(ds.sizes, copy=True)
        full.append((int((sizes == 128).sum()), len(sizes), int(sizes.sum() - len(sizes))))
        del ds
    (ast_full, ast_n, ast_tok), (fix_full, fix_n, fix_tok) = full
    assert ast_tok == fix_tok  # the same content tokens, cut elsewhere
    assert fix_full > ast_full and fix_n < ast_n  # fixed cuts fill every segment but the last
