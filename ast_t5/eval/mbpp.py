"""MBPP-format benchmarks from a user-supplied JSONL file (reference spec section 11.2).

One JSON object per line, with the fields of MBPP (Austin et al., 2021) and its sanitized
variant:

* ``prompt`` (sanitized) or ``text`` (original): the task description (required);
* ``test_list``: list of test statements, e.g. ``"assert add(1, 2) == 3"`` (required, non-empty);
* ``task_id``: any JSON value, compared as a string (default: the record's 0-based index);
* ``test_setup_code``: code run before the program (optional);
* ``test_imports``: list of import statements the tests need (optional);
* ``code``: the reference solution (optional). Never executed; only its signature is used, by
  the ``ast_t5`` prompt style.

Prompt styles (`build_mbpp_tasks`):

* ``ast_t5`` (spec 11.2): the reference solution's function whose name is called in the first
  test, with its body replaced by a docstring: the description, then every test rendered as
  ``>>> call`` and the expected value (``True``/``False`` for a bare or negated call), unparsed
  with ``ast.unparse`` (the original used astunparse, which writes the docstring as one quoted
  line), then ``"\\n    "`` and the sentinel. The model fills in the body; postprocess.AST_T5_BODY.
  A record without usable ``code`` falls back to ``plain``; fallbacks are counted and logged.
* ``plain``: the description and the tests in a module docstring; the completion is the whole
  solution (postprocess.MBPP_PLAIN).

Executed program: ``test_setup_code``, ``test_imports``, the prompt without the sentinel, the
completion, then the tests. Unlike the original (B-24), the tests' imports are executed, so a
test such as ``assert math.isclose(...)`` can pass; the reference code's own imports are not.
"""
import ast
import logging
from typing import List, Optional, Tuple

from .jsonl_io import read_jsonl
from .postprocess import AST_T5_BODY, BODY_INDENT, MBPP_PLAIN
from .tasks import DEFAULT_SENTINEL, EvalInputError, Task

logger = logging.getLogger(__name__)

DESCRIPTION_FIELDS = ("prompt", "text")  # sanitized MBPP, then original MBPP


def load_mbpp(path: str) -> List[dict]:
    """Validated records of an MBPP-format JSONL file, in file order."""
    records = read_jsonl(path)
    if not records:
        raise EvalInputError(f"{path}: no records")
    seen = set()
    for index, record in enumerate(records):
        where = f"{path}: record {index}"
        if not any(isinstance(record.get(name), str) for name in DESCRIPTION_FIELDS):
            raise EvalInputError(f"{where}: needs a 'prompt' or 'text' string")
        tests = record.get("test_list")
        if not (isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
            raise EvalInputError(f"{where}: 'test_list' must be a non-empty list of strings")
        imports = record.get("test_imports", [])
        if not (isinstance(imports, list) and all(isinstance(line, str) for line in imports)):
            raise EvalInputError(f"{where}: 'test_imports' must be a list of strings")
        for name in ("test_setup_code", "code"):
            if not isinstance(record.get(name, ""), str):
                raise EvalInputError(f"{where}: '{name}' must be a string")
        task_id = str(record.get("task_id", index))
        if task_id in seen:
            raise EvalInputError(f"{where}: duplicate task_id {task_id!r}")
        seen.add(task_id)
    logger.info("loaded %d MBPP-format tasks from %s", len(records), path)
    return records


def render_doctest(test: str) -> str:
    """``assert f(x) == y`` -> ``>>> f(x)`` / ``y``; bare call -> True; ``not`` call -> False."""
    try:
        node = ast.parse(test.strip()).body[0]
    except (SyntaxError, IndexError):
        return ">>> " + test.strip()
    expr = node.test if isinstance(node, ast.Assert) else getattr(node, "value", None)
    if expr is None:
        return ">>> " + test.strip()
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq):
        return f">>> {ast.unparse(expr.left)}\n{ast.unparse(expr.comparators[0])}"
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return f">>> {ast.unparse(expr.operand)}\nFalse"
    return f">>> {ast.unparse(expr)}\nTrue"


def _called_names(test: str) -> List[str]:
    """Names of plain function calls in `test`, outermost first."""
    try:
        tree = ast.parse(test.strip())
    except SyntaxError:
        return []
    return [node.func.id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]


def signature_prompt(code: str, description: str, tests: List[str]) -> Optional[str]:
    """The tested function of `code` with a doctest docstring as its body; None if not found."""
    try:
        module = ast.parse(code)
    except SyntaxError:
        return None
    functions = {node.name: node for node in module.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    name = next((name for name in _called_names(tests[0]) if name in functions), None)
    if name is None:
        return None
    function = functions[name]
    lines = [description.strip()] + [render_doctest(test) for test in tests]
    docstring = "\n".join(lines).replace("\n", "\n" + BODY_INDENT) + "\n" + BODY_INDENT
    function.body = [ast.Expr(ast.Constant(docstring))]
    function.decorator_list = []
    return ast.unparse(function)


def plain_prompt(description: str, tests: List[str]) -> str:
    """The description and the tests in a module docstring."""
    return '"""\n' + description.strip() + "\n" + "\n".join(tests) + '\n"""\n'


def mbpp_task(record: dict, index: int, style: str,
              sentinel: str = DEFAULT_SENTINEL) -> Tuple[Task, bool]:
    """The Task for one record, and whether the ``ast_t5`` style had to fall back to ``plain``."""
    if style not in ("ast_t5", "plain"):
        raise EvalInputError(f"unknown prompt style {style!r}")
    description = next(record[f] for f in DESCRIPTION_FIELDS if isinstance(record.get(f), str))
    tests = record["test_list"]
    header = "".join(
        part + "\n" for part in [record.get("test_setup_code", "")] + record.get("test_imports", [])
        if part.strip()
    )
    suffix = "\n".join(tests) + "\n"
    task_id = str(record.get("task_id", index))
    signature = None
    if style == "ast_t5" and record.get("code"):
        signature = signature_prompt(record["code"], description, tests)
    if signature is not None:
        prompt = signature + "\n" + BODY_INDENT + sentinel
        entry_point = ast.parse(signature).body[0].name
        return Task(task_id, prompt, header + signature + "\n", suffix, AST_T5_BODY,
                    (entry_point,)), False
    prompt = plain_prompt(description, tests)
    return Task(task_id, prompt, header + prompt, suffix, MBPP_PLAIN), style == "ast_t5"


def build_mbpp_tasks(records: List[dict], style: str,
                     sentinel: str = DEFAULT_SENTINEL) -> List[Task]:
    """Tasks for `records`, in order; logs how many fell back to the plain style."""
    tasks, fallbacks = [], 0
    for index, record in enumerate(records):
        task, fell_back = mbpp_task(record, index, style, sentinel)
        tasks.append(task)
        fallbacks += fell_back
    if fallbacks:
        logger.warning("%d of %d tasks have no usable 'code' signature: plain prompts used",
                       fallbacks, len(records))
    return tasks
