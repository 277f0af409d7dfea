// liblspawn_engine.so through its C ABI (shm/engine.h), ranks as threads of this process: what the
// torch.distributed backend's shims rely on. Arguments refused with LSPAWN_ENGINE_INVALID and a
// message naming them; the ops agree with each other; a rank that never comes makes the others
// fail in time, naming it by the number messages show; the status calls write the slot they get.
#include "shm/engine.h"

#include "status/reader.hpp"
#include "status/recorder.hpp"
#include "support/temp_dir.hpp"

#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// The store of one test: the callbacks' ctx.
struct Board {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
};

int board_set(void* ctx, const char* key, const void* value, size_t len, lspawn_engine_error*) {
  auto* b = static_cast<Board*>(ctx);
  std::lock_guard<std::mutex> l(b->mu);
  b->kv[key] = std::string(static_cast<const char*>(value), len);
  b->cv.notify_all();
  return 0;
}

long board_get(void* ctx, const char* key, void* buf, size_t cap, lspawn_engine_error* err) {
  auto* b = static_cast<Board*>(ctx);
  std::unique_lock<std::mutex> l(b->mu);
  if (!b->cv.wait_for(l, std::chrono::seconds(20), [&] { return b->kv.count(key) > 0; })) {
    std::snprintf(err->message, sizeof err->message, "no key %s", key);
    return -1;
  }
  const std::string& v = b->kv[key];
  std::memcpy(buf, v.data(), std::min(cap, v.size()));
  return static_cast<long>(v.size());
}

}  // namespace

TEST_CASE("engine: bad arguments are refused, naming them", "[shm][engine]") {
  Board board;
  lspawn_engine_error err{};
  CHECK(lspawn_engine_abi() == LSPAWN_ENGINE_ABI);
  CHECK(lspawn_engine_create(3, 2, "t", 1000, nullptr, board_set, board_get, &board, &err) == nullptr);
  CHECK(err.kind == LSPAWN_ENGINE_INVALID);
  CHECK(std::string(err.message).find("rank 3 of 2") != std::string::npos);
  CHECK(lspawn_engine_create(0, 1, "t", 0, nullptr, board_set, board_get, &board, &err) == nullptr);
  CHECK(std::string(err.message).find("timeout 0 ms") != std::string::npos);
  CHECK(lspawn_engine_create(0, 1, "t", 1000, nullptr, nullptr, board_get, &board, &err) == nullptr);
  CHECK(std::string(err.message).find("rendezvous") != std::string::npos);
  CHECK_FALSE(lspawn_engine_supports(LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_BXOR));
  CHECK(lspawn_engine_supports(LSPAWN_ENGINE_INT64, LSPAWN_ENGINE_BXOR));
  CHECK_FALSE(lspawn_engine_supports(42, LSPAWN_ENGINE_SUM));

  lspawn_engine* e = lspawn_engine_create(0, 1, "t", 1000, nullptr, board_set, board_get, &board, &err);
  REQUIRE(e != nullptr);
  float x = 1;
  CHECK(lspawn_engine_all_reduce(e, &x, 1, LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_BAND, &err) == LSPAWN_ENGINE_INVALID);
  CHECK(std::string(err.message).find("not supported") != std::string::npos);
  CHECK(lspawn_engine_broadcast(e, &x, sizeof x, 1, &err) == LSPAWN_ENGINE_INVALID);
  CHECK(std::string(err.message).find("root 1") != std::string::npos);
  CHECK(lspawn_engine_all_reduce(e, &x, 1, LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_SUM, &err) == LSPAWN_ENGINE_OK);
  CHECK(x == 1);
  lspawn_engine_destroy(e);
}

TEST_CASE("engine: threads as ranks, every op, and a rank that never comes is named", "[shm][engine]") {
  for (int n : {2, 3}) {
    Board board;
    std::vector<std::string> failures(n);
    std::vector<int> shown(n);
    for (int r = 0; r < n; ++r) shown[r] = 10 + r;  // global ranks as the backend passes them
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        lspawn_engine_error err{};
        lspawn_engine* e =
            lspawn_engine_create(r, n, "engine-test", 20000, shown.data(), board_set, board_get, &board, &err);
        if (!e) {
          failures[r] = err.message;
          return;
        }
        std::vector<std::int64_t> v(1000, r + 1);
        std::int64_t want = n * (n + 1) / 2;
        if (lspawn_engine_all_reduce(e, v.data(), v.size(), LSPAWN_ENGINE_INT64, LSPAWN_ENGINE_SUM, &err) ||
            v[999] != want)
          failures[r] += "all_reduce " + std::to_string(v[999]) + " " + err.message + "; ";
        int b = r == 1 ? 77 : 0;
        if (lspawn_engine_broadcast(e, &b, sizeof b, 1, &err) || b != 77) failures[r] += "broadcast; ";
        std::vector<int> all(n);
        if (lspawn_engine_all_gather(e, &r, sizeof r, all.data(), &err)) failures[r] += "all_gather; ";
        for (int q = 0; q < n; ++q)
          if (all[q] != q) failures[r] += "all_gather value; ";
        if (lspawn_engine_barrier(e, &err)) failures[r] += "barrier; ";
        lspawn_engine_destroy(e);
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) CHECK(failures[r] == "");
  }
  // Rank 1 of 2 creates its engine but never calls the all_reduce: rank 0 times out naming "rank 11".
  Board board;
  std::vector<int> shown{10, 11};
  lspawn_engine_error err0{};
  int rc0 = -1;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread t1([&] {
    lspawn_engine_error err{};
    lspawn_engine* e =
        lspawn_engine_create(1, 2, "engine-test-late", 300, shown.data(), board_set, board_get, &board, &err);
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
    if (e) lspawn_engine_destroy(e);
  });
  lspawn_engine* e0 =
      lspawn_engine_create(0, 2, "engine-test-late", 300, shown.data(), board_set, board_get, &board, &err0);
  REQUIRE(e0 != nullptr);
  float x = 1;
  rc0 = lspawn_engine_all_reduce(e0, &x, 1, LSPAWN_ENGINE_FLOAT32, LSPAWN_ENGINE_SUM, &err0);
  {
    std::lock_guard<std::mutex> l(mu);
    done = true;
  }
  cv.notify_all();
  t1.join();
  CHECK(rc0 == LSPAWN_ENGINE_TIMEOUT);
  CHECK(err0.rank == 11);
  CHECK(std::string(err0.message).find("rank 11") != std::string::npos);
  // Broken after an error: the next call fails at once.
  CHECK(lspawn_engine_barrier(e0, &err0) == LSPAWN_ENGINE_BROKEN);
  lspawn_engine_destroy(e0);
}

