"""Exact match and BLEU for code generation tasks (DESIGN.md section 1), both in percent.

* `exact_match`: share of hypotheses equal to one of their references after normalization.
  ``"whitespace"`` (default) strips both ends and collapses every run of whitespace to one space,
  i.e. it compares whitespace-separated token sequences, the CodeXGLUE convention
  (``hyp.split() == ref.split()``); ``"none"`` compares the strings as they are.
* `corpus_bleu`: sacrebleu's corpus BLEU (Post, 2018: 4-gram, brevity penalty, exponential
  smoothing), with the tokenizer chosen by name. ``"code"`` (default) is ours: identifiers and
  numbers (``\\w+``) stay whole and every other non-space character is its own token, then
  sacrebleu runs with ``tokenize="none"``. sacrebleu's ``"13a"`` would split identifiers at
  underscores (``my_var`` -> ``my _ var``), which inflates n-gram matches on code. Use ``"none"``
  for text that is already tokenized (e.g. CodeXGLUE's space-separated files); any other sacrebleu
  tokenizer name (``"13a"``, ``"intl"``, ``"char"``) is passed through.
* CodeBLEU is not provided: the PyPI ``codebleu`` package (0.7.0) requires tree-sitter < 0.23,
  which conflicts with this project's tree-sitter 0.26 pin.
"""
import logging
import re
from typing import Dict, List, Sequence

from sacrebleu.metrics import BLEU

from .tasks import EvalInputError

logger = logging.getLogger(__name__)

CODE_TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]")  # our "code" tokenizer, see the module docstring
CODE_TOKENIZER = "code"
EM_NORMALIZATIONS = ("whitespace", "none")
PERCENT = 100.0


def normalize_for_match(text: str, normalization: str = "whitespace") -> str:
    """`text` as exact match compares it."""
    if normalization == "whitespace":
        return " ".join(text.split())
    if normalization == "none":
        return text
    raise EvalInputError(f"unknown exact-match normalization {normalization!r}")


def _check_streams(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
    if not references:
        raise EvalInputError("at least one reference stream is needed")
    for index, stream in enumerate(references):
        if len(stream) != len(hypotheses):
            raise EvalInputError(
                f"reference stream {index} has {len(stream)} lines, "
                f"hypotheses have {len(hypotheses)}"
            )
    if not hypotheses:
        raise EvalInputError("no hypotheses")


def exact_match(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                normalization: str = "whitespace") -> float:
    """Percentage of hypotheses equal to any of their references.

    Args:
        hypotheses: one string per example.
        references: one or more reference streams, each with one string per example.
        normalization: "whitespace" or "none" (see the module docstring).
    """
    _check_streams(hypotheses, references)
    hits = 0
    for index, hypothesis in enumerate(hypotheses):
        target = normalize_for_match(hypothesis, normalization)
        hits += any(normalize_for_match(stream[index], normalization) == target
                    for stream in references)
    return PERCENT * hits / len(hypotheses)


def code_tokenize(text: str) -> str:
    """Space-separated tokens: words/numbers whole, every other non-space character alone."""
    return " ".join(CODE_TOKEN_PATTERN.findall(text))


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                tokenize: str = CODE_TOKENIZER) -> Dict[str, object]:
    """Corpus BLEU; returns ``{"bleu": score, "bleu_signature": sacrebleu signature}``."""
    _check_streams(hypotheses, references)
    if tokenize == CODE_TOKENIZER:
        hypotheses = [code_tokenize(text) for text in hypotheses]
        references = [[code_tokenize(text) for text in stream] for stream in references]
        sacrebleu_tokenize = "none"
    else:
        sacrebleu_tokenize = tokenize
    try:
        bleu = BLEU(tokenize=sacrebleu_tokenize)
    except KeyError:  # sacrebleu's answer to an unknown tokenizer name
        raise EvalInputError(f"unknown BLEU tokenizer {tokenize!r}") from None
    score = bleu.corpus_score(list(hypotheses), [list(stream) for stream in references])
    signature = str(bleu.get_signature()).replace(f"tok:{sacrebleu_tokenize}", f"tok:{tokenize}")
    return {"bleu": score.score, "bleu_signature": signature}


def text_metrics(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                 tokenize: str = CODE_TOKENIZER,
                 normalization: str = "whitespace") -> Dict[str, object]:
    """Exact match and BLEU together, with the example count."""
    result: Dict[str, object] = {
        "examples": len(hypotheses),
        "exact_match": exact_match(hypotheses, references, normalization),
    }
    result.update(corpus_bleu(hypotheses, references, tokenize))
    return result


def read_lines(path: str) -> List[str]:
    """One example per line (newlines inside an example must be escaped by the producer)."""
    try:
        with open(path, encoding="utf-8", newline="\n") as handle:
            return [line[:-1] if line.endswith("\n") else line for line in handle]
    except FileNotFoundError:
        raise EvalInputError(f"{path}: no such file") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise EvalInputError(f"{path}: cannot read: {exc}") from None
