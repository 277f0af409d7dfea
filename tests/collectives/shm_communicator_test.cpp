// shm::Communicator and its kernels, ranks as threads of this process (pure protocol logic; the
// process-level behaviour, peer death included, is in collectives_test.cpp).
#include "shm/communicator.hpp"

#include <catch2/catch.hpp>

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <tuple>

using namespace lspawn::shm;

namespace {

// An in-memory rendezvous shared by the threads of one test.
struct Board {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
  Rendezvous rendezvous() {
    Rendezvous r;
    r.set = [this](const std::string& k, const std::string& v) {
      std::lock_guard<std::mutex> l(mu);
      kv[k] = v;
      cv.notify_all();
    };
    r.get = [this](const std::string& k) {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return kv.count(k) > 0; });
      return kv[k];
    };
    return r;
  }
};

// Runs fn(comm) on `n` threads, one Communicator each. Exceptions are collected per rank.
template <typename Fn>
std::vector<std::exception_ptr> on_ranks(int n, CommOptions opts, Fn fn) {
  Board board;
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator c(r, n, board.rendezvous(), opts);
        fn(c);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

bool shm_entry_exists(const std::string& label) {
  bool found = false;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::strstr(e->d_name, label.c_str())) found = true;
    ::closedir(d);
  }
  return found;
}

// Catch2 assertions are not thread-safe: rank threads throw, the test thread asserts.
void expect(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

}  // namespace

TEST_CASE("reduce kernels fold left to right for every type and op", "[shm]") {
  const std::size_t n = 1000;
  std::vector<std::int32_t> a(n), b(n), c(n), out(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = int(i % 13) - 6, b[i] = int(i % 7) - 3, c[i] = int(i % 5);
  const void* srcs[] = {a.data(), b.data(), c.data()};
  reduce_into(out.data(), srcs, 3, n, ElemType::Int32, KernelOp::Sum);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == a[i] + b[i] + c[i]);
  reduce_into(out.data(), srcs, 3, n, ElemType::Int32, KernelOp::Max);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == std::max({a[i], b[i], c[i]}));
  reduce_into(out.data(), srcs, 3, n, ElemType::Int32, KernelOp::BitwiseXor);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == (a[i] ^ b[i] ^ c[i]));
  // dst may alias srcs[0]
  auto a2 = a;
  const void* srcs2[] = {a2.data(), b.data()};
  reduce_into(a2.data(), srcs2, 2, n, ElemType::Int32, KernelOp::Product);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(a2[i] == a[i] * b[i]);
  // bool: sum is "any", product is "all"
  std::vector<std::uint8_t> x = {0, 1, 0, 1}, y = {0, 0, 1, 1}, z(4);
  const void* bs[] = {x.data(), y.data()};
  reduce_into(z.data(), bs, 2, 4, ElemType::Bool, KernelOp::Sum);
  REQUIRE(z == std::vector<std::uint8_t>{0, 1, 1, 1});
  reduce_into(z.data(), bs, 2, 4, ElemType::Bool, KernelOp::Product);
  REQUIRE(z == std::vector<std::uint8_t>{0, 0, 0, 1});
  // float order: ((a + b) + c) exactly
  std::vector<float> f1 = {1e8f, 1.0f}, f2 = {-1e8f, 1e8f}, f3 = {1.0f, -1e8f}, fo(2);
  const void* fs[] = {f1.data(), f2.data(), f3.data()};
  reduce_into(fo.data(), fs, 3, 2, ElemType::Float32, KernelOp::Sum);
  REQUIRE(fo[0] == (1e8f + -1e8f) + 1.0f);
  REQUIRE(fo[1] == (1.0f + 1e8f) + -1e8f);
  CHECK_FALSE(kernel_supports(ElemType::Float32, KernelOp::BitwiseAnd));
  CHECK(kernel_supports(ElemType::Int8, KernelOp::BitwiseAnd));
}

