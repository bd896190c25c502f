"""Evaluation harness for AST-T5 models on code (reference spec section 11, DESIGN.md section 9).

Model-independent pieces: a sandbox that executes generated programs and judges them by the
benchmark's tests in a separate process (`sandbox`, `sandbox_child`), HumanEval and
MBPP-format benchmarks (`humaneval`, `mbpp`), completion post-processing (`postprocess`), the
unbiased pass@k estimator (`passk`), exact match / BLEU (`metrics`), and the `ast-t5-eval` CLI
(`cli`). Completions come from a JSONL file or from any `completions.CompletionFn`.
"""
