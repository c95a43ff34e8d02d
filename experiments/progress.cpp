#include "experiments/progress.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

namespace kvb {

Progress::Progress(size_t total, bool quiet, std::string unit)
    : total_(total),
      quiet_(quiet),
      tty_(::isatty(STDERR_FILENO) != 0),
      unit_(std::move(unit)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(size_t done, const std::string& label, bool ok, double point_seconds) {
  if (quiet_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) {
    const int width = 30;
    const int filled = total_ ? static_cast<int>(width * done / total_) : width;
    const double eta = done ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - done) : 0.0;
    std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu %s  %.1fs elapsed  ETA %.1fs ", filled,
                 "##############################", width - filled, "", done, total_, unit_.c_str(), elapsed, eta);
    if (!ok) std::fprintf(stderr, "\n  failed: %s\n", label.c_str());
    std::fflush(stderr);
    drawn_ = true;
  } else {
    // "point 3/20 done ..." ("windows" counts a "window").
    const std::string one = unit_.size() > 1 && unit_.back() == 's' ? unit_.substr(0, unit_.size() - 1) : unit_;
    std::fprintf(stderr, "%s %zu/%zu %s %s (%.2fs)\n", one.c_str(), done, total_, ok ? "done" : "FAILED",
                 label.c_str(), point_seconds);
  }
}

void Progress::finish() {
  if (quiet_) return;
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace kvb
