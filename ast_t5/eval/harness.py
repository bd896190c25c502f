"""Execute completions against their tests in the sandbox, in parallel, and score them.

`evaluate` runs every (task, sample) program through a `Sandbox` on a bounded thread pool (each
thread only waits on its child process) and returns results in a deterministic order: tasks in
benchmark order, samples in the order given. `summarize` turns them into pass@k scores, status
counts and the isolation mechanisms that were active in every run.
"""
import logging
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

from tqdm import tqdm

from .passk import pass_at_k_table
from .sandbox import FAILED, PASSED, TIMED_OUT, Sandbox
from .tasks import Task

logger = logging.getLogger(__name__)

SCORE_DIGITS = 4  # decimals shown in the summary table
STATUSES = (PASSED, FAILED, TIMED_OUT)


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


def evaluate(tasks: Sequence[Task], completions: Mapping[str, Sequence[str]], sandbox: Sandbox,
             workers: int, progress: bool = True) -> List[SampleResult]:
    """Run every completion of every task; results ordered by task, then sample."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    jobs = [(task, index, completion) for task in tasks
            for index, completion in enumerate(completions[task.task_id])]
    results: List[SampleResult] = [None] * len(jobs)  # type: ignore[list-item]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_one, sandbox, *job): position
                   for position, job in enumerate(jobs)}
        for future in tqdm(as_completed(futures), total=len(futures), desc="executing",
                           unit="program", disable=not progress):
            results[futures[future]] = future.result()
    return results


def summarize(benchmark: str, tasks: Sequence[Task], results: Sequence[SampleResult],
              ks: Sequence[int]) -> Dict[str, object]:
    """Scores and counts for `results` (as returned by `evaluate` for `tasks`)."""
    per_task = {task.task_id: [0, 0] for task in tasks}  # task id -> [samples, passed]
    for result in results:
        per_task[result.task_id][0] += 1
        per_task[result.task_id][1] += result.passed
    counts = [(n, c) for n, c in per_task.values()]
    sizes = sorted({n for n, _ in counts})
    isolation = set(results[0].isolation) if results else set()
    for result in results:
        isolation &= set(result.isolation)
    summary: Dict[str, object] = {
        "benchmark": benchmark,
        "tasks": len(tasks),
        "samples": len(results),
        "samples_per_task": sizes[0] if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}",
    }
    summary.update(pass_at_k_table(counts, ks))
    summary["tasks_solved"] = sum(1 for _, c in counts if c)
    summary["status"] = {status: sum(r.status == status for r in results) for status in STATUSES}
    ordered = results[0].isolation if results else ()
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
