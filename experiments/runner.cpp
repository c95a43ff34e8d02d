// run_experiment(): one experiment run, config to results folder (experiments/runner.h).
#include "experiments/data_building.h"
#include "experiments/query_positions.h"
#include "experiments/runner.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>

#include "experiments/crash_marker.h"
#include "experiments/machine_info.h"
#include "experiments/output_paths.h"
#include "experiments/point_log.h"
#include "experiments/progress.h"
#include "experiments/report.h"
#include "experiments/run_state.h"
#include "experiments/sequences.h"
#include "experiments/streaming.h"
#include "sim/core/strings.h"

namespace kvb {

namespace {

// Targets the synthetic generator could not reach (an entropy above log2 of the
// context, say): the data is not what the config asked for. Prints the first few on
// stderr and returns all of them (for the manifest).
std::vector<std::string> data_warnings(const Recording& rec) {
  const auto it = rec.metadata.find("synthetic.warnings");
  if (it == rec.metadata.end() || it->second.empty()) return {};
  const std::vector<std::string> warnings = split(it->second, '\n');
  constexpr size_t kShown = 3;
  std::fprintf(stderr, "kvbudget run: warning: the synthetic data misses %zu of its targets (all in manifest.json):\n",
               warnings.size());
  for (size_t i = 0; i < warnings.size() && i < kShown; ++i) std::fprintf(stderr, "  %s\n", warnings[i].c_str());
  if (warnings.size() > kShown) std::fprintf(stderr, "  ... and %zu more\n", warnings.size() - kShown);
  return warnings;
}

}  // namespace

RunOutcome run_experiment(const RunRequest& request) {
  const ExperimentSpec& spec = request.spec;
  const bool quiet = request.quiet;
  const std::string resume_dir = request.resume_dir.string();
  auto enter = [&](RunPhase phase) {
    if (request.on_phase) request.on_phase(phase);
  };
  auto stopped = [&] { return request.stop != nullptr && request.stop->load(); };
  if (spec.threads > 0) omp_set_num_threads(spec.threads);

  const std::vector<SweepPoint> all_points = expand_sweep(spec);
  check_plot_columns(spec, all_points);
  // This run's points: a shard's (experiments/shard.h); with a resume folder, those of
  // the folder's shard, less the finished ones kept (experiments/run_state.h).
  const std::string config_hash = sweep_config_hash(spec);
  std::optional<ResumeState> resumed;
  if (!resume_dir.empty()) resumed = prepare_resume(resume_dir, spec, config_hash, request.shard, all_points);
  const Shard shard = resumed ? resumed->shard : request.shard.value_or(Shard{});
  const std::vector<SweepPoint> points = resumed ? resumed->points : shard_points(spec, all_points, shard);
  const std::vector<SweepPoint> to_run = resumed ? points_not_in(points, resumed->kept) : points;
  // Before the data is loaded (or a model run): a results directory that cannot be
  // written is a config error, not a lost run.
  if (resumed) require_writable_dir(resume_dir, "--resume");
  else require_writable_dir(spec.output.dir / spec.name, spec.output.dir_where);
  if (spec.backend == BackendRequest::Cuda) {  // fail before any data is loaded or written
    std::string why;
    if (cuda_device(&why).empty())  // exit 2, as eval's and generate's --backend cuda
      throw ConfigError("backend = \"cuda\": " + why + "; use backend = \"cpu\" or \"auto\"");
  }
  enter(RunPhase::Loading);
  const auto t_start = std::chrono::steady_clock::now();
  // The phases' wall seconds (RunInfo::phase_seconds): each phase runs from the end of
  // the one before (`t_phase`) to now.
  auto t_phase = t_start;
  auto phase_end = [&t_phase] {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - t_phase).count();
    t_phase = now;
    return seconds;
  };
  if (!quiet) {
    std::string which;  // "(shard 1/4 of 96), 10 kept from DIR (2 failed there: run again)"
    if (!shard.whole()) which += " (shard " + shard.text() + " of " + std::to_string(all_points.size()) + ")";
    if (resumed) which += ", " + std::to_string(resumed->kept.size()) + " kept from " + resume_dir;
    if (resumed && resumed->failed_before)
      which += " (" + std::to_string(resumed->failed_before) + " failed there: run again)";
    std::fprintf(stderr, "kvbudget: %s: %zu points%s; loading data\n", spec.name.c_str(), points.size(), which.c_str());
  }
  // A model source runs the exact model once: its recording is what strategies see,
  // and the evaluator compares every point's quantized forward pass against it.
  // Several sequences (data.recordings, data.texts, data.synthetic.seeds; methods.md §4
  // "Several sequences"): each is loaded (a model source runs the model on each text),
  // every point is measured on each, and results aggregate over them
  // (experiments/sequences.h). One sequence runs as it always did.
  const std::vector<DataSpec> sequence_data = expand_sequences(spec.data);
  const size_t S = sequence_data.size();
  std::vector<std::string> sources;
  for (const DataSpec& d : sequence_data) sources.push_back(sequence_source(d));
  std::vector<std::shared_ptr<const ModelEvaluator>> models(S);
  std::vector<Recording> loaded(S);
  // A long synthetic recording is streamed, one layer held at a time
  // (experiments/streaming.h): its first pass runs here, as the data loads, when the
  // plans read what it computes or a --resume run must check the data's identity
  // before anything is measured; else the sweep's pass does its work (one pass).
  const bool stream = streams_layers(spec, all_points);
  std::optional<StreamedData> streamed;
  std::vector<const Recording*> recs(S);
  for (size_t s = 0; s < S; ++s) {
    if (s > 0 && stopped()) throw RunInterrupted("interrupted while loading the data; nothing was written");
    try {
      // A synthetic recording keeps what the whole sweep reads, not this shard's or
      // resumption's points: every shard of a run, and its resumption, see the same data
      // (recording_identity).
      if (spec.data.source == DataSpec::Source::Model) models[s] = build_model_evaluator(sequence_data[s], spec.backend, spec.precision);
      else if (stream)
        streamed = stream_recording(spec, sequence_data[s], synthetic_keep(spec, all_points, sequence_data[s]),
                                    to_run, resumed ? FirstPass::Always : FirstPass::WhenNeeded);
      else loaded[s] = build_recording(sequence_data[s], synthetic_keep(spec, all_points, sequence_data[s]));
    } catch (const RunInterrupted&) {
      throw;
    } catch (const ConfigError& e) {
      if (S == 1) throw;
      throw ConfigError(spec.data.sequences_where + "[" + std::to_string(s) + "] (" + sources[s] + "): " + e.what());
    } catch (const Error& e) {
      if (S == 1) throw;
      throw Error(spec.data.sequences_where + "[" + std::to_string(s) + "] (" + sources[s] + "): " + e.what());
    }
    recs[s] = models[s] ? &models[s]->recording() : streamed ? &streamed->streamed->recording() : &loaded[s];
    if (!quiet)
      std::fprintf(stderr, "kvbudget: recording %s%s: %s%s\n", recs[s]->name.c_str(),
                   S > 1 ? (" (sequence " + std::to_string(s) + ")").c_str() : "", recs[s]->summary().c_str(),
                   !streamed                ? ""
                   : streamed->one_pass ? "; layers streamed, one held at a time, in one pass"
                                        : "; layers streamed, one held at a time");
  }
  check_sequences_alike(recs, sources, spec.data.sequences_where);
  const Recording& rec = *recs.front();
  // In one pass the layers are validated and hashed, and the generator's metadata
  // completed, as the sweep first loads them: the data identity and the data's warnings
  // come then (below, the sweep's on_complete).
  OnePassCheck* const one_pass = streamed ? streamed->one_pass.get() : nullptr;

