#include "hang/hang_watch.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include <unistd.h>

#include "sys/duration_text.hpp"
#include "sys/sys.hpp"
#include "status/recorder.hpp"
#include "status/stack_dump.hpp"

namespace lspawn {

using sys::Clock;
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

}  // namespace

HangWatch::HangWatch(HangWatchOptions opts)
    : opts_(std::move(opts)), last_progress_(Clock::now()), last_poll_(last_progress_), started_(last_progress_) {
  started_us_ = status::now_us();
}

void HangWatch::note_unseen_ranks(Clock::time_point now, const std::vector<WorkerResult>& workers) {
  if (unseen_said_ || opts_.timeout.count() <= 0 || !opts_.print) return;
  std::vector<int> seen, unseen;
  for (const auto& w : workers) (readers_.count(w.rank) ? seen : unseen).push_back(w.rank);
  for (const auto& [node, inputs] : remote_)
    for (const auto& in : inputs) (in.record ? seen : unseen).push_back(in.rank);
  if (!seen.empty() && !first_record_) first_record_ = now;
  if (unseen.empty()) return;
  const auto after_others = std::max<std::chrono::milliseconds>(opts_.timeout, std::chrono::seconds(5));
  const auto after_start = std::max<std::chrono::milliseconds>(opts_.timeout, std::chrono::seconds(20));
  const char* why =
      "such ranks run neither lspawn's runtime (init_process_group(), lspawn's collectives) nor Python's lspawn_hang "
      "(a "
      "Python started with -E, -I or -S, or with LSPAWN_PYTHON_SITE=0), or have not reached it yet";
  std::sort(unseen.begin(), unseen.end());
  if (first_record_ && now - *first_record_ >= after_others) {
    unseen_said_ = true;
    opts_.print("lspawn: hang watch: " + std::string(unseen.size() > 1 ? "ranks " : "rank ") + format_ranks(unseen) +
                (unseen.size() > 1 ? " have" : " has") + " written no status record " +
                elapsed_text(now - *first_record_) + " after the first rank did, so " + opts_.timeout_flag +
                " cannot see " + (unseen.size() > 1 ? "them" : "it") + ": " + why + "\n");
  } else if (!first_record_ && now - started_ >= after_start) {
    unseen_said_ = true;
    opts_.print("lspawn: hang watch: no rank has written a status record in " + elapsed_text(now - started_) + ", so " +
                opts_.timeout_flag + " watches nothing yet: " + why + "\n");
  }
}

// Every time here is counted from the last poll(), never from now: a caller whose loop wakes
// more often than kCollectPoll (a coordinator reading thousands of nodes' status messages) would
// otherwise push a relative deadline ahead of itself on every turn and never poll.
Clock::time_point HangWatch::next_deadline() const {
  if (requested_) return last_poll_;  // due at once
  if (stack_job_) return std::min(last_poll_ + kCollectPoll, stack_job_->deadline);
  if (pending_) return std::min(last_poll_ + kCollectPoll, pending_->deadline);
  if (opts_.timeout.count() <= 0 || fired_) return Clock::time_point::max();
  const auto step = std::min<std::chrono::milliseconds>(
      kMaxPoll, std::max<std::chrono::milliseconds>(opts_.timeout / 4, std::chrono::milliseconds(10)));
  return std::min(last_poll_ + step, last_progress_ + opts_.timeout);
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
  last_poll_ = now;
  if (stack_job_) finish_stack_job(now >= stack_job_->deadline);
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
  note_unseen_ranks(now, workers);
  std::uint64_t sig = readers_.size();
  for (const auto& [rank, r] : readers_) sig = sig * 1000003 + r.progress();
  for (const auto& [node, inputs] : remote_) {
    for (const auto& in : inputs) {
      std::uint64_t v = in.record ? in.record->groups.size() : 0;
      if (in.record)
        for (const auto& g : in.record->groups) v += g.version;
      sig = sig * 1000003 + v + (in.exited ? 7 : 0);
    }
  }
  if (sig != last_signature_) {
    last_signature_ = sig;
    last_progress_ = now;
  }
  if (requested_) {
    requested_ = false;
    start_report(now, false, workers);
    return false;
  }
  if (fired_ || opts_.timeout.count() <= 0 || (readers_.empty() && remote_.empty()) ||
      now - last_progress_ < opts_.timeout)
    return false;
  bool any_in = false;
  for (const auto& [rank, r] : readers_) {
    const auto v = r.read();
    for (const auto& g : v.groups) any_in = any_in || g.in_collective;
  }
  bool all_exited = true;
  for (const auto& w : workers) all_exited = all_exited && w.exited;
  for (const auto& [node, inputs] : remote_) {
    for (const auto& in : inputs) {
      all_exited = all_exited && in.exited;
      if (in.record)
        for (const auto& g : in.record->groups) any_in = any_in || g.in_collective;
    }
  }
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
  std::map<int, int> node_of;  // remote rank → its node
  for (const auto& [node, inputs] : remote_) {
    for (const auto& in : inputs) {
      node_of[in.rank] = node;
      p.inputs.push_back(in);
    }
  }
  std::sort(p.inputs.begin(), p.inputs.end(), [](const RankInput& a, const RankInput& b) { return a.rank < b.rank; });
  p.now_us = status::now_us();
  p.analysis = analyse_hang(p.inputs, p.now_us);
  // Stacks: of the ranks behind; those of other nodes through their launchers.
  const std::vector<int>& want = p.analysis.lagging;
  std::map<int, std::vector<int>> remote_want;
  for (auto& in : p.inputs) {
    if (std::find(want.begin(), want.end(), in.rank) == want.end()) continue;
    if (in.exited) continue;
    if (auto it = node_of.find(in.rank); it != node_of.end()) {
      if (opts_.ask_remote_stacks) {
        remote_want[it->second].push_back(in.rank);
        p.remote_asked.push_back(in.rank);
      } else {
        in.stack_problem = "on another node";
      }
      continue;
    }
    if (ask_stack(in)) p.asked.push_back(in.rank);
  }
  for (const auto& [node, ranks] : remote_want) opts_.ask_remote_stacks(node, ranks);
  p.deadline = p.asked.empty() && p.remote_asked.empty() ? now : now + opts_.stack_wait;
  pending_ = std::move(p);
}

