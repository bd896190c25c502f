// Fused softmax + dropout over the last axis of attention scores, with additive bias and mask.
//
//   forward:  y = softmax(x + bias + mask); out = keep ? y / (1 - p) : 0
//   backward: g' = keep ? g / (1 - p) : 0;  dx = y * (g' - sum(y * g'))
//
// Each row (one query of one head) is handled by TPR threads: one warp for up to 1024 keys, a
// block of 128-512 threads beyond. Thread t holds keys t, t + TPR, ... in registers, so a row is
// read once and written once, with fp32 accumulation whatever the storage dtype. The keep mask is
// packed with warp ballots: word w of a row holds keys [32w, 32w + 32), one bit each.
//
// Only CUDA headers are included (see ../softmax_dropout_kernel.h for why).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "../softmax_dropout_kernel.h"
#include "philox.cuh"

namespace fused_ops {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kMinBlockThreads = 128;  // warp-per-row launches pack four rows per block
constexpr int kRandomsPerDraw = 4;     // one Philox block gives four 32-bit values
constexpr int64_t kMaxGridBlocks = 2147483647;
constexpr double kTwoTo32 = 4294967296.0;

// Launch table: rows of at most kColLimits[i] keys run with kIters[i] keys per thread and
// kThreadsPerRow[i] threads per row (kIters * kThreadsPerRow == kColLimits).
constexpr int kTableSize = 10;
constexpr int64_t kColLimits[kTableSize] = {32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
constexpr int kIters[kTableSize] = {1, 2, 4, 8, 16, 32, 16, 32, 32, 32};
constexpr int kThreadsPerRow[kTableSize] = {32, 32, 32, 32, 32, 32, 128, 128, 256, 512};
static_assert(kColLimits[kTableSize - 1] == kMaxCols, "launch table must cover kMaxCols");

int table_index(int64_t k_len) {
  int i = 0;
  while (i < kTableSize - 1 && k_len > kColLimits[i]) ++i;
  return i;
}

template <typename T>
struct Convert;
template <>
struct Convert<float> {
  __device__ __forceinline__ static float load(float v) { return v; }
  __device__ __forceinline__ static float store(float v) { return v; }
};
template <>
struct Convert<__half> {
  __device__ __forceinline__ static float load(__half v) { return __half2float(v); }
  __device__ __forceinline__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ __forceinline__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ __forceinline__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Reduce v over the TPR threads of a row: warp shuffles, then shared memory across warps.
template <int TPR, typename Op>
__device__ __forceinline__ float row_reduce(float v, Op op, float* smem) {
#pragma unroll
  for (int s = kWarpSize / 2; s > 0; s >>= 1) v = op(v, __shfl_xor_sync(kFullWarp, v, s));
  if constexpr (TPR > kWarpSize) {
    const int warp = threadIdx.x / kWarpSize;
    if (threadIdx.x % kWarpSize == 0) smem[warp] = v;
    __syncthreads();
    v = smem[0];
#pragma unroll
    for (int w = 1; w < TPR / kWarpSize; ++w) v = op(v, smem[w]);
    __syncthreads();  // smem is reused by the next reduction
  }
  return v;
}

// Offset of row `row` (= (b * heads + h) * q_len + q) in a broadcast additive term.
__device__ __forceinline__ int64_t term_offset(int64_t row, const BroadcastStrides& s,
                                               int64_t heads, int64_t q_len) {
  const int64_t bh = row / q_len;
  return (bh / heads) * s.batch + (bh % heads) * s.head + (row % q_len) * s.query;
}

__device__ __forceinline__ void unpack_philox(const PhiloxParams& rng, uint64_t* seed,
                                              uint64_t* offset) {
  if (rng.captured) {
    *seed = static_cast<uint64_t>(*rng.seed_ptr);
    *offset = static_cast<uint64_t>(*rng.offset_ptr) + rng.offset_intragraph;
  } else {
    *seed = rng.seed;
    *offset = rng.offset;
  }
}

__device__ __forceinline__ uint32_t pick(const uint4& r, int i) {
  return i == 0 ? r.x : (i == 1 ? r.y : (i == 2 ? r.z : r.w));
}

// Write probs and dropped output of one row and its packed keep mask.
template <typename T, int ITERS, int TPR>
__device__ __forceinline__ void dropout_store(const ForwardParams& p, int64_t row, int tid,
                                              const float (&e)[ITERS], float inv_sum,
                                              uint64_t keep_threshold, float scale) {
  uint64_t seed, offset;
  unpack_philox(p.rng, &seed, &offset);
  Philox4x32 rng(seed, static_cast<uint64_t>(row) * TPR + tid, offset);
  T* out = static_cast<T*>(p.out) + row * p.k_len;
  T* probs = static_cast<T*>(p.probs) + row * p.k_len;
  const int64_t words = (p.k_len + kMaskWordBits - 1) / kMaskWordBits;
  int32_t* bits = p.keep_bits + row * words;
  const int warp_in_row = tid / kWarpSize;
  const int k_len = static_cast<int>(p.k_len);  // <= kMaxCols (check_shape)
  uint4 draw = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    if (i % kRandomsPerDraw == 0) draw = rng.next();
    const int col = tid + i * TPR;
    const bool in_row = col < k_len;
    const bool keep = in_row && static_cast<uint64_t>(pick(draw, i % kRandomsPerDraw)) < keep_threshold;
    const float y = e[i] * inv_sum;
    if (in_row) {
      probs[col] = Convert<T>::store(y);
      out[col] = Convert<T>::store(keep ? y * scale : 0.0f);
    }
    const unsigned word = __ballot_sync(kFullWarp, keep);
    const int64_t w = static_cast<int64_t>(i) * (TPR / kWarpSize) + warp_in_row;
    if (threadIdx.x % kWarpSize == 0 && w < words) bits[w] = static_cast<int32_t>(word);
  }
}

// One row's scores plus its bias and mask terms, in fp32, -inf past the row's end. Every load is
// issued before any is used: a key past the row's end reads the row's last key (always in bounds)
// and is replaced by -inf afterwards, so the loop has no branch per key. (A branch per key made
// each key's loads wait for the previous key's to return: 32 memory round trips per row, one after
// the other, where one suffices.)
template <typename T, int ITERS, int TPR, bool HAS_BIAS, bool HAS_MASK>
__device__ __forceinline__ void load_row(const T* x, const float* bias, const float* mask, int k_len, int tid,
                                         float (&s)[ITERS]) {
  T raw[ITERS];
  float b[ITERS], m[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int col = min(tid + i * TPR, k_len - 1);  // k_len <= kMaxCols: 32-bit columns
    raw[i] = x[col];
    if constexpr (HAS_BIAS) b[i] = bias[col];
    if constexpr (HAS_MASK) m[i] = mask[col];
  }
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    float v = Convert<T>::load(raw[i]);
    if constexpr (HAS_BIAS) v += b[i];
    if constexpr (HAS_MASK) v += m[i];
    s[i] = tid + i * TPR < k_len ? v : -INFINITY;
  }
}

template <typename T, int ITERS, int TPR>
__global__ void __launch_bounds__(TPR > kMinBlockThreads ? TPR : kMinBlockThreads)
    softmax_dropout_forward_kernel(const ForwardParams p, int64_t rows, uint64_t keep_threshold,
                                   float scale) {
  constexpr int kRowsPerBlock = TPR >= kMinBlockThreads ? 1 : kMinBlockThreads / TPR;
  __shared__ float smem[TPR / kWarpSize];
  const int tid = threadIdx.x % TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR;
  if (row >= rows) return;  // uniform over a warp (TPR == 32) or a block (TPR >= 128)

  const T* x = static_cast<const T*>(p.scores) + row * p.k_len;
  const float* bias = p.bias ? p.bias + term_offset(row, p.bias_strides, p.heads, p.q_len) : nullptr;
  const float* mask = p.mask ? p.mask + term_offset(row, p.mask_strides, p.heads, p.q_len) : nullptr;
  const int k_len = static_cast<int>(p.k_len);  // <= kMaxCols (check_shape)
  float e[ITERS];
  if (bias != nullptr && mask != nullptr) {  // uniform branches: each loads the row in one go
    load_row<T, ITERS, TPR, true, true>(x, bias, mask, k_len, tid, e);
  } else if (bias != nullptr) {
    load_row<T, ITERS, TPR, true, false>(x, bias, mask, k_len, tid, e);
  } else if (mask != nullptr) {
    load_row<T, ITERS, TPR, false, true>(x, bias, mask, k_len, tid, e);
  } else {
    load_row<T, ITERS, TPR, false, false>(x, bias, mask, k_len, tid, e);
  }
  float row_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) row_max = fmaxf(row_max, e[i]);
  row_max = row_reduce<TPR>(row_max, MaxOp(), smem);
  float row_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int col = tid + i * TPR;
    e[i] = col < k_len ? __expf(e[i] - row_max) : 0.0f;
    row_sum += e[i];
  }
  const float inv_sum = 1.0f / row_reduce<TPR>(row_sum, SumOp(), smem);
  if (p.keep_bits != nullptr) {
    dropout_store<T, ITERS, TPR>(p, row, tid, e, inv_sum, keep_threshold, scale);
    return;
  }
  T* out = static_cast<T*>(p.out) + row * p.k_len;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int col = tid + i * TPR;
    if (col < k_len) out[col] = Convert<T>::store(e[i] * inv_sum);
  }
}

