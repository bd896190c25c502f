"""``ast-t5-export-hf CHECKPOINT OUT_DIR``: a T5 v1.1-family checkpoint as a Hugging Face model.

The output loads with ``AutoModelForSeq2SeqLM.from_pretrained(OUT_DIR)`` and
``AutoTokenizer.from_pretrained(OUT_DIR)`` (no remote code): ``config.json`` +
``generation_config.json`` (vocab size, pad 1, eos 2, decoder start 2), ``model.safetensors``
(stock ``T5ForConditionalGeneration`` weights, untied head), ``tokenizer.json`` +
``tokenizer_config.json`` (encodes and decodes exactly like ours, see ``ast_t5.hf.tokenizer``),
and ``ast_t5_spm.model`` + ``ast_t5_tokenizer.json`` (our tokenizer, for ``ast-t5-import-hf``).
Before anything is written the Hugging Face model's logits are compared with ours on seeded
random inputs; after writing, the directory is reloaded with ``from_pretrained`` and compared
again, so a config field that would load differently (e.g. the decoder-output scaling) fails the
export instead of giving a silently different model.

Transformers >= 5 sets ``tie_word_embeddings=True`` in every loaded ``T5Config`` and then warns
that ``shared.weight`` and ``lm_head.weight`` differ "so we will NOT tie them": for a T5 v1.1
model (untied head) that is the right outcome, not a problem with the export. The reload check
runs with that warning silenced and the export logs one line saying so.

Only the ``t5_v11`` family exports: stock T5 cannot represent the paper family (post-LayerNorm,
learned absolute positions, tied input/output embeddings, a relative bias in every encoder layer).
"""
import argparse
import json
import logging
import os
import sys
from typing import Optional, Sequence

import torch

from ..generation.checkpoints import CheckpointError, LoadedCheckpoint, load_checkpoint
from ..models.hf_conversion import hf_t5_config, ours_to_hf_state_dict
from .files import OutputExistsError, atomic_directory
from .parity import PARITY_TOLERANCE, hf_logits_difference
from .parity import logits_difference as random_logits_difference
from .tokenizer import build_hf_tokenizer

logger = logging.getLogger(__name__)

PROG = "ast-t5-export-hf"
PAPER_FAMILY_ERROR = ("the ast_t5_paper family cannot be exported to stock Hugging Face T5 (it "
                      "uses post-LayerNorm, learned positions, tied embeddings and a relative "
                      "bias per encoder layer); only t5_v11 models export")
SPM_FILE, META_FILE = "ast_t5_spm.model", "ast_t5_tokenizer.json"
PARITY_TEXT = "def add(a, b):\n\treturn a + b  # <extra_id_0>\r\n"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ExportError(ValueError):
    """A checkpoint that cannot be exported (one-line message)."""


def build_hf_model(loaded: LoadedCheckpoint):
    """A ``T5ForConditionalGeneration`` with our model's weights (fp32, eval mode)."""
    from transformers import T5ForConditionalGeneration

    model = loaded.model
    if str(getattr(model.cfg, "family", "")) != "t5_v11":
        raise ExportError(PAPER_FAMILY_ERROR)
    config = hf_t5_config(model.cfg, len(loaded.dictionary), pad_token_id=loaded.dictionary.pad(),
                          eos_token_id=loaded.dictionary.eos())
    hf_model = T5ForConditionalGeneration(config).eval()
    state = {k: v.float() for k, v in ours_to_hf_state_dict(model.state_dict()).items()}
    hf_model.load_state_dict(state, strict=True)
    return hf_model


