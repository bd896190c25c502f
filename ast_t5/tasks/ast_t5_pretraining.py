"""The AST-T5 pre-training task (Gong et al., ICML 2024, section 3; reference spec sections 3, 5, 6).

Reads the output of ``ast-t5-preprocess``: per-language token and AST datasets, the dictionary
with its trailing sentinels, and the language weights. Code segments get AST-aware span
corruption (``objective=ast``) or T5 random-span corruption (``objective=t5``, the ablation
baseline); the ``text`` subset always gets T5 corruption. Languages are mixed by
``data_weights.json`` with an optional sampling temperature. Validation subsets are ``valid``
(all languages mixed) and ``valid_<lang>`` (one language each).
"""
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq.data import Dictionary
from fairseq.logging import metrics
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import register_task
from omegaconf import II, MISSING

from ..data.loading import (TEXT_LANGUAGE, DataError, available_languages, count_node_types,
                            load_language_split, mixture_probabilities, read_data_weights)
from ..data.batch_pools import pool_batches
from ..data.masking_options import AstMaskingOptions
from ..data.mixture import WeightedMixtureDataset
from ..data.node_categories import NodeCategories
from ..data.sentinels import SentinelSpec
from ..data.span_corruption_dataset import SpanCorruptionDataset
from ..distributed import DistributedOptions
from . import token_budget
from .shared_vocab_task import SharedVocabTask

logger = logging.getLogger(__name__)

OBJECTIVES = ChoiceEnum(["ast", "t5"])
AST_CHECKS = ChoiceEnum(["sample", "full", "none"])
_D = AstMaskingOptions  # defaults of the AST objective live in one place


def _f(default, text):
    return field(default=default, metadata={"help": text})


@dataclass
class AstT5PretrainingConfig(FairseqDataclass, DistributedOptions):
    data: str = _f(MISSING, "output directory of ast-t5-preprocess")
    languages: str = _f("", "comma-separated languages to train on (default: all in data_weights.json)")
    sampling_temperature: float = _f(1.0, "mixture probabilities are proportional to "
                                          "weight ** (1 / T); T > 1 up-samples small languages")
    epoch_size: int = _f(0, "items per epoch of the mixture (0: all items of all languages)")
    objective: OBJECTIVES = _f("ast", "ast: AST-aware span corruption; t5: T5 random spans")
    mask_prob: float = _f(_D.mask_prob, "AST objective: share of tokens masked (exact budget)")
    threshold_lb: int = _f(_D.threshold_lb, "AST objective: smallest per-node threshold")
    threshold_ub: int = _f(_D.threshold_ub, "AST objective: largest per-node threshold")
    mask_multiple_length: int = _f(_D.mask_multiple_length,
                                   "AST objective: flat spans inside leaf-only nodes have 1..L-1 tokens")
    obfuscation_prob: float = _f(_D.obfuscation_prob, "AST objective: share of samples with "
                                                      "identifier obfuscation")
    obfuscation_ratio: float = _f(_D.obfuscation_ratio, "AST objective: at most this share of "
                                                        "the budget goes to obfuscated identifiers")
    t2c_prob: float = _f(_D.t2c_prob, "AST objective: share of samples in text-to-code mode (Python)")
    t2c_ratio: float = _f(_D.t2c_ratio, "AST objective: share of the budget for function bodies")
    dedup_spans: bool = _f(_D.dedup_spans, "AST objective: identical spans share one sentinel")
    noise_density: float = _f(0.15, "T5 objective and text subset: share of noise tokens")
    mean_span_length: float = _f(3.0, "T5 objective and text subset: mean noise span length")
    max_source_positions: int = _f(1024, "longest segment (tokens incl. </s>) the encoder accepts")
    max_target_positions: int = _f(1024, "longest target incl. </s>; masking shrinks to fit")
    ast_check: AST_CHECKS = _f("sample", "validate AST items at load: a seeded sample of 1000, "
                                         "all of them, or only counts and shapes")
    audit_log: str = _f("", "if set, a folder where every rank appends, per update, the ids of "
                            "its samples and a checksum of the parameters it starts from "
                            "(audit_rank<R>.jsonl): to check data sharding and replica sync")
    max_train_tokens: int = _f(0, "stop after this many training tokens (the segments' own tokens, "
                                  "before corruption, over all ranks), within max_train_tokens_tolerance; "
                                  "0: stop by optimization.max_update only")
    max_train_tokens_tolerance: float = _f(0.001, "allowed relative distance from max_train_tokens")
    batch_pool: int = _f(1, "cut the training batches again by their masked lengths in pools of this many "
                            "batches adjacent in length (ast_t5/data/batch_pools.py; 8-16 saved 8.5-8.9% of "
                            "the FLOPs with the AST objective); 1: fairseq's batches as they are")
    seed: int = II("common.seed")


