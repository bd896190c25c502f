"""A Hugging Face tokenizer that encodes and decodes exactly like our TextCodec.

Stock ``T5Tokenizer`` cannot be used: in transformers 5 it is a Unigram model behind a
whitespace-splitting pre-tokenizer (whitespace is lost), while ours is a sentencepiece BPE model
with identity normalization, no dummy prefix and byte fallback. So we build a ``tokenizers``
BPE model from the sentencepiece model and save it as a plain ``tokenizer.json`` that
``AutoTokenizer.from_pretrained`` loads without remote code:

* vocabulary: every sentencepiece piece at its id (``<s>``=0, ``<pad>``=1, ``</s>``=2,
  ``<unk>``=3, byte pieces ``<0xNN>``, merged pieces), then the sentinels ``<extra_id_{S-1}>`` ..
  ``<extra_id_0>`` as added tokens, so ``<extra_id_k>`` has id ``vocab_size - 1 - k`` as in our
  dictionary;
* merges: every split ``a + b`` of a piece into two pieces, ranked by the piece's sentencepiece
  score (BPE pieces are scored by merge order), which reproduces sentencepiece's greedy
  highest-score-first merging;
* normalization: spaces become U+2581 and nothing else changes; no pre-tokenizer splitting;
* decoding: U+2581 -> space, byte pieces -> bytes -> UTF-8; nothing stripped;
* sentinels are matched in text (like our ``<extra_id_N>`` regex) and kept by
  ``skip_special_tokens=True``; ``</s>``, ``<pad>``, ``<s>``, ``<unk>`` are special tokens that are
  *not* matched in text (``split_special_tokens``), because sentencepiece encodes "</s>" in code
  as characters;
* ``tokenizer(text)`` appends ``</s>``, the source format of pre-training and fine-tuning.
"""
from typing import Dict, List, Tuple

from ..data.text_codec import TextCodec

SPACE_MARK = "\u2581"  # sentencepiece's visible space


def bpe_vocab_and_merges(codec: TextCodec) -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    """The sentencepiece model as a BPE vocabulary ``{piece: id}`` and ranked merges."""
    sp = codec.sp
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    ranked = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i):
            continue
        piece = sp.id_to_piece(i)
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-sp.get_score(i), i, cut, (left, right)))
    ranked.sort()
    return vocab, [pair for *_, pair in ranked]


def build_backend_tokenizer(codec: TextCodec):
    """A ``tokenizers.Tokenizer`` equivalent to ``codec`` (see the module docstring)."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        processors,
    )

    vocab, merges = bpe_vocab_and_merges(codec)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE_MARK)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    sentinels = [AddedToken(f"<extra_id_{k}>", special=False, normalized=False)
                 for k in reversed(range(codec.num_sentinels))]
    tok.add_tokens(sentinels)
    last = tok.token_to_id("<extra_id_0>")
    if tok.get_vocab_size() != codec.vocab_size or last != codec.sentinel_id(0):
        raise ValueError("the Hugging Face vocabulary does not line up with ours")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", codec.eos)])
    return tok


def build_hf_tokenizer(codec: TextCodec, model_max_length: int):
    """A ``transformers`` fast tokenizer equivalent to ``codec``, ready for ``save_pretrained``."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_backend_tokenizer(codec), bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", unk_token="<unk>", clean_up_tokenization_spaces=False,
        split_special_tokens=True, model_max_length=model_max_length)
