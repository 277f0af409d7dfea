#include "collectives/work.hpp"

#include "collectives/error.hpp"
#include "collectives/group.hpp"
#include "shm/communicator.hpp"

#include <algorithm>
#include <sstream>

namespace lspawn {

void Work::wait() {
  if (!pending_) return;
  Pending& p = *pending_;
  if (p.done) {
    if (p.error) std::rethrow_exception(p.error);
    return;
  }
  p.done = true;
  try {
    try {
      if (p.work) p.work->wait();
      p.status.complete(p.sequence);
    } catch (...) {
      p.status.complete(p.sequence);
      throw_collective_error(*p.group, p.op, p.sequence, p.start, std::current_exception());
    }
    if (p.finish) p.finish();
  } catch (...) {
    p.error = std::current_exception();
    p.finish = nullptr;
    throw;
  }
  p.finish = nullptr;
  p.work.reset();
}

bool Work::completed() const { return !pending_ || pending_->done || !pending_->work || pending_->work->isCompleted(); }

void throw_collective_error(Group& group, const std::string& op, std::uint64_t sequence,
                            std::chrono::steady_clock::time_point start, std::exception_ptr error) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string cause;
  enum { Generic, Timeout, Mismatch } kind = Generic;
  std::vector<int> ranks;
  bool ranks_known = false;
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveError&) {
    throw;                         // already has its context
  } catch (const shm::Error& e) {  // also the hierarchy's (collectives/hierarchy.hpp)
    cause = e.what();
    ranks = e.ranks();
    ranks_known = !ranks.empty();
    if (e.kind() == shm::Error::Kind::Timeout) kind = Timeout;
    if (e.kind() == shm::Error::Kind::Mismatch) kind = Mismatch;
  } catch (const std::exception& e) {
    cause = e.what();
    std::string lower = cause;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos) kind = Timeout;
  } catch (...) {
    cause = "unknown exception";
  }
  // Keep the first line of the transport's message (c10d appends long backtraces).
  if (const auto nl = cause.find('\n'); nl != std::string::npos) cause = cause.substr(0, nl);
  if (!ranks_known && kind != Mismatch) {
    // The ranks that fail too record their progress; those that never do did not take part.
    const auto wait = std::min<std::chrono::milliseconds>(group.timeout(), std::chrono::seconds(3));
    ranks = group.ranks_not_reaching(sequence, wait);
  }
  std::ostringstream msg;
  msg << "lspawn " << op << " (op #" << sequence << ") on " << group.describe() << " failed after " << elapsed
      << " s (timeout " << std::chrono::duration<double>(group.timeout()).count() << " s): " << cause;
  if (!ranks.empty() && kind != Mismatch) {
    msg << (ranks_known ? "; ranks concerned:" : "; ranks that did not reach op #" + std::to_string(sequence) + ":");
    for (int r : ranks) msg << " " << r;
  }
  switch (kind) {
    case Timeout: throw CollectiveTimeout(op, group.name(), ranks, msg.str());
    case Mismatch: throw CollectiveMismatch(op, group.name(), ranks, msg.str());
    default: throw CollectiveError(op, group.name(), ranks, msg.str());
  }
}

}  // namespace lspawn