def masking_options(cfg) -> AstMaskingOptions:
    names = [f.name for f in dataclasses.fields(AstMaskingOptions) if f.name != "max_target_len"]
    return AstMaskingOptions(**{n: getattr(cfg, n) for n in names},
                             max_target_len=cfg.max_target_positions)


def validate_config(cfg) -> None:
    """One-line ValueErrors for bad objective settings, before any data is read."""
    masking_options(cfg).validate()
    if not 0 < cfg.noise_density < 1:
        raise ValueError(f"noise_density={cfg.noise_density} must be in (0, 1)")
    if cfg.mean_span_length < 1:
        raise ValueError(f"mean_span_length={cfg.mean_span_length} must be >= 1")
    if cfg.max_source_positions < 2 or cfg.max_target_positions < 2:
        raise ValueError("max_source_positions and max_target_positions must be >= 2")
    if cfg.max_train_tokens < 0 or not 0 <= cfg.max_train_tokens_tolerance < 1:
        raise ValueError("max_train_tokens must be >= 0 and max_train_tokens_tolerance in [0, 1)")
    if cfg.batch_pool < 1:
        raise ValueError(f"batch_pool={cfg.batch_pool} must be >= 1 (1: no pools)")


@register_task("ast_t5_pretraining", dataclass=AstT5PretrainingConfig)
class AstT5PretrainingTask(SharedVocabTask):
    """Span-corruption pre-training on the AST-aware segments of ast-t5-preprocess.

    Args:
        dictionary (~fairseq.data.Dictionary): pieces then sentinels (``dict.txt``).
        sentinels (SentinelSpec): where the sentinels are.
    """

    cfg: AstT5PretrainingConfig

    def __init__(self, cfg: AstT5PretrainingConfig, dictionary: Dictionary, sentinels: SentinelSpec):
        super().__init__(cfg)
        self.dictionary, self.sentinels = dictionary, sentinels
        self.languages = available_languages(cfg.data, cfg.languages)
        weights = read_data_weights(cfg.data)
        self.probs = mixture_probabilities({l: weights[l] for l in self.languages},
                                           cfg.sampling_temperature)
        self.languages = [l for l in self.languages if l in self.probs]
        logger.info("languages and mixture probabilities: %s",
                    ", ".join(f"{l}={self.probs[l]:.3f}" for l in self.languages))

    @classmethod
    def setup_task(cls, cfg: AstT5PretrainingConfig, **kwargs):
        validate_config(cfg)
        dictionary, sentinels = load_dictionary(cfg.data)
        return cls(cfg, dictionary, sentinels)

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        if "_" in split and split.split("_", 1)[1] in self.languages:
            base, lang = split.split("_", 1)
            ds = self._language_dataset(lang, base)
            if ds is None:
                raise DataError(f"no {base} data for {lang} in {self.cfg.data}")
            self.datasets[split] = WeightedMixtureDataset([ds], [1.0], self.cfg.seed,
                                                          language_ids=[self.languages.index(lang)])
            return
        parts = [(l, self._language_dataset(l, split)) for l in self.languages]
        parts = [(l, d) for l, d in parts if d is not None]
        if not parts:
            raise DataError(f"no '{split}' split for {self.languages} in {self.cfg.data}")
        probs = [self.probs[l] for l, _ in parts]
        size = self.cfg.epoch_size if split == "train" else 0
        self.datasets[split] = WeightedMixtureDataset(
            [d for _, d in parts], probs, self.cfg.seed, size,
            language_ids=[self.languages.index(l) for l, _ in parts])  # share_<lang> labels
        self.datasets[split].language_names = [l for l, _ in parts]
        self.datasets[split].set_epoch(epoch)

    def _language_dataset(self, lang: str, split: str):
        cfg = self.cfg
        num_types = count_node_types(cfg.data, lang)
        loaded = load_language_split(cfg.data, lang, split, num_types, check=cfg.ast_check, seed=cfg.seed)
        if loaded is None:
            logger.info("%s: no %s split", lang, split)
            return None
        tokens, asts = loaded
        if int(tokens.sizes.max()) > cfg.max_source_positions:
            raise DataError(f"{cfg.data}/{lang}/{split} has segments of {int(tokens.sizes.max())} "
                            f"tokens > max_source_positions={cfg.max_source_positions}")
        use_ast = cfg.objective == "ast" and lang != TEXT_LANGUAGE
        cats = None
        if use_ast:
            path = os.path.join(cfg.data, lang, "node_types.txt")
            cats = NodeCategories.from_node_types_file(path, lang)
        return SpanCorruptionDataset(
            tokens, asts if use_ast else None, self.sentinels, self.dictionary.pad(), cfg.seed,
            ast_options=masking_options(cfg) if use_ast else None, categories=cats,
            noise_density=cfg.noise_density, mean_span_length=cfg.mean_span_length,
            max_target_len=cfg.max_target_positions, name=f"{lang}/{split}")

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq's iterator; a training split's in pools cut by masked lengths with ``batch_pool`` > 1."""
        itr = super().get_batch_iterator(dataset, *args, **kwargs)
        if self.cfg.batch_pool > 1 and any(dataset is d for name, d in self.datasets.items()
                                           if name.split("_", 1)[0] == "train"):
            itr = pool_batches(itr, self.cfg.batch_pool)
        return itr

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if self.cfg.audit_log:
            write_audit_record(self.cfg.audit_log, sample, model, update_num)
        if self.cfg.max_train_tokens > 0:
            return self._budgeted_train_step(sample, model, criterion, optimizer, update_num,
                                             ignore_grad)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def _budgeted_train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad):
        """train_step under ``max_train_tokens`` (see ``token_budget``)."""
        budget = getattr(self, "_token_budget", None)
        if budget is None:
            tol = int(self.cfg.max_train_tokens * self.cfg.max_train_tokens_tolerance)
            budget = self._token_budget = token_budget.TokenBudget(self.cfg.max_train_tokens, tol)
            if update_num > 0:
                budget.load(token_budget.restored_counters(token_budget.root_config(self.cfg),
                                                           update_num))
                logger.info("resumed token budget at update %d: %d of %d tokens", update_num,
                            budget.tokens, budget.budget)
        has_items = bool(sample) and "id" in sample and not ignore_grad and not budget.done
        sizes = self.datasets["train"].sizes[host_ids(sample)] if has_items else np.zeros(0, np.int64)
        keep = np.ones(len(sizes), dtype=bool)
        if has_items and token_budget.world_size() == 1:
            keep = token_budget.select_items(sizes, budget.remaining, budget.tolerance)
        if not keep.any():  # nothing of this batch fits: a no-op contribution to the update
            loss, _, logging_output = super().train_step(sample, model, criterion, optimizer,
                                                         update_num, ignore_grad=True)
            logging_output = {k: (v * 0 if isinstance(v, (int, float)) or torch.is_tensor(v) else v)
                              for k, v in logging_output.items()}
            counts = [0, 0, 0]
            sample_size = 0
        else:
            if not keep.all():
                sample = token_budget.subset_sample(sample, keep, self.dictionary.pad())
            loss, sample_size, logging_output = super().train_step(
                sample, model, criterion, optimizer, update_num, ignore_grad)
            counts = [int(sizes[keep].sum()), host_source_tokens(sample), int(sample["ntokens"])]
        counts = token_budget.all_reduce_counts(counts)
        budget.tokens += counts[0]
        budget.source_tokens += counts[1]
        budget.target_tokens += counts[2]
        self.state.merge_state_dict(budget.state())
        metrics.log_scalar("train_tokens", budget.tokens, weight=0, priority=900, round=0)
        if budget.done and token_budget.stop_after_update(self.cfg, update_num) is not None:
            logger.info("token budget reached: %d tokens (budget %d +- %d); stopping after "
                        "update %d", budget.tokens, budget.budget, budget.tolerance, update_num + 1)
        return loss, sample_size, logging_output


def host_ids(sample) -> np.ndarray:
    """The batch's dataset indices on the host: the collater's numpy copy (no device-to-host
    read inside the update), else read back from ``sample["id"]`` (batches built elsewhere)."""
    host = sample.get("host")
    if host is not None and "id" in host:
        return host["id"]
    return sample["id"].cpu().numpy()


def host_source_tokens(sample) -> int:
    """Source tokens of the batch, from the collater's host copy of the lengths when present."""
    host = sample.get("host")
    if host is not None and "src_lengths" in host:
        return int(host["src_lengths"].sum())
    return int(sample["net_input"]["src_lengths"].sum())


