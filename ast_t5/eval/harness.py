"""Execute completions against their tests in the sandbox, in parallel, and score them.

`evaluate` runs every (task, sample) program through a `Sandbox` on a bounded thread pool (each
thread only waits on its child process) and returns results in a deterministic order: tasks in
benchmark order, samples in the order given. A run that the sandbox itself cannot carry out
(an exception in the evaluator, e.g. no memory to start a process) is retried once, then
recorded with status SANDBOX_ERROR; the other results are kept. `on_result` sees every result as
it finishes (the CLI writes them out incrementally). `summarize` turns them into pass@k scores,
status counts and the isolation mechanisms that were active in every run.
"""
import logging
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tqdm import tqdm

from .passk import pass_at_k_table
from .sandbox import FAILED, PASSED, TIMED_OUT, Sandbox
from .tasks import Task

logger = logging.getLogger(__name__)

SCORE_DIGITS = 4  # decimals shown in the summary table
SANDBOX_ERROR = "sandbox error"  # the evaluator could not run the sample (never a pass)
STATUSES = (PASSED, FAILED, TIMED_OUT, SANDBOX_ERROR)
RUN_ATTEMPTS = 2  # a sandbox run that raises is retried once


@dataclass(frozen=True)
class SampleResult:
    """How one completion of one task fared."""

    task_id: str
    sample_index: int
    status: str
    detail: str
    elapsed_s: float
    completion: str  # as received
    cleaned_completion: str  # as executed, after post-processing
    isolation: Tuple[str, ...]

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def to_record(self) -> dict:
        """The JSON record written to --output (isolation goes to the summary instead)."""
        record = asdict(self)
        del record["isolation"]
        record["passed"] = self.passed
        return record


def _run_one(sandbox: Sandbox, task: Task, sample_index: int, completion: str) -> SampleResult:
    cleaned = task.clean(completion)
    result = sandbox.run_tests(task.candidate_program(cleaned), task.suffix, trusted=task.prefix,
                               entry_points=task.entry_points)
    return SampleResult(task.task_id, sample_index, result.status, result.detail,
                        round(result.elapsed_s, 3), completion, cleaned, result.isolation)


def _run_guarded(sandbox: Sandbox, task: Task, sample_index: int,
                 completion: str) -> SampleResult:
    error: Exception = RuntimeError("no attempt")
    for attempt in range(1, RUN_ATTEMPTS + 1):
        try:
            return _run_one(sandbox, task, sample_index, completion)
        except Exception as exc:  # noqa: B902  (the evaluator's own failure: keep going)
            error = exc
            logger.warning("%s sample %d: the sandbox failed (%s: %s), attempt %d of %d",
                           task.task_id, sample_index, type(exc).__name__, exc, attempt,
                           RUN_ATTEMPTS)
    try:
        cleaned = task.clean(completion)
    except Exception:  # noqa: B902
        cleaned = ""
    return SampleResult(task.task_id, sample_index, SANDBOX_ERROR,
                        f"the sandbox could not run this sample: {type(error).__name__}: {error}",
                        0.0, completion, cleaned, ())


def evaluate(tasks: Sequence[Task], completions: Mapping[str, Sequence[str]], sandbox: Sandbox,
             workers: int, progress: bool = True,
             on_result: Optional[Callable[[SampleResult], None]] = None) -> List[SampleResult]:
    """Run every completion of every task; results ordered by task, then sample."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    jobs = [(task, index, completion) for task in tasks
            for index, completion in enumerate(completions[task.task_id])]
    results: List[SampleResult] = [None] * len(jobs)  # type: ignore[list-item]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_guarded, sandbox, *job): position
                   for position, job in enumerate(jobs)}
        for future in tqdm(as_completed(futures), total=len(futures), desc="executing",
                           unit="program", disable=not progress):
            results[futures[future]] = result = future.result()
            if on_result is not None:
                on_result(result)
    return results


def summarize(benchmark: str, tasks: Sequence[Task], results: Sequence[SampleResult],
              ks: Sequence[int], warn_skipped_k: bool = True) -> Dict[str, object]:
    """Scores and counts for `results` (as returned by `evaluate` for `tasks`).

    `warn_skipped_k`: warn about each k larger than the samples per task (off when `ks` is the
    default list rather than the user's choice).
    """
    per_task = {task.task_id: [0, 0] for task in tasks}  # task id -> [samples, passed]
    for result in results:
        per_task[result.task_id][0] += 1
        per_task[result.task_id][1] += result.passed
    counts = [(n, c) for n, c in per_task.values()]
    sizes = sorted({n for n, _ in counts})
    ran = [result for result in results if result.status != SANDBOX_ERROR]
    isolation = set(ran[0].isolation) if ran else set()
    for result in ran:
        isolation &= set(result.isolation)
    summary: Dict[str, object] = {
        "benchmark": benchmark,
        "tasks": len(tasks),
        "samples": len(results),
        "samples_per_task": sizes[0] if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}",
    }
    summary.update(pass_at_k_table(counts, ks, warn=warn_skipped_k))
    summary["tasks_solved"] = sum(1 for _, c in counts if c)
    summary["status"] = {status: sum(r.status == status for r in results) for status in STATUSES}
    ordered = ran[0].isolation if ran else ()
    summary["isolation"] = [name for name in ordered if name in isolation]
    return summary


def format_summary(summary: Mapping[str, object]) -> str:
    """A two-column text table of `summary`."""
    rows = []
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{value:.{SCORE_DIGITS}f}"
        elif isinstance(value, dict):
            value = ", ".join(f"{name} {count}" for name, count in value.items())
        elif isinstance(value, list):
            value = ", ".join(value) if value else "-"
        rows.append((str(key), str(value)))
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)
