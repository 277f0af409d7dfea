#include "shm/communicator.hpp"
#include "sys/shm_segments.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LSPAWN_CPU_RELAX() _mm_pause()
#else
#define LSPAWN_CPU_RELAX() \
  do {                     \
  } while (0)
#endif

namespace lspawn::shm {
namespace {

// 64 random bits from the kernel (getrandom(2), the system call: glibc's wrapper is 2.25's and the
// manylinux2014 wheel runs on 2.17), not std::random_device: in a libstdc++ linked statically (the
// wheel's engine) that calls glibc 2.36's arc4random.
std::uint64_t random_u64() {
  std::uint64_t v = 0;
  char* p = reinterpret_cast<char*>(&v);
  std::size_t got = 0;
  while (got < sizeof v) {
    const ssize_t n = ::syscall(SYS_getrandom, p + got, sizeof v - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (errno != EINTR) {
      v ^= static_cast<std::uint64_t>(::getpid()) << 32 ^ static_cast<std::uint64_t>(::time(nullptr));
      break;
    }
  }
  return v;
}

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kMagic = 0x6c7370776e73686dULL;  // "lspwnshm"
constexpr std::uint32_t kVersion = 2;                    // 2: InfoLine's left and reason
constexpr std::size_t kLine = 64;
// How long a waiter yields before it sleeps on the futex (Communicator::wait_all).
constexpr auto kYieldFor = std::chrono::microseconds(20);

enum class OpCode : std::uint32_t { Init = 1, AllReduce, Broadcast, AllGather, Barrier };

const char* op_name(std::uint32_t op) {
  switch (static_cast<OpCode>(op)) {
    case OpCode::Init: return "init";
    case OpCode::AllReduce: return "all_reduce";
    case OpCode::Broadcast: return "broadcast";
    case OpCode::AllGather: return "all_gather";
    case OpCode::Barrier: return "barrier";
  }
  return "?";
}

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

std::string errno_text(const char* call, int err) { return std::string(call) + ": " + std::strerror(err); }

long futex(std::atomic<std::uint32_t>* addr, int op, std::uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// A process that no longer runs: gone (ESRCH) or a zombie its parent has not reaped yet.
bool process_dead(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct Communicator::Desc {
  std::uint32_t op = 0;
  std::uint32_t elem = 0;
  std::uint32_t kop = 0;
  std::int32_t root = -1;
  std::uint64_t count = 0;  // elements (all_reduce) or bytes
  bool operator==(const Desc& o) const {
    return op == o.op && elem == o.elem && kop == o.kop && root == o.root && count == o.count;
  }
  std::string str() const {
    std::ostringstream s;
    s << op_name(op);
    switch (static_cast<OpCode>(op)) {
      case OpCode::AllReduce:
        s << "(" << elem_name(static_cast<ElemType>(elem)) << " x " << count << ", "
          << kernel_op_name(static_cast<KernelOp>(kop)) << ")";
        break;
      case OpCode::Broadcast: s << "(" << count << " bytes, root " << root << ")"; break;
      case OpCode::AllGather: s << "(" << count << " bytes per rank)"; break;
      default: break;
    }
    return s.str();
  }
};

// Control block at the start of the mapping. Per-rank lines follow it.
struct Communicator::Segment {
  std::uint64_t magic;
  std::uint32_t version;
  std::int32_t size;
  std::uint64_t slot_bytes;
  std::uint64_t data_offset;
  alignas(kLine) std::atomic<std::uint32_t> sleepers;  // ranks inside futex_wait (any word)
};

namespace {
// One cache line per rank for the counter others poll, one for what is read once per round.
struct alignas(kLine) ArriveLine {
  std::atomic<std::uint32_t> arrived;
};
struct alignas(kLine) InfoLine {
  std::int32_t pid;
  std::int32_t single_copy_ok;  // this rank could read its neighbour's memory (process_vm_readv)
  unsigned char desc[2][32];    // Communicator::Desc per round parity
  std::uint64_t addr[2];        // single-copy all_reduce: the buffer's address, per round parity
  std::uint64_t canary_addr;    // probe at construction: where to read, and what to find there
  std::uint64_t canary_value;
  // 0 while this rank is in the group; kLeftFailed or kLeftClosed once it left (release; read with
  // acquire by the peers that wait for it, then `reason`, written before it). kLeaving while the
  // one thread that won the race to leave writes `reason` (abort() may come from another thread).
  std::atomic<std::uint32_t> left;
  char reason[192];  // why it left (NUL-terminated)
};
constexpr std::uint32_t kLeftFailed = 1;  // its communicator broke or was aborted
constexpr std::uint32_t kLeftClosed = 2;  // destroyed
constexpr std::uint32_t kLeaving = 3;     // being written: not yet left
static_assert(sizeof(ArriveLine) == kLine);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// memcpy that accepts the null pointers of empty tensors.
void copy(void* dst, const void* src, std::size_t n) {
  if (n) std::memcpy(dst, src, n);
}
}  // namespace

static std::size_t ctrl_bytes_for(int size, std::size_t segment_bytes) {
  return round_up(round_up(segment_bytes, kLine) + size * (sizeof(ArriveLine) + sizeof(InfoLine)), 4096);
}

#define LSPAWN_SEG_ARRIVE(seg, r) \
  (reinterpret_cast<ArriveLine*>(reinterpret_cast<unsigned char*>(seg) + round_up(sizeof(Segment), kLine)) + (r))
#define LSPAWN_SEG_INFO(seg, n, r)                                                                        \
  (reinterpret_cast<InfoLine*>(reinterpret_cast<unsigned char*>(seg) + round_up(sizeof(Segment), kLine) + \
                               (n) * sizeof(ArriveLine)) +                                                \
   (r))

int single_copy_from_env() {
  const char* env = std::getenv("LSPAWN_SHM_SINGLE_COPY");
  if (env == nullptr || *env == '\0') return -1;
  const std::string v = env;
  if (v != "0" && v != "1")
    throw Error(Error::Kind::System, {}, "shm: LSPAWN_SHM_SINGLE_COPY='" + v + "': expected 1 (on) or 0 (off)");
  return v == "1" ? 1 : 0;
}

Communicator::Communicator(int rank, int size, const Rendezvous& rendezvous, CommOptions options)
    : rank_(rank), size_(size), options_(std::move(options)) {
  static_assert(sizeof(Desc) <= 32);
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(Error::Kind::System, {}, "shm: invalid rank " + std::to_string(rank) + " of " + std::to_string(size));
  options_.slot_bytes = round_up(std::max<std::size_t>(options_.slot_bytes, 4096), kLine);
  options_.flat_max_bytes = std::min(options_.flat_max_bytes, options_.slot_bytes);
  // LSPAWN_SHM_SINGLE_COPY overrides CommOptions::single_copy either way; checked before the
  // segment exists, so a bad value fails every rank alike and leaves nothing behind.
  if (const int env = single_copy_from_env(); env >= 0) options_.single_copy = env == 1;
  srcs_.resize(static_cast<std::size_t>(size));
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  oversubscribed_ = cpus > 0 && size > cpus;
  if (size == 1) return;  // every operation is local

  const std::size_t ctrl = ctrl_bytes_for(size, sizeof(Segment));
  map_bytes_ = ctrl + 2 * static_cast<std::size_t>(size) * options_.slot_bytes;
  std::string name;
  int fd = -1;
  if (rank == 0) {
    name = sys::shm_segment_name(options_.label, getpid(), random_u64());  // the supervisor's rule too
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw Error(Error::Kind::System, {}, "shm: " + errno_text("shm_open", errno) + " (" + name + ")");
    if (::ftruncate(fd, static_cast<off_t>(map_bytes_)) != 0) {
      const int e = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw Error(Error::Kind::System, {},
                  "shm: " + errno_text("ftruncate", e) + " (" + name + ", " + std::to_string(map_bytes_) + " bytes)");
    }
  } else {
    name = rendezvous.get("shm_name");
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
      throw Error(Error::Kind::System, {},
                  "shm: " + errno_text("shm_open", errno) + " (" + name + ", rank " + std::to_string(rank) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != map_bytes_) {
      ::close(fd);
      throw Error(Error::Kind::System, {},
                  "shm: segment " + name + " has " + std::to_string(st.st_size) + " bytes, rank " +
                      std::to_string(rank) + " expects " + std::to_string(map_bytes_) +
                      " (different slot_bytes or size across ranks?)");
    }
  }
  void* base = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    if (rank == 0) ::shm_unlink(name.c_str());
    throw Error(Error::Kind::System, {}, "shm: " + errno_text("mmap", map_errno) + " (" + name + ")");
  }
  seg_ = static_cast<Segment*>(base);
  data_ = static_cast<unsigned char*>(base) + ctrl;
  if (rank == 0) {
    new (&seg_->sleepers) std::atomic<std::uint32_t>(0);
    for (int r = 0; r < size; ++r) {
      new (&LSPAWN_SEG_ARRIVE(seg_, r)->arrived) std::atomic<std::uint32_t>(0);
      new (&LSPAWN_SEG_INFO(seg_, size, r)->left) std::atomic<std::uint32_t>(0);
      LSPAWN_SEG_INFO(seg_, size, r)->pid = 0;
    }
    seg_->size = size;
    seg_->slot_bytes = options_.slot_bytes;
    seg_->data_offset = ctrl;
    seg_->version = kVersion;
    std::atomic_thread_fence(std::memory_order_release);
    seg_->magic = kMagic;
    try {
      rendezvous.set("shm_name", name);
    } catch (...) {
      ::shm_unlink(name.c_str());
      throw;
    }
  } else if (seg_->magic != kMagic || seg_->version != kVersion || seg_->size != size ||
             seg_->slot_bytes != options_.slot_bytes) {
    ::munmap(base, map_bytes_);
    seg_ = nullptr;
    throw Error(Error::Kind::System, {},
                "shm: segment " + name + " does not match rank " + std::to_string(rank) + "'s size/slot_bytes/version");
  }
  LSPAWN_SEG_INFO(seg_, size, rank)->pid = static_cast<std::int32_t>(getpid());
  // First round: everybody has mapped the segment; then nobody needs the name any more.
  current_op_ = "init";
  try {
    Desc d;
    d.op = static_cast<std::uint32_t>(OpCode::Init);
    begin_round(d);
  } catch (...) {
    if (rank == 0) ::shm_unlink(name.c_str());
    ::munmap(base, map_bytes_);
    seg_ = nullptr;
    throw;
  }
  if (rank == 0) ::shm_unlink(name.c_str());
  probe_single_copy();
}

// Two more init rounds: publish a canary, read the neighbour's with process_vm_readv and write it
// back with process_vm_writev, agree.
// Every rank runs them (also with single copy off: it then just reports "no").
void Communicator::probe_single_copy() {
  InfoLine* mine = LSPAWN_SEG_INFO(seg_, size_, rank_);
  canary_ = random_u64() | 1;
  mine->canary_addr = reinterpret_cast<std::uint64_t>(&canary_);
  mine->canary_value = canary_;
  Desc d;
  d.op = static_cast<std::uint32_t>(OpCode::Init);
  begin_round(d);
  bool ok = options_.single_copy;
  if (ok) {
    const InfoLine* peer = LSPAWN_SEG_INFO(seg_, size_, (rank_ + 1) % size_);
    std::uint64_t seen = 0;
    iovec local{&seen, sizeof seen};
    iovec remote{reinterpret_cast<void*>(peer->canary_addr), sizeof seen};
    ok = ::process_vm_readv(peer->pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof seen) &&
         seen == peer->canary_value;
    // all_reduce also writes into the peers' buffers: put the same value back.
    ok = ok && ::process_vm_writev(peer->pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof seen);
  }
  mine->single_copy_ok = ok ? 1 : 0;
  begin_round(d);
  single_copy_ = true;
  for (int q = 0; q < size_; ++q) single_copy_ = single_copy_ && LSPAWN_SEG_INFO(seg_, size_, q)->single_copy_ok;
}

// Copies `bytes` between `local` and address `remote` of rank q's process: from the peer with
// process_vm_readv, to it (`to_peer`) with process_vm_writev.
void Communicator::peer_copy(int q, void* local, std::uint64_t remote, std::size_t bytes, bool to_peer) {
  const int pid = LSPAWN_SEG_INFO(seg_, size_, q)->pid;
  auto* mine = static_cast<unsigned char*>(local);
  while (bytes > 0) {
    iovec l{mine, bytes};
    iovec r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t done = to_peer ? ::process_vm_writev(pid, &l, 1, &r, 1, 0) : ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (done <= 0) {
      const int e = done < 0 ? errno : EIO;
      std::ostringstream msg;
      msg << "shm " << current_op_ << ": " << me() << " cannot " << (to_peer ? "write" : "read") << " rank " << shown(q)
          << " (pid " << pid << "): " << errno_text(to_peer ? "process_vm_writev" : "process_vm_readv", e);
      if (e == ESRCH || process_dead(pid)) fail(Error(Error::Kind::PeerDied, {q}, msg.str()));
      fail(Error(Error::Kind::System, {q}, msg.str()));
    }
    mine += done;
    remote += static_cast<std::uint64_t>(done);
    bytes -= static_cast<std::size_t>(done);
  }
}

// Single copy (large all_reduce, when every rank may read the others' memory): 2 rounds in all.
//   round 1: publish the buffer address (every input is in place);
//   rank q owns region q (cache-line-aligned bounds). Piece by piece (cache-sized), it reads the
//   piece from every peer's buffer (process_vm_readv), folds all of them and its own, in rank
//   order, into a cache-resident result, and writes the result into its own buffer and every
//   peer's (process_vm_writev), from cache. Only rank q ever touches region q of any buffer (it
//   reads a piece everywhere before it writes it), so no piece is overwritten before it is read;
//   round 2: every region is final in every buffer; nobody returns (and reuses its buffer) while a
//   peer may still write into it.
// Per rank that is (N-1)/N of the buffer read remotely and written remotely, 1/N read and written
// locally: 2 passes over the buffer's size, where reading the final regions back (a third round)
// took 3.
void Communicator::all_reduce_single_copy(unsigned char* data, std::size_t count, ElemType type, KernelOp op,
                                          const Desc& d) {
  const std::size_t es = elem_size(type);
  const int parity = static_cast<int>(round_ % 2);
  LSPAWN_SEG_INFO(seg_, size_, rank_)->addr[parity] = reinterpret_cast<std::uint64_t>(data);
  begin_round(d);
  std::vector<std::uint64_t> addr(size_);
  for (int q = 0; q < size_; ++q) addr[q] = LSPAWN_SEG_INFO(seg_, size_, q)->addr[parity];
  const std::size_t align = std::max<std::size_t>(1, kLine / es);
  auto edge = [&](int q) { return std::min(count, round_up(count * q / size_, align)); };
  // The peers' pieces and the result stay in this core's cache (about 1 MiB in all).
  const std::size_t piece_bytes = std::max<std::size_t>(std::size_t{64} << 10, (std::size_t{1} << 20) / size_);
  const std::size_t piece = std::max<std::size_t>(1, piece_bytes / es);
  piece_buffer_.resize(static_cast<std::size_t>(size_) * piece * es);
  unsigned char* result = piece_buffer_.data() + static_cast<std::size_t>(size_ - 1) * piece * es;
  std::vector<const void*> srcs(size_);
  for (std::size_t off = edge(rank_), hi = edge(rank_ + 1); off < hi; off += piece) {
    const std::size_t m = std::min(piece, hi - off);
    for (int q = 0, k = 0; q < size_; ++q) {
      if (q == rank_) {
        srcs[q] = data + off * es;
        continue;
      }
      auto* tmp = piece_buffer_.data() + static_cast<std::size_t>(k++) * piece * es;
      peer_copy(q, tmp, addr[q] + off * es, m * es, false);
      srcs[q] = tmp;
    }
    reduce_into(result, srcs.data(), size_, m, type, op);
    copy(data + off * es, result, m * es);
    for (int q = 0; q < size_; ++q)
      if (q != rank_) peer_copy(q, result, addr[q] + off * es, m * es, true);
  }
  begin_round(d);
}

Communicator::~Communicator() {
  if (!seg_) return;
  leave(kLeftClosed, "it closed its communicator (destroyed its group)");
  ::munmap(seg_, map_bytes_);
}

void Communicator::abort(const std::string& reason) {
  broken_ = true;
  if (seg_) leave(kLeftFailed, reason);
}

// Says in this rank's line that it left (the first time only) and wakes the peers asleep on its
// arrival counter, which is what they wait for when they wait for this rank.
void Communicator::leave(std::uint32_t how, const std::string& reason) {
  InfoLine* mine = LSPAWN_SEG_INFO(seg_, size_, rank_);
  // A process forked from the rank (a DataLoader worker, a child that exits through exit()) has a copy
  // of this object and the segment mapped: its abort or destructor is not the rank's.
  if (mine->pid != static_cast<std::int32_t>(::getpid())) return;
  std::uint32_t none = 0;
  if (!mine->left.compare_exchange_strong(none, kLeaving, std::memory_order_relaxed)) return;  // left already
  std::snprintf(mine->reason, sizeof mine->reason, "%s", reason.substr(0, reason.find('\n')).c_str());
  mine->left.store(how, std::memory_order_release);
  auto* arrived = &LSPAWN_SEG_ARRIVE(seg_, rank_)->arrived;
  if (seg_->sleepers.load(std::memory_order_seq_cst) > 0) futex(arrived, FUTEX_WAKE, INT_MAX, nullptr);
}

unsigned char* Communicator::slot(int set, int rank) const {
  return data_ + (static_cast<std::size_t>(set) * size_ + rank) * options_.slot_bytes;
}

int Communicator::shown(int q) const {
  return q >= 0 && q < static_cast<int>(options_.shown_ranks.size()) ? options_.shown_ranks[q] : q;
}

std::string Communicator::me() const {
  std::ostringstream s;
  if (options_.shown_ranks.empty())
    s << "rank " << rank_ << "/" << size_ << " (pid " << getpid() << ")";
  else
    s << "rank " << shown(rank_) << " (" << rank_ << "/" << size_ << " here, pid " << getpid() << ")";
  return s.str();
}

void Communicator::fail(Error e) {
  abort(e.what());
  throw e;
}

void Communicator::arrive() {
  auto* mine = &LSPAWN_SEG_ARRIVE(seg_, rank_)->arrived;
  mine->store(static_cast<std::uint32_t>(round_ + 1), std::memory_order_seq_cst);
  if (seg_->sleepers.load(std::memory_order_seq_cst) > 0) futex(mine, FUTEX_WAKE, INT_MAX, nullptr);
}

void Communicator::wait_all(std::uint32_t target, const char* what) {
  const auto start = Clock::now();
  const auto deadline = start + options_.timeout;
  auto last_liveness = start;
  auto reached = [target](std::uint32_t v) { return static_cast<std::int32_t>(v - target) >= 0; };
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    auto* word = &LSPAWN_SEG_ARRIVE(seg_, q)->arrived;
    if (reached(word->load(std::memory_order_acquire))) continue;
    bool done = false;
    if (!oversubscribed_) {
      for (int i = 0; i < 1000 && !done; ++i) {
        LSPAWN_CPU_RELAX();
        done = reached(word->load(std::memory_order_acquire));
      }
    }
    // Yield for up to kYieldFor: on a node with more ranks than CPUs this hands the CPU to the
    // rank we wait for, cheaper than a futex sleep and wake-up. Bounded in time, not in count:
    // under load one yield can cost a whole time slice, and then the first one ends it.
    for (const auto until = Clock::now() + kYieldFor; !done;) {
      sched_yield();
      done = reached(word->load(std::memory_order_acquire));
      if (Clock::now() >= until) break;
    }
    while (!done) {
      seg_->sleepers.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = word->load(std::memory_order_seq_cst);
      if (!reached(seen)) {
        timespec ts{0, 2'000'000};  // wake up to check the deadline and the peers' liveness
        futex(word, FUTEX_WAIT, seen, &ts);
      }
      seg_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      done = reached(word->load(std::memory_order_acquire));
      if (done) break;
      const auto now = Clock::now();
      const bool timed_out = now >= deadline;
      if (!timed_out && now - last_liveness < std::chrono::milliseconds(20)) continue;
      last_liveness = now;
      if (const InfoLine* own = LSPAWN_SEG_INFO(seg_, size_, rank_);
          own->left.load(std::memory_order_acquire) == kLeftFailed) {  // abort() from another thread
        throw Error(Error::Kind::Broken, {},
                    "shm " + std::string(what) + ": " + me() + " aborted while waiting after " +
                        std::to_string(seconds(now - start)) +
                        " s: " + std::string(own->reason, strnlen(own->reason, sizeof own->reason)));
      }
      std::vector<int> late, dead, gone;
      std::ostringstream who, why;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || reached(LSPAWN_SEG_ARRIVE(seg_, p)->arrived.load(std::memory_order_acquire))) continue;
        const InfoLine* line = LSPAWN_SEG_INFO(seg_, size_, p);
        const int pid = line->pid;
        late.push_back(p);
        if (process_dead(pid)) {
          dead.push_back(p);
        } else if (const std::uint32_t how = line->left.load(std::memory_order_acquire);
                   how == kLeftFailed || how == kLeftClosed) {
          gone.push_back(p);
          why << (gone.size() > 1 ? "; " : "") << "rank " << shown(p) << " (pid " << pid << ", alive) left the group"
              << (how == kLeftClosed ? ": " : " after a failure of its own: ")
              << std::string(line->reason, strnlen(line->reason, sizeof line->reason));
        }
        who << (late.size() > 1 ? ", " : "") << "rank " << shown(p) << " (pid " << pid
            << (process_dead(pid) ? ", dead" : "") << ")";
      }
      std::ostringstream msg;
      msg << "shm " << what << ": " << me() << " ";
      if (!dead.empty()) {
        msg << "peer died during the collective: " << who.str() << " after " << seconds(now - start) << " s of waiting";
        fail(Error(Error::Kind::PeerDied, dead, msg.str()));
      }
      if (!gone.empty()) {
        msg << "cannot complete after " << seconds(now - start) << " s: " << why.str();
        fail(Error(Error::Kind::PeerLeft, gone, msg.str()));
      }
      if (timed_out) {
        msg << "timed out after " << seconds(now - start) << " s (timeout "
            << std::chrono::duration<double>(options_.timeout).count() << " s) waiting for " << who.str()
            << " to join round " << target;
        fail(Error(Error::Kind::Timeout, late, msg.str()));
      }
    }
  }
}

void Communicator::check_descs(const Desc& mine) {
  const int parity = static_cast<int>(round_ % 2);
  auto desc_of = [&](int q) {
    Desc d;
    std::memcpy(&d, LSPAWN_SEG_INFO(seg_, size_, q)->desc[parity], sizeof(Desc));
    return d;
  };
  bool same = true;
  for (int q = 0; q < size_ && same; ++q) same = desc_of(q) == mine;  // the common case: no allocation
  if (same) return;
  std::vector<Desc> all(size_);
  for (int q = 0; q < size_; ++q) all[q] = desc_of(q);
  // Name the ranks that differ from rank 0 (every rank computes the same list).
  std::vector<int> odd;
  std::ostringstream msg;
  msg << "collective mismatch: ";
  for (int q = 0; q < size_; ++q) {
    if (!(all[q] == all[0])) odd.push_back(q);
    msg << (q ? ", " : "") << "rank " << shown(q) << " called " << all[q].str();
  }
  fail(Error(Error::Kind::Mismatch, odd, msg.str()));
}

void Communicator::begin_round(const Desc& desc) {
  if (broken_)
    throw Error(Error::Kind::Broken, {},
                std::string("shm ") + current_op_ + ": communicator is unusable after an earlier failure");
  const int parity = static_cast<int>(round_ % 2);
  std::memcpy(LSPAWN_SEG_INFO(seg_, size_, rank_)->desc[parity], &desc, sizeof(Desc));
  arrive();
  wait_all(static_cast<std::uint32_t>(round_ + 1), current_op_);
  check_descs(desc);
  ++round_;
}

void Communicator::all_reduce(void* data, std::size_t count, ElemType type, KernelOp op) {
  current_op_ = "all_reduce";
  if (!kernel_supports(type, op))
    throw Error(Error::Kind::Mismatch, {},
                std::string("shm all_reduce: ") + kernel_op_name(op) + " is not defined on " + elem_name(type));
  if (size_ == 1) return;
  const std::size_t es = elem_size(type);
  Desc d;
  d.op = static_cast<std::uint32_t>(OpCode::AllReduce);
  d.elem = static_cast<std::uint32_t>(type);
  d.kop = static_cast<std::uint32_t>(op);
  d.count = count;
  auto* bytes = static_cast<unsigned char*>(data);
  std::vector<const void*>& srcs = srcs_;
  if (single_copy_ && count * es >= options_.single_copy_min_bytes) {
    all_reduce_single_copy(bytes, count, type, op, d);
    return;
  }
  if (count * es <= options_.flat_max_bytes) {
    const int set = static_cast<int>(epoch_++ % 2);
    copy(slot(set, rank_), bytes, count * es);
    begin_round(d);
    for (int q = 0; q < size_; ++q) srcs[q] = slot(set, q);
    reduce_into(bytes, srcs.data(), size_, count, type, op);
    return;
  }
  const std::size_t chunk = options_.slot_bytes / es;
  const std::size_t align = std::max<std::size_t>(1, kLine / es);
  for (std::size_t off = 0; off < count; off += chunk) {
    const std::size_t n = std::min(chunk, count - off);
    const int set = static_cast<int>(epoch_++ % 2);
    copy(slot(set, rank_), bytes + off * es, n * es);
    begin_round(d);
    // Region q of the chunk is folded by rank q into slot 0; boundaries on cache lines.
    auto edge = [&](int q) { return std::min(n, round_up(n * q / size_, align)); };
    const std::size_t lo = edge(rank_), hi = edge(rank_ + 1);
    for (int q = 0; q < size_; ++q) srcs[q] = slot(set, q) + lo * es;
    reduce_into(slot(set, 0) + lo * es, srcs.data(), size_, hi - lo, type, op);
    begin_round(d);
    copy(bytes + off * es, slot(set, 0), n * es);
  }
}

void Communicator::broadcast(void* data, std::size_t bytes, int root) {
  current_op_ = "broadcast";
  if (root < 0 || root >= size_)
    throw Error(Error::Kind::Mismatch, {},
                "shm broadcast: root " + std::to_string(root) + " out of range for size " + std::to_string(size_));
  if (size_ == 1) return;
  Desc d;
  d.op = static_cast<std::uint32_t>(OpCode::Broadcast);
  d.root = root;
  d.count = bytes;
  auto* p = static_cast<unsigned char*>(data);
  if (single_copy_ && bytes >= options_.single_copy_min_bytes) {
    // Single copy: the others read the root's buffer directly; the second round keeps the root
    // from returning (and reusing its buffer) while they read.
    const int parity = static_cast<int>(round_ % 2);
    LSPAWN_SEG_INFO(seg_, size_, rank_)->addr[parity] = reinterpret_cast<std::uint64_t>(p);
    begin_round(d);
    if (rank_ != root) peer_copy(root, p, LSPAWN_SEG_INFO(seg_, size_, root)->addr[parity], bytes, false);
    begin_round(d);
    return;
  }
  std::size_t off = 0;
  do {
    const std::size_t n = std::min(options_.slot_bytes, bytes - off);
    const int set = static_cast<int>(epoch_++ % 2);
    if (rank_ == root) copy(slot(set, root), p + off, n);
    begin_round(d);
    if (rank_ != root) copy(p + off, slot(set, root), n);
    off += n;
  } while (off < bytes);
}

void Communicator::all_gather(const void* in, std::size_t bytes, void* out) {
  current_op_ = "all_gather";
  auto* o = static_cast<unsigned char*>(out);
  const auto* i = static_cast<const unsigned char*>(in);
  if (size_ == 1) {
    if (bytes) std::memmove(o, i, bytes);
    return;
  }
  Desc d;
  d.op = static_cast<std::uint32_t>(OpCode::AllGather);
  d.count = bytes;
  if (single_copy_ && bytes >= options_.single_copy_min_bytes) {
    // Single copy: everybody reads every peer's input straight into its output.
    const int parity = static_cast<int>(round_ % 2);
    LSPAWN_SEG_INFO(seg_, size_, rank_)->addr[parity] = reinterpret_cast<std::uint64_t>(i);
    begin_round(d);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) {
        if (o + q * bytes != i) std::memmove(o + q * bytes, i, bytes);
      } else {
        peer_copy(q, o + q * bytes, LSPAWN_SEG_INFO(seg_, size_, q)->addr[parity], bytes, false);
      }
    }
    begin_round(d);
    return;
  }
  std::size_t off = 0;
  do {
    const std::size_t n = std::min(options_.slot_bytes, bytes - off);
    const int set = static_cast<int>(epoch_++ % 2);
    copy(slot(set, rank_), i + off, n);
    begin_round(d);
    for (int q = 0; q < size_; ++q) copy(o + q * bytes + off, slot(set, q), n);
    off += n;
  } while (off < bytes);
}

void Communicator::barrier() {
  current_op_ = "barrier";
  if (size_ == 1) return;
  Desc d;
  d.op = static_cast<std::uint32_t>(OpCode::Barrier);
  begin_round(d);
}

}  // namespace lspawn::shm
