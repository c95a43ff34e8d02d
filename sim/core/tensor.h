// A dense fp32 tensor, row-major, host memory. Recordings hold these.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvb {

struct Tensor {
  std::vector<int64_t> shape;  // outermost first
  std::vector<float> data;     // row-major, numel() values

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s) : shape(std::move(s)), data(count(shape), 0.0f) {}

  static int64_t count(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t v : s) n *= v;
    return n;
  }
  int64_t numel() const { return count(shape); }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  bool empty() const { return data.empty(); }

  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }

  // Rank-3 access: [a, b, c].
  float& at(int64_t a, int64_t b, int64_t c) { return data[static_cast<size_t>((a * shape[1] + b) * shape[2] + c)]; }
  float at(int64_t a, int64_t b, int64_t c) const {
    return data[static_cast<size_t>((a * shape[1] + b) * shape[2] + c)];
  }
  // Start of the [b, c] slice at a (rank 3): e.g. one head's [tokens, head_dim].
  float* slice(int64_t a) { return data.data() + a * shape[1] * shape[2]; }
  const float* slice(int64_t a) const { return data.data() + a * shape[1] * shape[2]; }
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[6, 512, 64]"

// Throws kvb::Error naming `what` and the multi-index of the first NaN or Inf.
void require_finite(const Tensor& t, const std::string& what);

}  // namespace kvb
