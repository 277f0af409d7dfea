#include "collectives/hierarchy.hpp"

#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <thread>

namespace lspawn {

NodeLayout NodeLayout::of(const std::vector<std::string>& node_ids, int rank) {
  NodeLayout l;
  std::vector<std::string> ids;  // per node
  for (int q = 0; q < static_cast<int>(node_ids.size()); ++q) {
    const auto it = std::find(ids.begin(), ids.end(), node_ids[q]);
    const int k = static_cast<int>(it - ids.begin());
    if (it == ids.end()) {
      ids.push_back(node_ids[q]);
      l.members.emplace_back();
      l.names.push_back(node_ids[q].substr(0, node_ids[q].find('/')));
    }
    l.node_of.push_back(k);
    if (q == rank) {
      l.node = k;
      l.local_rank = static_cast<int>(l.members[k].size());
    }
    l.members[k].push_back(q);
  }
  return l;
}

int NodeLayout::max_members() const {
  std::size_t m = 0;
  for (const auto& v : members) m = std::max(m, v.size());
  return static_cast<int>(m);
}

Hierarchy::Hierarchy(NodeLayout layout, std::unique_ptr<shm::Communicator> local,
                     c10::intrusive_ptr<c10d::ProcessGroup> leaders, c10::intrusive_ptr<c10d::Store> store,
                     std::chrono::milliseconds note_wait)
    : layout_(std::move(layout)),
      local_(std::move(local)),
      leaders_(std::move(leaders)),
      store_(std::move(store)),
      note_wait_(note_wait) {}

namespace {
constexpr const char* kNoteKey = "failure";

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
}  // namespace

void Hierarchy::publish(int rank, const std::string& text) {
  const std::string v = std::to_string(rank) + "\n" + text;
  try {
    store_->compareSet(kNoteKey, {}, std::vector<uint8_t>(v.begin(), v.end()));
  } catch (...) {
    // The store is gone (its host died): the others fall back to their own view.
  }
}

std::optional<Hierarchy::Note> Hierarchy::read_note(std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  try {
    for (;;) {
      if (store_->check({kNoteKey})) {
        const auto v = store_->get(kNoteKey);
        const std::string s(v.begin(), v.end());
        const auto nl = s.find('\n');
        if (nl == std::string::npos) return std::nullopt;
        return Note{std::atoi(s.substr(0, nl).c_str()), s.substr(nl + 1)};
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (...) {
    return std::nullopt;
  }
}

void Hierarchy::fail(std::exception_ptr error) {
  try {
    explain(std::move(error));
  } catch (const std::exception& e) {
    if (!failure_) failure_ = std::current_exception();
    leave(e.what());
    throw;
  } catch (...) {
    if (!failure_) failure_ = std::current_exception();
    leave("unknown exception");
    throw;
  }
}

void Hierarchy::leave(const std::string& reason) {
  local_->abort(reason);
  leaders_.reset();  // its only reference: ProcessGroupGloo's destructor closes the pairs
}

void Hierarchy::check_usable() const {
  if (!failure_) return;
  try {
    std::rethrow_exception(failure_);
  } catch (const shm::Error& e) {
    throw shm::Error(e.kind(), e.ranks(), std::string("unusable after an earlier failure: ") + e.what());
  } catch (const std::exception& e) {
    throw shm::Error(shm::Error::Kind::Broken, {}, std::string("unusable after an earlier failure: ") + e.what());
  }
}

void Hierarchy::explain(std::exception_ptr error) {
  const auto& members = layout_.members[layout_.node];
  const int me = members[layout_.local_rank];
  std::ostringstream where;
  where << "node " << layout_.node << " (" << layout_.names[layout_.node] << ")";
  using Kind = shm::Error::Kind;
  try {
    std::rethrow_exception(error);
  } catch (const shm::Error& e) {
    std::vector<int> ranks;
    for (int q : e.ranks()) ranks.push_back(q >= 0 && q < static_cast<int>(members.size()) ? members[q] : q);
    Kind kind = e.kind();
    std::string what = where.str() + ": " + e.what();
    if (kind == Kind::PeerDied && !ranks.empty()) {
      publish(ranks[0], "rank " + std::to_string(ranks[0]) + " died (" + where.str() + "), seen by rank " +
                            std::to_string(me) + ": " + first_line(e.what()));
    }
    if (kind == Kind::PeerDied || kind == Kind::Timeout || kind == Kind::PeerLeft) {
      // The member we saw die may have left because of an earlier failure elsewhere.
      if (auto note = read_note(std::chrono::milliseconds(0));
          note && std::find(ranks.begin(), ranks.end(), note->rank) == ranks.end()) {
        what += "; first failure in the group: " + note->text;
        ranks = {note->rank};
        kind = Kind::PeerDied;
      }
    }
    throw shm::Error(kind, std::move(ranks), what);
  } catch (const std::exception& e) {
    // A gloo stage (leaders): the peer that closed its connection is named by address only. The
    // rank that saw the first death on its node says which rank it was.
    auto note = read_note(note_wait_);
    if (!note) throw;
    throw shm::Error(Kind::PeerDied, {note->rank},
                     where.str() + ": " + first_line(e.what()) + "; first failure in the group: " + note->text);
  }
}

}  // namespace lspawn