TEST_CASE("engine: lspawn_engine_abort makes the peer that waits fail at once with PEER_LEFT, quoting the reason",
          "[shm][engine]") {
  Board board;
  std::vector<int> shown{10, 11};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int rc1 = -1;
  std::thread t1([&] {
    lspawn_engine_error err{};
    lspawn_engine* e =
        lspawn_engine_create(1, 2, "engine-test-abort", 20000, shown.data(), board_set, board_get, &board, &err);
    if (!e) return;
    lspawn_engine_abort(e, "all_reduce between hosts failed");
    lspawn_engine_abort(e, nullptr);  // again: harmless, the first reason stays
    rc1 = lspawn_engine_barrier(e, &err);
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });  // alive and holding its engine
    lspawn_engine_destroy(e);
  });
  lspawn_engine_error err0{};
  lspawn_engine* e0 =
      lspawn_engine_create(0, 2, "engine-test-abort", 20000, shown.data(), board_set, board_get, &board, &err0);
  REQUIRE(e0 != nullptr);
  const auto start = std::chrono::steady_clock::now();
  const int rc0 = lspawn_engine_barrier(e0, &err0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> l(mu);
    done = true;
  }
  cv.notify_all();
  t1.join();
  CHECK(rc0 == LSPAWN_ENGINE_PEER_LEFT);
  CHECK(err0.rank == 11);
  CHECK(took < 5.0);  // the timeout is 20 s
  CHECK_THAT(err0.message, Catch::Contains("rank 11 (pid") &&
                               Catch::EndsWith("left the group after a failure of its own: all_reduce between hosts "
                                               "failed"));
  CHECK(rc1 == LSPAWN_ENGINE_BROKEN);
  lspawn_engine_destroy(e0);
}

TEST_CASE("engine: lspawn_status_enter/complete write the slot they are given", "[shm][engine]") {
  lspawn::test::TempDir dir;
  auto rec = lspawn::status::Recorder::create(dir.path, 3);
  lspawn::status::SlotWriter unused = rec->add_group("world", 0, 2);  // a slot of someone else's
  (void)unused;
  rec->add_group("lspawn:world", 0, 2);
  // The slot's address: the record's file, mapped again here, as lspawn_hang hands it over.
  auto reader = lspawn::status::RecordReader::open(lspawn::status::record_path(dir.path, 3));
  REQUIRE(reader);
  lspawn_status_enter(nullptr, "all_reduce", 1, 4);  // NULL: nothing
  // Write through the C calls into slot 1 of a writable mapping of the same file.
  FILE* f = std::fopen(lspawn::status::record_path(dir.path, 3).c_str(), "r+");
  REQUIRE(f);
  void* m = ::mmap(nullptr, lspawn::status::kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
  std::fclose(f);
  REQUIRE(m != MAP_FAILED);
  void* slot1 = static_cast<char*>(m) + sizeof(lspawn::status::FileHeader) + sizeof(lspawn::status::GroupSlot);
  lspawn_status_enter(slot1, "reduce_scatter_tensor", 1, 4096);
  auto v = reader->read();
  REQUIRE(v.groups.size() == 2);
  CHECK(v.groups[1].name == "lspawn:world");
  CHECK(v.groups[1].in_collective);
  CHECK(v.groups[1].op == "reduce_scatter_tensor");
  CHECK(v.groups[1].bytes == 4096);
  CHECK_FALSE(v.groups[0].in_collective);
  lspawn_status_complete(slot1, 1);
  v = reader->read();
  CHECK_FALSE(v.groups[1].in_collective);
  CHECK(v.groups[1].completed_seq == 1);
  ::munmap(m, lspawn::status::kFileBytes);
}