  const QueryPositions positions = resolve_positions(spec, rec.tokens);
  check_model_metric_positions(spec, positions, rec.tokens);
  check_attention_rows(spec, positions, rec.tokens);
  for (const Recording* r : recs) check_full_causal_metrics(spec, *r);  // sliding-window models past W
  const double data_seconds = phase_end();
  std::string data_identity = streamed ? streamed->identity : recording_identity(rec);
  for (size_t s = 1; s < S; ++s) data_identity += " + " + recording_identity(*recs[s]);
  const double identity_seconds = phase_end();
  if (resumed) check_resume_data(resume_dir, *resumed, data_identity);
  // The checks that need the data (a group size against head_dim, a budget against
  // the family's cheapest and dearest allocation) run on every point's plan now, on
  // every sequence, before anything is measured or written.
  std::vector<PlanCheck> plan_checks;
  std::vector<std::string> plan_errors;
  for (size_t s = 0; s < S; ++s) {
    plan_checks.push_back(check_plans(spec, *recs[s], to_run, request.stop, streamed ? streamed->stats.get() : nullptr));
    const std::string on = S > 1 ? "sequence " + std::to_string(s) + " (" + sources[s] + "): " : "";
    for (const std::string& e : plan_checks.back().errors) plan_errors.push_back(on + e);
  }
  if (!plan_errors.empty()) {
    constexpr size_t kShown = 5;
    std::string msg = std::to_string(plan_errors.size()) + (S > 1 ? " plans" : "") + " of " +
                      std::to_string(to_run.size()) + " points cannot run on this data (" + rec.name + ": " +
                      rec.summary() + "); nothing was measured or written; fix or remove them:";
    for (size_t i = 0; i < plan_errors.size() && i < kShown; ++i) msg += "\n  " + plan_errors[i];
    if (plan_errors.size() > kShown) msg += "\n  ... and " + std::to_string(plan_errors.size() - kShown) + " more";
    throw ConfigError(msg);
  }
  // Memory is a point's, not a sequence's: each point must cost the same on every one.
  if (const std::vector<std::string> mismatches = plan_memory_mismatches(spec, to_run, plan_checks, sources,
                                                                         rec.tokens);
      !mismatches.empty()) {
    constexpr size_t kShown = 5;
    std::string msg = spec.data.sequences_where + ": " + std::to_string(mismatches.size()) + " of " +
                      std::to_string(to_run.size()) +
                      " points would cost different memory on different sequences (their strategies allocate from "
                      "each sequence's statistics), so their aggregate would pair one error with several memories; "
                      "nothing was measured or written; give these points a fixed allocation, or run each sequence "
                      "on its own:";
    for (size_t i = 0; i < mismatches.size() && i < kShown; ++i) msg += "\n  " + mismatches[i];
    if (mismatches.size() > kShown) msg += "\n  ... and " + std::to_string(mismatches.size() - kShown) + " more";
    throw ConfigError(msg);
  }
  // The plans' warnings (check_plans), printed now and kept in manifest.json's warnings.
  std::vector<std::string> plan_warnings;
  for (size_t s = 0; s < S; ++s)
    for (const std::string& w : plan_checks[s].warnings) {
      plan_warnings.push_back((S > 1 ? "sequence " + std::to_string(s) + ": " : std::string()) + w);
      std::fprintf(stderr, "kvbudget run: warning: %s\n", plan_warnings.back().c_str());
    }
  const double check_plans_seconds = phase_end();
  // Any --shard, 0/1 included (scripts/slurm/submit.sh -n 1): its folder is named as a
  // shard, which merge and sweep.sbatch's resume look for.
  const std::string shard_suffix =
      request.shard ? "-shard" + std::to_string(shard.index) + "of" + std::to_string(shard.count) : "";
  // A stop while the data loaded (a caller that does not end the process then) leaves
  // nothing behind.
  if (stopped()) throw RunInterrupted("interrupted while loading the data; nothing was written");
  // From the results directory on, a stop is graceful: what finished is written.
  enter(RunPhase::Writing);
  RunOutcome out;
  out.streamed = streamed.has_value();
  Report report(spec, all_points,
                resumed ? std::filesystem::path(resume_dir) : make_run_dir(spec.output.dir, spec.name, shard_suffix));
  out.dir = report.dir();
  out.points = points.size();
  RunInfo info;
  info.command_line = request.command_line;
  info.status = "running";
  info.started_iso = time_now("%Y-%m-%dT%H:%M:%S%z");
  info.points_total = points.size();
  info.recording_summary = rec.name + ": " + rec.summary();
  for (size_t s = 1; s < S; ++s) info.recording_summary += "; " + recs[s]->name + ": " + recs[s]->summary();
  for (size_t s = 0; s < S && !one_pass; ++s) {
    const std::string on = S > 1 ? "sequence " + std::to_string(s) + ": " : "";
    for (const std::string& w : data_warnings(*recs[s])) info.warnings.push_back(on + w);
  }
  info.warnings.insert(info.warnings.end(), plan_warnings.begin(), plan_warnings.end());
  if (S > 1) info.sequences = sources;
  info.backend.requested = spec.backend;
  info.positions = positions;
  info.shard = shard;
  info.sweep_points_total = all_points.size();
  info.points_resumed = resumed ? resumed->kept.size() : 0;
  if (resumed) info.earlier_warnings = carried_warnings(resumed->manifest);
  if (resumed && !resumed->kept.empty()) info.point_backends = manifest_point_backends(resumed->manifest);
  info.config_hash = config_hash;
  info.data_identity = data_identity;  // in one pass empty (not in the manifest) until every layer was loaded
  info.heartbeat_interval_s = heartbeat_interval_seconds();
  // A resumed folder keeps its config's wish (its config.toml has --no-plots folded in).
  info.plots_in_config = resumed && resumed->manifest.contains("plots_in_config")
                             ? resumed->manifest["plots_in_config"].get<bool>()
                             : request.plots_in_config.value_or(spec.output.plots);
  // A fatal signal from here on leaves the manifest "crashed" rather than "running"
  // (its texts rendered from `info` as it is now: made again when `info` changes).
  auto make_crash_marker = [&] {
    return std::make_unique<CrashMarker>(report.manifest_path(), [&](const char* signal) {
      RunInfo crashed = info;
      crashed.status = "crashed";
      crashed.signal = signal;
      return report.manifest_text(crashed);
    });
  };
  auto crash_marker = make_crash_marker();
  report.write_config();
  // Each finished point is appended to results.jsonl at once (what merge and --resume read).
  PointLog point_log(report.dir() / kPointLogFile);
  report.write_manifest(info);
  // While the sweep runs, the manifest's heartbeat is refreshed (kvbudget status tells
  // a live run from one killed without a chance to write), with `info` as it is now
  // (made again when `info` changes).
  auto make_heartbeat = [&] {
    return std::make_unique<Heartbeat>(info.heartbeat_interval_s, [&report, running = info] {
      try {
        report.write_manifest(running);
      } catch (...) {  // the next beat tries again
      }
    });
  };
  auto heartbeat = make_heartbeat();