TEST_CASE("threads as ranks: all_reduce and broadcast and all_gather agree bit for bit", "[shm]") {
  const int n = GENERATE(2, 3, 4);
  const bool single_copy = GENERATE(false, true);
  CommOptions opts;
  opts.slot_bytes = 4096;  // many chunks
  opts.flat_max_bytes = 1024;
  opts.single_copy = single_copy;
  opts.single_copy_min_bytes = 512;  // exercised from 200 floats on
  opts.timeout = std::chrono::seconds(20);
  opts.label = "kerneltest" + std::to_string(::getpid());
  std::vector<std::vector<float>> results(n);
  auto errors = on_ranks(n, opts, [&](Communicator& c) {
    expect(c.single_copy() == single_copy, "single copy probe (threads share one pid: always allowed)");
    c.barrier();  // rank 0 unlinks the name right after the first round, before this barrier
    expect(!shm_entry_exists(opts.label), "segment unlinked once everybody mapped it");
    for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{200}, std::size_t{10007}}) {
      std::vector<float> v(len);
      std::mt19937 gen(c.rank() * 1000 + len);
      std::uniform_real_distribution<float> dist(-1, 1);
      for (auto& x : v) x = dist(gen);
      c.all_reduce(v.data(), len, ElemType::Float32, KernelOp::Sum);
      if (len == 10007) results[c.rank()] = v;
      std::vector<std::int64_t> b(len, c.rank());
      c.broadcast(b.data(), len * 8, n - 1);
      for (auto x : b) expect(x == n - 1, "broadcast");
      std::vector<std::int32_t> mine(len, c.rank() + 1), all(len * n);
      c.all_gather(mine.data(), len * 4, all.data());
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < len; ++i) expect(all[q * len + i] == q + 1, "all_gather");
      c.barrier();
    }
  });
  for (int r = 0; r < n; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
  for (int r = 1; r < n; ++r) REQUIRE(std::memcmp(results[r].data(), results[0].data(), results[0].size() * 4) == 0);
}

TEST_CASE("threads as ranks: LSPAWN_SHM_SINGLE_COPY overrides the option either way, another value is refused",
          "[shm]") {
  struct EnvGuard {
    ~EnvGuard() { ::unsetenv("LSPAWN_SHM_SINGLE_COPY"); }
  } guard;
  CommOptions opts;
  opts.timeout = std::chrono::seconds(20);
  opts.label = "envtest" + std::to_string(::getpid());
  REQUIRE_FALSE(opts.single_copy);  // off by default
  for (auto [value, option, want] : {std::tuple{"1", false, true}, std::tuple{"0", true, false},
                                     std::tuple{"", true, true}, std::tuple{"", false, false}}) {
    INFO("LSPAWN_SHM_SINGLE_COPY='" << value << "', option " << option);
    ::setenv("LSPAWN_SHM_SINGLE_COPY", value, 1);
    opts.single_copy = option;
    auto errors = on_ranks(2, opts, [&](Communicator& c) {
      expect(c.single_copy() == want, "single copy as the environment says");
      std::vector<float> v(1 << 19, 1.0f);  // 2 MiB: over single_copy_min_bytes
      c.all_reduce(v.data(), v.size(), ElemType::Float32, KernelOp::Sum);
      for (float x : v) expect(x == 2.0f, "all_reduce result");
    });
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  ::setenv("LSPAWN_SHM_SINGLE_COPY", "yes", 1);
  auto errors = on_ranks(2, opts, [](Communicator&) {});
  for (auto& e : errors) {
    REQUIRE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      CHECK(err.kind() == Error::Kind::System);
      CHECK_THAT(err.what(), Catch::Contains("LSPAWN_SHM_SINGLE_COPY='yes': expected 1 (on) or 0 (off)"));
    }
  }
  CHECK_FALSE(shm_entry_exists(opts.label));  // refused before any segment was made
}

