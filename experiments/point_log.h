// results.jsonl: every finished point's result, machine-readable, one JSON object a
// line, so that `kvbudget merge` and `kvbudget run --resume` can read results back
// exactly (points.csv rounds nothing, but it cannot hold the attribution sums, a
// failed point's error, or tell a number annotation from a text one).
//
// Each line: {"id", "key", "ok", "error", "bpe", "bpe_target", "bytes",
// "bytes_target", "plan", "annotations": [{"name", "value": number or {"text"}}], "metrics": [...]
// (aligned with manifest.json's metrics_reported), "attribution": {"layers",
// "q_heads", "total": [kl, out_err2], "head": [[kl, out_err2], ...], "regions":
// [{"partition", "name", "kl", "out_err2"}]} (when computed), "seconds",
// "sequences": [one such object per sequence, without "key", "block_sums" and
// "attribution"] (an aggregate over several sequences: its rows of
// points_by_sequence.csv, which is rebuilt from this file)}. Numbers
// are written with enough digits to read back bit for bit; a non-finite one is the
// string "nan", "inf" or "-inf".
//
// While a run goes, each point's line is appended as it finishes (a process killed
// mid-write leaves at most one truncated last line, which readers skip); at the end
// the file is rewritten atomically in id order.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "experiments/sweep.h"

namespace kvb {

inline constexpr const char* kPointLogFile = "results.jsonl";

// One line (without the newline). `key` is the point's key (a check for readers).
std::string point_result_json(const PointResult& r, const std::string& key);
// Parses one line; throws kvb::Error naming `where` (file:line) when it is not one.
PointResult point_result_from_json(const std::string& line, const std::string& where, std::string* key = nullptr);

struct PointLogEntry {
  PointResult result;
  std::string key;
  size_t line = 0;  // 1-based line in the file
};
// Reads a results.jsonl; when one id appears on several lines the last one counts (a
// point re-run by --resume). A line that is not JSON (a writer killed mid-line) is
// skipped; a JSON line that is no point result throws kvb::Error naming the file and
// line. Sorted by id.
std::vector<PointLogEntry> read_point_log(const std::filesystem::path& file);

// Appends lines to results.jsonl, each with one write() on an O_APPEND descriptor:
// a kill loses at most the line being written. Errors name the file.
class PointLog {
 public:
  explicit PointLog(std::filesystem::path file);
  ~PointLog();
  PointLog(const PointLog&) = delete;
  PointLog& operator=(const PointLog&) = delete;
  void append(const PointResult& r, const std::string& key);

 private:
  std::filesystem::path file_;
  int fd_ = -1;
};

}  // namespace kvb
