// Element conversion from raw little-endian tensor bytes (as stored in safetensors and
// NumPy files, any alignment) to fp32 or int64. Internal to sim/io.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/io/tensor_store.h"

namespace kvb {

bool dtype_is_float(DType d);  // F32, F16, BF16, F64
// "F32", "BF16", ... (safetensors spelling) -> DType; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);
// "F32, F16, BF16, F64, I32, ..." for error messages.
std::string known_dtype_names();

// n elements starting at src, stored in row-major (C) order -> out[0..n).
void convert_to_f32(const uint8_t* src, DType d, int64_t n, float* out);
// Throws kvb::Error "WHAT: F64 value V at storage index i is beyond fp32's range" when a
// finite F64 element would become Inf in fp32 (only F64 can; other dtypes: no-op).
void require_fits_f32(const uint8_t* src, DType d, int64_t n, const std::string& what);
void convert_to_i64(const uint8_t* src, DType d, int64_t n, int64_t* out);  // d must be an integer type

// Elements of `shape` stored in column-major (Fortran) order -> row-major out.
void convert_fortran_to_f32(const uint8_t* src, DType d, const std::vector<int64_t>& shape, float* out);
void convert_fortran_to_i64(const uint8_t* src, DType d, const std::vector<int64_t>& shape, int64_t* out);

// Product of the dimensions; throws kvb::Error (prefixed with `where`) on a negative
// dimension or when the byte size would overflow 63 bits.
int64_t checked_numel(const std::vector<int64_t>& shape, int element_bytes, const std::string& where);

}  // namespace kvb
