#include "sim/io/zip.h"

#include <zlib.h>

#include <algorithm>
#include <limits>

#include "sim/core/error.h"

namespace kvb {

namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndOfDirSig = 0x06054b50;
constexpr uint32_t kZip64EndOfDirSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint64_t kEndOfDirSize = 22;      // fixed part, before the comment
constexpr uint64_t kZip64LocatorSize = 20;
constexpr uint64_t kZip64EndOfDirSize = 56;  // fixed part
constexpr uint64_t kCentralHeaderSize = 46;
constexpr uint64_t kLocalHeaderSize = 30;

// Bounds-checked little-endian reads from the mapped archive.
class ArchiveReader {
 public:
  explicit ArchiveReader(const MappedFile& f) : f_(f) {}
  void need(uint64_t offset, uint64_t length, const std::string& what) const {
    if (offset > f_.size() || length > f_.size() - offset)
      fail(f_.where(), "truncated zip archive: " + what + " at offset " + std::to_string(offset) + " (+" +
                           std::to_string(length) + " bytes) lies beyond the end of the file (" +
                           std::to_string(f_.size()) + " bytes)");
  }
  uint64_t u(uint64_t offset, int bytes) const { return load_le(f_.data() + offset, bytes); }

 private:
  const MappedFile& f_;
};

struct EndOfDirectory {
  uint64_t entries = 0;
  uint64_t dir_size = 0;
  uint64_t dir_offset = 0;
};

EndOfDirectory find_end_of_directory(const MappedFile& zip, const ArchiveReader& r) {
  const uint64_t size = zip.size();
  if (size < kEndOfDirSize) fail(zip.where(), "not a zip archive (" + std::to_string(size) + " bytes)");
  // The record sits at the end, followed only by a comment of at most 65535 bytes.
  const uint64_t lowest = size > kEndOfDirSize + 0xffff ? size - kEndOfDirSize - 0xffff : 0;
  uint64_t eocd = std::numeric_limits<uint64_t>::max();
  for (uint64_t p = size - kEndOfDirSize + 1; p-- > lowest;) {
    if (r.u(p, 4) == kEndOfDirSig && p + kEndOfDirSize + r.u(p + 20, 2) <= size) {
      eocd = p;
      break;
    }
  }
  if (eocd == std::numeric_limits<uint64_t>::max())
    fail(zip.where(), "not a zip archive or truncated: no end-of-central-directory record");
  if (r.u(eocd + 4, 2) != 0 || r.u(eocd + 6, 2) != 0) fail(zip.where(), "multi-disk zip archives are not supported");
  EndOfDirectory e;
  e.entries = r.u(eocd + 10, 2);
  e.dir_size = r.u(eocd + 12, 4);
  e.dir_offset = r.u(eocd + 16, 4);
  const bool zip64 = e.entries == 0xffff || e.dir_size == 0xffffffff || e.dir_offset == 0xffffffff;
  if (eocd >= kZip64LocatorSize && r.u(eocd - kZip64LocatorSize, 4) == kZip64LocatorSig) {
    const uint64_t loc = eocd - kZip64LocatorSize;
    const uint64_t z = r.u(loc + 8, 8);
    r.need(z, kZip64EndOfDirSize, "zip64 end-of-central-directory record");
    if (r.u(z, 4) != kZip64EndOfDirSig) fail(zip.where(), "bad zip64 end-of-central-directory signature");
    e.entries = r.u(z + 32, 8);
    e.dir_size = r.u(z + 40, 8);
    e.dir_offset = r.u(z + 48, 8);
  } else if (zip64) {
    fail(zip.where(), "zip64 archive without a zip64 end-of-central-directory locator");
  }
  r.need(e.dir_offset, e.dir_size, "central directory");
  return e;
}

// Replaces the 0xFFFFFFFF fields of a central header by the zip64 extra field's values
// (which appear in the fixed order: uncompressed size, compressed size, header offset).
void apply_zip64_extra(const MappedFile& zip, const ArchiveReader& r, uint64_t extra, uint64_t extra_len,
                       ZipMember& m, uint64_t& local_offset) {
  const bool need_u = m.uncompressed_size == 0xffffffff, need_c = m.compressed_size == 0xffffffff,
             need_o = local_offset == 0xffffffff;
  if (!need_u && !need_c && !need_o) return;
  for (uint64_t p = extra; p + 4 <= extra + extra_len;) {
    const uint64_t id = r.u(p, 2), len = r.u(p + 2, 2);
    if (p + 4 + len > extra + extra_len) break;
    if (id == kZip64ExtraId) {
      uint64_t q = p + 4;
      const uint64_t end = q + len;
      auto take = [&](uint64_t& field) {
        if (q + 8 > end) fail(zip.where(), "member '" + m.name + "': zip64 extra field too short");
        field = r.u(q, 8);
        q += 8;
      };
      if (need_u) take(m.uncompressed_size);
      if (need_c) take(m.compressed_size);
      if (need_o) take(local_offset);
      return;
    }
    p += 4 + len;
  }
  fail(zip.where(), "member '" + m.name + "': sizes/offset are 0xFFFFFFFF but there is no zip64 extra field");
}

}  // namespace

