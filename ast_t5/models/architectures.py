"""Registers each preset of presets.py as a fairseq architecture (``--arch`` / ``model._name``)."""
from fairseq.models import register_model_architecture

from . import ast_t5_model  # noqa: F401  (the model must be registered before its architectures)
from .presets import ARCH_PRESETS, MODEL_NAME, apply_preset


def _register(arch: str) -> None:
    @register_model_architecture(MODEL_NAME, arch)
    def preset(cfg):
        apply_preset(cfg, arch)

    preset.__name__ = arch
    preset.__doc__ = f"Sizes of {arch}: {ARCH_PRESETS[arch]}"


for _arch in ARCH_PRESETS:
    _register(_arch)