// One row of the backward's inputs: y = probs, g = grad * scale where the key was kept (0 where
// dropped), both 0 past the row's end; every load issued before any is used, as in load_row.
template <typename T, int ITERS, int TPR, bool HAS_BITS>
__device__ __forceinline__ void load_grad_row(const T* grad, const T* probs, const int32_t* bits, int k_len,
                                              int tid, float scale, float (&y)[ITERS], float (&g)[ITERS]) {
  T raw_y[ITERS], raw_g[ITERS];
  int32_t word[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int col = min(tid + i * TPR, k_len - 1);  // k_len <= kMaxCols: 32-bit columns
    raw_y[i] = probs[col];
    raw_g[i] = grad[col];
    if constexpr (HAS_BITS) word[i] = bits[col / kMaskWordBits];
  }
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int col = tid + i * TPR;
    bool use = col < k_len;
    if constexpr (HAS_BITS) use = use && ((word[i] >> (col % kMaskWordBits)) & 1) != 0;
    y[i] = col < k_len ? Convert<T>::load(raw_y[i]) : 0.0f;
    g[i] = use ? Convert<T>::load(raw_g[i]) * scale : 0.0f;
  }
}

template <typename T, int ITERS, int TPR>
__global__ void __launch_bounds__(TPR > kMinBlockThreads ? TPR : kMinBlockThreads)
    softmax_dropout_backward_kernel(const BackwardParams p, float scale) {
  constexpr int kRowsPerBlock = TPR >= kMinBlockThreads ? 1 : kMinBlockThreads / TPR;
  __shared__ float smem[TPR / kWarpSize];
  const int tid = threadIdx.x % TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR;
  if (row >= p.rows) return;

  const T* grad = static_cast<const T*>(p.grad_out) + row * p.k_len;
  const T* probs = static_cast<const T*>(p.probs) + row * p.k_len;
  const int64_t words = (p.k_len + kMaskWordBits - 1) / kMaskWordBits;
  const int32_t* bits = p.keep_bits ? p.keep_bits + row * words : nullptr;
  const int k_len = static_cast<int>(p.k_len);  // <= kMaxCols (check_shape)
  float y[ITERS], g[ITERS];
  if (bits != nullptr) {  // uniform: each branch loads the row in one go (load_row)
    load_grad_row<T, ITERS, TPR, true>(grad, probs, bits, k_len, tid, scale, y, g);
  } else {
    load_grad_row<T, ITERS, TPR, false>(grad, probs, bits, k_len, tid, scale, y, g);
  }
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) dot += y[i] * g[i];
  dot = row_reduce<TPR>(dot, SumOp(), smem);
  T* grad_in = static_cast<T*>(p.grad_in) + row * p.k_len;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int col = tid + i * TPR;
    if (col < k_len) grad_in[col] = Convert<T>::store(y[i] * (g[i] - dot));
  }
}

