"""Linear projections that fairseq's Trainer does not mistake for shared parameters.

``nn.Linear(..., bias=False)`` registers ``bias`` as a None parameter; fairseq's Trainer catalogs
parameters by identity, so all those Nones look like one parameter shared by every projection
and it logs "detected shared parameter" for each. Here a bias-free projection keeps ``bias`` as a
plain attribute instead.
"""
import torch.nn as nn


def linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """An nn.Linear (weight (out, in)); with ``bias=False`` no None entry among its parameters."""
    layer = nn.Linear(in_features, out_features, bias=bias)
    if not bias:
        del layer._parameters["bias"]
        layer.bias = None  # nn.Linear.forward reads self.bias
    return layer
