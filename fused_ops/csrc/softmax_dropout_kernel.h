// Interface between the torch glue (softmax_dropout.cpp) and the CUDA kernels
// (cuda/softmax_dropout_kernel.cu).
//
// Only plain C++ and CUDA runtime types cross this boundary, so the kernel file compiles against
// the CUDA toolkit alone: the CPU build of PyTorch ships ATen/cuda headers but not the generated
// c10/cuda ones (c10/cuda/impl/cuda_cmake_macros.h), and minimal CUDA toolkits lack curand. The
// glue includes only device-generic torch headers plus ATen/cuda/CUDAGeneratorImpl.h.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace fused_ops {

// Longest key length in the launch table; keep equal to MAX_FUSED_COLS in softmax_dropout.py.
constexpr int64_t kMaxCols = 16384;
// The keep mask is packed one 32-bit word per 32 consecutive keys of a row.
constexpr int kMaskWordBits = 32;

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// PyTorch's Philox state for one launch (mirrors at::PhiloxCudaState). Outside CUDA-graph capture
// the seed and offset are values; during capture they are device pointers read by the kernel,
// plus an offset within the graph.
struct PhiloxParams {
  uint64_t seed = 0;
  uint64_t offset = 0;
  const int64_t* seed_ptr = nullptr;
  const int64_t* offset_ptr = nullptr;
  uint64_t offset_intragraph = 0;
  bool captured = false;
};

// Element strides of an additive term (bias or mask) over the (batch, head, query) axes of the
// scores; 0 on broadcast axes. Its key axis has unit stride.
struct BroadcastStrides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t query = 0;
};

struct ForwardParams {
  const void* scores = nullptr;  // (batch, heads, q_len, k_len) contiguous, `dtype`
  const float* bias = nullptr;   // optional, fp32, `bias_strides`
  BroadcastStrides bias_strides;
  const float* mask = nullptr;   // optional, fp32, `mask_strides`
  BroadcastStrides mask_strides;
  void* out = nullptr;           // like scores
  void* probs = nullptr;         // like scores; written only when dropout is applied
  int32_t* keep_bits = nullptr;  // (rows, ceil(k_len / 32)); non-null iff dropout is applied
  int64_t batch = 0, heads = 0, q_len = 0, k_len = 0;
  float dropout_p = 0.0f;
  PhiloxParams rng;
  DType dtype = DType::kFloat32;
};

struct BackwardParams {
  const void* grad_out = nullptr;      // (rows, k_len) contiguous, `dtype`
  const void* probs = nullptr;         // softmax before dropout, like grad_out
  const int32_t* keep_bits = nullptr;  // null when no dropout was applied
  void* grad_in = nullptr;             // like grad_out
  int64_t rows = 0, k_len = 0;
  float dropout_p = 0.0f;
  DType dtype = DType::kFloat32;
};

// Random 32-bit values each thread draws for a row of k_len keys (a multiple of 4): the Philox
// offset increment to reserve from PyTorch's generator for one forward launch.
uint64_t philox_randoms_per_thread(int64_t k_len);

// Threads that share one row for k_len keys (the launch table in the .cu file).
int threads_per_row(int64_t k_len);

// Launch on `stream`; return nullptr on success, else a static error message.
const char* launch_softmax_dropout_forward(const ForwardParams& params, cudaStream_t stream);
const char* launch_softmax_dropout_backward(const BackwardParams& params, cudaStream_t stream);

}  // namespace fused_ops
