"""``ast-t5-ablate``: does the AST objective pay? Arms trained at equal tokens, judged alike.

One command trains named arms (``t5``: random spans over fixed-length segments; ``t5+seg``:
random spans over AST-aware segments; ``ast``: AST-aware segments and subtree corruption;
masking-ratio variants ``ARM@RATIO``; user arms as config overrides) through the real
``fairseq-hydra-train`` path at the same training-token budget, evaluates every arm on the same
held-out problems (masked-subtree and random-span infilling, validation loss under both
objectives, a fine-tuned Python docstring-to-body task) and writes ``report.md``,
``results.json`` and PNG plots. See ``ast_t5.ablate.cli``.
"""