def logits_difference(loaded: LoadedCheckpoint, hf_model, text: str = PARITY_TEXT) -> float:
    """Max |ours - Hugging Face| logit on one encoded text, both in fp32 on the CPU."""
    codec = loaded.codec
    ids = codec.encode(text)
    src = torch.tensor([ids + [codec.eos]])
    prev = torch.tensor([[codec.eos] + ids[:8]])  # decoder input: </s> + a prefix
    ours = loaded.model.float().cpu().eval()
    with torch.no_grad():
        a = ours(src, src.ne(codec.pad).sum(1), prev)[0]
        b = hf_model(input_ids=src, attention_mask=torch.ones_like(src),
                     decoder_input_ids=prev).logits
    return (a - b).abs().max().item()


def write_our_tokenizer(loaded: LoadedCheckpoint, out_dir: str) -> None:
    codec = loaded.codec
    with open(os.path.join(out_dir, SPM_FILE), "wb") as f:
        f.write(codec.spm_model_bytes)
    meta = {"spm_model": SPM_FILE, "num_sentinels": codec.num_sentinels,
            "vocab_size": codec.vocab_size, "spm_sha256": codec.tokenizer.sha256,
            "sentinel_format": "<extra_id_{}>",
            "sentinel_order": "descending", "bos_id": 0, "pad_id": 1, "eos_id": 2, "unk_id": 3}
    with open(os.path.join(out_dir, META_FILE), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")


def export_to_hf(checkpoint: str, out_dir: str, tokenizer_dir: Optional[str] = None,
                 overwrite: bool = False, dtype: str = "float32") -> str:
    """Export a checkpoint (file or directory) to ``out_dir``; returns ``out_dir``."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    loaded = load_checkpoint(checkpoint, tokenizer_dir, device="cpu", attention_backend="torch")
    hf_model = build_hf_model(loaded)
    ids = (len(loaded.dictionary), loaded.dictionary.pad(), loaded.dictionary.eos())
    diff = max(logits_difference(loaded, hf_model), random_logits_difference(loaded.model, hf_model, *ids))
    if diff > PARITY_TOLERANCE:
        raise ExportError(f"the Hugging Face model's logits differ from ours by {diff:.2e} "
                          f"(> {PARITY_TOLERANCE}); nothing was written")
    logger.info("parity check: max logit difference %.2e", diff)
    tokenizer = build_hf_tokenizer(loaded.codec, loaded.model.encoder.max_positions())
    with atomic_directory(out_dir, overwrite) as tmp:
        hf_model.to(DTYPES[dtype]).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_our_tokenizer(loaded, tmp)
        reloaded = load_exported(tmp)
        diff = hf_logits_difference(hf_model.float(), reloaded, *ids)
        if diff > PARITY_TOLERANCE:  # raising here leaves nothing behind
            raise ExportError(f"the written model, reloaded with from_pretrained, gives logits "
                              f"{diff:.2e} away from ours (> {PARITY_TOLERANCE}); nothing was written")
    logger.info("exported %s to %s (reloaded and checked: max logit difference %.2e). Transformers "
                ">= 5 warns on loading that shared.weight and lm_head.weight are not tied: T5 "
                "v1.1's head is untied, so that is expected", loaded.path, out_dir, diff)
    return out_dir


def load_exported(hf_dir: str):
    """``T5ForConditionalGeneration.from_pretrained`` in fp32, without transformers' warning that
    the untied head of a T5 v1.1 model is not tied (see the module docstring)."""
    from transformers import T5ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return T5ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                          local_files_only=True).eval()
    finally:
        hf_logging.set_verbosity(verbosity)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point; 2 with a one-line message on bad input."""
    p = argparse.ArgumentParser(prog=PROG, description="Export a t5_v11-family AST-T5 checkpoint "
                                "to a Hugging Face T5ForConditionalGeneration directory.")
    p.add_argument("checkpoint", help="checkpoint file or directory")
    p.add_argument("out_dir", help="output directory (written atomically)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (default: found "
                   "from the checkpoint)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights dtype")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        export_to_hf(args.checkpoint, args.out_dir, args.tokenizer, args.force, args.dtype)
    except (ExportError, CheckpointError, OutputExistsError, FileNotFoundError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
