// Torch glue for the fused softmax-dropout kernel: op schemas, input checks, the RNG state and the
// stream. Registers torch.ops.fused_ops.softmax_dropout_forward / softmax_dropout_backward.
//
// Only device-generic torch headers plus ATen/cuda/CUDAGeneratorImpl.h are used (no c10/cuda):
// the current stream comes from the device guard interface, so this file also compiles against
// the CPU build of PyTorch (see scripts/check_cuda_compile.sh).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <tuple>

#include "softmax_dropout_kernel.h"

namespace fused_ops {
namespace {

DType to_kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK(false, "softmax_dropout: scores must be float32, float16 or bfloat16, got ", t);
  }
}

cudaStream_t current_stream(const at::Device& device) {
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return static_cast<cudaStream_t>(impl->getStream(device).native_handle());
}

void check_scores(const at::Tensor& scores) {
  TORCH_CHECK(scores.is_cuda(), "softmax_dropout: scores must be a CUDA tensor");
  TORCH_CHECK(scores.dim() == 4, "softmax_dropout: scores must be (B, H, Tq, Tk), got ", scores.sizes());
  TORCH_CHECK(scores.is_contiguous(), "softmax_dropout: scores must be contiguous");
  TORCH_CHECK(scores.size(3) >= 1 && scores.size(3) <= kMaxCols,
              "softmax_dropout: key length must be in [1, ", kMaxCols, "], got ", scores.size(3));
}

// An additive term: fp32, expanded to the scores' shape, unit stride on keys.
const float* check_term(const std::optional<at::Tensor>& term, const at::Tensor& scores,
                        const char* name, BroadcastStrides* strides) {
  if (!term.has_value() || !term->defined()) return nullptr;
  const at::Tensor& t = *term;
  TORCH_CHECK(t.device() == scores.device(), "softmax_dropout: ", name, " is on another device");
  TORCH_CHECK(t.scalar_type() == at::kFloat, "softmax_dropout: ", name, " must be float32");
  TORCH_CHECK(t.sizes() == scores.sizes(), "softmax_dropout: ", name,
              " must be expanded to the scores' shape ", scores.sizes(), ", got ", t.sizes());
  TORCH_CHECK(t.stride(3) == 1, "softmax_dropout: ", name, " needs unit stride on the key axis");
  strides->batch = t.stride(0);
  strides->head = t.stride(1);
  strides->query = t.stride(2);
  return t.data_ptr<float>();
}

PhiloxParams reserve_philox(const at::Device& device, uint64_t increment) {
  auto gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(device.index()));
  at::PhiloxCudaState state;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    state = gen->philox_cuda_state(increment);
  }
  PhiloxParams rng;
  rng.captured = state.captured_;
  if (state.captured_) {
    rng.seed_ptr = state.seed_.ptr;
    rng.offset_ptr = state.offset_.ptr;
    rng.offset_intragraph = state.offset_intragraph_;
  } else {
    rng.seed = state.seed_.val;
    rng.offset = state.offset_.val;
  }
  return rng;
}

}  // namespace

// Returns (out, probs, keep_bits); probs and keep_bits are empty when no dropout is applied.
std::tuple<at::Tensor, at::Tensor, at::Tensor> softmax_dropout_forward(
    const at::Tensor& scores, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& mask, double p, bool training) {
  check_scores(scores);
  TORCH_CHECK(p >= 0.0 && p < 1.0, "softmax_dropout: p must be in [0, 1), got ", p);
  c10::DeviceGuard guard(scores.device());
  ForwardParams params;
  params.scores = scores.data_ptr();
  params.bias = check_term(bias, scores, "bias", &params.bias_strides);
  params.mask = check_term(mask, scores, "mask", &params.mask_strides);
  params.batch = scores.size(0);
  params.heads = scores.size(1);
  params.q_len = scores.size(2);
  params.k_len = scores.size(3);
  params.dtype = to_kernel_dtype(scores.scalar_type());
  at::Tensor out = at::empty_like(scores);
  at::Tensor probs = at::empty({0}, scores.options());
  at::Tensor keep_bits = at::empty({0}, scores.options().dtype(at::kInt));
  params.out = out.data_ptr();
  if (training && p > 0.0) {
    const int64_t rows = params.batch * params.heads * params.q_len;
    const int64_t words = (params.k_len + kMaskWordBits - 1) / kMaskWordBits;
    probs = at::empty_like(scores);
    keep_bits = at::empty({rows, words}, scores.options().dtype(at::kInt));
    params.probs = probs.data_ptr();
    params.keep_bits = keep_bits.data_ptr<int32_t>();
    params.dropout_p = static_cast<float>(p);
    params.rng = reserve_philox(scores.device(), philox_randoms_per_thread(params.k_len));
  }
  const char* err = launch_softmax_dropout_forward(params, current_stream(scores.device()));
  TORCH_CHECK(err == nullptr, "softmax_dropout forward launch failed: ", err);
  return {out, probs, keep_bits};
}

