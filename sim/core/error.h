// The one exception type of the library. Messages say what went wrong and where
// (file, tensor name and index, config key and line, point key, seed), so a failure
// is reproducible from its log line.
#pragma once
#include <exception>
#include <stdexcept>
#include <string>

namespace kvb {

// Exit codes used by the CLI.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;       // bad data, impossible budget, failed points
inline constexpr int kExitUsage = 2;       // bad command line or config
inline constexpr int kExitInterrupted = 130;

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what), message_(what) {}
  const char* what() const noexcept override { return message_.c_str(); }

  // Puts where it happened in front of the message ("<where>: <message>"), for an error
  // caught on its way up and rethrown with `throw;`, which keeps its type (ConfigError,
  // NonFiniteReconstruction, ...): catch (Error& e) { e.add_context("layer 3"); throw; }
  void add_context(const std::string& where) { message_ = where + ": " + message_; }

 private:
  std::string message_;
};

// Config and usage errors: the CLI exits with kExitUsage for these.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what) {}
};

// Prefixes an error message with a location ("data/x.safetensors: ...").
[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw Error(where.empty() ? what : where + ": " + what);
}

// The message of the exception being handled; call only inside a catch block.
inline std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception (not derived from std::exception)";
  }
}

}  // namespace kvb
