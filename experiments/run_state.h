// A results folder's life beyond one process: the heartbeat of a running run, what
// `kvbudget status` reports (alive, finished, or stale: left "running" by a process
// that died without a chance to write, kill -9 or the out-of-memory killer), and
// what `kvbudget run --resume` keeps.
//
// manifest.json of a run records, for this: "pid" and "host" of the process, and
// "heartbeat" (local time), "heartbeat_unix" (seconds since the epoch) and
// "heartbeat_interval_s": the manifest is rewritten that often while the run goes.
// A "running" manifest is stale when its process is gone (same host: no process with
// that id, or one that is not kvbudget) or, seen from another host, when its
// heartbeat is older than kStaleHeartbeats intervals (at least kStaleMinSeconds).
#pragma once
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "experiments/point_log.h"
#include "experiments/shard.h"
#include "experiments/sweep.h"

namespace kvb {

inline constexpr double kStaleHeartbeats = 3;
inline constexpr double kStaleMinSeconds = 60;

// Seconds between heartbeats: $KVB_HEARTBEAT_SECONDS when set (tests use 1), else 10.
double heartbeat_interval_seconds();

// Calls beat() every interval_s seconds on its own thread until destroyed (which
// waits for a beat in progress). beat() must not throw.
class Heartbeat {
 public:
  Heartbeat(double interval_s, std::function<void()> beat);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// manifest.json of a results folder; throws kvb::Error naming the file when it is
// missing or not JSON, and naming the key when one kvbudget reads back has another type
// ("DIR/manifest.json: key 'points_total': expected a number, not \"2\"").
nlohmann::json read_manifest(const std::filesystem::path& dir);

// The shard a manifest records ("shard": {"index", "count"}; a run without one is 0/1).
Shard manifest_shard(const nlohmann::json& manifest);

// The backends that measured a folder's points, in the order they first did
// (manifest `point_backends`; an older manifest's `backend`; empty when none is recorded).
std::vector<std::string> manifest_point_backends(const nlohmann::json& manifest);
// Appends `backend` to `backends` unless it is there.
void add_point_backend(std::vector<std::string>& backends, const std::string& backend);
// The manifest's warning when a folder's points come from more than one backend.
std::string mixed_backends_note(const std::vector<std::string>& backends);

// An earlier manifest's warnings that a folder made from it keeps (a resumed folder, a
// merge of shards): the data's and the plans' warnings, without those derived from the
// folder's points as a whole (the mixed-backends note, the per-sequence rows note, the
// memory_read_note), which the new manifest derives again.
std::vector<std::string> carried_warnings(const nlohmann::json& manifest);
// Appends each warning of `more` that `warnings` does not hold yet, in order: a union
// in first-seen order, each text once.
void add_warnings(std::vector<std::string>& warnings, const std::vector<std::string>& more);

// DIR/config.toml of a results folder, with `overrides` applied, as its run read it:
// relative data paths are looked up in the folder of the config the run was started
// from (manifest.json's `config`, which becomes spec.config_path), not in DIR. Throws
// kvb::ConfigError when DIR is not a results folder (no readable manifest.json).
ExperimentSpec load_results_config(const std::filesystem::path& dir, const std::vector<std::string>& overrides);

struct RunStatus {
  std::string status;          // the manifest's: running, complete, interrupted, failed, crashed
  bool running = false;        // status is "running"
  bool stale = false;          // running, but its process is gone (or silent too long)
  std::string liveness;        // why alive or stale: "process 123 on node1 is gone", ...
  size_t done = 0, total = 0;  // points finished (measured or failed) of the run's points
  size_t failed = 0;
  Shard shard;
  size_t sweep_total = 0;  // points of the whole sweep
  // A failed run's error outside any point (manifest.json's `error`): a file that could
  // not be written, the data, a device; empty otherwise.
  std::string error;
};
RunStatus read_run_status(const std::filesystem::path& dir);
// The lines `kvbudget status` prints.
std::string describe_run_status(const std::filesystem::path& dir, const RunStatus& s);

// What `kvbudget run --resume DIR` continues from.
struct ResumeState {
  nlohmann::json manifest;
  Shard shard;
  std::vector<SweepPoint> points;  // the shard's points (all of them)
  std::vector<PointResult> kept;   // measured points of the shard, kept as they are
  size_t failed_before = 0;        // points that had failed: run again
};
// Checks that DIR's run is the same sweep (config hash, program version, shard) and
// not running (a live process on this host refuses), and reads its finished points.
// `shard` is the --shard option when given (else the manifest's shard is resumed);
// `points` is the whole sweep. Throws kvb::ConfigError naming what differs.
ResumeState prepare_resume(const std::filesystem::path& dir, const ExperimentSpec& spec, const std::string& config_hash,
                           const std::optional<Shard>& shard, const std::vector<SweepPoint>& points);
// The points of `points` without a result in `kept`.
std::vector<SweepPoint> points_not_in(const std::vector<SweepPoint>& points, const std::vector<PointResult>& kept);
// After the data is loaded: throws kvb::ConfigError when it is not the data DIR's
// points were measured on.
void check_resume_data(const std::filesystem::path& dir, const ResumeState& state, const std::string& data_identity);

}  // namespace kvb
