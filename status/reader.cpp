#include "status/reader.hpp"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "status/layout.hpp"

namespace lspawn::status {
namespace {

constexpr std::chrono::milliseconds kGiveUp{250};

std::string load_name(const std::atomic<std::uint64_t>* words) {
  char buf[kOpBytes + 1] = {};
  for (std::size_t w = 0; w < kOpBytes / 8; ++w) {
    const std::uint64_t v = words[w].load(std::memory_order_acquire);
    std::memcpy(buf + 8 * w, &v, 8);
  }
  buf[kOpBytes - 1] = '\0';
  return buf;
}

const FileHeader* header_of(const void* m) { return static_cast<const FileHeader*>(m); }
const GroupSlot* slots_of(const void* m) {
  return reinterpret_cast<const GroupSlot*>(static_cast<const char*>(m) + sizeof(FileHeader));
}

}  // namespace

std::string rank_file(const std::string& dir, int rank, const std::string& kind) {
  return dir + "/rank-" + std::to_string(rank) + "." + kind;
}
std::string record_path(const std::string& dir, int rank) { return rank_file(dir, rank, "status"); }
std::string stack_path(const std::string& dir, int rank) { return rank_file(dir, rank, "stack"); }

std::optional<RankPlace> rank_place_from_environment() {
  const char* dir = std::getenv(kDirEnv);
  const char* rank = std::getenv("RANK");
  if (!dir || !*dir || !rank || !*rank) return std::nullopt;
  char* end = nullptr;
  const long r = std::strtol(rank, &end, 10);
  if (*end || r < 0) return std::nullopt;
  return RankPlace{dir, static_cast<int>(r)};
}

RecordReader::~RecordReader() {
  if (map_) ::munmap(const_cast<void*>(map_), len_);
}
RecordReader::RecordReader(RecordReader&& o) noexcept : map_(o.map_), len_(o.len_) { o.map_ = nullptr; }
RecordReader& RecordReader::operator=(RecordReader&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<void*>(map_), len_);
    map_ = o.map_;
    len_ = o.len_;
    o.map_ = nullptr;
  }
  return *this;
}

std::optional<RecordReader> RecordReader::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw std::runtime_error("status record " + path + ": open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != kFileBytes) {
    ::close(fd);
    throw std::runtime_error("status record " + path + ": size " + std::to_string(st.st_size) + ", expected " +
                             std::to_string(kFileBytes) + " (another lspawn version?)");
  }
  void* m = ::mmap(nullptr, kFileBytes, PROT_READ, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw std::runtime_error("status record " + path + ": mmap: " + std::strerror(e));
  RecordReader r;
  r.map_ = m;
  r.len_ = kFileBytes;
  const FileHeader* h = header_of(m);
  if (std::memcmp(h->magic, kMagic, sizeof kMagic) != 0 || h->version != kVersion ||
      h->header_bytes != sizeof(FileHeader) || h->slot_bytes != sizeof(GroupSlot) || h->slot_count != kMaxGroups)
    throw std::runtime_error("status record " + path + ": not a version " + std::to_string(kVersion) +
                             " lspawn status record");
  return r;
}

RankView RecordReader::read() const {
  RankView v;
  const FileHeader* h = header_of(map_);
  v.rank = h->rank;
  v.pid = h->pid;
  v.opened_us = h->opened_us;
  v.stack_signal = h->stack_signal.load(std::memory_order_acquire);
  v.groups_dropped = h->groups_dropped.load(std::memory_order_relaxed);
  const std::uint32_t n = std::min(h->groups.load(std::memory_order_acquire), kMaxGroups);
  const GroupSlot* slots = slots_of(map_);
  for (std::uint32_t i = 0; i < n; ++i) {
    const GroupSlot& s = slots[i];
    GroupView g;
    g.name.assign(s.name, strnlen(s.name, kNameBytes));
    g.group_rank = s.group_rank;
    g.group_size = s.group_size;
    bool ok = false;
    // A writer preempted mid-update (a loaded machine) is waited for, up to kGiveUp; only one
    // that stays mid-update that long (it died there) makes the record "torn".
    const auto give_up = std::chrono::steady_clock::now() + kGiveUp;
    for (int attempt = 0; !ok; ++attempt) {
      if (attempt > 100) {
        if (std::chrono::steady_clock::now() > give_up) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      const std::uint64_t v1 = s.version.load(std::memory_order_acquire);
      if (v1 & 1) continue;
      g.in_collective = s.state.load(std::memory_order_acquire) == static_cast<std::uint32_t>(SlotState::InCollective);
      g.seq = s.seq.load(std::memory_order_acquire);
      g.op = load_name(s.op);
      g.bytes = s.bytes.load(std::memory_order_acquire);
      g.since_us = s.since_us.load(std::memory_order_acquire);
      g.completed_seq = s.completed_seq.load(std::memory_order_acquire);
      g.completed_op = load_name(s.completed_op);
      g.completed_us = s.completed_us.load(std::memory_order_acquire);
      const std::uint64_t v2 = s.version.load(std::memory_order_relaxed);  // after the acquire loads
      ok = v1 == v2;
      g.version = v1;
    }
    if (!ok) v.torn = true;
    v.groups.push_back(std::move(g));
  }
  return v;
}

std::uint64_t RecordReader::progress() const {
  const FileHeader* h = header_of(map_);
  const std::uint32_t n = std::min(h->groups.load(std::memory_order_acquire), kMaxGroups);
  std::uint64_t sum = n;
  const GroupSlot* slots = slots_of(map_);
  for (std::uint32_t i = 0; i < n; ++i) sum += slots[i].version.load(std::memory_order_acquire);
  return sum;
}

}  // namespace lspawn::status
