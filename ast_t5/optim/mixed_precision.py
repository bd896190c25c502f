"""The update step of fairseq's mixed-precision wrapper (``FP16Optimizer`` under ``common.bf16``),
without its per-parameter loops.

Under ``common.bf16=true`` fairseq wraps our optimizer in ``FP16Optimizer`` with one fp32 master
copy per parameter (it never flattens them under bf16). Its ``step`` updates the masters and then
copies each back into its bf16 parameter with its own ``copy_``, and the trainer's ``zero_grad``
before the next forward zeroes each master gradient with its own ``zero_``: on a GPU, T5-base's 198
parameter tensors make about 400 kernel launches at the end of every update, all issued after the
trainer's host synchronizations of that update (the gradient-norm check and the logged values),
while the GPU has nothing else to run.

``fp16_optimizer_step`` does what ``FP16Optimizer.step`` does (an optimizer that
``folds_gradient_factor``, adamw_scale, is handed the wrapper's gradient factor instead of having
the gradients multiplied by it first), with the copy back as one
``torch._foreach_copy_`` per device and dtype, and then drops the master gradients
(``grad = None``): the next update's gradient sync allocates them again from the bf16 gradients
(fairseq's own path for a master without a gradient, ``p.grad.float()``, one launch each, as the
``copy_`` it replaces), so ``zero_grad`` finds nothing to zero, and the fp32 gradients (4 bytes per
parameter, about 1 GB for T5-base) are not held through the next forward and backward. The
parameters, optimizer state and gradients each step sees are exactly those of fairseq's step
(``tests/ast_t5/test_host_overhead.py``).

The tasks call it from ``optimizer_step`` (FairseqTask's hook for the step); any other optimizer or
wrapper (fp16 with flat master weights and loss scaling, memory-efficient or AMP wrappers) takes
its own ``step``.
"""
from collections import defaultdict

import torch
from fairseq.optim.fp16_optimizer import FP16Optimizer


def takes_fast_step(optimizer) -> bool:
    """Whether ``fp16_optimizer_step`` applies: fairseq's FP16Optimizer itself (not a subclass,
    whose step may differ), with one master weight per parameter (bf16 always; fp16 with
    ``fp16_no_flatten_grads``)."""
    return type(optimizer) is FP16Optimizer and not optimizer.has_flat_params


def fp16_optimizer_step(optimizer) -> None:
    """``FP16Optimizer.step()`` with the master-to-model copies batched and the master gradients
    released (module docstring). ``optimizer`` must satisfy ``takes_fast_step``."""
    if not takes_fast_step(optimizer):
        raise TypeError(f"fp16_optimizer_step needs fairseq's FP16Optimizer with one master weight per "
                        f"parameter, got {type(optimizer).__name__}")
    # FP16Optimizer.step's own sequence, down to the copy back
    optimizer._sync_fp16_grads_to_fp32()
    inner = optimizer.fp32_optimizer.optimizer
    if getattr(inner, "folds_gradient_factor", False):
        # the optimizer multiplies the gradients by the wrapper's factor itself (adamw_scale: inside its
        # compiled kernels), where _unscale_grads would make a pass of its own; then reset as it does
        factor = optimizer._multiply_factor
        inner.step(grad_factor=factor if torch.is_tensor(factor) or factor != 1.0 else None)
        optimizer._multiply_factor = 1.0
    elif getattr(optimizer, "supports_step_with_scale", False):
        optimizer.fp32_optimizer.step(None, scale=(1.0 / optimizer._multiply_factor), groups=None)
    else:
        optimizer._unscale_grads()
        optimizer.fp32_optimizer.step(None, groups=None)
    if optimizer.scaler is not None:
        optimizer.scaler.update()
    pairs = defaultdict(lambda: ([], []))
    for p, p32 in zip(optimizer.fp16_params, optimizer.fp32_params):
        if p.requires_grad:
            dst, src = pairs[(p.device, p.dtype, p32.device)]
            dst.append(p)
            src.append(p32)
    with torch.no_grad():  # (not .data: that is one more dispatched op per tensor)
        for dst, src in pairs.values():
            torch._foreach_copy_(dst, src)
    for p32 in optimizer.fp32_params:
        p32.grad = None
