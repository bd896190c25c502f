"""``ast-t5-import-hf HF_DIR OUT_DIR``: a local Hugging Face T5 v1.1 directory as our checkpoint.

Writes ``OUT_DIR/checkpoint.pt`` (weights only, t5_v11 family, the tokenizer in its task state)
and the tokenizer files ``spm.model``, ``spm.vocab``, ``dict.txt``, ``tokenizer.json``, so that

* fine-tuning starts from it: ``checkpoint.finetune_from_model=OUT_DIR/checkpoint.pt
  task.tokenizer=OUT_DIR`` plus the model sizes the command prints;
* pre-training continues from it the same way (the pre-training data must use this tokenizer);
* ``ast_t5.generate`` and ``ast-t5-export-hf`` load ``OUT_DIR`` directly.

Only local files are read (nothing is downloaded). The tokenizer comes from the files
``ast-t5-export-hf`` writes (``ast_t5_spm.model``, ``ast_t5_tokenizer.json``) or from
``--tokenizer DIR``. The vocabulary layout must be ours (pad 1, eos = decoder start 2): Google's
T5 checkpoints (pad 0, eos 1, a normalizing Unigram tokenizer) would need a vocabulary remap,
which is not supported.
"""
import argparse
import glob
import json
import logging
import os
import sys
from typing import Dict, Optional, Sequence

import torch

from ..data.text_codec import TextCodec
from ..generation.checkpoints import load_checkpoint, save_weights_checkpoint
from ..models.config import config_from
from ..models.hf_conversion import ast_t5_config_from_hf, hf_to_ours_state_dict
from .export import META_FILE, SPM_FILE
from .files import OutputExistsError, atomic_directory
from .parity import PARITY_TOLERANCE, logits_difference

logger = logging.getLogger(__name__)

PROG = "ast-t5-import-hf"
CHECKPOINT_NAME = "checkpoint.pt"
SIZE_FIELDS = ("family", "embed_dim", "ffn_dim", "num_heads", "head_dim", "encoder_layers",
               "decoder_layers", "rel_pos_buckets", "rel_pos_max_distance")


class HFImportError(ValueError):
    """A Hugging Face directory that cannot be imported (one-line message)."""


def read_hf_state_dict(hf_dir: str) -> Dict[str, torch.Tensor]:
    """All tensors of the (possibly sharded) safetensors or PyTorch weight files of ``hf_dir``."""
    safetensors = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    state: Dict[str, torch.Tensor] = {}
    if safetensors:
        from safetensors.torch import load_file

        for path in safetensors:
            state.update(load_file(path))
        return state
    bins = sorted(glob.glob(os.path.join(hf_dir, "pytorch_model*.bin")))
    if not bins:
        raise HFImportError(f"{hf_dir} has no *.safetensors or pytorch_model*.bin weights")
    for path in bins:
        state.update(torch.load(path, map_location="cpu", weights_only=True))
    return state


def load_hf_codec(hf_dir: str, tokenizer_dir: Optional[str]) -> TextCodec:
    """Our tokenizer for an exported directory, or from ``tokenizer_dir``."""
    if tokenizer_dir:
        return TextCodec.from_dir(tokenizer_dir)
    meta_path, spm_path = os.path.join(hf_dir, META_FILE), os.path.join(hf_dir, SPM_FILE)
    if not (os.path.isfile(meta_path) and os.path.isfile(spm_path)):
        raise HFImportError(f"{hf_dir} has no {SPM_FILE}/{META_FILE} (written by "
                            "ast-t5-export-hf); pass --tokenizer DIR with spm.model and "
                            "tokenizer.json")
    with open(meta_path, encoding="utf-8") as f:
        num_sentinels = int(json.load(f)["num_sentinels"])
    with open(spm_path, "rb") as f:
        return TextCodec.from_bytes(f.read(), num_sentinels)


def decoder_start_id(config, hf_dir: str):
    """``decoder_start_token_id`` of the config, else of ``generation_config.json`` (where current
    transformers may keep it), else None."""
    value = getattr(config, "decoder_start_token_id", None)
    path = os.path.join(hf_dir, "generation_config.json")
    if value is None and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            value = json.load(f).get("decoder_start_token_id")
    return value


def scales_decoder_outputs(config) -> bool:
    """Whether Hugging Face multiplies the decoder output by d_model ** -0.5 before the head:
    ``scale_decoder_outputs`` (transformers >= 5), else ``tie_word_embeddings`` (older versions
    scale exactly when the head is tied)."""
    scale = getattr(config, "scale_decoder_outputs", None)
    if scale is None:
        scale = getattr(config, "tie_word_embeddings", True)
    return bool(scale)