TEST_CASE("threads as ranks: a mismatched call throws Mismatch on every rank", "[shm]") {
  CommOptions opts;
  opts.timeout = std::chrono::seconds(20);
  auto errors = on_ranks(3, opts, [&](Communicator& c) {
    std::vector<float> v(10, 1.0f);
    if (c.rank() == 1)
      c.broadcast(v.data(), 40, 0);
    else
      c.all_reduce(v.data(), 10, ElemType::Float32, KernelOp::Sum);
  });
  for (int r = 0; r < 3; ++r) {
    REQUIRE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      CHECK(e.kind() == Error::Kind::Mismatch);
      CHECK(e.ranks() == std::vector<int>{1});
      CHECK_THAT(e.what(), Catch::Contains("rank 1 called broadcast"));
    }
  }
}

// Rank threads that wait for each other outside the communicator (a rank that must stay in its
// group, alive, until the others are done with it).
struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  int count;
  explicit Latch(int n) : count(n) {}
  void arrive() {
    std::lock_guard<std::mutex> l(mu);
    if (--count == 0) cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return count <= 0; });
  }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST_CASE("threads as ranks: a rank that never joins makes the others time out naming it", "[shm]") {
  CommOptions opts;
  opts.timeout = std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  Latch others(2);
  auto errors = on_ranks(3, opts, [&](Communicator& c) {
    if (c.rank() == 2) return others.wait();  // skips the barrier, its communicator kept
    try {
      c.barrier();
    } catch (...) {
      others.arrive();
      throw;
    }
    others.arrive();
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(took < 10.0);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      CHECK(e.kind() == Error::Kind::Timeout);
      CHECK(e.ranks() == std::vector<int>{2});
      CHECK_THAT(e.what(), Catch::Contains("timed out") && Catch::Contains("rank 2"));
    }
  }
}

TEST_CASE("threads as ranks: a rank that destroyed its communicator makes the others fail at once naming it", "[shm]") {
  CommOptions opts;
  opts.timeout = std::chrono::seconds(20);  // only the left mark can be this fast
  const auto start = std::chrono::steady_clock::now();
  auto errors = on_ranks(3, opts, [&](Communicator& c) {
    c.barrier();
    if (c.rank() == 2) return;  // leaves: its communicator is destroyed, its thread (process) lives on
    c.barrier();
  });
  CHECK(seconds_since(start) < 5.0);
  CHECK_FALSE(errors[2]);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      CHECK(e.kind() == Error::Kind::PeerLeft);
      CHECK(e.ranks() == std::vector<int>{2});
      CHECK_THAT(e.what(), Catch::Contains("shm barrier") &&
                               Catch::Contains("alive) left the group: it closed its communicator"));
    }
  }
}

TEST_CASE(
    "threads as ranks: abort(reason) makes the peers that wait fail at once quoting it, and refuses the "
    "rank's own later calls",
    "[shm]") {
  CommOptions opts;
  opts.timeout = std::chrono::seconds(20);
  const auto start = std::chrono::steady_clock::now();
  Latch others(2);
  std::string own;  // rank 1's later call
  auto errors = on_ranks(3, opts, [&](Communicator& c) {
    std::vector<double> v(1000, 1.0);
    c.all_reduce(v.data(), v.size(), ElemType::Float64, KernelOp::Sum);
    if (c.rank() == 1) {
      c.abort("all_reduce between nodes failed\nsecond line, not shown");
      c.abort("a second reason, not shown");
      try {
        c.barrier();
      } catch (const Error& e) {
        own = std::string(e.kind() == Error::Kind::Broken ? "Broken: " : "other: ") + e.what();
      }
      return others.wait();  // alive and holding its communicator, as a trainer that caught the error
    }
    try {
      c.all_reduce(v.data(), v.size(), ElemType::Float64, KernelOp::Sum);
    } catch (...) {
      others.arrive();
      throw;
    }
    others.arrive();
  });
  CHECK(seconds_since(start) < 5.0);
  CHECK_FALSE(errors[1]);
  CHECK_THAT(own, Catch::StartsWith("Broken: ") && Catch::Contains("unusable after an earlier failure"));
  for (int r : {0, 2}) {
    REQUIRE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      CHECK(e.kind() == Error::Kind::PeerLeft);
      CHECK(e.ranks() == std::vector<int>{1});
      CHECK_THAT(e.what(), Catch::Contains("shm all_reduce") && Catch::Contains("rank 1 (pid ") &&
                               Catch::EndsWith("alive) left the group after a failure of its own: all_reduce "
                                               "between nodes failed"));
    }
  }
}

