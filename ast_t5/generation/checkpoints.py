"""Loading a trained ``ast_t5`` model with its tokenizer, and writing weights-only checkpoints.

A checkpoint is found from a file or a directory (``checkpoint_best.pt``, then
``checkpoint_last.pt``, then ``checkpoint.pt``). Its tokenizer is looked up in this order:

1. an explicit tokenizer directory (``spm.model`` + ``tokenizer.json``);
2. the tokenizer stored inside the checkpoint (fine-tuning checkpoints carry it in their task
   state, see ``ast_t5.tasks.seq2seq_finetuning``), which makes them self-contained;
3. the checkpoint's own directory (``ast-t5-import-hf`` writes the tokenizer files there);
4. the training run's ``task.tokenizer`` or ``task.data`` directory (pre-training checkpoints).

The model is rebuilt through fairseq's own ``build_model`` from the checkpoint's model config,
exactly as training built it, then loaded strictly.
"""
import logging
import os
import pickle
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Optional

import torch
from fairseq import checkpoint_utils
from fairseq.models import build_model
from omegaconf import DictConfig, OmegaConf, open_dict

from ..data.text_codec import TextCodec, is_tokenizer_dir

logger = logging.getLogger(__name__)

CHECKPOINT_NAMES = ("checkpoint_best.pt", "checkpoint_last.pt", "checkpoint.pt")
# task-state entry of a checkpoint: {"spm_model": bytes, "num_sentinels": int}
TOKENIZER_STATE_KEY = "ast_t5_tokenizer"


class CheckpointError(ValueError):
    """A checkpoint or tokenizer that cannot be loaded (one-line message)."""


@dataclass
class LoadedCheckpoint:
    """A model in eval mode with everything needed to feed it text."""

    model: torch.nn.Module
    codec: TextCodec
    dictionary: object  # fairseq Dictionary
    cfg: DictConfig  # the training run's full config
    path: str


def resolve_checkpoint_file(path: str) -> str:
    """The checkpoint file that ``path`` (a file or a checkpoint directory) designates."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        for name in CHECKPOINT_NAMES:
            candidate = os.path.join(path, name)
            if os.path.isfile(candidate):
                return candidate
        raise CheckpointError(f"{path} contains none of {', '.join(CHECKPOINT_NAMES)}")
    raise CheckpointError(f"{path}: no such checkpoint file or directory")


def find_codec(state: dict, checkpoint_file: str, tokenizer_dir: Optional[str] = None) -> TextCodec:
    """The tokenizer of a loaded checkpoint state (see the module docstring for the order)."""
    if tokenizer_dir:
        return TextCodec.from_dir(tokenizer_dir)
    stored = (state.get("task_state") or {}).get(TOKENIZER_STATE_KEY)
    if stored:
        return TextCodec.from_bytes(stored["spm_model"], int(stored["num_sentinels"]))
    candidates = [os.path.dirname(os.path.abspath(checkpoint_file))]
    task_cfg = (state.get("cfg") or {}).get("task") or {}
    candidates += [task_cfg.get(k) for k in ("tokenizer", "data") if task_cfg.get(k)]
    for candidate in candidates:
        if is_tokenizer_dir(candidate):
            logger.info("tokenizer of %s: %s", checkpoint_file, candidate)
            return TextCodec.from_dir(candidate)
    raise CheckpointError(f"cannot find the tokenizer of {checkpoint_file} (looked in "
                          f"{[c for c in candidates if c]}); pass a tokenizer directory with "
                          "spm.model and tokenizer.json")


def load_checkpoint(path: str, tokenizer_dir: Optional[str] = None, device: str = "cpu",
                    attention_backend: str = "auto") -> LoadedCheckpoint:
    """Load model, dictionary and tokenizer from a checkpoint file or directory.

    ``attention_backend`` replaces the training run's choice (a run trained with ``fused`` on a
    GPU can then generate on a CPU); pass None to keep it.
    """
    checkpoint_file = resolve_checkpoint_file(path)
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint_file)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:  # corrupt or foreign
        raise CheckpointError(f"{checkpoint_file}: not a readable checkpoint ({e})") from None
    cfg = state.get("cfg")
    if cfg is None or "model" not in cfg or "model" not in state:
        raise CheckpointError(f"{checkpoint_file}: no model config or weights in the checkpoint")
    codec = find_codec(state, checkpoint_file, tokenizer_dir)
    dictionary = codec.dictionary()
    rows = state["model"].get("encoder.embed_tokens.weight")
    if rows is not None and rows.shape[0] != len(dictionary):
        raise CheckpointError(f"{checkpoint_file}: the model has {rows.shape[0]} token embeddings "
                              f"but the tokenizer has {len(dictionary)} ids; wrong tokenizer?")
    model_cfg = cfg.model
    if attention_backend is not None:
        with open_dict(model_cfg):
            model_cfg.attention_backend = attention_backend
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = build_model(model_cfg, task, from_checkpoint=True)
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=model_cfg)
    except RuntimeError as e:
        lines = str(e).strip().splitlines()
        detail = lines[1].strip() if len(lines) > 1 else lines[0]
        raise CheckpointError(f"{checkpoint_file}: weights do not fit the architecture in its "
                              f"config ({detail})") from None
    model.to(device).eval()
    return LoadedCheckpoint(model, codec, dictionary, cfg, checkpoint_file)


def model_config_dict(model_cfg) -> dict:
    """A plain dict of an AstT5Config (or DictConfig) with ``_name: ast_t5``, for checkpoints."""
    values = OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg) \
        else asdict(model_cfg)
    values = {k: (str(v) if k in ("family", "attention_backend") else v) for k, v in values.items()}
    values["_name"] = "ast_t5"
    return values


def save_weights_checkpoint(path: str, model_cfg, model_state: dict, codec: TextCodec,
                            task_cfg: Optional[dict] = None) -> None:
    """Write a fairseq checkpoint holding weights only (no optimizer state), atomically.

    It carries the model config, the tokenizer (task state) and an empty training history, so
    ``checkpoint.finetune_from_model=PATH`` starts fine-tuning from it with a fresh optimizer,
    and ``ast_t5.generate`` loads it.
    """
    state = {
        "args": None,
        "cfg": {"model": model_config_dict(model_cfg), "task": dict(task_cfg or {})},
        "model": {k: v.detach().clone().contiguous() for k, v in model_state.items()},
        "criterion": None,
        "optimizer_history": [{"criterion_name": "none", "optimizer_name": "none",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "task_state": {TOKENIZER_STATE_KEY: tokenizer_state(codec)},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "version": 2}},
        "last_optimizer_state": None,
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(state, path)  # writes PATH.tmp, then renames


def tokenizer_state(codec: TextCodec) -> dict:
    """What a checkpoint stores to rebuild its tokenizer."""
    return {"spm_model": codec.spm_model_bytes, "num_sentinels": codec.num_sentinels}
