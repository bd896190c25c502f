"""Arms, the token-budget selection, intervals and the verdict rule, and the held-out problems."""
import numpy as np
import pytest
import torch

from ast_t5.ablate import problems, stats
from ast_t5.ablate.arms import ArmError, parse_arm, parse_arms
from ast_t5.tasks.token_budget import TokenBudget, select_items, subset_sample


def test_builtin_arms_differ_only_in_segmentation_and_objective():
    t5, seg, ast = parse_arms(["t5", "t5+seg", "ast"])
    assert (t5.corpus, t5.objective) == ("fixed", "t5")
    assert (seg.corpus, seg.objective) == ("ast", "t5")
    assert (ast.corpus, ast.objective) == ("ast", "ast")
    assert "++task.noise_density=0.25" in t5.task_overrides()
    assert "++task.mask_prob=0.25" in ast.task_overrides()


def test_ratio_and_user_arms():
    a = parse_arm("ast@0.15")
    assert a.mask_ratio == 0.15 and "++task.mask_prob=0.15" in a.task_overrides()
    u = parse_arm("noobf=ast:task.obfuscation_prob=0,task.threshold_lb=3")
    assert u.name == "noobf" and u.overrides == ("task.obfuscation_prob=0", "task.threshold_lb=3")
    for bad in ("bert", "ast@x", "ast@1.5", "x=ast:novalue"):
        with pytest.raises(ArmError):
            parse_arm(bad)
    with pytest.raises(ArmError):
        parse_arms(["ast", "ast"])


@pytest.mark.parametrize("seed", range(20))
def test_select_items_lands_within_tolerance(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 129, rng.integers(1, 40))
    remaining = int(rng.integers(1, int(sizes.sum()) + 50))
    tol = 128  # >= the longest item, as ast-t5-ablate requires
    keep = select_items(sizes, remaining, tol)
    taken = int(sizes[keep].sum())
    assert taken <= remaining + tol
    if sizes.sum() <= remaining + tol:
        assert keep.all()
    else:
        assert abs(remaining - taken) <= tol


def test_subset_sample_keeps_batch_layout():
    pad = 1
    sample = {"id": torch.tensor([5, 6, 7]), "nsentences": 3, "ntokens": 9,
              "net_input": {"src_tokens": torch.tensor([[4, 2, 1], [4, 4, 2], [2, 1, 1]]),
                            "src_lengths": torch.tensor([2, 3, 1]),
                            "prev_output_tokens": torch.tensor([[2, 9, 1], [2, 9, 9], [2, 1, 1]])},
              "target": torch.tensor([[9, 2, 1], [9, 9, 2], [2, 1, 1]]),
              "language": torch.tensor([0, 1, 0])}
    out = subset_sample(sample, np.array([True, False, True]), pad)
    assert out["id"].tolist() == [5, 7] and out["language"].tolist() == [0, 0]
    assert out["net_input"]["src_lengths"].tolist() == [2, 1]
    assert out["nsentences"] == 2 and out["ntokens"] == 3


def test_token_budget_done_within_tolerance():
    b = TokenBudget(1000, 10)
    b.tokens = 989
    assert not b.done
    b.tokens = 990
    assert b.done and b.state()["train_tokens"] == 990


def test_bootstrap_interval_covers_the_mean_and_is_seeded():
    v = np.random.default_rng(0).random(200)
    m, lo, hi = stats.bootstrap_ci(v, 3)
    assert lo < m < hi and stats.bootstrap_ci(v, 3) == (m, lo, hi)
    assert stats.bootstrap_ci([1.0] * 10, 0) == (1.0, 1.0, 1.0)


def test_verdict_calls_a_difference_inside_the_seed_spread_a_tie():
    paired = (0.05, 0.01, 0.09)  # the paired interval alone would say "a wins"
    v = stats.verdict("a", "b", "em", [0.50, 0.60], [0.48, 0.52], paired)
    assert v["tie"] and "seed spread" in v["text"]
    w = stats.verdict("a", "b", "em", [0.70, 0.71], [0.48, 0.50], paired)
    assert not w["tie"] and w["better"] == "a"
    z = stats.verdict("a", "b", "em", [0.7], [0.5], (0.2, -0.01, 0.4))
    assert z["tie"] and "contains 0" in z["text"]
    lower = stats.verdict("a", "b", "loss", [2.0], [3.0], (-1.0, -1.2, -0.8), higher_is_better=False)
    assert lower["better"] == "a"
    unknown = stats.verdict("a", "b", "loss", [2.0], [3.0], (float("nan"),) * 3)
    assert unknown["tie"]


