"""Where completions come from: a JSONL file, or a model behind a `CompletionFn`.

Contract with the generation side (``ast_t5.generate``, written separately)::

    load_completion_fn(checkpoint_dir: str, **gen_opts) -> CompletionFn
    completion_fn(prompts: List[str], num_samples: int) -> List[List[str]]

The CLI passes these ``gen_opts``: ``beam`` (int, beam size), ``sampling`` (bool), ``temperature``
(float), ``top_p`` (float), ``max_new_tokens`` (int), ``length_penalty`` (float), ``seed`` (int).
A `CompletionFn` returns, for every prompt and in the same order, exactly `num_samples` decoded
strings (sentinel strings may remain; post-processing removes them). With beam search and
num_samples > 1 the n best beams are expected; they are not an unbiased sample, so pass@k for
k > 1 should come from sampling.

A completions file has one JSON object per line, ``{"task_id": ..., "completion": "..."}``, with
as many lines per task as samples (task ids are compared as strings; order within a task is kept).
"""
import logging
from typing import Callable, Dict, List, Optional, Sequence

from tqdm import tqdm

from .jsonl_io import read_jsonl, write_jsonl_atomic
from .tasks import EvalInputError, Task

logger = logging.getLogger(__name__)

CompletionFn = Callable[[List[str], int], List[List[str]]]


def load_completions(path: str, tasks: Sequence[Task],
                     num_samples: Optional[int] = None) -> Dict[str, List[str]]:
    """Completions per task id from a JSONL file; every task needs at least one (or `num_samples`).

    Records for tasks outside `tasks` (e.g. beyond --limit) are ignored and counted in the log.
    With `num_samples`, the first `num_samples` completions of each task are used.
    """
    by_task: Dict[str, List[str]] = {task.task_id: [] for task in tasks}
    ignored = 0
    for index, record in enumerate(read_jsonl(path)):
        if "task_id" not in record or not isinstance(record.get("completion"), str):
            raise EvalInputError(
                f"{path}: record {index} needs 'task_id' and a string 'completion'")
        task_id = str(record["task_id"])
        if task_id in by_task:
            by_task[task_id].append(record["completion"])
        else:
            ignored += 1
    if ignored:
        logger.info("ignored %d completions for tasks not in this run", ignored)
    need = num_samples or 1
    short = [task_id for task_id, samples in by_task.items() if len(samples) < need]
    if short:
        raise EvalInputError(
            f"{path}: fewer than {need} completion(s) for {len(short)} of {len(by_task)} tasks "
            f"(first: {short[0]})"
        )
    if num_samples:
        by_task = {task_id: samples[:num_samples] for task_id, samples in by_task.items()}
    return by_task


def generate_completions(completion_fn: CompletionFn, tasks: Sequence[Task], num_samples: int,
                         batch_size: int, progress: bool = True) -> Dict[str, List[str]]:
    """Ask `completion_fn` for `num_samples` completions per task, `batch_size` prompts a call."""
    if num_samples < 1 or batch_size < 1:
        raise EvalInputError("num_samples and batch_size must be at least 1")
    completions: Dict[str, List[str]] = {}
    starts = range(0, len(tasks), batch_size)
    for start in tqdm(starts, desc="generating", unit="batch", disable=not progress):
        batch = tasks[start:start + batch_size]
        outputs = completion_fn([task.prompt for task in batch], num_samples)
        if len(outputs) != len(batch) or any(len(samples) != num_samples for samples in outputs):
            raise RuntimeError(
                f"the completion function broke its contract: expected {len(batch)} lists of "
                f"{num_samples} strings, got {[len(samples) for samples in outputs]}"
            )
        for task, samples in zip(batch, outputs):
            completions[task.task_id] = [str(sample) for sample in samples]
    return completions


def load_checkpoint_completion_fn(checkpoint_dir: str, **gen_opts) -> CompletionFn:
    """`ast_t5.generate.load_completion_fn(checkpoint_dir, **gen_opts)`, imported lazily."""
    try:
        from ast_t5.generate import load_completion_fn
    except ImportError as exc:
        raise EvalInputError(
            f"--checkpoint needs ast_t5.generate.load_completion_fn, which cannot be imported "
            f"({exc}); generate elsewhere and pass --completions FILE instead"
        ) from None
    return load_completion_fn(checkpoint_dir, **gen_opts)


def write_prompts(path: str, tasks: Sequence[Task]) -> None:
    """Write ``{"task_id", "prompt"}`` lines, in task order, atomically."""
    write_jsonl_atomic(path, ({"task_id": task.task_id, "prompt": task.prompt} for task in tasks))
    logger.info("wrote %d prompts to %s", len(tasks), path)
