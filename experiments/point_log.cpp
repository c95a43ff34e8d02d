#include "experiments/point_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace kvb {

namespace {

using nlohmann::json;

json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double number_from(const json& j, const std::string& what) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return HUGE_VAL;
    if (s == "-inf") return -HUGE_VAL;
  }
  throw Error(what + " is not a number");
}

// An attribution's sums: one number per attributed error, in their order.
json sums_json(const ErrorSums& e) {
  json j = json::array();
  for (double v : e) j.push_back(number(v));
  return j;
}

ErrorSums sums_from(const json& j, const std::vector<const AdditiveError*>& errors, const std::string& what) {
  std::vector<std::string> names;
  for (const AdditiveError* e : errors) names.push_back(e->name);
  if (!j.is_array() || j.size() != errors.size()) throw Error(what + " is not a [" + join(names, ", ") + "] array");
  ErrorSums e;
  for (const json& v : j) e.push_back(number_from(v, what));
  return e;
}

// The attributed errors named in a results.jsonl line: "errors", else the default
// (lines written before attribution named them).
std::vector<const AdditiveError*> attributed_errors_from(const json& ja) {
  if (!ja.contains("errors")) return default_attributed_errors();
  std::vector<const AdditiveError*> errors;
  for (const json& name : ja.at("errors")) {
    const std::string n = name.get<std::string>();
    const AdditiveError* found = nullptr;
    for (const AdditiveError& e : additive_errors())
      if (n == e.name) found = &e;
    if (!found) throw Error("attribution names an unknown error '" + n + "'");
    errors.push_back(found);
  }
  return errors;
}

// A result as JSON, without its key; `sequences` (an aggregate's per-sequence results,
// which have none of their own) nested.
json result_json(const PointResult& r) {
  json j;
  j["id"] = r.id;
  j["ok"] = r.ok;
  j["error"] = r.error;
  j["bpe"] = number(r.bpe);
  j["bpe_target"] = number(r.bpe_target);
  j["bpe_read"] = number(r.bpe_read);
  j["bytes"] = number(r.bytes);
  j["bytes_target"] = number(r.bytes_target);
  j["measured_tokens"] = r.measured_tokens;  // what the extrapolated marks compare
  j["sized_for_tokens"] = r.sized_for_tokens;
  j["target_extrapolated"] = r.target_extrapolated;
  j["stores_tokens_alike"] = r.stores_tokens_alike;
  j["plan"] = r.plan;
  json notes = json::array();
  for (const Annotation& a : r.annotations) {
    // Text is wrapped, {"text": ...}, so that a text "nan" does not read back as a number.
    const json value = std::holds_alternative<double>(a.value) ? number(std::get<double>(a.value))
                                                               : json{{"text", std::get<std::string>(a.value)}};
    notes.push_back({{"name", a.name}, {"value", value}});
  }
  j["annotations"] = notes;
  json metrics = json::array();
  for (double m : r.metrics) metrics.push_back(number(m));
  j["metrics"] = metrics;
  json ses = json::array(), intervals = json::array();
  for (double se : r.standard_errors) ses.push_back(number(se));
  for (const Interval& iv : r.intervals) intervals.push_back(json::array({number(iv.lo), number(iv.hi)}));
  j["standard_errors"] = ses;
  j["intervals"] = intervals;
  // Per metric: [[num per block], [den per block]], or [] when not pairable; over
  // several sequences a third array holds the blocks of each sequence.
  json block_sums = json::array();
  for (const BlockSums& b : r.block_sums) {
    json num = json::array(), den = json::array();
    for (double v : b.num) num.push_back(number(v));
    for (double v : b.den) den.push_back(number(v));
    json entry = b.empty() ? json::array() : json::array({num, den});
    if (!b.empty() && !b.sequence_blocks.empty()) entry.push_back(b.sequence_blocks);
    block_sums.push_back(std::move(entry));
  }
  j["block_sums"] = block_sums;
  if (r.attribution) {
    const Attribution& a = *r.attribution;
    json names = json::array(), heads = json::array(), regions = json::array();
    for (const AdditiveError* e : a.errors) names.push_back(e->name);
    for (const ErrorSums& h : a.head) heads.push_back(sums_json(h));
    for (const Attribution::Region& g : a.regions) {
      json region = {{"partition", g.partition}, {"name", g.name}};
      for (size_t i = 0; i < a.errors.size(); ++i) region[a.errors[i]->name] = number(g.error[i]);
      regions.push_back(region);
    }
    j["attribution"] = {{"errors", names},     {"layers", a.layers}, {"q_heads", a.q_heads},
                        {"total", sums_json(a.total)}, {"head", heads}, {"regions", regions}};
  }
  j["seconds"] = number(r.seconds);
  if (!r.sequences.empty()) {
    json sequences = json::array();
    for (const PointResult& on_sequence : r.sequences) sequences.push_back(result_json(on_sequence));
    j["sequences"] = std::move(sequences);
  }
  return j;
}