def write_audit_record(folder: str, sample, model, update_num: int) -> None:
    """Append {update, ids, checksum} for this rank; the checksum is order-sensitive. The
    checksum is read back to the host (an opt-in audit, one sync per batch by design)."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    with torch.no_grad():
        flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device) / flat.numel()
        checksum = [float(flat.sum()), float((flat * weights).sum())]
    ids = host_ids(sample).tolist() if sample and "id" in sample else []
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"audit_rank{rank}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"update": int(update_num), "ids": ids, "checksum": checksum}) + "\n")


def load_dictionary(data_dir: str):
    """The fairseq dictionary of a preprocessed directory and its sentinel layout."""
    dict_path, meta_path = os.path.join(data_dir, "dict.txt"), os.path.join(data_dir, "tokenizer.json")
    for p in (dict_path, meta_path):
        if not os.path.exists(p):
            raise DataError(f"{p} not found: is {data_dir} the output of ast-t5-preprocess?")
    dictionary = Dictionary.load(dict_path)
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if len(dictionary) != meta["vocab_size"]:
        raise DataError(f"{dict_path} has {len(dictionary)} symbols, tokenizer.json says {meta['vocab_size']}")
    return dictionary, SentinelSpec(len(dictionary), int(meta["num_sentinels"]), dictionary.eos())
