// Ctrl-C (SIGINT), SIGTERM and SIGHUP during a command that writes files (eval,
// record): the process ends at once, and leaves no temporary file of an unfinished
// write behind (sim/io/atomic_file.h: remove_unfinished_atomic_files). It prints
// "kvbudget CMD: interrupted by SIGINT; unfinished output files were removed" on stderr
// and exits 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP),
// as `kvbudget run` does; files already complete stay. The handlers are the
// ScopedSignalHandlers of experiments/crash_marker.h, with run's policy: SIGINT and
// SIGTERM are always handled (a shell script starts background jobs with SIGINT
// ignored); a SIGHUP that nohup set to be ignored stays ignored.
#pragma once
#include <memory>
#include <string>

#include "experiments/crash_marker.h"

namespace kvb::cli {

class ExitOnInterrupt {
 public:
  // `command`: the subcommand the message names ("eval"). One at a time per process.
  explicit ExitOnInterrupt(const std::string& command);
  ~ExitOnInterrupt();  // restores the previous dispositions
  ExitOnInterrupt(const ExitOnInterrupt&) = delete;
  ExitOnInterrupt& operator=(const ExitOnInterrupt&) = delete;

 private:
  std::unique_ptr<ScopedSignalHandlers> stop_handlers_, hangup_handler_;
};

}  // namespace kvb::cli
