#include "experiments/run_state.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "experiments/config.h"
#include "experiments/experiment.h"
#include "experiments/sequences.h"
#include "experiments/shard.h"
#include "experiments/sweep.h"
#include "kvb/build_config.h"
#include "kvb/git_info.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace kvb {

namespace {

std::string this_host() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// Whether process `pid` on this host is a running kvbudget (not a reused id).
bool kvbudget_process_alive(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  if (!std::getline(comm, name)) return true;  // no /proc: trust the id
  return name.rfind("kvbudget", 0) == 0;
}

std::string json_text(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return "";
  const nlohmann::json& v = j[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

double heartbeat_interval_seconds() {
  if (const char* s = std::getenv("KVB_HEARTBEAT_SECONDS"); s && *s) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end && *end == '\0' && v > 0 && std::isfinite(v)) return v;
  }
  return 10;
}

Heartbeat::Heartbeat(double interval_s, std::function<void()> beat) {
  const auto interval = std::chrono::duration<double>(interval_s);
  thread_ = std::thread([this, interval, beat = std::move(beat)] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, interval, [this] { return stop_; })) {
      lock.unlock();
      beat();
      lock.lock();
    }
  });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

namespace {

// What a manifest key kvbudget reads back must hold.
enum class ManifestKind { Text, Number, Count, Bool, Object, TextList };

struct ManifestKey {
  const char* key;  // "shard.index": "index" inside "shard"
  ManifestKind kind;
};

constexpr ManifestKey kManifestKeysRead[] = {
    {"status", ManifestKind::Text},
    {"error", ManifestKind::Text},
    {"config", ManifestKind::Text},
    {"config_hash", ManifestKind::Text},
    {"host", ManifestKind::Text},
    {"backend", ManifestKind::Text},
    {"point_backends", ManifestKind::TextList},
    {"points_total", ManifestKind::Count},
    {"sweep_points_total", ManifestKind::Count},
    {"points_resumed", ManifestKind::Count},
    {"pid", ManifestKind::Number},
    {"heartbeat_unix", ManifestKind::Number},
    {"heartbeat_interval_s", ManifestKind::Number},
    {"wall_seconds", ManifestKind::Number},
    {"plots_in_config", ManifestKind::Bool},
    {"shard", ManifestKind::Object},
    {"shard.index", ManifestKind::Count},
    {"shard.count", ManifestKind::Count},
    {"sequences", ManifestKind::TextList},
};

// "" when `v` is of `kind`, else what was expected.
std::string kind_mismatch(const nlohmann::json& v, ManifestKind kind) {
  switch (kind) {
    case ManifestKind::Text:
      return v.is_string() ? "" : "expected a text";
    case ManifestKind::Number:
      return v.is_number() ? "" : "expected a number";
    case ManifestKind::Count:
      if (!v.is_number()) return "expected a number";
      return v.is_number_unsigned() ? "" : "expected a whole number, at least 0";
    case ManifestKind::Bool:
      return v.is_boolean() ? "" : "expected true or false";
    case ManifestKind::Object:
      return v.is_object() ? "" : "expected an object";
    case ManifestKind::TextList:
      if (v.is_array() && std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) { return e.is_string(); }))
        return "";
      return "expected a list of texts";
  }
  return "";
}

// Throws kvb::Error naming the file and key when a key kvbudget reads back has another
// type (a hand-edited or foreign manifest), so that no later read fails with a bare
// JSON library error.
void check_manifest_keys(const nlohmann::json& m, const std::filesystem::path& file) {
  if (!m.is_object()) throw Error(file.string() + ": expected a JSON object, not " + std::string(m.type_name()));
  for (const ManifestKey& k : kManifestKeysRead) {
    const std::string key = k.key;
    const size_t dot = key.find('.');
    const nlohmann::json* v = &m;
    if (dot != std::string::npos) {
      const std::string outer = key.substr(0, dot);
      if (!m.contains(outer) || !m[outer].is_object()) continue;  // its own entry reports it
      v = &m[outer];
    }
    const std::string inner = dot == std::string::npos ? key : key.substr(dot + 1);
    if (!v->contains(inner) || (*v)[inner].is_null()) continue;
    if (const std::string why = kind_mismatch((*v)[inner], k.kind); !why.empty())
      throw Error(file.string() + ": key '" + key + "': " + why + ", not " + (*v)[inner].dump());
  }
}

}  // namespace

nlohmann::json read_manifest(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "manifest.json";
  std::ifstream in(file);
  if (!in) throw Error(file.string() + ": missing: " + dir.string() + " is not a kvbudget results folder");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(file.string() + ": not JSON: " + e.what());
  }
  check_manifest_keys(m, file);
  return m;
}

