"""Generation with ``ast_t5`` models: checkpoint loading, decoding, validation metrics.

The public entry points are re-exported by ``ast_t5.generate``.
"""
