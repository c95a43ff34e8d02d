// Sweep progress on stderr: a redrawn bar on a terminal, plain lines otherwise
// (logs, CI), so that output piped to a file stays readable.
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

namespace kvb {

class Progress {
 public:
  // `unit` names what is counted ("points", "windows").
  Progress(size_t total, bool quiet, std::string unit = "points");
  // A point finished; `label` names it, `ok` says whether it succeeded.
  void update(size_t done, const std::string& label, bool ok, double point_seconds);
  void finish();

 private:
  size_t total_;
  bool quiet_;
  bool tty_;
  bool drawn_ = false;
  std::string unit_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kvb
