"""Adafactor selectable from Hydra configs (Shazeer & Stern, 2018; T5's optimizer).

fairseq ships an Adafactor, but registers it the legacy argparse way, so a YAML
``optimizer: {_name: adafactor}`` reaches it without its defaults. This registers the same
algorithm (fairseq's ``fairseq.optim.adafactor.Adafactor``, imported, not copied) under the name
``t5_adafactor`` with a dataclass config, which fairseq-hydra-train validates and fills.
"""
from dataclasses import dataclass, field
from typing import Any, List, Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.adafactor import Adafactor
from omegaconf import II


@dataclass
class T5AdafactorConfig(FairseqDataclass):
    adafactor_eps: Any = field(default=(1e-30, 1e-3), metadata={
        "help": "(eps1, eps2): regularizer of the squared gradient, floor of the parameter scale"})
    clip_threshold: float = field(default=1.0, metadata={"help": "threshold of the update's RMS"})
    decay_rate: float = field(default=-0.8, metadata={"help": "decay of the second moment"})
    beta1: Optional[float] = field(default=None, metadata={"help": "first moment (None: none)"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    scale_parameter: bool = field(default=True, metadata={"help": "scale the step by the parameter RMS"})
    relative_step: bool = field(default=False, metadata={
        "help": "T5's time-dependent step size instead of optimization.lr (then set lr to [0])"})
    warmup_init: bool = field(default=False, metadata={"help": "warm-up with relative_step"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("t5_adafactor", dataclass=T5AdafactorConfig)
class T5Adafactor(FairseqOptimizer):
    def __init__(self, cfg: T5AdafactorConfig, params):
        super().__init__(cfg)
        self._optimizer = Adafactor(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        lr = None if self.cfg.relative_step else self.cfg.lr[0]
        return {"lr": lr, "eps": tuple(self.cfg.adafactor_eps), "clip_threshold": self.cfg.clip_threshold,
                "decay_rate": self.cfg.decay_rate, "beta1": self.cfg.beta1,
                "weight_decay": self.cfg.weight_decay, "scale_parameter": self.cfg.scale_parameter,
                "relative_step": self.cfg.relative_step, "warmup_init": self.cfg.warmup_init}
