// Reading members of a zip archive (as NumPy's savez / savez_compressed write them),
// following PKWARE's APPNOTE: the end-of-central-directory record (and its zip64
// variant), central directory headers with zip64 extended-information extra fields,
// local headers, and members stored (method 0) or deflated (method 8, via zlib).
// Internal to sim/io.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sim/io/mapped_file.h"

namespace kvb {

struct ZipMember {
  std::string name;
  uint16_t method = 0;             // 0 stored, 8 deflated (others are rejected when read)
  uint32_t crc32 = 0;              // of the uncompressed bytes
  uint64_t compressed_size = 0;    // bytes at data_offset in the archive
  uint64_t uncompressed_size = 0;
  uint64_t data_offset = 0;        // archive offset of the member's (compressed) bytes
};

// The members listed in the central directory, in directory order. Every member's
// local header and data are checked to lie inside the file. Throws kvb::Error naming
// the archive (and the member) on any structural problem, encryption, or a
// multi-disk archive.
std::vector<ZipMember> read_zip_directory(const MappedFile& zip);

// The first `max_bytes` uncompressed bytes of a member (all of them when max_bytes is
// at least uncompressed_size, in which case the size and CRC-32 are verified).
// Stored members are copied; use them in place when possible (see zip_stored_bytes).
std::vector<uint8_t> zip_inflate(const MappedFile& zip, const ZipMember& m, uint64_t max_bytes);

// Verifies the CRC-32 of a stored member in place. Throws naming the member.
void zip_check_stored_crc(const MappedFile& zip, const ZipMember& m);

}  // namespace kvb
