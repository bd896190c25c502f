"""Text generation with an ``ast_t5`` model: fairseq's SequenceGenerator (beam search or sampling,
with the decoder's cached keys/values) behind a text interface.

Three ways to use a model, all with the pre-training conventions (DESIGN.md 5.2): the source ends
with ``</s>``, decoding starts from ``</s>`` and stops at ``</s>``.

* :meth:`AstT5Generator.translate`: source text -> generated text (fine-tuned models);
* :meth:`AstT5Generator.infill`: code with ``<extra_id_N>`` holes -> the code with every hole
  filled from the generated ``<extra_id_N> span ...`` target (span infilling, as pre-trained);
* :meth:`AstT5Generator.complete`: a prompt -> its continuation (infilling one hole at the end).

Greedy decoding is beam search with ``beam=1``. Sampling draws ``num_return`` independent
samples per source (temperature, top-p, top-k) from a generator seeded by ``seed``, so a call is
reproducible; batches and one-by-one calls agree for beam search (padding is masked).
"""
import logging
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Union

import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

from ..data.seq2seq_dataset import inference_dataset
from .checkpoints import LoadedCheckpoint, load_checkpoint

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class GenerationOptions:
    """Decoding settings (validated by :meth:`validate`)."""

    beam: int = 1  # beam size for beam search (1 = greedy)
    sampling: bool = False  # sample instead of beam search
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus sampling mass (1.0 = off)
    top_k: int = 0  # sample among the k most likely tokens (0 = off)
    num_return: int = 1  # outputs per source (best beams, or independent samples)
    max_new_tokens: int = 256  # tokens generated before </s> is forced
    min_new_tokens: int = 1
    length_penalty: float = 1.0  # beam search: < 1 favours short outputs, > 1 long ones
    no_repeat_ngram_size: int = 0
    batch_size: int = 8  # sources per forward pass
    seed: int = 0  # sampling seed

    def validate(self) -> "GenerationOptions":
        checks = [("beam", self.beam >= 1), ("num_return", self.num_return >= 1),
                  ("max_new_tokens", self.max_new_tokens >= 1),
                  ("batch_size", self.batch_size >= 1),
                  ("min_new_tokens", 0 <= self.min_new_tokens <= self.max_new_tokens),
                  ("temperature", self.temperature > 0), ("top_p", 0 < self.top_p <= 1),
                  ("top_k", self.top_k >= 0),
                  ("no_repeat_ngram_size", self.no_repeat_ngram_size >= 0)]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"invalid generation option {name}={getattr(self, name)!r}")
        if not self.sampling and self.num_return > self.beam:
            raise ValueError(f"num_return={self.num_return} needs beam >= {self.num_return} "
                             "(or sampling)")
        return self


