"""The benchmark-independent unit of evaluation: a prompt plus the program around a completion.

A `Task` knows what the completion source sees (`prompt`), what the completion is placed
between when it is executed (`prefix`, `suffix`), and how a raw completion is cleaned first
(`postprocess`). HumanEval and MBPP-format benchmarks both produce Tasks (humaneval.py, mbpp.py).
"""
from dataclasses import dataclass
from typing import Tuple

from ..data.sentinels import SENTINEL_FORMAT
from .postprocess import PostprocessConfig, postprocess_completion

PROMPT_STYLES = ("ast_t5", "plain")  # see humaneval.py and mbpp.py for what each one builds
DEFAULT_PROMPT_STYLE = "ast_t5"
# The first span's sentinel marks the code to fill in (spec 11.1/11.2). This project names it
# <extra_id_0> (ast_t5.data.sentinels); the original checkpoints used <sen001> (--sentinel).
DEFAULT_SENTINEL = SENTINEL_FORMAT.format(0)


class EvalInputError(ValueError):
    """Bad user input (file, field, option); the CLI prints it as a one-line error."""


@dataclass(frozen=True)
class Task:
    """One problem: program = prefix + postprocess(completion) + "\\n" + suffix.

    In the sandbox the program runs without the suffix (`candidate_program`), and the suffix, the
    tests, runs in a separate judge process after the (trusted) `prefix`, calling the program's
    `entry_points` and any other name the tests use that neither the prefix nor the tests define
    (ast_t5.eval.sandbox.Sandbox.run_tests).
    """

    task_id: str
    prompt: str  # what the model (or whoever writes the completions) sees
    prefix: str  # executed before the completion
    suffix: str  # executed after it: the tests, and the call that runs them
    postprocess: PostprocessConfig
    entry_points: Tuple[str, ...] = ()  # functions the tests always take from the program

    def clean(self, completion: str) -> str:
        """The completion as it will be executed."""
        return postprocess_completion(completion, self.postprocess)

    def program(self, cleaned_completion: str) -> str:
        """The full program for an already cleaned completion (see `clean`)."""
        return self.candidate_program(cleaned_completion) + self.suffix

    def candidate_program(self, cleaned_completion: str) -> str:
        """What runs inside the sandbox: the program without its tests."""
        return self.prefix + cleaned_completion + "\n"
