// Weights held in the checkpoint's dtype (sim/model/weights.h) and dense() on them
// (sim/model/layers.h): 16-bit weights give bit-identical products to the same weights
// held in fp32, transposes and stacks keep every value, and memory is 2 bytes a weight.
#include <cstring>
#include <vector>

#include "sim/core/half.h"
#include "sim/model/layers.h"
#include "sim/model/weights.h"
#include "test_util.h"

using namespace kvb;

namespace {

// A [rows, cols] matrix of N(0, 1) values rounded to the dtype, held 16-bit, and the
// same values held in fp32.
std::pair<WeightMatrix, WeightMatrix> random_weight(DType dtype, int64_t rows, int64_t cols, uint64_t seed) {
  const std::vector<float> x = test::random_normal(static_cast<size_t>(rows * cols), seed);
  WeightMatrix::Bits bits(x.size());
  RowMatrix f32(rows, cols);
  for (size_t i = 0; i < x.size(); ++i) {
    bits[i] = dtype == DType::BF16 ? f32_to_bf16_bits(x[i]) : f32_to_f16_bits(x[i]);
    f32.data()[i] = dtype == DType::BF16 ? bf16_bits_to_f32(bits[i]) : f16_bits_to_f32(bits[i]);
  }
  return {WeightMatrix(dtype, rows, cols, std::move(bits)), WeightMatrix(std::move(f32))};
}

bool same_bits(const RowMatrix& a, const RowMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size()) * sizeof(float)) == 0;
}

RowMatrix to_f32(const WeightMatrix& w) {
  RowMatrix m(w.rows(), w.cols());
  w.rows_to_f32(0, w.rows(), m.data());
  return m;
}

}  // namespace

TEST_CASE("dense() on 16-bit weights equals dense() on the same weights in fp32, bit for bit") {
  for (const DType dt : {DType::BF16, DType::F16}) {
    CAPTURE(dtype_name(dt));
    // 300 outputs: two full column tiles of 128 and a partial one; 600 rows: three row tiles.
    const auto [w16, w32] = random_weight(dt, 300, 96, 5);
    CHECK(w16.bytes() == 300 * 96 * 2);
    CHECK(w32.bytes() == 300 * 96 * 4);
    Eigen::VectorXf bias = Eigen::VectorXf::Random(300);
    for (const int64_t rows : {1, 7, 600}) {
      CAPTURE(rows);
      const RowMatrix x = RowMatrix::Random(rows, 96);
      RowMatrix y16(rows, 300), y32(rows, 300);
      dense(x, w16, &bias, y16);
      dense(x, w32, &bias, y32);
      CHECK(same_bits(y16, y32));
      dense(x, w16, nullptr, y16);
      dense(x, w32, nullptr, y32);
      CHECK(same_bits(y16, y32));
    }
  }
}

TEST_CASE("16-bit weights: transposed and stacked keep every value and their dtype") {
  const auto [a16, a32] = random_weight(DType::BF16, 5, 3, 1);
  const auto [b16, b32] = random_weight(DType::BF16, 2, 3, 2);
  const WeightMatrix t = a16.transposed();
  CHECK(t.dtype() == DType::BF16);
  CHECK(same_bits(to_f32(t), RowMatrix(to_f32(a32).transpose())));
  const WeightMatrix s = WeightMatrix::stack_rows({a16, b16});
  CHECK(s.dtype() == DType::BF16);
  RowMatrix want(7, 3);
  want << to_f32(a32), to_f32(b32);
  CHECK(same_bits(to_f32(s), want));
  // Mixed dtypes stack in fp32, values unchanged.
  const WeightMatrix mixed = WeightMatrix::stack_rows({a16, b32});
  CHECK(mixed.dtype() == DType::F32);
  CHECK(same_bits(to_f32(mixed), want));
  // One row at a time (the embedding lookup).
  std::vector<float> row(3);
  a16.rows_to_f32(4, 1, row.data());
  CHECK(std::memcmp(row.data(), to_f32(a32).row(4).data(), sizeof(float) * 3) == 0);
}

TEST_CASE("fp16 weights widen to the per-value conversion's bits for every pattern, at any offset and length") {
  // All 65536 patterns (NaNs with payloads, subnormals, infinities, signed zeros) as a
  // [256, 256] matrix; widened from every first row and in odd lengths, so that both the
  // vector groups of eight and the tails are met.
  WeightMatrix::Bits bits(65536);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  const WeightMatrix w(DType::F16, 256, 256, bits);
  std::vector<float> out(65536);
  w.rows_to_f32(0, 256, out.data());
  size_t differing = 0;
  for (size_t i = 0; i < out.size(); ++i)
    differing += float_bits(out[i]) != float_bits(f16_bits_to_f32(static_cast<uint16_t>(i)));
  CHECK(differing == 0);
  const WeightMatrix narrow(DType::F16, 65536 / 7, 7, WeightMatrix::Bits(bits.begin(), bits.begin() + 65536 / 7 * 7));
  std::vector<float> row(7 * 3);
  for (int64_t first : {int64_t{0}, int64_t{1}, int64_t{4681}, int64_t{9358}}) {
    narrow.rows_to_f32(first, 3, row.data());
    for (size_t k = 0; k < row.size(); ++k)
      CHECK(float_bits(row[k]) == float_bits(f16_bits_to_f32(static_cast<uint16_t>(first * 7 + static_cast<int64_t>(k)))));
  }
}
