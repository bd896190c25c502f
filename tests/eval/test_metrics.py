"""ast_t5.eval.metrics: exact match normalization, BLEU against sacrebleu, tokenizers."""
import pytest
from sacrebleu.metrics import BLEU

from ast_t5.eval.metrics import (code_tokenize, corpus_bleu, exact_match, normalize_for_match,
                                 read_lines, text_metrics)
from ast_t5.eval.tasks import EvalInputError

HYPS = ["int x = a + b ;", "return  foo(bar)", "print ( 1 )", "a_b = c"]
REFS = ["int x = a + b ;", "return foo(bar)", "print ( 2 )", "a_b = d"]


def test_exact_match_normalization():
    assert normalize_for_match("  a \t b\n") == "a b"
    assert exact_match(HYPS, [REFS]) == 50.0  # whitespace-collapsed: first two match
    assert exact_match(HYPS, [REFS], normalization="none") == 25.0
    assert exact_match(HYPS, [REFS, ["x", "y", "print ( 1 )", "z"]]) == 75.0  # any reference
    with pytest.raises(EvalInputError):
        normalize_for_match("a", "lowercase")


def test_code_tokenizer_keeps_identifiers():
    assert code_tokenize("my_var=foo(x,1.5)") == "my_var = foo ( x , 1 . 5 )"


def test_bleu_matches_sacrebleu():
    ours = corpus_bleu(HYPS, [REFS], tokenize="13a")
    direct = BLEU(tokenize="13a").corpus_score(HYPS, [REFS]).score
    assert ours["bleu"] == pytest.approx(direct)
    assert "tok:13a" in ours["bleu_signature"]
    code = corpus_bleu(HYPS, [REFS])
    expected = BLEU(tokenize="none").corpus_score([code_tokenize(h) for h in HYPS],
                                                 [[code_tokenize(r) for r in REFS]]).score
    assert code["bleu"] == pytest.approx(expected) and "tok:code" in code["bleu_signature"]
    assert corpus_bleu(REFS, [REFS])["bleu"] == pytest.approx(100.0)
    assert corpus_bleu(HYPS, [REFS])["bleu"] < 100.0


def test_mismatched_or_bad_input():
    with pytest.raises(EvalInputError, match="lines"):
        exact_match(HYPS, [REFS[:2]])
    with pytest.raises(EvalInputError):
        corpus_bleu([], [[]])
    with pytest.raises(EvalInputError, match="tokenizer"):
        corpus_bleu(HYPS, [REFS], tokenize="no-such-tokenizer")


def test_text_metrics_and_read_lines(tmp_path):
    path = tmp_path / "h.txt"
    path.write_text("a b\n\nc\n")
    assert read_lines(str(path)) == ["a b", "", "c"]
    scores = text_metrics(["a b", "", "c"], [["a  b", "", "d"]])
    assert scores["examples"] == 3 and scores["exact_match"] == pytest.approx(200 / 3)
    with pytest.raises(EvalInputError, match="no such file"):
        read_lines(str(tmp_path / "missing.txt"))
