// Small facts about the machine and the clock that reports and benchmarks print:
// the CPU model, elapsed seconds, the local or UTC time in a strftime format.
#pragma once
#include <chrono>
#include <string>

namespace kvb {

// "model name" of /proc/cpuinfo, or "unknown".
std::string cpu_model();

// Wall seconds since t0 (steady clock).
double seconds_since(std::chrono::steady_clock::time_point t0);

// The current time through strftime(format): local time, or UTC with utc = true.
std::string time_now(const char* format, bool utc = false);

}  // namespace kvb