// Deflate's largest expansion (a 258-byte match per 2 bits, in the limit).
constexpr uint64_t kMaxDeflateRatio = 1032;

std::vector<ZipMember> read_zip_directory(const MappedFile& zip) {
  const ArchiveReader r(zip);
  const EndOfDirectory eod = find_end_of_directory(zip, r);
  std::vector<ZipMember> members;
  uint64_t p = eod.dir_offset;
  const uint64_t dir_end = eod.dir_offset + eod.dir_size;
  for (uint64_t i = 0; i < eod.entries; ++i) {
    if (p + kCentralHeaderSize > dir_end) fail(zip.where(), "central directory shorter than its entry count");
    if (r.u(p, 4) != kCentralHeaderSig)
      fail(zip.where(), "bad central directory header signature at offset " + std::to_string(p));
    ZipMember m;
    const uint64_t flags = r.u(p + 8, 2);
    m.method = static_cast<uint16_t>(r.u(p + 10, 2));
    m.crc32 = static_cast<uint32_t>(r.u(p + 16, 4));
    m.compressed_size = r.u(p + 20, 4);
    m.uncompressed_size = r.u(p + 24, 4);
    const uint64_t name_len = r.u(p + 28, 2), extra_len = r.u(p + 30, 2), comment_len = r.u(p + 32, 2);
    uint64_t local_offset = r.u(p + 42, 4);
    if (p + kCentralHeaderSize + name_len + extra_len + comment_len > dir_end)
      fail(zip.where(), "central directory entry " + std::to_string(i) + " runs past the directory");
    m.name.assign(reinterpret_cast<const char*>(zip.data() + p + kCentralHeaderSize), name_len);
    apply_zip64_extra(zip, r, p + kCentralHeaderSize + name_len, extra_len, m, local_offset);
    if (flags & 1u) fail(zip.where(), "member '" + m.name + "' is encrypted; encrypted archives are not supported");

    r.need(local_offset, kLocalHeaderSize, "local header of member '" + m.name + "'");
    if (r.u(local_offset, 4) != kLocalHeaderSig)
      fail(zip.where(), "member '" + m.name + "': bad local header signature at offset " + std::to_string(local_offset));
    // The local header's name and extra lengths may differ from the central directory's.
    m.data_offset = local_offset + kLocalHeaderSize + r.u(local_offset + 26, 2) + r.u(local_offset + 28, 2);
    r.need(m.data_offset, m.compressed_size, "data of member '" + m.name + "'");
    // Sizes are checked before anything is allocated for them: deflate expands at most
    // 1032:1, and a stored member's sizes are equal.
    // (Other methods are refused when a member is read; np.load skips non-.npy members.)
    const uint64_t most = m.method == 0 ? m.compressed_size : m.compressed_size * kMaxDeflateRatio + 1024;
    if ((m.method == 0 || m.method == 8) && m.uncompressed_size > most)
      fail(zip.where(), "member '" + m.name + "' claims " + std::to_string(m.uncompressed_size) +
                            " uncompressed bytes from " + std::to_string(m.compressed_size) + " compressed (" +
                            (m.method == 0 ? "stored: the sizes must be equal" : "deflate expands at most 1032:1") +
                            "): corrupt archive");
    members.push_back(std::move(m));
    p += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
  if (p != dir_end)  // e.g. an end record claiming 0 entries over a full directory
    fail(zip.where(), "central directory of " + std::to_string(eod.dir_size) + " bytes holds more than the " +
                          std::to_string(eod.entries) + " entries its end record counts (corrupt archive)");
  return members;
}

std::vector<uint8_t> zip_inflate(const MappedFile& zip, const ZipMember& m, uint64_t max_bytes) {
  const std::string where = zip.where() + ": member '" + m.name + "'";
  const uint64_t want = std::min(max_bytes, m.uncompressed_size);
  const bool whole = want == m.uncompressed_size;
  const uint8_t* src = zip.data() + m.data_offset;
  if (m.method != 0 && m.method != 8)  // before anything is allocated for the member
    throw Error(where + ": unsupported compression method " + std::to_string(m.method) +
                " (supported: 0 stored, 8 deflated)");
  std::vector<uint8_t> out(static_cast<size_t>(want));
  if (m.method == 0) {
    if (m.compressed_size != m.uncompressed_size)
      throw Error(where + ": stored member's compressed and uncompressed sizes differ");
    std::copy(src, src + want, out.begin());
  } else {  // deflated
    z_stream zs{};
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) throw Error(where + ": zlib inflateInit2 failed");
    // zlib counts in uInt; feed and drain in chunks so members over 4 GiB work too.
    constexpr uint64_t kChunk = 1u << 30;
    uint64_t in_done = 0, out_done = 0;
    int rc = Z_OK;
    while (out_done < want && rc != Z_STREAM_END) {
      if (zs.avail_in == 0 && in_done < m.compressed_size) {
        const uint64_t n = std::min(kChunk, m.compressed_size - in_done);
        zs.next_in = const_cast<Bytef*>(src + in_done);
        zs.avail_in = static_cast<uInt>(n);
        in_done += n;
      }
      const uint64_t n_out = std::min(kChunk, want - out_done);
      zs.next_out = out.data() + out_done;
      zs.avail_out = static_cast<uInt>(n_out);
      const uLong in_before = zs.total_in;
      rc = inflate(&zs, Z_NO_FLUSH);
      const uint64_t produced = n_out - zs.avail_out;
      out_done += produced;
      // No progress with nothing left to feed: the stream is short (reported below).
      if (produced == 0 && zs.total_in == in_before && (zs.avail_in != 0 || in_done == m.compressed_size)) break;
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
        const std::string msg = zs.msg ? zs.msg : "error " + std::to_string(rc);
        inflateEnd(&zs);
        throw Error(where + ": corrupt deflate data (" + msg + ")");
      }
    }
    inflateEnd(&zs);
    if (out_done < want)
      throw Error(where + ": deflate data ended after " + std::to_string(out_done) + " of " + std::to_string(want) +
                  " bytes (truncated or corrupt)");
  }
  if (whole) {
    uint64_t crc = crc32(0L, Z_NULL, 0);
    for (uint64_t done = 0; done < out.size();) {
      const uint64_t n = std::min<uint64_t>(1u << 30, out.size() - done);
      crc = crc32(crc, out.data() + done, static_cast<uInt>(n));
      done += n;
    }
    if (crc != m.crc32) throw Error(where + ": CRC-32 mismatch (corrupt archive)");
  }
  return out;
}

void zip_check_stored_crc(const MappedFile& zip, const ZipMember& m) {
  const uint8_t* src = zip.data() + m.data_offset;
  uint64_t crc = crc32(0L, Z_NULL, 0);
  for (uint64_t done = 0; done < m.compressed_size;) {
    const uint64_t n = std::min<uint64_t>(1u << 30, m.compressed_size - done);
    crc = crc32(crc, src + done, static_cast<uInt>(n));
    done += n;
  }
  if (crc != m.crc32) throw Error(zip.where() + ": member '" + m.name + "': CRC-32 mismatch (corrupt archive)");
}

}  // namespace kvb