TEST_CASE(
    "threads as ranks: a rank that timed out has left, and the late rank's next call fails at once "
    "quoting the timeout",
    "[shm]") {
  CommOptions opts;
  opts.timeout = std::chrono::milliseconds(300);
  Latch first_done(1);
  std::string late_error;
  double late_took = -1;
  auto errors = on_ranks(2, opts, [&](Communicator& c) {
    if (c.rank() == 0) {
      try {
        c.barrier();  // rank 1 is late: times out, and leaves
      } catch (...) {
        first_done.arrive();
        throw;
      }
      first_done.arrive();
      return;
    }
    first_done.wait();
    // The round rank 0 abandoned may still complete here (rank 0 arrived before it gave up); the next one can not.
    const auto t = std::chrono::steady_clock::now();
    try {
      c.barrier();
      c.barrier();
    } catch (const Error& e) {
      late_took = seconds_since(t);
      late_error = std::string(e.kind() == Error::Kind::PeerLeft ? "PeerLeft: " : "other: ") + e.what();
    }
  });
  REQUIRE(errors[0]);
  CHECK_FALSE(errors[1]);
  CHECK(late_took >= 0);
  CHECK(late_took < 0.25);  // under the 300 ms timeout: not a timeout of its own
  CHECK_THAT(late_error, Catch::StartsWith("PeerLeft: ") && Catch::Contains("rank 0 (pid ") &&
                             Catch::Contains("left the group after a failure of its own: shm barrier:") &&
                             Catch::Contains("timed out"));
}

TEST_CASE(
    "threads as ranks: a process forked from a rank that aborts its copy of the communicator does not "
    "take the rank out",
    "[shm]") {
  CommOptions opts;
  opts.timeout = std::chrono::seconds(20);
  auto errors = on_ranks(2, opts, [&](Communicator& c) {
    c.barrier();
    if (c.rank() == 0) {
      const pid_t child = ::fork();
      if (child == 0) {
        c.abort("the child's abort");  // its copy; the rank (this process) stays in the group
        ::_exit(c.broken() ? 0 : 1);
      }
      int status = 0;
      expect(child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
             "the child broke its own copy and exited 0");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 1 waits for us, checking our line
    }
    c.barrier();  // after the child is gone: still a group of two
    expect(!c.broken(), "the rank's own communicator is not broken");
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST_CASE("threads as ranks: abort() from another thread ends the op this rank waits in", "[shm]") {
  CommOptions opts;
  opts.timeout = std::chrono::seconds(20);
  Latch rank0_done(1);
  double took = -1;
  std::string error;
  auto errors = on_ranks(2, opts, [&](Communicator& c) {
    if (c.rank() == 1) return rank0_done.wait();  // alive, never comes: holds rank 0 up
    std::thread watchdog([&c] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c.abort("the watchdog gave up on rank 1");
    });
    const auto start = std::chrono::steady_clock::now();
    try {
      c.barrier();
    } catch (const Error& e) {
      took = seconds_since(start);
      error = std::string(e.kind() == Error::Kind::Broken ? "Broken: " : "other: ") + e.what();
    }
    watchdog.join();
    rank0_done.arrive();
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  CHECK(took >= 0.2);
  CHECK(took < 5.0);  // the timeout is 20 s
  CHECK_THAT(error, Catch::StartsWith("Broken: shm barrier: rank 0/2") && Catch::Contains("aborted while waiting") &&
                        Catch::EndsWith("the watchdog gave up on rank 1"));
}