def test_ratio_ci_and_paired_difference():
    nll, tok = [10.0, 20.0, 30.0, 40.0], [5, 10, 15, 20]
    m, lo, hi = stats.ratio_ci(nll, tok, 0)
    assert m == 2.0 and lo == hi == 2.0
    d, dlo, dhi = stats.paired_ratio_difference([11.0, 22.0, 33.0, 44.0], nll, tok, 0)
    assert abs(d - 0.2) < 1e-12 and dlo > 0


@pytest.mark.parametrize("name,parent,lang,expected", [
    ("identifier", "call", "python", "identifier/expression"),
    ("call", "expression_statement", "python", "identifier/expression"),
    ("return_statement", "block", "python", "statement"),
    ("block", "function_definition", "python", "function body"),
    ("block", "if_statement", "python", "block"),
    ("block", "method_declaration", "java", "function body"),
    ("compound_statement", "function_definition", "c", "function body"),
    ("local_variable_declaration", "block", "java", "statement"),
    ("function_definition", "module", "python", None),
    ("string", "expression_statement", "python", None),
])
def test_node_category(name, parent, lang, expected):
    assert problems.node_category(name, parent, lang) == expected


def test_subtree_problems_are_deterministic_and_reconstruct_the_segment(ablation_corpus):
    from ast_t5.tasks.ast_t5_pretraining import load_dictionary

    _, sentinels = load_dictionary(ablation_corpus)
    a = problems.subtree_problems(ablation_corpus, sentinels, 0, 5, 32)
    b = problems.subtree_problems(ablation_corpus, sentinels, 0, 5, 32)
    c = problems.subtree_problems(ablation_corpus, sentinels, 1, 5, 32)
    assert [p.to_json() for p in a] == [p.to_json() for p in b]
    assert [p.to_json() for p in a] != [p.to_json() for p in c]
    assert set(problems.CATEGORIES) <= {p.category for p in a}
    tokens, _ = problems.load_split(ablation_corpus, "python", "test")
    hole = int(sentinels.sentinel_id(0))
    for p in a:
        if p.language != "python":
            continue
        k = p.source.index(hole)
        span = p.target[1:-1]
        assert p.target[0] == hole and p.target[-1] == sentinels.eos and 1 <= len(span) <= 32
        assert p.source[:k] + span + p.source[k + 1:] == tokens[p.segment].tolist()


def test_docstring_functions_parse_and_split_at_the_docstring(ablation_corpus):
    import ast as python_ast

    from ast_t5.data.text_codec import TextCodec

    codec = TextCodec.from_dir(ablation_corpus)
    rows = problems.docstring_functions(ablation_corpus, "test", codec, 50, 64, 0)
    assert rows
    for r in rows:
        fn = python_ast.parse(__import__("textwrap").dedent(r["source"] + r["target"])).body[0]
        assert python_ast.get_docstring(fn) is not None
        assert r["target"].strip() and '"""' not in r["target"].split("\n")[0]


def test_cli_arm_list_keeps_user_overrides_together():
    from ast_t5.ablate.cli import build_parser, resolve

    args = resolve(build_parser().parse_args(
        ["--corpus", "c", "-o", "o", "--arms", "t5,noobf=ast:task.obfuscation_prob=0,task.threshold_lb=3,ast@0.15",
         "--arm", "x=t5+seg:task.mean_span_length=5,task.noise_density=0.3"]))
    assert [a.name for a in args.arm_list] == ["t5", "noobf", "ast@0.15", "x"]
    assert args.arm_list[1].overrides == ("task.obfuscation_prob=0", "task.threshold_lb=3")
    assert args.arm_list[3].overrides == ("task.mean_span_length=5", "task.noise_density=0.3")
    assert args.tokens == 300_000 and args.seed_list == [1]  # the tiny recipe's defaults


def test_default_config_folders_are_found_from_any_directory(tmp_path):
    """`ast-t5-ablate` run outside the checkout (an installed package) finds the recipes: the
    folders come from the installed configs, not from a path relative to the package's files."""
    import os
    import subprocess
    import sys

    code = ("import os; from ast_t5.ablate.train import repo_config_dir; "
            "print(all(os.path.isfile(os.path.join(repo_config_dir(k), n)) "
            "for k, n in (('pretrain', 'tiny.yaml'), ('finetune', 'concode.yaml'))))")
    # from another directory, with the environment as given: in CI (an installed package, no
    # PYTHONPATH) the package's files are not in the checkout, which is what failed before
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
