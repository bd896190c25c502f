"""Load and validate the corpus pipeline's per-language datasets (DESIGN.md section 5.3).

A token dataset and its AST side-channel must describe the same segments. Loading checks, with
one-line errors naming the files: both exist, same number of items, every AST item is a whole
number of (start, end, type) rows, and, on a seeded sample of items (or all of them), that the
rows are in range, in pre-order and properly nested (``ast_t5_preprocess.formats.check_ast_item``).
"""
import json
import logging
import os
from typing import Dict, List

import numpy as np

from ast_t5_preprocess.formats import AST_FIELDS, FormatError, ast_rows, check_ast_item

logger = logging.getLogger(__name__)

TEXT_LANGUAGE = "text"


class DataError(ValueError):
    """The preprocessed data directory is missing something or is inconsistent."""


def read_data_weights(data_dir: str) -> Dict[str, float]:
    path = os.path.join(data_dir, "data_weights.json")
    if not os.path.exists(path):
        raise DataError(f"{path} not found: is {data_dir} the output of ast-t5-preprocess?")
    with open(path, encoding="utf-8") as f:
        return {k: float(v) for k, v in json.load(f).items()}


def mixture_probabilities(weights: Dict[str, float], temperature: float) -> Dict[str, float]:
    """Sampling probabilities p_i proportional to w_i ** (1 / temperature) (T=1: the data's shares)."""
    if temperature <= 0:
        raise DataError(f"sampling temperature must be > 0, got {temperature}")
    raw = {k: w ** (1.0 / temperature) for k, w in weights.items() if w > 0}
    total = sum(raw.values())
    if not total:
        raise DataError("every language has zero weight")
    return {k: v / total for k, v in raw.items()}


def load_language_split(data_dir: str, lang: str, split: str, num_types: int,
                        check: str = "sample", sample_size: int = 1000, seed: int = 0):
    """Token and AST datasets of one language and split, validated; None if the split is absent.

    Args:
        check: "full" validates every AST item, "sample" a seeded sample of ``sample_size``
            items, "none" only the item counts and row shapes.
    """
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    prefix = os.path.join(data_dir, lang, split)
    if not os.path.exists(prefix + ".idx"):
        return None
    for p in (prefix + ".bin", prefix + ".ast.idx", prefix + ".ast.bin"):
        if not os.path.exists(p):
            raise DataError(f"{p} is missing (the token dataset {prefix}.idx exists)")
    tokens, asts = MMapIndexedDataset(prefix), MMapIndexedDataset(prefix + ".ast")
    if len(tokens) != len(asts):
        raise DataError(f"{prefix}.idx has {len(tokens)} items but {prefix}.ast.idx has {len(asts)}")
    if np.any(asts.sizes % AST_FIELDS) or np.any(asts.sizes == 0):
        raise DataError(f"{prefix}.ast.bin: an item is not a non-empty list of (start, end, type) rows")
    if check != "none":
        rng = np.random.default_rng(seed)
        idx = np.arange(len(tokens)) if check == "full" or len(tokens) <= sample_size else \
            np.sort(rng.choice(len(tokens), sample_size, replace=False))
        for i in idx.tolist():
            try:
                check_ast_item(ast_rows(asts[i].numpy()), int(tokens.sizes[i]), num_types)
            except FormatError as e:
                raise DataError(f"{prefix}.ast item {i}: {e}") from None
    return tokens, asts


def count_node_types(data_dir: str, lang: str) -> int:
    path = os.path.join(data_dir, lang, "node_types.txt")
    if not os.path.exists(path):
        raise DataError(f"{path} not found")
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def available_languages(data_dir: str, requested: str) -> List[str]:
    """Languages to train on: the comma-separated request, or all with a data weight."""
    weights = read_data_weights(data_dir)
    langs = [l.strip() for l in requested.split(",") if l.strip()] if requested else sorted(weights)
    missing = [l for l in langs if l not in weights]
    if missing:
        raise DataError(f"languages {missing} are not in {data_dir}/data_weights.json "
                        f"(available: {sorted(weights)})")
    return langs
