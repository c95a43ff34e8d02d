#include "experiments/crash_marker.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>

#include "sim/core/error.h"

namespace kvb {

namespace {

struct FatalSignal {
  int number;
  const char* name;
};
// Signals whose default action ends the process and that the run does not handle
// itself (SIGINT, SIGTERM and SIGHUP stop the sweep gracefully: cmd_run.cpp).
constexpr std::array<FatalSignal, 12> kFatalSignals = {
    {{SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"}, {SIGILL, "SIGILL"}, {SIGABRT, "SIGABRT"},
     {SIGQUIT, "SIGQUIT"}, {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}, {SIGALRM, "SIGALRM"}, {SIGPIPE, "SIGPIPE"},
     {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}}};

// Rendered before any signal can arrive; read-only while the marker lives.
std::string g_manifest, g_temporary;
std::array<std::string, kFatalSignals.size()> g_texts;
std::atomic<bool> g_installed{false}, g_written{false};

extern "C" void mark_crashed(int sig) {
  if (!g_written.exchange(true)) {  // the first thread to crash writes; others just die
    for (size_t i = 0; i < kFatalSignals.size(); ++i) {
      if (kFatalSignals[i].number != sig) continue;
      const int fd = ::open(g_temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        const std::string& text = g_texts[i];
        size_t done = 0;
        while (done < text.size()) {
          const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
          if (n <= 0) break;
          done += static_cast<size_t>(n);
        }
        ::close(fd);
        if (done == text.size()) ::rename(g_temporary.c_str(), g_manifest.c_str());
        else ::unlink(g_temporary.c_str());
      }
    }
  }
  // Default action: a raised signal is delivered when the handler returns; a fault
  // recurs when the faulting instruction runs again.
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

ScopedSignalHandlers::ScopedSignalHandlers(const std::vector<int>& signals, void (*handler)(int), bool keep_ignored) {
  for (int sig : signals) {
    Saved s{sig, {}};
    if (::sigaction(sig, nullptr, &s.previous) != 0) continue;
    if (keep_ignored && s.previous.sa_handler == SIG_IGN) continue;
    struct sigaction act = {};
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    if (::sigaction(sig, &act, nullptr) == 0) saved_.push_back(s);
  }
}

ScopedSignalHandlers::~ScopedSignalHandlers() {
  for (const Saved& s : saved_) ::sigaction(s.signal, &s.previous, nullptr);
}

CrashMarker::CrashMarker(const std::filesystem::path& manifest, const std::function<std::string(const char*)>& render) {
  if (g_installed.exchange(true)) throw Error("internal: a second CrashMarker while one is installed");
  g_manifest = manifest.string();
  g_temporary = g_manifest + ".crashed.tmp";
  for (size_t i = 0; i < kFatalSignals.size(); ++i) g_texts[i] = render(kFatalSignals[i].name);
  g_written.store(false);
  std::vector<int> numbers;
  for (const FatalSignal& s : kFatalSignals) numbers.push_back(s.number);
  handlers_ = std::make_unique<ScopedSignalHandlers>(numbers, mark_crashed, true);
}

CrashMarker::~CrashMarker() {
  handlers_.reset();
  g_installed.store(false);
}

}  // namespace kvb
