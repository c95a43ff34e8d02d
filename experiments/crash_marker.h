// CrashMarker: while it lives, a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGABRT, which std::terminate raises, or SIGQUIT) first replaces the run's
// manifest.json by a version that says "status": "crashed" and names the signal, so a
// results directory never claims "running" for a dead run; points.csv keeps the
// points finished up to its last write. The texts are rendered up front: the handler
// only opens, writes, renames (async-signal-safe calls) and then lets the signal take
// its default action (the process still dies of it). SIGKILL cannot be caught.
#pragma once
#include <filesystem>
#include <functional>
#include <string>

namespace kvb {

class CrashMarker {
 public:
  // render(signal_name) is the manifest text to leave, e.g. for "SIGSEGV". One marker
  // at a time per process.
  CrashMarker(const std::filesystem::path& manifest, const std::function<std::string(const char*)>& render);
  ~CrashMarker();  // restores the default actions
  CrashMarker(const CrashMarker&) = delete;
  CrashMarker& operator=(const CrashMarker&) = delete;
};

}  // namespace kvb
