#pragma once
#include <array>
#include <cstddef>
#include <optional>

// Fixed-capacity FIFO queue that overwrites nothing: push fails when full.
template <typename T, std::size_t N>
class RingBuffer {
 public:
  bool push(const T& value) {
    if (count_ == N) return false;
    data_[(head_ + count_) % N] = value;
    ++count_;
    return true;
  }

  std::optional<T> pop() {
    if (count_ == 0) return std::nullopt;
    T value = data_[head_];
    head_ = (head_ + 1) % N;
    --count_;
    return value;
  }

  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

 private:
  std::array<T, N> data_{};
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};
