// Philox4x32-10 counter-based random numbers, written from the algorithm's description in
// Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3" (SC 2011).
//
// The 128-bit counter is (block index, subsequence): block index = PyTorch's Philox offset / 4
// plus the blocks this thread already drew; subsequence = a per-thread id. Four 32-bit values per
// block, so a launch that draws n values per thread must advance PyTorch's offset by
// 4 * ceil(n / 4), which keeps every (seed, counter) pair used once across launches.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace fused_ops {

class Philox4x32 {
 public:
  __device__ __forceinline__ Philox4x32(uint64_t seed, uint64_t subsequence, uint64_t offset)
      : block_(offset / 4), subsequence_(subsequence) {
    key_ = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }

  // The next four independent uniform 32-bit values.
  __device__ __forceinline__ uint4 next() {
    uint4 ctr = make_uint4(static_cast<uint32_t>(block_), static_cast<uint32_t>(block_ >> 32),
                           static_cast<uint32_t>(subsequence_),
                           static_cast<uint32_t>(subsequence_ >> 32));
    uint2 key = key_;
#pragma unroll
    for (int r = 0; r < kRounds - 1; ++r) {
      ctr = round(ctr, key);
      key.x += kWeyl0;
      key.y += kWeyl1;
    }
    ++block_;
    return round(ctr, key);
  }

 private:
  static constexpr int kRounds = 10;
  static constexpr uint32_t kMul0 = 0xD2511F53u;   // Philox4x32 round multipliers
  static constexpr uint32_t kMul1 = 0xCD9E8D57u;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // key schedule (golden ratio, sqrt(3) - 1)
  static constexpr uint32_t kWeyl1 = 0xBB67AE85u;

  __device__ __forceinline__ static uint4 round(uint4 c, uint2 k) {
    const uint32_t hi0 = __umulhi(kMul0, c.x);
    const uint32_t lo0 = kMul0 * c.x;
    const uint32_t hi1 = __umulhi(kMul1, c.z);
    const uint32_t lo1 = kMul1 * c.z;
    return make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }

  uint2 key_;
  uint64_t block_;
  uint64_t subsequence_;
};

}  // namespace fused_ops