def check_hf_config(config, codec: TextCodec, hf_dir: str = "") -> None:
    """One-line errors for configs our t5_v11 family or vocabulary cannot take."""
    if getattr(config, "model_type", None) != "t5":
        raise HFImportError(f"model_type {getattr(config, 'model_type', None)!r} is not 't5'")
    proj = getattr(config, "feed_forward_proj", None)
    if proj != "gated-gelu":
        raise HFImportError(f"feed_forward_proj={proj!r}: only T5 v1.1 models (gated-gelu) map to "
                            "our t5_v11 family (the original T5's relu feed-forward does not)")
    ids = (config.pad_token_id, config.eos_token_id, decoder_start_id(config, hf_dir))
    if ids != (codec.pad, codec.eos, codec.eos):
        raise HFImportError(f"pad/eos/decoder-start ids {ids} differ from ours ({codec.pad}, "
                            f"{codec.eos}, {codec.eos}); Google's T5 vocabulary layout is not "
                            "supported")
    if config.vocab_size != codec.vocab_size:
        raise HFImportError(f"the model's vocab_size {config.vocab_size} differs from the "
                           f"tokenizer's {codec.vocab_size}")
    if abs(config.layer_norm_epsilon - 1e-6) > 1e-12:
        raise HFImportError(f"layer_norm_epsilon={config.layer_norm_epsilon:g}: our t5_v11 family "
                            "uses 1e-6")


def import_from_hf(hf_dir: str, out_dir: str, tokenizer_dir: Optional[str] = None,
                   overwrite: bool = False):
    """Convert ``hf_dir`` into ``out_dir`` (see the module docstring); returns our model config."""
    from transformers import AutoConfig

    if not os.path.isdir(hf_dir):
        raise HFImportError(f"{hf_dir}: no such directory")
    codec = load_hf_codec(hf_dir, tokenizer_dir)
    try:
        config = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    except (OSError, ValueError) as e:
        raise HFImportError(f"{hf_dir}: no readable config.json ({str(e).splitlines()[0]})") from None
    check_hf_config(config, codec, hf_dir)
    try:
        cfg = config_from(ast_t5_config_from_hf(config))
        state = hf_to_ours_state_dict(read_hf_state_dict(hf_dir))
    except KeyError as e:
        raise HFImportError(f"{hf_dir}: weights do not match a T5 v1.1 model "
                            f"({e.args[0]})") from None
    except ValueError as e:
        raise HFImportError(f"{hf_dir}: {e}") from None
    rows = state["encoder.embed_tokens.weight"].shape[0]
    if rows != codec.vocab_size:
        raise HFImportError(f"the weights have {rows} token embeddings, the tokenizer "
                            f"{codec.vocab_size} ids")
    state = {k: v.float() for k, v in state.items()}
    if scales_decoder_outputs(config):
        # Hugging Face multiplies the decoder output by d_model ** -0.5 before its (bias-free)
        # head; our t5_v11 model does not, so the factor goes into the head's weights.
        head = "decoder.output_projection.weight"
        state[head] = state[head] * config.d_model ** -0.5
        logger.info("scale_decoder_outputs: folded d_model ** -0.5 into the output projection")
    final_dir = os.path.abspath(out_dir)
    task_cfg = {"_name": "ast_t5_seq2seq", "data": final_dir, "tokenizer": final_dir}
    with atomic_directory(out_dir, overwrite) as tmp:
        codec.write(tmp)
        save_weights_checkpoint(os.path.join(tmp, CHECKPOINT_NAME), cfg, state, codec, task_cfg)
        check_import_parity(hf_dir, tmp, codec)  # raising here leaves nothing behind
    logger.info("imported %s into %s", hf_dir, out_dir)
    return cfg


def check_import_parity(hf_dir: str, imported_dir: str, codec: TextCodec) -> float:
    """HFImportError unless the imported checkpoint's logits equal the Hugging Face model's on
    seeded random inputs; returns the relative difference."""
    from .export import load_exported

    loaded = load_checkpoint(imported_dir, device="cpu", attention_backend="torch")
    diff = logits_difference(loaded.model, load_exported(hf_dir), codec.vocab_size, codec.pad, codec.eos)
    if diff > PARITY_TOLERANCE:
        raise HFImportError(f"the imported model's logits differ from the Hugging Face model's by "
                            f"{diff:.2e} (> {PARITY_TOLERANCE}): a config field our t5_v11 family "
                            "does not carry changes the function; nothing was written")
    logger.info("parity check: max relative logit difference %.2e", diff)
    return diff


def finetune_overrides(cfg, out_dir: str) -> str:
    """The command-line overrides that fine-tune from an imported checkpoint."""
    out_dir = os.path.abspath(out_dir)
    sizes = " ".join(f"++model.{name}={getattr(cfg, name)}" for name in SIZE_FIELDS)
    return (f"checkpoint.finetune_from_model={os.path.join(out_dir, CHECKPOINT_NAME)} "
            f"task.tokenizer={out_dir} model._name=ast_t5 {sizes}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point; 2 with a one-line message on bad input."""
    p = argparse.ArgumentParser(prog=PROG, description="Convert a local Hugging Face T5 v1.1 "
                                "directory (e.g. from ast-t5-export-hf) into an AST-T5 checkpoint.")
    p.add_argument("hf_dir", help="Hugging Face model directory (local files only)")
    p.add_argument("out_dir", help="output directory: checkpoint.pt + tokenizer files (atomic)")
    p.add_argument("--tokenizer", metavar="DIR", help="our tokenizer directory, when HF_DIR lacks "
                   f"{SPM_FILE}")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = import_from_hf(args.hf_dir, args.out_dir, args.tokenizer, args.force)
    except (HFImportError, OutputExistsError, FileNotFoundError, OSError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    overrides = finetune_overrides(cfg, args.out_dir)
    print(f"wrote {args.out_dir}; fine-tune from it with these overrides:\n  {overrides}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