at::Tensor softmax_dropout_backward(const at::Tensor& grad_out, const at::Tensor& probs,
                                    const at::Tensor& keep_bits, double p) {
  check_scores(grad_out);
  TORCH_CHECK(probs.sizes() == grad_out.sizes() && probs.is_contiguous() &&
                  probs.scalar_type() == grad_out.scalar_type() && probs.device() == grad_out.device(),
              "softmax_dropout backward: probs must match grad_out (shape, dtype, device, contiguous)");
  c10::DeviceGuard guard(grad_out.device());
  BackwardParams params;
  params.rows = grad_out.numel() / grad_out.size(3);
  params.k_len = grad_out.size(3);
  if (keep_bits.numel() > 0) {
    const int64_t words = (params.k_len + kMaskWordBits - 1) / kMaskWordBits;
    TORCH_CHECK(keep_bits.scalar_type() == at::kInt && keep_bits.is_contiguous() &&
                    keep_bits.numel() == params.rows * words,
                "softmax_dropout backward: keep_bits must be contiguous int32 (rows, ceil(Tk/32))");
    params.keep_bits = keep_bits.data_ptr<int32_t>();
    params.dropout_p = static_cast<float>(p);
  }
  at::Tensor grad_in = at::empty_like(grad_out);
  params.grad_out = grad_out.data_ptr();
  params.probs = probs.data_ptr();
  params.grad_in = grad_in.data_ptr();
  params.dtype = to_kernel_dtype(grad_out.scalar_type());
  const char* err = launch_softmax_dropout_backward(params, current_stream(grad_out.device()));
  TORCH_CHECK(err == nullptr, "softmax_dropout backward launch failed: ", err);
  return grad_in;
}

}  // namespace fused_ops

TORCH_LIBRARY(fused_ops, m) {
  m.def("softmax_dropout_forward(Tensor scores, Tensor? bias, Tensor? mask, float p, bool training)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("softmax_dropout_backward(Tensor grad_out, Tensor probs, Tensor keep_bits, float p) -> Tensor");
}

TORCH_LIBRARY_IMPL(fused_ops, CUDA, m) {
  m.impl("softmax_dropout_forward", &fused_ops::softmax_dropout_forward);
  m.impl("softmax_dropout_backward", &fused_ops::softmax_dropout_backward);
}

// A Python module entry point, so the library imports as `fused_ops._C` (setup.py) or under the
// JIT build's name; importing it runs the registrations above.
#define FUSED_OPS_CONCAT_(a, b) a##b
#define FUSED_OPS_CONCAT(a, b) FUSED_OPS_CONCAT_(a, b)
#define FUSED_OPS_STR_(a) #a
#define FUSED_OPS_STR(a) FUSED_OPS_STR_(a)
#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME _C
#endif

PyMODINIT_FUNC FUSED_OPS_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, FUSED_OPS_STR(TORCH_EXTENSION_NAME),
                                   "fused_ops CUDA kernels (ops registered under torch.ops.fused_ops)",
                                   -1, nullptr};
  return PyModule_Create(&module_def);
}