class AstT5Generator:
    """Generate from a loaded checkpoint; see the module docstring.

    Args:
        loaded: model, dictionary and tokenizer (see ``checkpoints.load_checkpoint``).
        options: default decoding options; every method accepts overrides as keyword arguments.
    """

    def __init__(self, loaded: LoadedCheckpoint, options: Optional[GenerationOptions] = None):
        self.model, self.codec, self.dictionary = loaded.model, loaded.codec, loaded.dictionary
        self.options = (options or GenerationOptions()).validate()
        self.device = next(self.model.parameters()).device
        self.max_source_positions = self.model.encoder.max_positions()

    @classmethod
    def from_checkpoint(cls, path: str, tokenizer_dir: Optional[str] = None,
                        device: Optional[str] = None, dtype: str = "float32",
                        **options) -> "AstT5Generator":
        """Load a checkpoint file or directory (CUDA when available unless ``device`` is given)
        with its weights in ``dtype`` (float32, bfloat16 or float16; the last two for GPUs)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        loaded = load_checkpoint(path, tokenizer_dir, device)
        loaded.model.to(DTYPES[dtype])
        return cls(loaded, GenerationOptions(**options))

    def _options(self, overrides) -> GenerationOptions:
        return replace(self.options, **overrides).validate() if overrides else self.options

    def _sequence_generator(self, opts: GenerationOptions) -> SequenceGenerator:
        strategy, beam = None, opts.beam
        if opts.sampling:
            strategy = search.Sampling(self.dictionary, opts.top_k or -1,
                                       opts.top_p if opts.top_p < 1 else -1.0)
            beam = opts.num_return  # each "beam" is an independent sample
        return SequenceGenerator(
            [self.model], self.dictionary, beam_size=beam, max_len_a=0,
            max_len_b=opts.max_new_tokens, min_len=opts.min_new_tokens,
            len_penalty=opts.length_penalty, temperature=opts.temperature,
            no_repeat_ngram_size=opts.no_repeat_ngram_size, search_strategy=strategy)

    def generate_ids(self, sources: Sequence[Sequence[int]], **overrides) -> List[List[List[int]]]:
        """For each source (ids ending with ``</s>``), ``num_return`` outputs as id lists (no
        ``</s>``), best first."""
        opts = self._options(overrides)
        generator = self._sequence_generator(opts)
        dataset = inference_dataset(sources, self.dictionary.pad(), self.dictionary.eos(),
                                    self.max_source_positions)
        outputs: List[List[List[int]]] = []
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(opts.seed)
            for start in range(0, len(dataset), opts.batch_size):
                stop = min(start + opts.batch_size, len(dataset))
                batch = dataset.collater([dataset[i] for i in range(start, stop)])
                net_input = {k: batch["net_input"][k].to(self.device)
                             for k in ("src_tokens", "src_lengths")}
                hypos = generator.generate([self.model], {"net_input": net_input})
                outputs.extend([_strip_eos(h["tokens"], self.dictionary.eos())
                                for h in hyps[:opts.num_return]] for hyps in hypos)
        return outputs

    def encode_source(self, text: str) -> List[int]:
        return self.codec.encode(text) + [self.codec.eos]

    def translate(self, sources: Union[str, Sequence[str]], **overrides):
        """Generated text for a source (str -> str) or for each of a list (-> list). With
        ``num_return > 1`` each result is a list of strings."""
        single = isinstance(sources, str)
        texts = [sources] if single else list(sources)
        results = self.generate_ids([self.encode_source(t) for t in texts], **overrides)
        decoded = [[self.codec.decode(ids) for ids in outs] for outs in results]
        decoded = [outs[0] if len(outs) == 1 else outs for outs in decoded]
        return decoded[0] if single else decoded

    def infill(self, code: Union[str, Sequence[str]], **overrides):
        """Fill every ``<extra_id_N>`` hole of ``code`` with the generated span; returns the full
        text (str -> str, list -> list). A hole the model left out is filled with nothing."""
        single = isinstance(code, str)
        texts = [code] if single else list(code)
        sources = [self.encode_source(t) for t in texts]
        for text, src in zip(texts, sources):
            if not any(self.codec.is_sentinel(t) for t in src):
                raise ValueError(f"infill needs at least one <extra_id_N> hole in {text[:40]!r}...")
        results = self.generate_ids(sources, **overrides)
        filled = [[self.codec.decode(fill_spans(src, out, self.codec)) for out in outs]
                  for src, outs in zip(sources, results)]
        filled = [outs[0] if len(outs) == 1 else outs for outs in filled]
        return filled[0] if single else filled

    def complete(self, prompt: Union[str, Sequence[str]], **overrides):
        """The continuation of a prompt: the span generated for a hole at its end."""
        single = isinstance(prompt, str)
        texts = [prompt] if single else list(prompt)
        hole = self.codec.sentinel_id(0)
        sources = [self.codec.encode(t) + [hole, self.codec.eos] for t in texts]
        results = self.generate_ids(sources, **overrides)
        spans = [[self.codec.decode(span_tokens(out, hole, self.codec)) for out in outs]
                 for outs in results]
        spans = [outs[0] if len(outs) == 1 else outs for outs in spans]
        return spans[0] if single else spans


def _strip_eos(tokens: torch.Tensor, eos: int) -> List[int]:
    ids = tokens.tolist()
    return ids[:-1] if ids and ids[-1] == eos else ids


def split_spans(target: Sequence[int], codec) -> dict:
    """``{sentinel id: [span ids]}`` of a generated target; the first span of a repeated
    sentinel wins, tokens before the first sentinel are ignored."""
    spans, current = {}, None
    for token in target:
        if codec.is_sentinel(token):
            current = None if token in spans else spans.setdefault(token, [])
        elif current is not None:
            current.append(token)
    return spans


def span_tokens(target: Sequence[int], sentinel: int, codec) -> List[int]:
    """The span generated for ``sentinel`` (empty if absent)."""
    return split_spans(target, codec).get(sentinel, [])


def fill_spans(source: Sequence[int], target: Sequence[int], codec) -> List[int]:
    """``source`` (without ``</s>``) with each sentinel replaced by its span from ``target``."""
    spans = split_spans(target, codec)
    out: List[int] = []
    for token in source:
        if token == codec.eos:
            break
        if codec.is_sentinel(token):
            if token not in spans:
                logger.warning("the model generated no span for <extra_id_%d>; filled with nothing",
                               codec.sentinel_number(token))
            out.extend(spans.get(token, []))
        else:
            out.append(token)
    return out
