// CrashMarker: while it lives, a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGABRT, which std::terminate raises, SIGQUIT, and the other signals whose default
// action ends the process: SIGUSR1/2, SIGALRM, SIGPIPE, SIGXCPU, SIGXFSZ) first replaces the run's
// manifest.json by a version that says "status": "crashed" and names the signal, so a
// results directory never claims "running" for a dead run; points.csv keeps the
// points finished up to its last write. The texts are rendered up front: the handler
// only opens, writes, renames (async-signal-safe calls) and then lets the signal take
// its default action (the process still dies of it). SIGKILL cannot be caught.
#pragma once
#include <csignal>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvb {

// Installs `handler` for each of `signals` while it lives and restores each signal's
// previous disposition when destroyed. With keep_ignored, a signal the process
// inherited as ignored (nohup's SIGHUP, a parent's SIGPIPE) stays ignored.
class ScopedSignalHandlers {
 public:
  ScopedSignalHandlers(const std::vector<int>& signals, void (*handler)(int), bool keep_ignored);
  ~ScopedSignalHandlers();
  ScopedSignalHandlers(const ScopedSignalHandlers&) = delete;
  ScopedSignalHandlers& operator=(const ScopedSignalHandlers&) = delete;

 private:
  struct Saved {
    int signal;
    struct sigaction previous;
  };
  std::vector<Saved> saved_;
};

class CrashMarker {
 public:
  // render(signal_name) is the manifest text to leave, e.g. for "SIGSEGV". One marker
  // at a time per process.
  CrashMarker(const std::filesystem::path& manifest, const std::function<std::string(const char*)>& render);
  ~CrashMarker();  // restores the previous dispositions
  CrashMarker(const CrashMarker&) = delete;
  CrashMarker& operator=(const CrashMarker&) = delete;

 private:
  std::unique_ptr<ScopedSignalHandlers> handlers_;
};

}  // namespace kvb