Shard manifest_shard(const nlohmann::json& manifest) {
  Shard s;
  if (manifest.contains("shard")) {
    s.index = manifest["shard"].value("index", size_t{0});
    s.count = manifest["shard"].value("count", size_t{1});
  }
  return s;
}

std::vector<std::string> manifest_point_backends(const nlohmann::json& manifest) {
  if (manifest.contains("point_backends") && manifest["point_backends"].is_array())
    return manifest["point_backends"].get<std::vector<std::string>>();
  if (manifest.contains("backend") && manifest["backend"].is_string())  // older manifests
    return {manifest["backend"].get<std::string>()};
  return {};
}

void add_point_backend(std::vector<std::string>& backends, const std::string& backend) {
  if (std::find(backends.begin(), backends.end(), backend) == backends.end()) backends.push_back(backend);
}

std::string mixed_backends_note(const std::vector<std::string>& backends) {
  return "this folder's points were measured on backends " + join(backends, " and ") +
         " (a --resume or a shard on another machine): their metrics agree to about 1e-5 relative "
         "(tests/gpu), their `seconds` do not compare";
}

std::vector<std::string> carried_warnings(const nlohmann::json& manifest) {
  std::vector<std::string> kept;
  const nlohmann::json* warnings = manifest.contains("warnings") ? &manifest["warnings"] : nullptr;
  if (!warnings || !warnings->is_array()) return kept;
  const std::vector<std::string> backends = manifest_point_backends(manifest);
  const std::string backends_note = backends.size() > 1 ? mixed_backends_note(backends) : std::string();
  for (const nlohmann::json& w : *warnings) {
    if (!w.is_string()) continue;
    const std::string text = w.get<std::string>();
    if ((!backends_note.empty() && text == backends_note) || is_unknown_sequence_rows_note(text) ||
        is_memory_read_note(text))
      continue;
    kept.push_back(text);
  }
  return kept;
}

void add_warnings(std::vector<std::string>& warnings, const std::vector<std::string>& more) {
  for (const std::string& w : more) append_once(warnings, w);
}

ExperimentSpec load_results_config(const std::filesystem::path& dir, const std::vector<std::string>& overrides) {
  nlohmann::json manifest;
  try {
    manifest = read_manifest(dir);
  } catch (const Error& e) {  // not a results folder: a usage error, as a bad config path
    throw ConfigError(e.what());
  }
  const nlohmann::json* started_from = manifest.contains("config") ? &manifest["config"] : nullptr;
  const std::filesystem::path original =
      started_from && started_from->is_string() ? started_from->get<std::string>() : std::string();
  std::shared_ptr<ConfigDoc> doc = ConfigDoc::load(dir / "config.toml");
  for (const std::string& o : overrides) doc->apply_override(o);
  return parse_experiment(doc, original);
}

RunStatus read_run_status(const std::filesystem::path& dir) {
  const nlohmann::json m = read_manifest(dir);
  RunStatus s;
  s.status = m.value("status", std::string("unknown"));
  s.error = m.value("error", std::string());
  s.running = s.status == "running";
  s.total = m.value("points_total", size_t{0});
  s.sweep_total = m.value("sweep_points_total", s.total);
  s.shard = manifest_shard(m);
  if (std::filesystem::exists(dir / kPointLogFile))
    for (const PointLogEntry& e : read_point_log(dir / kPointLogFile)) {
      ++s.done;
      s.failed += e.result.ok ? 0 : 1;
    }
  if (!s.running) return s;
  const int64_t pid = m.value("pid", int64_t{0});
  const std::string host = m.value("host", std::string());
  const double interval = m.value("heartbeat_interval_s", 10.0);
  const double beat = m.value("heartbeat_unix", 0.0);
  const double age = static_cast<double>(std::time(nullptr)) - beat;
  const double limit = std::max(kStaleMinSeconds, kStaleHeartbeats * interval);
  char age_text[64];
  std::snprintf(age_text, sizeof age_text, "last heartbeat %.0f s ago", age);
  const std::string process = "process " + std::to_string(pid) + " on " + (host.empty() ? "?" : host);
  if (pid <= 0 || beat <= 0) {
    s.stale = true;
    s.liveness = "the manifest records no process id or heartbeat (written by an older kvbudget?)";
  } else if (host == this_host()) {
    s.stale = !kvbudget_process_alive(pid);
    s.liveness = process + (s.stale ? " is gone, " : ", ") + age_text;
  } else {
    s.stale = age > limit;
    s.liveness = process + ", another host: " + age_text + (s.stale ? ", more than " : ", within ") +
                 std::to_string(static_cast<int64_t>(limit)) + " s";
  }
  return s;
}

