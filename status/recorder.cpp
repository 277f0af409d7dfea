#include "status/recorder.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "status/reader.hpp"
#include "status/stack_dump.hpp"

namespace lspawn::status {
namespace {

[[noreturn]] void fail(const char* call, const std::string& path) {
  throw std::system_error(errno, std::generic_category(), std::string(call) + " " + path);
}

constexpr auto kField = std::memory_order_release;  // every field store inside a WriteSection

void store_name(std::atomic<std::uint64_t>* words, const char* s) {
  char buf[kOpBytes] = {};
  for (std::size_t i = 0; i + 1 < kOpBytes && s[i]; ++i) buf[i] = s[i];
  for (std::size_t w = 0; w < kOpBytes / 8; ++w) {
    std::uint64_t v;
    std::memcpy(&v, buf + 8 * w, 8);
    words[w].store(v, kField);
  }
}

void copy_name(std::atomic<std::uint64_t>* to, const std::atomic<std::uint64_t>* from) {
  for (std::size_t w = 0; w < kOpBytes / 8; ++w) to[w].store(from[w].load(std::memory_order_relaxed), kField);
}

// Seqlock write section: version odd, the fields (release stores), version even (release). A
// reader whose acquire load of a field sees a value stored here also sees the odd version (it was
// stored before, in this thread), so its second version load tells it the read was torn. No
// fences (ThreadSanitizer does not model them); on x86 every one of these is a plain store.
// With several writers (Writers::Many), the odd version is also the writers' lock: taken by a
// compare-and-swap from an even value (acquire: the previous writer's fields are seen), so a
// second writer spins until the first's section ends (a few stores: nanoseconds).
struct WriteSection {
  GroupSlot* s;
  std::uint64_t v;
  WriteSection(GroupSlot* slot, bool many) : s(slot), v(slot->version.load(std::memory_order_relaxed)) {
    if (!many) {
      s->version.store(v + 1, std::memory_order_relaxed);
      return;
    }
    for (;;) {
      if ((v & 1) == 0 &&
          s->version.compare_exchange_weak(v, v + 1, std::memory_order_acquire, std::memory_order_relaxed)) {
        return;
      }
      if (v & 1) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        v = s->version.load(std::memory_order_relaxed);
      }
    }
  }
  ~WriteSection() { s->version.store(v + 2, std::memory_order_release); }
};

}  // namespace

std::int64_t now_us() {
  // The coarse clock: read from the vDSO's data page without touching the hardware clock
  // (6 ns of CPU here, CLOCK_REALTIME 29 ns); a tick (1-4 ms) of resolution is plenty for
  // "waiting for 41 s".
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

void SlotWriter::enter(const char* op, std::uint64_t seq, std::uint64_t bytes) {
  if (!slot_) return;
  const std::int64_t t = now_us();
  WriteSection w(slot_, many_);
  slot_->seq.store(seq, kField);
  store_name(slot_->op, op);
  slot_->bytes.store(bytes, kField);
  slot_->since_us.store(t, kField);
  slot_->state.store(static_cast<std::uint32_t>(SlotState::InCollective), kField);
}

void SlotWriter::complete(std::uint64_t seq) {
  if (!slot_) return;
  const std::int64_t t = now_us();
  WriteSection w(slot_, many_);
  if (seq > slot_->completed_seq.load(std::memory_order_relaxed)) {
    slot_->completed_seq.store(seq, kField);
    slot_->completed_us.store(t, kField);
    if (seq == slot_->seq.load(std::memory_order_relaxed)) {
      copy_name(slot_->completed_op, slot_->op);
    }
  }
  if (seq == slot_->seq.load(std::memory_order_relaxed)) {
    slot_->state.store(static_cast<std::uint32_t>(SlotState::Idle), kField);
    slot_->since_us.store(t, kField);
  }
}

Recorder::~Recorder() {
  if (map_) ::munmap(map_, kFileBytes);
}

std::unique_ptr<Recorder> Recorder::create(const std::string& dir, int rank) {
  auto r = std::make_unique<Recorder>();
  r->dir_ = dir;
  r->rank_ = rank;
  r->path_ = record_path(dir, rank);
  const std::string tmp = r->path_ + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) fail("open", tmp);
  if (::ftruncate(fd, static_cast<off_t>(kFileBytes)) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = e;
    fail("ftruncate", tmp);
  }
  void* m = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) {
    ::unlink(tmp.c_str());
    errno = e;
    fail("mmap", tmp);
  }
  // The file is zero-filled: every atomic starts at 0 (Idle, version 0). Placement-new the header
  // (its atomics) and fill the immutable part before the file gets its name.
  auto* h = new (m) FileHeader{};
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->version = kVersion;
  h->header_bytes = sizeof(FileHeader);
  h->slot_bytes = sizeof(GroupSlot);
  h->slot_count = kMaxGroups;
  h->rank = rank;
  h->pid = ::getpid();
  h->opened_us = now_us();
  auto* slots = reinterpret_cast<GroupSlot*>(static_cast<char*>(m) + sizeof(FileHeader));
  for (std::uint32_t i = 0; i < kMaxGroups; ++i) new (&slots[i]) GroupSlot{};
  // rename() publishes the initialised file: a reader maps it only after finding its name.
  if (::rename(tmp.c_str(), r->path_.c_str()) != 0) {
    const int e2 = errno;
    ::munmap(m, kFileBytes);
    ::unlink(tmp.c_str());
    errno = e2;
    fail("rename", r->path_);
  }
  r->map_ = m;
  r->header_ = h;
  return r;
}

Recorder& Recorder::process() {
  static std::mutex mutex;
  static Recorder disabled;
  static std::unique_ptr<Recorder> current;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(mutex);
  const pid_t me = ::getpid();
  if (owner == me) return current ? *current : disabled;
  owner = me;
  current.release();  // a forked child: the parent's mapping is the parent's record; leave it mapped
  const auto place = rank_place_from_environment();
  if (!place) return disabled;
  try {
    current = create(place->dir, place->rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lspawn: rank %d: no status record (hang diagnosis is off for this rank): %s\n", place->rank,
                 e.what());
    return disabled;
  }
  if (install_stack_dump(stack_path(place->dir, place->rank))) current->set_stack_signal(kStackSignal);
  return *current;
}

SlotWriter Recorder::add_group(const std::string& name, int group_rank, int group_size, Writers writers) {
  if (!header_) return SlotWriter();
  std::lock_guard<std::mutex> lock(add_group_mutex_);
  const std::uint32_t i = header_->groups.load(std::memory_order_relaxed);
  if (i >= kMaxGroups) {
    header_->groups_dropped.fetch_add(1, std::memory_order_relaxed);
    return SlotWriter();
  }
  auto* slot = reinterpret_cast<GroupSlot*>(static_cast<char*>(map_) + sizeof(FileHeader)) + i;
  std::memset(slot->name, 0, kNameBytes);
  std::memcpy(slot->name, name.data(), std::min(name.size(), kNameBytes - 1));
  slot->group_rank = group_rank;
  slot->group_size = group_size;
  slot->since_us.store(now_us(), std::memory_order_relaxed);
  header_->groups.store(i + 1, std::memory_order_release);
  return SlotWriter(slot, writers);
}

void Recorder::set_stack_signal(int sig) {
  if (header_) header_->stack_signal.store(sig, std::memory_order_release);
}

}  // namespace lspawn::status
