"""Arms of the ablation and the sized recipes.

An arm is a pre-training objective on a segmentation of the same files: which corpus it reads
(``ast``: the AST-aware segments given to the command; ``fixed``: fixed-length segments of the same
files) and the Hydra overrides that select its objective. Everything else (model, seed,
optimizer, schedule, token budget) is shared by all arms of a run.
"""
import re
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

DEFAULT_MASK_RATIO = 0.25  # the AST objective's rate; the T5 arms use it as noise density
MEAN_SPAN_LENGTH = 3.0  # T5's mean noise-span length


class ArmError(ValueError):
    """An arm specification that cannot be understood (one-line message)."""


@dataclass(frozen=True)
class Arm:
    name: str
    corpus: str  # "ast" or "fixed"
    objective: str  # "ast" or "t5"
    mask_ratio: float
    overrides: Tuple[str, ...] = ()
    description: str = ""

    def task_overrides(self) -> List[str]:
        if self.objective == "t5":
            base = ["++task.objective=t5", f"++task.noise_density={self.mask_ratio}",
                    f"++task.mean_span_length={MEAN_SPAN_LENGTH}"]
        else:
            base = ["++task.objective=ast", f"++task.mask_prob={self.mask_ratio}"]
        return base + list(self.overrides)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name)


BUILTIN = {
    "t5": ("fixed", "t5", "T5 random spans over fixed-length segments (plain T5)"),
    "t5+seg": ("ast", "t5", "T5 random spans over AST-aware segments"),
    "ast": ("ast", "ast", "AST-aware segments and AST-aware subtree corruption (AST-T5)"),
}


def parse_arm(spec: str, mask_ratio: float = DEFAULT_MASK_RATIO) -> Arm:
    """``t5`` | ``t5+seg`` | ``ast`` | ``BASE@RATIO`` | ``NAME=BASE:KEY=VALUE[,KEY=VALUE...]``.

    ``BASE@RATIO`` changes the masking ratio (noise density of the T5 arms, mask_prob of the AST
    arm); a user arm adds Hydra overrides (``task.obfuscation_prob=0``, ``+task.x=...``) to a
    built-in arm.
    """
    spec = spec.strip()
    name, overrides = spec, ()
    if "=" in spec.split(":", 1)[0]:
        name, rest = spec.split("=", 1)
        base, _, over = rest.partition(":")
        overrides = tuple(o.strip() for o in over.split(",") if o.strip())
        bad = [o for o in overrides if "=" not in o]
        if bad or not name.strip():
            raise ArmError(f"arm {spec!r}: expected NAME=BASE:KEY=VALUE[,KEY=VALUE...]")
        arm = parse_arm(base, mask_ratio)
        return Arm(name.strip(), arm.corpus, arm.objective, arm.mask_ratio,
                   arm.overrides + overrides, f"{arm.description}; {', '.join(overrides)}")
    ratio = mask_ratio
    if "@" in name:
        name, _, r = name.partition("@")
        try:
            ratio = float(r)
        except ValueError:
            raise ArmError(f"arm {spec!r}: the masking ratio after '@' must be a number") from None
        if not 0 < ratio < 1:
            raise ArmError(f"arm {spec!r}: the masking ratio must be in (0, 1)")
    if name not in BUILTIN:
        raise ArmError(f"unknown arm {name!r} (built in: {', '.join(BUILTIN)}; or BASE@RATIO, "
                       "or NAME=BASE:KEY=VALUE,...)")
    corpus, objective, text = BUILTIN[name]
    return Arm(spec, corpus, objective, ratio, (), f"{text}, masking ratio {ratio:g}")


def parse_arms(specs: Sequence[str], mask_ratio: float = DEFAULT_MASK_RATIO) -> List[Arm]:
    arms = [parse_arm(s, mask_ratio) for s in specs if s.strip()]
    names = [a.name for a in arms]
    if len(set(names)) != len(names) or len({a.slug for a in arms}) != len(arms):
        raise ArmError(f"arm names must be distinct: {names}")
    if not arms:
        raise ArmError("no arms given")
    return arms


@dataclass(frozen=True)
class Recipe:
    """Defaults of a sized run; every field can be overridden on the command line."""

    preset: str
    tokens: int
    arms: Tuple[str, ...]
    seeds: Tuple[int, ...]
    overrides: Tuple[str, ...] = ()  # training overrides shared by all arms
    warmup_updates: int = 0  # 0: the preset's warm-up, capped at a tenth of the schedule
    curve_points: int = 6
    problems_per_category: int = 40
    max_infill_tokens: int = 48
    random_span_problems: int = 40
    random_span_window: int = 96
    valid_items_per_language: int = 200
    downstream_train: int = 400
    downstream_test: int = 60
    finetune_updates: int = 60
    finetune_overrides: Tuple[str, ...] = ()
    max_body_tokens: int = 64
    notes: str = ""
    expected: Dict[str, str] = field(default_factory=dict)


RECIPES: Dict[str, Recipe] = {
    # CPU smoke run: a few hundred thousand tokens per arm on a small corpus, minutes on 2 cores.
    "tiny": Recipe(
        preset="tiny", tokens=300_000, arms=("t5", "ast"), seeds=(1,),
        overrides=("dataset.max_tokens=2048", "dataset.batch_size=16"),
        curve_points=4, problems_per_category=12, max_infill_tokens=24, random_span_problems=12,
        random_span_window=64, valid_items_per_language=48, downstream_train=120,
        downstream_test=16, finetune_updates=30, max_body_tokens=32,
        finetune_overrides=("dataset.max_tokens=2048", "dataset.batch_size=16",
                            "common.bf16=false", "++common.cpu=true", "dataset.num_workers=0"),
        notes="CPU smoke recipe: checks the machinery (equal tokens, report structure), never a "
              "winner"),
    # One H100-hour: T5 v1.1 small, 3 arms x 1 seed, ~13 min of training each (see RESULTS.md).
    "small": Recipe(
        preset="small", tokens=200_000_000, arms=("t5", "t5+seg", "ast"), seeds=(1,),
        overrides=("optimization.update_freq=[4]", "dataset.num_workers=6"),
        warmup_updates=500, curve_points=8, problems_per_category=200, max_infill_tokens=64,
        random_span_problems=400, random_span_window=256, valid_items_per_language=2000,
        downstream_train=20_000, downstream_test=500, finetune_updates=2000,
        max_body_tokens=128, finetune_overrides=("dataset.max_tokens=16384",),
        notes="one-H100-hour recipe: 200M training tokens per arm, ~13 minutes per arm at an "
              "estimated ~250k training tokens/s (see RESULTS.md for how it was sized)"),
}
