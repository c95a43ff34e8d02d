#include "experiments/cli/interrupt.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>

#include "sim/core/error.h"
#include "sim/io/atomic_file.h"

namespace kvb::cli {

namespace {

struct HandledSignal {
  int number;
  const char* name;
};
constexpr std::array<HandledSignal, 3> kInterrupts = {{{SIGINT, "SIGINT"}, {SIGTERM, "SIGTERM"}, {SIGHUP, "SIGHUP"}}};

// The message of each signal of kInterrupts, rendered before a signal can arrive;
// read-only while the handlers are installed.
std::array<std::string, kInterrupts.size()> g_messages;
std::atomic<bool> g_installed{false};

extern "C" void exit_interrupted(int sig) {  // only async-signal-safe calls here
  remove_unfinished_atomic_files();
  for (size_t i = 0; i < kInterrupts.size(); ++i) {
    if (kInterrupts[i].number != sig) continue;
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, g_messages[i].data(), g_messages[i].size());
  }
  ::_exit(128 + sig);
}

}  // namespace

ExitOnInterrupt::ExitOnInterrupt(const std::string& command) {
  if (g_installed.exchange(true)) throw Error("internal: a second ExitOnInterrupt while one is installed");
  for (size_t i = 0; i < kInterrupts.size(); ++i)
    g_messages[i] = "\nkvbudget " + command + ": interrupted by " + kInterrupts[i].name +
                    "; unfinished output files were removed\n";
  stop_handlers_ = std::make_unique<ScopedSignalHandlers>(std::vector<int>{SIGINT, SIGTERM}, exit_interrupted, false);
  hangup_handler_ = std::make_unique<ScopedSignalHandlers>(std::vector<int>{SIGHUP}, exit_interrupted, true);
}

ExitOnInterrupt::~ExitOnInterrupt() {
  hangup_handler_.reset();
  stop_handlers_.reset();
  g_installed.store(false);
}

}  // namespace kvb::cli
