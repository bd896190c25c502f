"""Cross-entropy for span corruption, with the metrics pre-training logs.

Besides the loss it logs the accuracy of the decoder on the masked tokens (target positions that
are neither a sentinel nor ``</s>``) and, when the batch says which language each sample comes
from, each language's share of the batch's target tokens (``share_<lang>``). All logged values
are sums over samples, so they can be summed across workers.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass


@dataclass
class SpanCrossEntropyConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.0, metadata={"help": "epsilon for label smoothing"})


@register_criterion("ast_t5_span_cross_entropy", dataclass=SpanCrossEntropyConfig)
class SpanCrossEntropyCriterion(FairseqCriterion):
    def __init__(self, task, label_smoothing: float = 0.0):
        super().__init__(task)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1)")
        self.eps = label_smoothing
        sentinels = getattr(task, "sentinels", None)
        self.first_sentinel = sentinels.first_sentinel if sentinels is not None else None
        self.eos = task.target_dictionary.eos()

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True).float()  # (B, T, V)
        target = sample["target"]  # (B, T)
        flat = lprobs.view(-1, lprobs.size(-1))
        nll = F.nll_loss(flat, target.view(-1), ignore_index=self.padding_idx, reduction="sum")
        loss = nll
        if self.eps > 0:
            keep = target.view(-1).ne(self.padding_idx)
            smooth = -flat.sum(-1)[keep].sum() / flat.size(-1)
            loss = (1 - self.eps) * nll + self.eps * smooth
        ntokens = sample["ntokens"]
        log = {"loss": loss.data, "nll_loss": nll.data, "ntokens": ntokens,
               "nsentences": sample["nsentences"], "sample_size": ntokens}
        log.update(self._accuracy(lprobs, target))
        log.update(self._language_shares(sample, target))
        return loss, ntokens, log

    def _accuracy(self, lprobs, target):
        with torch.no_grad():
            masked = target.ne(self.padding_idx) & target.ne(self.eos)
            if self.first_sentinel is not None:
                masked &= target.lt(self.first_sentinel)
            correct = (lprobs.argmax(-1).eq(target) & masked).sum()
        return {"n_masked": masked.sum().item(), "n_correct": correct.item()}

    def _language_shares(self, sample, target):
        names = getattr(self.task, "languages", None)
        if "language" not in sample or not names:
            return {}
        counts = target.ne(self.padding_idx).sum(1)
        out = {}
        for k, name in enumerate(names):
            out[f"lang_tokens:{name}"] = counts[sample["language"] == k].sum().item()
        return out

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = lambda key: sum(log.get(key, 0) for log in logging_outputs)
        loss, nll, ntokens = total("loss"), total("nll_loss"), total("ntokens")
        sample_size = total("sample_size")
        metrics.log_scalar("loss", loss / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda m: 2 ** m["nll_loss"].avg if m["nll_loss"].avg < 64 else float("inf"))
        n_masked = total("n_masked")
        if n_masked:
            metrics.log_scalar("masked_accuracy", 100.0 * total("n_correct") / n_masked, n_masked, round=2)
        keys = {k for log in logging_outputs for k in log if k.startswith("lang_tokens:")}
        for key in sorted(keys):
            metrics.log_scalar("share_" + key.split(":", 1)[1], total(key) / max(ntokens, 1), ntokens, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