std::string describe_run_status(const std::filesystem::path& dir, const RunStatus& s) {
  std::ostringstream os;
  os << dir.string() << "\n";
  os << "  status: " << s.status;
  if (s.running) os << (s.stale ? " (stale: " : " (alive: ") << s.liveness << ")";
  os << "\n  points: " << s.done << " of " << s.total << " done";
  if (s.failed) os << " (" << s.failed << " failed)";
  if (!s.shard.whole()) os << "; shard " << s.shard.text() << " of a " << s.sweep_total << "-point sweep";
  os << "\n";
  if (s.stale)
    os << "  the run died without a chance to write (kill -9, the out-of-memory killer, a lost node); continue it "
          "with: kvbudget run --resume "
       << dir.string() << "\n";
  if (!s.error.empty())  // a failure outside any point: resuming would not help until it is fixed
    os << "  error: " << s.error << "\n";
  else if (!s.stale && !s.running && s.done < s.total)
    os << "  unfinished; continue it with: kvbudget run --resume " << dir.string() << "\n";
  return os.str();
}

std::vector<SweepPoint> points_not_in(const std::vector<SweepPoint>& points, const std::vector<PointResult>& kept) {
  std::vector<SweepPoint> out;
  for (const SweepPoint& p : points)
    if (std::none_of(kept.begin(), kept.end(), [&](const PointResult& r) { return r.id == p.id; })) out.push_back(p);
  return out;
}

namespace {

// ": seed (0 there, 1 now); ..." for a resumed folder whose config.toml differs from
// this command's config in keys the hash reads; "" when none is found.
std::string changed_keys(const std::filesystem::path& dir, const ExperimentSpec& spec) {
  const std::string keys = folder_config_differences(dir, spec.resolved_toml);
  return keys.empty() ? "" : ": " + keys;
}

}  // namespace

ResumeState prepare_resume(const std::filesystem::path& dir, const ExperimentSpec& spec, const std::string& config_hash,
                           const std::optional<Shard>& shard, const std::vector<SweepPoint>& points) {
  ResumeState st;
  const std::string where = "--resume " + dir.string();
  try {
    st.manifest = read_manifest(dir);
  } catch (const Error& e) {
    throw ConfigError(where + ": " + e.what());
  }
  const nlohmann::json& m = st.manifest;
  if (!m.contains("config_hash"))
    throw ConfigError(where +
                      ": its manifest.json has no config_hash: written by a kvbudget that could not resume "
                      "runs (run the experiment again)");
  std::vector<std::string> differences;
  auto differ = [&](const char* key, const std::string& now, const std::string& why) {
    const std::string then = json_text(m, key);
    if (then != now) differences.push_back(std::string(key) + " " + then + " there, " + now + " now (" + why + ")");
  };
  differ("config_hash", config_hash, "a different config, --set, --budget or --backend" + changed_keys(dir, spec));
  differ("git_commit", KVB_GIT_COMMIT, "another program version");
  differ("kvbudget_version", KVB_VERSION, "another program version");
  if (!differences.empty())
    throw ConfigError(where + ": not the same sweep as this command's: " + join(differences, "; "));
  st.shard = manifest_shard(m);
  if (shard && (shard->index != st.shard.index || shard->count != st.shard.count))
    throw ConfigError(where + ": the folder holds shard " + st.shard.text() + ", not --shard " + shard->text());
  st.points = shard_points(spec, points, st.shard);
  const std::vector<SweepPoint>& shard_points = st.points;
  if (m.value("status", std::string()) == "running") {
    const RunStatus s = read_run_status(dir);
    if (!s.stale) throw ConfigError(where + ": the run is still going: " + s.liveness);
  }
  const std::filesystem::path log = dir / kPointLogFile;
  if (!std::filesystem::exists(log)) return st;  // killed before any point finished
  std::vector<PointLogEntry> entries;
  try {
    entries = read_point_log(log);
  } catch (const Error& e) {
    throw ConfigError(where + ": " + e.what());
  }
  for (const PointLogEntry& e : entries) {
    const auto p = std::find_if(shard_points.begin(), shard_points.end(),
                                [&](const SweepPoint& sp) { return sp.id == e.result.id; });
    if (p == shard_points.end() || p->key != e.key)
      throw ConfigError(log.string() + ":" + std::to_string(e.line) + ": point " + std::to_string(e.result.id) + " (" +
                        e.key + ") is not a point of this shard of the sweep");
    if (e.result.ok)
      st.kept.push_back(e.result);
    else
      ++st.failed_before;
  }
  return st;
}

void check_resume_data(const std::filesystem::path& dir, const ResumeState& state, const std::string& data_identity) {
  const std::string then = json_text(state.manifest, "data_identity");
  if (!then.empty() && then != data_identity)
    throw ConfigError("--resume " + dir.string() +
                      ": the data differs from the data its points were measured on "
                      "(data_identity " +
                      then + " there, " + data_identity + " now)");
}

}  // namespace kvb