bool HangWatch::ask_stack(RankInput& in) {
  if (!in.record) {
    in.stack_problem = "no status record, so no stack handler to ask";
    return false;
  }
  if (in.record->stack_signal != status::kStackSignal) {
    in.stack_problem = "its runtime did not install the stack handler";
    return false;
  }
  if (in.record->pid != in.pid) {
    in.stack_problem = "its record was written by pid " + std::to_string(in.record->pid) + ", not the worker's pid " +
                       std::to_string(in.pid);
    return false;
  }
  const std::string path = status::stack_path(opts_.dir, in.rank);
  ::unlink(path.c_str());
  if (sys::kill(in.pid, status::kStackSignal, "asking rank " + std::to_string(in.rank) + " for its stack")) return true;
  in.stack_problem = "it is gone";
  return false;
}

void HangWatch::set_remote(int node_rank, std::vector<RankInput> inputs) { remote_[node_rank] = std::move(inputs); }

void HangWatch::add_remote_stacks(const std::vector<RankInput>& answers) {
  if (!pending_) return;
  for (const auto& a : answers) {
    auto asked = std::find(pending_->remote_asked.begin(), pending_->remote_asked.end(), a.rank);
    if (asked == pending_->remote_asked.end()) continue;
    pending_->remote_asked.erase(asked);
    for (auto& in : pending_->inputs) {
      if (in.rank != a.rank) continue;
      in.stack = a.stack;
      in.stack_problem = a.stack_problem;
    }
  }
}

void HangWatch::ask_stacks_for(const std::vector<int>& ranks, const std::vector<WorkerResult>& workers,
                               std::function<void(std::vector<RankInput>)> answer) {
  StackJob job;
  job.answer = std::move(answer);
  for (auto& in : collect_inputs(workers)) {
    if (std::find(ranks.begin(), ranks.end(), in.rank) == ranks.end()) continue;
    if (in.exited)
      in.stack_problem = "it has exited";
    else if (ask_stack(in))
      job.asked.push_back(in.rank);
    job.inputs.push_back(std::move(in));
  }
  for (int r : ranks) {
    const bool known =
        std::any_of(job.inputs.begin(), job.inputs.end(), [r](const RankInput& in) { return in.rank == r; });
    if (!known) {
      RankInput in;
      in.rank = r;
      in.stack_problem = "not a rank of this node";
      job.inputs.push_back(std::move(in));
    }
  }
  job.deadline = Clock::now() + opts_.stack_wait;
  stack_job_ = std::move(job);
  finish_stack_job(false);
}

void HangWatch::finish_stack_job(bool force) {
  StackJob& job = *stack_job_;
  if (!force) {
    for (int rank : job.asked)
      if (!read_stack(status::stack_path(opts_.dir, rank))) return;
  }
  std::vector<RankInput> answers;
  for (auto& in : job.inputs) {
    RankInput a;
    a.rank = in.rank;
    a.stack_problem = in.stack_problem;
    if (std::find(job.asked.begin(), job.asked.end(), in.rank) != job.asked.end()) {
      if (auto frames = read_stack(status::stack_path(opts_.dir, in.rank)))
        a.stack = std::move(*frames);
      else
        a.stack_problem = "no answer within " + seconds_text(opts_.stack_wait);
    }
    answers.push_back(std::move(a));
  }
  auto answer = std::move(job.answer);
  stack_job_.reset();
  if (answer) answer(std::move(answers));
}

bool HangWatch::stacks_ready() const {
  if (!pending_->remote_asked.empty()) return false;
  for (int rank : pending_->asked)
    if (!read_stack(status::stack_path(opts_.dir, rank))) return false;
  return true;
}

void HangWatch::finish_report() {
  Pending& p = *pending_;
  for (auto& in : p.inputs) {
    if (std::find(p.remote_asked.begin(), p.remote_asked.end(), in.rank) != p.remote_asked.end()) {
      in.stack_problem = "its node's lspawn sent no answer within " + seconds_text(opts_.stack_wait);
      continue;
    }
    if (std::find(p.asked.begin(), p.asked.end(), in.rank) == p.asked.end()) continue;
    if (auto frames = read_stack(status::stack_path(opts_.dir, in.rank)))
      in.stack = std::move(*frames);
    else
      in.stack_problem = "no answer within " + seconds_text(opts_.stack_wait);
  }
  std::string headline;
  if (p.hang) {
    headline = "hang: no rank made progress in its collectives for " +
               elapsed_text(std::chrono::duration<double>(p.quiet_s)) + " (" + opts_.timeout_flag + " " +
               seconds_number(opts_.timeout) + ")";
  } else {
    headline =
        "status of " + std::to_string(p.inputs.size()) + " rank" + (p.inputs.size() == 1 ? "" : "s") + " (on request)";
  }
  last_report_ = format_hang_report(headline, p.analysis, p.inputs);
  if (opts_.print) opts_.print(last_report_);
  pending_.reset();
}

}  // namespace lspawn