  // Completed results are rewritten atomically at most once a second while the
  // sweep runs, so a crash loses at most the last second of points.
  std::vector<PointResult> done_results = resumed ? resumed->kept : std::vector<PointResult>{};
  auto last_write = std::chrono::steady_clock::now();
  Progress progress(to_run.size() * S, quiet);
  size_t progress_offset = 0;  // points finished on the sequences before this one
  // Failures outside any point (writing a file, a callback): each is reported, the
  // rest is still written, and the run exits non-zero.
  std::vector<std::string>& run_errors = out.run_errors;
  auto attempt = [&](const std::string& what, const std::function<void()>& write) {
    try {
      write();
    } catch (const std::exception& e) {
      run_errors.push_back(what + ": " + e.what());
    }
  };
  // An intermediate write that fails is retried by the next one and by the final
  // write; it is an error of the run only if the final write fails too.
  size_t failed_intermediate_writes = 0;
  std::string first_intermediate_error;
  // points.csv, and with several sequences points_by_sequence.csv, rebuilt whole from
  // `results` (kept and new points: the file always derives from results.jsonl's
  // content). Returns the measured points without per-sequence rows (older logs).
  auto write_points_files = [&](const std::vector<PointResult>& results) {
    report.write_points(results);
    return S > 1 ? report.write_points_by_sequence(sources, results) : std::vector<size_t>{};
  };
  // As the first point finishes (the sweep chose its backend before running any), the
  // manifest gets the backend, so that a run killed later says what measured the
  // points its results.jsonl keeps, and a --resume elsewhere can say they mix.
  auto record_backend = [&] {
    if (info.backend_decided) return;
    info.backend_decided = true;
    add_point_backend(info.point_backends, backend_name(info.backend.used));  // the manifest derives the warning
    heartbeat.reset();
    crash_marker.reset();
    crash_marker = make_crash_marker();
    attempt("manifest.json (with the backend, as the first point finished)", [&] { report.write_manifest(info); });
    heartbeat = make_heartbeat();
  };
  auto on_point = [&](const SweepPoint& p, const PointResult& r, size_t done, size_t total) {
    record_backend();
    done_results.push_back(r);
    progress.update(progress_offset + done, r.ok ? p.display_label : r.error, r.ok, r.seconds);
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_write).count() >= 1.0) {
      last_write = now;
      try {
        write_points_files(done_results);
      } catch (const std::exception& e) {
        if (failed_intermediate_writes++ == 0) first_intermediate_error = e.what();
      }
    }
    point_log.append(r, p.key);  // a failure is a run error; the final results.jsonl retries
    if (request.on_point) request.on_point(p, r, done, total);
  };
  std::vector<std::string> sweep_errors;
  std::vector<PointResult> results;
  // Several sequences: one sweep each; as the last sequence finishes a point, its
  // results on every sequence are aggregated and handed to the run's bookkeeping.
  std::vector<std::map<size_t, PointResult>> by_sequence(S);
  SweepSeconds sweep_seconds;
  if (one_pass) {
    // The sweep has loaded the last layer, before running its tasks (so before any point
    // finishes: each has tasks on every layer): the manifest gets the data identity,
    // which --resume and merge compare, before any point is in results.jsonl.
    one_pass->on_complete = [&](const std::string& identity) {
      heartbeat.reset();
      crash_marker.reset();
      info.data_identity = identity;
      const std::vector<std::string> data = data_warnings(rec);  // printed now, not before the sweep
      info.warnings.insert(info.warnings.begin(), data.begin(), data.end());  // before the plans' warnings
      crash_marker = make_crash_marker();
      attempt("manifest.json (with the data identity, once every layer was loaded)",
              [&] { report.write_manifest(info); });
      heartbeat = make_heartbeat();
    };
  }
  phase_end();  // the results folder, config.toml and the first manifest: no phase of their own
  // An exception out of the sweep (in one pass, a layer that fails validation as it is
  // loaded; a CUDA device that fails) ends the run: what finished is written, the
  // manifest says "failed", and the error goes to the caller.
  try {
    for (size_t s = 0; s < S; ++s) {
      const bool last = s + 1 == S;
      PointCallback on_sequence_point = on_point;
      if (!last) {
        on_sequence_point = [&](const SweepPoint& p, const PointResult& r, size_t done, size_t) {
          record_backend();
          progress.update(progress_offset + done, r.ok ? p.display_label : r.error, r.ok, r.seconds);
        };
      } else if (S > 1) {
        on_sequence_point = [&](const SweepPoint& p, const PointResult& r, size_t done, size_t total) {
          std::vector<const PointResult*> per_sequence;
          for (size_t e = 0; e + 1 < S; ++e) {
            const auto it = by_sequence[e].find(r.id);
            if (it == by_sequence[e].end()) return;  // not finished there (a stop): not finished
            per_sequence.push_back(&it->second);
          }
          per_sequence.push_back(&r);
          PointResult aggregate = aggregate_sequences(spec, per_sequence, sources);
          for (size_t e = 0; e + 1 < S; ++e) by_sequence[e][r.id].resamples.clear();
          results.push_back(aggregate);
          on_point(p, aggregate, done, total);
        };
      }
      std::vector<std::string> errors_here;
      std::vector<PointResult> finished = run_sweep(spec, *recs[s], to_run, on_sequence_point, request.stop,
                                                    &info.backend, models[s].get(), &errors_here, &plan_checks[s],
                                                    streamed ? streamed->streamed.get() : nullptr, &sweep_seconds);
      const std::string on = S > 1 ? "sequence " + std::to_string(s) + " (" + sources[s] + "): " : "";
      for (const std::string& e : errors_here) sweep_errors.push_back(on + e);
      progress_offset += to_run.size();
      if (S == 1) {
        results = std::move(finished);
      } else {
        for (PointResult& r : finished) by_sequence[s][r.id] = std::move(r);
      }
    }
    // A sweep that left some layer unloaded (no task on it): the rest of the pass, for
    // the identity. Not after a stop: a run stopped before the last layer was loaded has
    // no identity in its manifest, and no point finished (each finishes with its tasks
    // on the last layer).
    if (one_pass && !stopped()) finish_one_pass(*streamed);
  } catch (...) {
    progress.finish();
    heartbeat.reset();
    crash_marker.reset();
    info.status = "failed";
    try {
      throw;
    } catch (const std::exception& e) {
      info.error = e.what();
    } catch (...) {
      info.error = "an unknown error";
    }
    try {
      write_points_files(done_results);
      report.write_manifest(info);
    } catch (...) {  // the error below is the run's
    }
    if (!quiet)
      std::fprintf(stderr, "kvbudget: the run stopped with the error below; %s says \"failed\"\n",
                   report.manifest_path().string().c_str());
    throw;
  }
  if (resumed) results.insert(results.end(), resumed->kept.begin(), resumed->kept.end());
  // By id: several sequences' aggregates arrive in the order their points finish (any,
  // with threads), and a resumed run's kept points come after the new ones.
  std::sort(results.begin(), results.end(), [](const PointResult& a, const PointResult& b) { return a.id < b.id; });
  const double sweep_wall_seconds = phase_end();
  // Too few blocks or problems for intervals and paired verdicts: said once, here and in
  // the manifest (its final write below).
  for (const std::string& w : too_few_interval_units_warnings(
           spec, static_cast<int64_t>(positions.evaluation.size()), results)) {
    std::fprintf(stderr, "kvbudget run: warning: %s\n", w.c_str());
    info.warnings.push_back(w);
  }
  for (const std::string& e : sweep_errors) run_errors.push_back("while the sweep ran, " + e);
  info.backend_decided = true;
  progress.finish();
  if (!quiet) {
    std::fprintf(stderr, "kvbudget: backend %s (%s)%s%s\n", backend_name(info.backend.used), info.backend.reason.c_str(),
                 info.backend.device.empty() ? "" : ": ", info.backend.device.c_str());
    if (info.point_backends.size() > 1)
      std::fprintf(stderr, "kvbudget run: warning: %s\n", mixed_backends_note(info.point_backends).c_str());
  }

  const size_t errors_before_final_write = run_errors.size();
  attempt("points.csv / errors.csv", [&] { report.write_points(results); });
  out.points_lost = run_errors.size() > errors_before_final_write;
  if (S > 1)  // every point's rows, the kept ones' included (from their results.jsonl lines)
    attempt("points_by_sequence.csv", [&] {
      if (const std::vector<size_t> unknown = report.write_points_by_sequence(sources, results); !unknown.empty()) {
        const std::string note = unknown_sequence_rows_note(unknown);
        std::fprintf(stderr, "kvbudget run: warning: %s\n", note.c_str());
        info.warnings.push_back(note);
      }
    });
  if (const std::string note = memory_read_note(results, all_points); !note.empty()) {
    std::fprintf(stderr, "kvbudget run: warning: %s\n", note.c_str());
    info.warnings.push_back(note);
  }
  attempt("results.jsonl", [&] { report.write_point_log(results); });
  if (failed_intermediate_writes > 0) {
    const std::string what = std::to_string(failed_intermediate_writes) +
                             " intermediate write(s) of points.csv failed while the sweep ran (first: " +
                             first_intermediate_error + ")";
    if (run_errors.size() > errors_before_final_write)
      run_errors.push_back(what);
    else
      std::fprintf(stderr, "kvbudget run: warning: %s; the final write succeeded\n", what.c_str());
  }
  attempt("attribution.csv / concentration.csv", [&] { report.write_attribution(results); });
  size_t failed = 0;
  for (const PointResult& r : results) failed += r.ok ? 0 : 1;
  out.failed = failed;
  out.interrupted = stopped();
  attempt("pareto.csv / budgets.json", [&] {
    std::string write_error;
    out.frontier = report.write_frontier(results, &write_error);
    if (!write_error.empty()) throw Error(write_error);
  });
  attempt("comparisons.csv", [&] {
    std::string write_error;
    out.frontier += report.write_comparisons(results, &write_error);
    if (!write_error.empty()) throw Error(write_error);
  });
  if (spec.output.plots && results.size() > failed) {
    out.plot_error = report.write_plots();
    out.plots_written = out.plot_error.empty();
  }

  const double reports_seconds = phase_end();
  info.wall_seconds = std::chrono::duration<double>(t_phase - t_start).count();
  out.wall_seconds = info.wall_seconds;
  // The sweep's plans and exact pass are taken out of its wall time; what is left of it
  // (the task loop; the sequences' aggregates, the sorting) is "points".
  const double points_seconds =
      std::max(0.0, sweep_wall_seconds - sweep_seconds.plans - sweep_seconds.exact_pass);
  info.phase_seconds = {{"data", data_seconds},
                        {"identity", identity_seconds},
                        {"plans", check_plans_seconds + sweep_seconds.plans},
                        {"exact_pass", sweep_seconds.exact_pass},
                        {"points", points_seconds},
                        {"finalize", sweep_seconds.finalize},
                        {"reports", reports_seconds}};
  heartbeat.reset();
  crash_marker.reset();  // the final manifest below says how the run ended
  // "complete" only for a run that exits 0: every point measured and every file written.
  info.status = out.interrupted ? "interrupted"
                                : ((failed || !run_errors.empty() || !out.plot_error.empty()) ? "failed" : "complete");
  out.status = info.status;
  std::vector<std::string> outside_points = run_errors;
  if (!out.plot_error.empty()) outside_points.push_back("plots not written: " + out.plot_error);
  if (info.status == "failed") info.error = join(outside_points, "; ");
  attempt("manifest.json", [&] { report.write_manifest(info); });
  if (out.points_lost) {  // the measurements must not be lost with the disk: the caller prints them
    std::vector<PointResult> by_id = results;
    std::sort(by_id.begin(), by_id.end(), [](const PointResult& a, const PointResult& b) { return a.id < b.id; });
    out.lost_points_csv = report.points_csv(by_id);
  }
  out.results = std::move(results);
  return out;
}

}  // namespace kvb