template <int I>
constexpr int block_threads() {
  return kThreadsPerRow[I] > kMinBlockThreads ? kThreadsPerRow[I] : kMinBlockThreads;
}

template <int I>
int64_t grid_blocks(int64_t rows) {
  constexpr int kRowsPerBlock = block_threads<I>() / kThreadsPerRow[I];
  return (rows + kRowsPerBlock - 1) / kRowsPerBlock;
}

template <typename T>
struct ForwardLauncher {
  const ForwardParams& p;
  cudaStream_t stream;
  uint64_t keep_threshold;
  float scale;
  template <int I>
  void run(int64_t rows) const {
    softmax_dropout_forward_kernel<T, kIters[I], kThreadsPerRow[I]>
        <<<grid_blocks<I>(rows), block_threads<I>(), 0, stream>>>(p, rows, keep_threshold, scale);
  }
};

template <typename T>
struct BackwardLauncher {
  const BackwardParams& p;
  cudaStream_t stream;
  float scale;
  template <int I>
  void run(int64_t rows) const {
    softmax_dropout_backward_kernel<T, kIters[I], kThreadsPerRow[I]>
        <<<grid_blocks<I>(rows), block_threads<I>(), 0, stream>>>(p, scale);
  }
};

template <typename Launcher>
void dispatch_cols(int64_t k_len, int64_t rows, const Launcher& launcher) {
  switch (table_index(k_len)) {
    case 0: launcher.template run<0>(rows); break;
    case 1: launcher.template run<1>(rows); break;
    case 2: launcher.template run<2>(rows); break;
    case 3: launcher.template run<3>(rows); break;
    case 4: launcher.template run<4>(rows); break;
    case 5: launcher.template run<5>(rows); break;
    case 6: launcher.template run<6>(rows); break;
    case 7: launcher.template run<7>(rows); break;
    case 8: launcher.template run<8>(rows); break;
    default: launcher.template run<9>(rows); break;
  }
}

