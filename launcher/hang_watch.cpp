#include "launcher/hang_watch.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <unistd.h>

#include "launcher/sys.hpp"
#include "status/recorder.hpp"
#include "status/stack_dump.hpp"

namespace lspawn {
namespace {

constexpr std::chrono::milliseconds kCollectPoll{20};
constexpr std::chrono::milliseconds kMaxPoll{500};

// The frames of a complete stack file (ends with kStackEnd), else nullopt.
std::optional<std::vector<std::string>> read_stack(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::vector<std::string> lines;
  bool complete = false;
  for (std::string line; std::getline(in, line);) {
    if (line == status::kStackEnd) {
      complete = true;
      break;
    }
    if (lines.size() < 200) lines.push_back(line);
  }
  if (!complete) return std::nullopt;
  if (!lines.empty()) lines.erase(lines.begin());  // "pid N main thread"
  return lines;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

HangWatch::HangWatch(HangWatchOptions opts) : opts_(std::move(opts)), last_progress_(Clock::now()) {
  started_us_ = status::now_us();
}

Clock::time_point HangWatch::next_deadline() const {
  const auto now = Clock::now();
  if (pending_ || requested_) return std::min(now + kCollectPoll, pending_ ? pending_->deadline : now + kCollectPoll);
  if (opts_.timeout.count() <= 0 || fired_) return Clock::time_point::max();
  const auto step = std::min<std::chrono::milliseconds>(kMaxPoll, std::max<std::chrono::milliseconds>(opts_.timeout / 4, std::chrono::milliseconds(10)));
  return std::min(now + step, last_progress_ + opts_.timeout);
}

std::vector<RankInput> HangWatch::collect_inputs(const std::vector<WorkerResult>& workers) {
  std::vector<RankInput> out;
  open_records(workers);
  for (const auto& w : workers) {
    RankInput in;
    in.rank = w.rank;
    in.pid = w.pid;
    in.exited = w.exited;
    if (w.exited) in.exit_text = "has exited (" + w.describe() + ")";
    in.started_us = started_us_;
    if (auto it = readers_.find(w.rank); it != readers_.end()) in.record = it->second.read();
    if (auto it = problems_.find(w.rank); it != problems_.end()) in.record_problem = it->second;
    out.push_back(std::move(in));
  }
  return out;
}

void HangWatch::open_records(const std::vector<WorkerResult>& workers) {
  for (const auto& w : workers) {
    if (readers_.count(w.rank)) continue;
    try {
      if (auto r = status::RecordReader::open(status::record_path(opts_.dir, w.rank))) {
        readers_.emplace(w.rank, std::move(*r));
        problems_.erase(w.rank);
      }
    } catch (const std::exception& e) {
      problems_[w.rank] = e.what();
    }
  }
}

bool HangWatch::poll(Clock::time_point now, const std::vector<WorkerResult>& workers) {
  if (pending_) {
    if (stacks_ready() || now >= pending_->deadline) {
      const bool hang = pending_->hang;
      finish_report();
      if (hang) {
        fired_ = true;
        return true;
      }
    }
    return false;
  }
  // Progress: any record's versions, or a new record.
  open_records(workers);
  std::uint64_t sig = readers_.size();
  for (const auto& [rank, r] : readers_) sig = sig * 1000003 + r.progress();
  if (sig != last_signature_) {
    last_signature_ = sig;
    last_progress_ = now;
  }
  if (requested_) {
    requested_ = false;
    start_report(now, false, workers);
    return false;
  }
  if (fired_ || opts_.timeout.count() <= 0 || readers_.empty() || now - last_progress_ < opts_.timeout) return false;
  bool any_in = false;
  for (const auto& [rank, r] : readers_) {
    const auto v = r.read();
    for (const auto& g : v.groups) any_in = any_in || g.in_collective;
  }
  bool all_exited = true;
  for (const auto& w : workers) all_exited = all_exited && w.exited;
  if (!any_in || all_exited) {
    last_progress_ = now;  // ranks computing between collectives: not a hang
    return false;
  }
  start_report(now, true, workers);
  return false;
}

void HangWatch::start_report(Clock::time_point now, bool hang, const std::vector<WorkerResult>& workers) {
  Pending p;
  p.hang = hang;
  p.quiet_s = std::chrono::duration<double>(now - last_progress_).count();
  p.inputs = collect_inputs(workers);
  p.now_us = status::now_us();
  p.analysis = analyse_hang(p.inputs, p.now_us);
  // Stacks: of the ranks behind.
  std::vector<int> want = p.analysis.lagging;
  for (auto& in : p.inputs) {
    if (std::find(want.begin(), want.end(), in.rank) == want.end()) continue;
    if (in.exited) continue;
    if (!in.record) {
      in.stack_problem = "no status record, so no stack handler to ask";
      continue;
    }
    if (in.record->stack_signal != status::kStackSignal) {
      in.stack_problem = "its runtime did not install the stack handler";
      continue;
    }
    if (in.record->pid != in.pid) {
      in.stack_problem = "its record was written by pid " + std::to_string(in.record->pid) + ", not the worker's pid " +
                         std::to_string(in.pid);
      continue;
    }
    const std::string path = status::stack_path(opts_.dir, in.rank);
    ::unlink(path.c_str());
    if (sys::kill(in.pid, status::kStackSignal, "asking rank " + std::to_string(in.rank) + " for its stack")) {
      p.asked.push_back(in.rank);
    } else {
      in.stack_problem = "it is gone";
    }
  }
  p.deadline = p.asked.empty() ? now : now + opts_.stack_wait;
  pending_ = std::move(p);
}

bool HangWatch::stacks_ready() const {
  for (int rank : pending_->asked)
    if (!read_stack(status::stack_path(opts_.dir, rank))) return false;
  return true;
}

void HangWatch::finish_report() {
  Pending& p = *pending_;
  for (auto& in : p.inputs) {
    if (std::find(p.asked.begin(), p.asked.end(), in.rank) == p.asked.end()) continue;
    if (auto frames = read_stack(status::stack_path(opts_.dir, in.rank))) in.stack = std::move(*frames);
    else
      in.stack_problem = "no answer within " + seconds_text(std::chrono::duration<double>(opts_.stack_wait).count()) + " s";
  }
  std::string headline;
  if (p.hang) {
    char q[32];
    std::snprintf(q, sizeof q, "%.1f", p.quiet_s);
    headline = "hang: no rank made progress in its collectives for " + std::string(q) + " s (" + opts_.timeout_flag + " " +
               seconds_text(std::chrono::duration<double>(opts_.timeout).count()) + ")";
  } else {
    headline = "status of " + std::to_string(p.inputs.size()) + " rank" + (p.inputs.size() == 1 ? "" : "s") +
               " (on request)";
  }
  if (opts_.print) opts_.print(format_hang_report(headline, p.analysis, p.inputs));
  pending_.reset();
}

}  // namespace lspawn
