// The NumPy .npy header (format versions 1.0, 2.0, 3.0). Internal to sim/io.
//
//   "\x93NUMPY" major minor  header_len (u16 LE for 1.x, u32 LE for 2.x/3.x)
//   header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
//   then the array's bytes: row-major (C order) unless fortran_order is True.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sim/io/tensor_store.h"

namespace kvb {

struct NpyHeader {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;   // () for a 0-d array
  bool fortran_order = false;   // column-major storage; read_f32 transposes it to row-major
  uint64_t data_offset = 0;     // bytes from the start of the .npy to the array data
  int64_t numel() const;
  uint64_t data_bytes() const;  // numel * dtype size
};

// Bytes the header occupies (magic, length field and dict), given at least the first
// 12 bytes of the .npy (fewer: throws "truncated"). `where` prefixes errors.
uint64_t npy_header_size(const uint8_t* bytes, uint64_t available, const std::string& where);

// Parses the header from the first `available` bytes of an .npy image (at least
// npy_header_size of them). Supported descr: '<f4' '<f2' '<f8' '<i2' '<i4' '<i8'
// '|u1' '|i1' '|b1'. Big-endian and structured dtypes are rejected with a clear error.
NpyHeader parse_npy_header(const uint8_t* bytes, uint64_t available, const std::string& where);

}  // namespace kvb
