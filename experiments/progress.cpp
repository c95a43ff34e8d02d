#include "experiments/progress.h"

#include <unistd.h>

#include <cstdio>

namespace kvb {

Progress::Progress(size_t total, bool quiet)
    : total_(total), quiet_(quiet), tty_(::isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}

void Progress::update(size_t done, const std::string& label, bool ok, double point_seconds) {
  if (quiet_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) {
    const int width = 30;
    const int filled = total_ ? static_cast<int>(width * done / total_) : width;
    const double eta = done ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - done) : 0.0;
    std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu points  %.1fs elapsed  ETA %.1fs ", filled,
                 "##############################", width - filled, "", done, total_, elapsed, eta);
    if (!ok) std::fprintf(stderr, "\n  failed: %s\n", label.c_str());
    std::fflush(stderr);
    drawn_ = true;
  } else {
    std::fprintf(stderr, "point %zu/%zu %s %s (%.2fs)\n", done, total_, ok ? "done" : "FAILED", label.c_str(),
                 point_seconds);
  }
}

void Progress::finish() {
  if (quiet_) return;
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace kvb