template <template <typename> class Launcher, typename... Args>
const char* dispatch_dtype(DType dtype, int64_t k_len, int64_t rows, Args&&... args) {
  switch (dtype) {
    case DType::kFloat32: dispatch_cols(k_len, rows, Launcher<float>{args...}); break;
    case DType::kFloat16: dispatch_cols(k_len, rows, Launcher<__half>{args...}); break;
    case DType::kBFloat16: dispatch_cols(k_len, rows, Launcher<__nv_bfloat16>{args...}); break;
    default: return "softmax_dropout: unsupported dtype";
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

const char* check_shape(int64_t rows, int64_t k_len) {
  if (k_len < 1 || k_len > kMaxCols) return "softmax_dropout: key length outside [1, kMaxCols]";
  if (rows > kMaxGridBlocks) return "softmax_dropout: more rows than one launch can cover";
  return nullptr;
}

}  // namespace

uint64_t philox_randoms_per_thread(int64_t k_len) {
  const int iters = kIters[table_index(k_len)];
  return static_cast<uint64_t>((iters + kRandomsPerDraw - 1) / kRandomsPerDraw) * kRandomsPerDraw;
}

int threads_per_row(int64_t k_len) { return kThreadsPerRow[table_index(k_len)]; }

const char* launch_softmax_dropout_forward(const ForwardParams& p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads * p.q_len;
  if (const char* err = check_shape(rows, p.k_len)) return err;
  if (rows == 0) return nullptr;
  const double keep_prob = 1.0 - static_cast<double>(p.dropout_p);
  const uint64_t keep_threshold = static_cast<uint64_t>(std::llround(keep_prob * kTwoTo32));
  const float scale = static_cast<float>(1.0 / keep_prob);
  return dispatch_dtype<ForwardLauncher>(p.dtype, p.k_len, rows, p, stream, keep_threshold, scale);
}

const char* launch_softmax_dropout_backward(const BackwardParams& p, cudaStream_t stream) {
  if (const char* err = check_shape(p.rows, p.k_len)) return err;
  if (p.rows == 0) return nullptr;
  const float scale = p.keep_bits ? static_cast<float>(1.0 / (1.0 - p.dropout_p)) : 1.0f;
  return dispatch_dtype<BackwardLauncher>(p.dtype, p.k_len, p.rows, p, stream, scale);
}

}  // namespace fused_ops