// The inverse of result_json; throws json::exception or kvb::Error.
PointResult result_from_json(const json& j) {
  PointResult r;
  if (!j.is_object()) throw Error("not a JSON object");
  r.id = j.at("id").get<size_t>();
  r.ok = j.at("ok").get<bool>();
  r.error = j.at("error").get<std::string>();
  r.bpe = number_from(j.at("bpe"), "bpe");
  r.bpe_target = number_from(j.at("bpe_target"), "bpe_target");
  if (j.contains("bpe_read")) r.bpe_read = number_from(j.at("bpe_read"), "bpe_read");
  r.bytes = number_from(j.at("bytes"), "bytes");
  r.bytes_target = number_from(j.at("bytes_target"), "bytes_target");
  r.measured_tokens = j.at("measured_tokens").get<int64_t>();
  r.sized_for_tokens = j.at("sized_for_tokens").get<int64_t>();
  r.target_extrapolated = j.at("target_extrapolated").get<bool>();
  r.stores_tokens_alike = j.value("stores_tokens_alike", false);
  r.plan = j.at("plan").get<std::string>();
  for (const json& a : j.at("annotations")) {
    Annotation note;
    note.name = a.at("name").get<std::string>();
    const json& v = a.at("value");
    if (v.is_object())
      note.value = v.at("text").get<std::string>();
    else
      note.value = number_from(v, "annotation " + note.name);
    r.annotations.push_back(std::move(note));
  }
  for (const json& m : j.at("metrics")) r.metrics.push_back(number_from(m, "a metric"));
  for (const json& m : j.at("standard_errors")) r.standard_errors.push_back(number_from(m, "a standard error"));
  for (const json& m : j.at("intervals"))
    r.intervals.push_back(Interval{number_from(m.at(0), "an interval"), number_from(m.at(1), "an interval")});
  if (j.contains("block_sums")) {  // absent in results of older builds: no paired comparisons
    for (const json& b : j.at("block_sums")) {
      BlockSums sums;
      if (!b.empty()) {
        for (const json& v : b.at(0)) sums.num.push_back(number_from(v, "a block sum"));
        for (const json& v : b.at(1)) sums.den.push_back(number_from(v, "a block sum"));
        if (sums.num.size() != sums.den.size()) throw Error("block_sums: numerators and denominators differ in length");
        if (b.size() > 2) {
          size_t total = 0;
          for (const json& n : b.at(2)) {
            sums.sequence_blocks.push_back(n.get<uint32_t>());
            total += sums.sequence_blocks.back();
          }
          if (total != sums.num.size()) throw Error("block_sums: the sequences' block counts do not add up");
        }
      }
      r.block_sums.push_back(std::move(sums));
    }
  }
  if (j.contains("attribution")) {
    const json& ja = j["attribution"];
    Attribution a;
    a.errors = attributed_errors_from(ja);
    a.layers = ja.at("layers").get<int64_t>();
    a.q_heads = ja.at("q_heads").get<int64_t>();
    a.total = sums_from(ja.at("total"), a.errors, "attribution total");
    for (const json& h : ja.at("head")) a.head.push_back(sums_from(h, a.errors, "attribution head"));
    if (static_cast<int64_t>(a.head.size()) != a.layers * a.q_heads)
      throw Error("attribution has " + std::to_string(a.head.size()) +
                  " head entries, not layers x q_heads = " + std::to_string(a.layers * a.q_heads));
    for (const json& g : ja.at("regions")) {
      Attribution::Region region{g.at("partition").get<std::string>(), g.at("name").get<std::string>(), {}};
      for (const AdditiveError* e : a.errors)
        region.error.push_back(number_from(g.at(e->name), std::string("region ") + e->name));
      a.regions.push_back(std::move(region));
    }
    r.attribution = std::move(a);
  }
  r.seconds = number_from(j.at("seconds"), "seconds");
  // Absent in results of older builds (and with one sequence): the per-sequence
  // results are then unknown.
  if (j.contains("sequences"))
    for (const json& on_sequence : j.at("sequences")) {
      r.sequences.push_back(result_from_json(on_sequence));
      if (r.sequences.back().id != r.id) throw Error("sequences: a per-sequence result of another point");
    }
  return r;
}

}  // namespace

std::string point_result_json(const PointResult& r, const std::string& key) {
  json j = result_json(r);
  j["key"] = key;
  return j.dump();
}

PointResult point_result_from_json(const std::string& line, const std::string& where, std::string* key) {
  PointResult r;
  try {
    const json j = json::parse(line);
    r = result_from_json(j);
    if (key) *key = j.at("key").get<std::string>();
  } catch (const json::exception& e) {
    throw Error(where + ": not a point result: " + e.what());
  } catch (Error& e) {
    e.add_context(where + ": not a point result");
    throw;
  }
  return r;
}

std::vector<PointLogEntry> read_point_log(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot be read: " + std::strerror(errno));
  std::map<size_t, PointLogEntry> by_id;
  size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    // A line that is not JSON at all is what a writer killed mid-line leaves (the
    // next writer starts on a fresh line): skipped. Valid JSON that is not a point
    // result is an error.
    if (line.empty() || !json::accept(line)) continue;
    PointLogEntry e;
    e.line = number;
    e.result = point_result_from_json(line, file.string() + ":" + std::to_string(number), &e.key);
    by_id[e.result.id] = std::move(e);
  }
  std::vector<PointLogEntry> out;
  for (auto& [id, e] : by_id) out.push_back(std::move(e));
  return out;
}

PointLog::PointLog(std::filesystem::path file) : file_(std::move(file)) {
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);  // read: the last byte
  if (fd_ < 0) throw Error(file_.string() + ": cannot be opened for appending: " + std::strerror(errno));
  // A line a killed writer left half-written must not swallow the next one.
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  if (end > 0) {
    char last = '\n';
    if (::pread(fd_, &last, 1, end - 1) == 1 && last != '\n') {
      const char nl = '\n';
      if (::write(fd_, &nl, 1) != 1) throw Error(file_.string() + ": cannot be written: " + std::strerror(errno));
    }
  }
}

PointLog::~PointLog() {
  if (fd_ >= 0) ::close(fd_);
}

void PointLog::append(const PointResult& r, const std::string& key) {
  const std::string line = point_result_json(r, key) + "\n";
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()))
    throw Error(file_.string() + ": cannot be written: " + (n < 0 ? std::strerror(errno) : "short write"));
}

}  // namespace kvb
