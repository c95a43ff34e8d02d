#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/core/strings.h"
#include "sim/io/dtype_convert.h"

namespace kvb {

static_assert(std::endian::native == std::endian::little,
              "tensor files are little-endian; the loaders read them in place and assume a little-endian host");

namespace {

struct DTypeRow {
  DType dtype;
  const char* name;
  int bytes;
  bool is_float;
};

constexpr DTypeRow kDTypes[] = {
    {DType::F32, "F32", 4, true},  {DType::F16, "F16", 2, true},   {DType::BF16, "BF16", 2, true},
    {DType::F64, "F64", 8, true},  {DType::I32, "I32", 4, false},  {DType::I64, "I64", 8, false},
    {DType::U8, "U8", 1, false},   {DType::I8, "I8", 1, false},    {DType::I16, "I16", 2, false},
    {DType::BOOL, "BOOL", 1, false},
};

const DTypeRow& row(DType d) {
  for (const DTypeRow& r : kDTypes)
    if (r.dtype == d) return r;
  throw Error("internal: unknown DType value " + std::to_string(static_cast<int>(d)));
}

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Calls f(element_pointer -> value) for the dtype: the one switch every converter shares.
template <class Out, class Visit>
void with_element_reader(DType d, Visit&& visit) {
  switch (d) {
    case DType::F32: return visit([](const uint8_t* p) { return static_cast<Out>(load<float>(p)); });
    case DType::F16: return visit([](const uint8_t* p) { return static_cast<Out>(f16_bits_to_f32(load<uint16_t>(p))); });
    case DType::BF16:
      return visit([](const uint8_t* p) { return static_cast<Out>(bf16_bits_to_f32(load<uint16_t>(p))); });
    case DType::F64: return visit([](const uint8_t* p) { return static_cast<Out>(load<double>(p)); });
    case DType::I32: return visit([](const uint8_t* p) { return static_cast<Out>(load<int32_t>(p)); });
    case DType::I64: return visit([](const uint8_t* p) { return static_cast<Out>(load<int64_t>(p)); });
    case DType::U8: return visit([](const uint8_t* p) { return static_cast<Out>(*p); });
    case DType::I8: return visit([](const uint8_t* p) { return static_cast<Out>(static_cast<int8_t>(*p)); });
    case DType::I16: return visit([](const uint8_t* p) { return static_cast<Out>(load<int16_t>(p)); });
    case DType::BOOL: return visit([](const uint8_t* p) { return static_cast<Out>(*p != 0); });
  }
}

template <class Out>
void convert_c_order(const uint8_t* src, DType d, int64_t n, Out* out) {
  if constexpr (std::is_same_v<Out, float>) {
    if (d == DType::F32) {  // already the output representation
      if (n > 0) std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      return;
    }
  }
  const int64_t size = dtype_bytes(d);
  with_element_reader<Out>(d, [&](auto read) {
    for (int64_t i = 0; i < n; ++i) out[i] = read(src + i * size);
  });
}

// Walks the source in storage order (axis 0 fastest) and scatters into row-major out.
template <class Out>
void convert_fortran_order(const uint8_t* src, DType d, const std::vector<int64_t>& shape, Out* out) {
  const int64_t n = Tensor::count(shape);
  const size_t rank = shape.size();
  if (n == 0) return;
  std::vector<int64_t> c_stride(rank, 1);  // row-major strides of the output, in elements
  for (size_t a = rank; a-- > 1;) c_stride[a - 1] = c_stride[a] * shape[a];
  std::vector<int64_t> idx(rank, 0);
  const int64_t size = dtype_bytes(d);
  with_element_reader<Out>(d, [&](auto read) {
    int64_t dest = 0;
    for (int64_t j = 0; j < n; ++j) {
      out[dest] = read(src + j * size);
      for (size_t a = 0; a < rank; ++a) {  // next multi-index, axis 0 fastest
        dest += c_stride[a];
        if (++idx[a] < shape[a]) break;
        dest -= c_stride[a] * shape[a];
        idx[a] = 0;
      }
    }
  });
}

}  // namespace

const char* dtype_name(DType d) { return row(d).name; }
int dtype_bytes(DType d) { return row(d).bytes; }
bool dtype_is_float(DType d) { return row(d).is_float; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeRow& r : kDTypes)
    if (name == r.name) return r.dtype;
  return std::nullopt;
}

std::string known_dtype_names() {
  std::string s;
  for (const DTypeRow& r : kDTypes) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

void convert_to_f32(const uint8_t* src, DType d, int64_t n, float* out) { convert_c_order(src, d, n, out); }

void require_fits_f32(const uint8_t* src, DType d, int64_t n, const std::string& what) {
  if (d != DType::F64) return;
  for (int64_t i = 0; i < n; ++i) {
    const double v = load<double>(src + i * 8);
    if (std::isfinite(v) && std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max()))
      throw Error(what + ": F64 value " + format_double(v) + " at storage index " + std::to_string(i) +
                  " is beyond fp32's range (kvbudget computes in fp32)");
  }
}

void convert_to_i64(const uint8_t* src, DType d, int64_t n, int64_t* out) {
  if (dtype_is_float(d)) throw Error(std::string("internal: convert_to_i64 on float dtype ") + dtype_name(d));
  convert_c_order(src, d, n, out);
}

void convert_fortran_to_f32(const uint8_t* src, DType d, const std::vector<int64_t>& shape, float* out) {
  convert_fortran_order(src, d, shape, out);
}

void convert_fortran_to_i64(const uint8_t* src, DType d, const std::vector<int64_t>& shape, int64_t* out) {
  if (dtype_is_float(d)) throw Error(std::string("internal: convert_to_i64 on float dtype ") + dtype_name(d));
  convert_fortran_order(src, d, shape, out);
}

int64_t checked_numel(const std::vector<int64_t>& shape, int element_bytes, const std::string& where) {
  int64_t n = 1;
  const int64_t limit = std::numeric_limits<int64_t>::max() / std::max(1, element_bytes);
  for (int64_t v : shape) {
    if (v < 0) throw Error(where + ": negative dimension in shape " + shape_str(shape));
    if (v != 0 && n > limit / v) throw Error(where + ": shape " + shape_str(shape) + " is too large");
    n *= v;
  }
  return n;
}

}  // namespace kvb
