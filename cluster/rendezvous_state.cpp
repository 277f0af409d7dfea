#include "cluster/rendezvous_state.hpp"

#include <algorithm>

namespace lspawn::node {

const char* rdzv_state_name(RdzvState s) {
  switch (s) {
    case RdzvState::Waiting: return "Waiting";
    case RdzvState::LastCall: return "LastCall";
    case RdzvState::Formed: return "Formed";
    case RdzvState::TimedOut: return "TimedOut";
    case RdzvState::Rejected: return "Rejected";
  }
  return "?";
}

const char* rdzv_event_name(RdzvEvent e) {
  switch (e) {
    case RdzvEvent::MinJoined: return "MinJoined";
    case RdzvEvent::BelowMin: return "BelowMin";
    case RdzvEvent::AllJoined: return "AllJoined";
    case RdzvEvent::LastCallOver: return "LastCallOver";
    case RdzvEvent::Deadline: return "Deadline";
    case RdzvEvent::Reject: return "Reject";
  }
  return "?";
}

std::optional<RdzvState> next_rdzv_state(RdzvState s, RdzvEvent e) {
  using S = RdzvState;
  switch (s) {
    case S::Waiting:
      switch (e) {
        case RdzvEvent::MinJoined: return S::LastCall;
        case RdzvEvent::AllJoined: return S::Formed;
        case RdzvEvent::Deadline: return S::TimedOut;
        case RdzvEvent::Reject: return S::Rejected;
        default: return std::nullopt;
      }
    case S::LastCall:
      switch (e) {
        case RdzvEvent::MinJoined: return std::nullopt;
        case RdzvEvent::BelowMin: return S::Waiting;
        case RdzvEvent::AllJoined:
        case RdzvEvent::LastCallOver:
        case RdzvEvent::Deadline: return S::Formed;
        case RdzvEvent::Reject: return S::Rejected;
      }
      return std::nullopt;
    case S::Formed:
      if (e == RdzvEvent::Reject) return S::Rejected;
      return std::nullopt;
    case S::TimedOut:
    case S::Rejected: return std::nullopt;
  }
  return std::nullopt;
}

Formation::Formation(int nnodes, int min_nnodes, std::chrono::milliseconds last_call, time_point deadline)
    : nnodes_(nnodes),
      min_nnodes_(min_nnodes > 0 && min_nnodes < nnodes ? min_nnodes : 0),
      last_call_(last_call),
      deadline_(deadline) {}

bool Formation::enter(RdzvEvent e, time_point now) {
  const std::optional<RdzvState> next = next_rdzv_state(state_, e);
  if (!next) return false;
  state_ = *next;
  if (state_ == RdzvState::LastCall) {
    last_call_end_ = now + last_call_;
  } else {
    last_call_end_.reset();
  }
  return true;
}

std::vector<RdzvState> Formation::update(int joined, time_point now) {
  std::vector<RdzvState> entered;
  const auto event = [&](RdzvEvent e) {
    if (enter(e, now)) entered.push_back(state_);
  };
  if (joined >= nnodes_) {
    event(RdzvEvent::AllJoined);
    return entered;
  }
  if (min_nnodes_ > 0 && joined >= min_nnodes_) {
    event(RdzvEvent::MinJoined);
    if (last_call_end_ && now >= *last_call_end_) event(RdzvEvent::LastCallOver);
  } else {
    event(RdzvEvent::BelowMin);
  }
  if (now >= deadline_) event(RdzvEvent::Deadline);
  return entered;
}

Formation::time_point Formation::next_due() const {
  return last_call_end_ ? std::min(deadline_, *last_call_end_) : deadline_;
}

}  // namespace lspawn::node
