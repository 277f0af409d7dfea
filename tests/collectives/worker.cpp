// One rank of a collectives test: run by tests/collectives/*_test.cpp N times as real processes
// (forked from the test, which links this file too, or exec'd as the program worker_main.cpp).
//
//   lspawn_collectives_test_worker <scenario> <backend gloo|shm|auto>
//   env: RANK, WORLD_SIZE, MASTER_PORT (a TCPStore server on 127.0.0.1 hosted by the test),
//        LSPAWN_TEST_TIMEOUT_MS (group timeout), LSPAWN_TEST_BIG=1 (add the 64 MiB case),
//        LSPAWN_TEST_EXPECT_BACKEND (Group::backend() must say so), LSPAWN_TEST_EXPECT_SINGLE_COPY
//        (0/1: the shm communicator's single-copy path must be off/on), LSPAWN_TEST_KILL_RANK (the
//        rank scenarios "kill", "kill_retry" and "kill_stay" SIGKILL; default the last), LSPAWN_TEST_FROM_WORLD=1 (join through
//        runtime's init_process_group() and Group::from_world(): run under lspawn, any host)
//
// Exit status: 0 all checks passed; 1 a check failed (message on stderr); 2 CollectiveError;
// 3 CollectiveTimeout; 4 CollectiveMismatch; 5 any other exception. Errors print
// "rank R: <kind>: <what>" to stderr, so the test can assert on the text.
#include "tests/collectives/worker.hpp"

#include "collectives/cuda_ipc.hpp"
#include "shm/communicator.hpp"
#include "collectives/object.hpp"
#include "collectives/ops.hpp"
#include "collectives/strategy_ops.hpp"
#include "runtime/process_group.hpp"
#include "support/env.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

using lspawn::Group;
using lspawn::ReduceOp;
using lspawn::test::env_int;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// Deterministic input of `rank`: small integers, exact in every dtype (also float16/bfloat16).
at::Tensor input_of(int rank, int64_t n, at::ScalarType dtype) {
  auto i = at::arange(n, at::kLong);
  if (dtype == at::kBool) return ((i * 5 + rank * 3) % 3 != 0);
  if (dtype == at::kByte) return ((i + rank) % 4).to(dtype);
  return ((i * 7 + rank * 3) % 11 - 5).to(dtype);
}

at::Tensor combine(const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  const bool boolean = a.scalar_type() == at::kBool;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: return boolean ? a.logical_or(b) : a + b;
    case ReduceOp::Product: return boolean ? a.logical_and(b) : a * b;
    case ReduceOp::Min: return at::minimum(a, b);
    case ReduceOp::Max: return at::maximum(a, b);
    case ReduceOp::BitwiseAnd: return a.bitwise_and(b);
    case ReduceOp::BitwiseOr: return a.bitwise_or(b);
    case ReduceOp::BitwiseXor: return a.bitwise_xor(b);
  }
  return a;
}

at::Tensor reference(int size, int64_t n, at::ScalarType dtype, ReduceOp op) {
  auto ref = input_of(0, n, dtype);
  for (int r = 1; r < size; ++r) ref = combine(ref, input_of(r, n, dtype), op);
  if (op == ReduceOp::Mean) {
    if (at::isFloatingType(dtype))
      ref = ref / size;
    else
      ref = at::div(ref, size, "trunc");
  }
  return ref.to(dtype);
}

void expect_equal(const std::string& what, const at::Tensor& got, const at::Tensor& ref) {
  check(got.sizes() == ref.sizes(), what + ": shape " + c10::str(got.sizes()) + " != " + c10::str(ref.sizes()));
  check(got.scalar_type() == ref.scalar_type(), what + ": dtype");
  bool ok;
  if (at::isFloatingType(ref.scalar_type())) {
    const double tol = (ref.scalar_type() == at::kHalf || ref.scalar_type() == at::kBFloat16) ? 1e-2 : 1e-6;
    ok = at::allclose(got.to(at::kDouble), ref.to(at::kDouble), tol, tol);
  } else {
    ok = at::equal(got, ref);
  }
  if (!ok) {
    auto diff = (got.to(at::kDouble) - ref.to(at::kDouble)).abs();
    const auto where = diff.reshape({-1}).argmax().item<int64_t>();
    std::ostringstream s;
    s << what << ": mismatch at flat index " << where << ": got " << got.reshape({-1})[where].item<double>()
      << ", expected " << ref.reshape({-1})[where].item<double>();
    check(false, s.str());
  }
}

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt,
                                             at::kLong,  at::kByte,   at::kChar, at::kBool};

std::vector<ReduceOp> ops_for(at::ScalarType t) {
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product};
  if (t != at::kBool) ops.push_back(ReduceOp::Mean);
  if (!at::isFloatingType(t)) {
    ops.push_back(ReduceOp::BitwiseAnd);
    ops.push_back(ReduceOp::BitwiseOr);
    ops.push_back(ReduceOp::BitwiseXor);
  }
  return ops;
}

// Every op against a local reference. Sizes: 0, 1, 7 (not divisible by 2..4), 1000 and 300001
// (more than one 1 MiB shm slot in float32: the chunked path).
void scenario_suite(Group& g) {
  const int n = g.size(), me = g.rank();
  const std::vector<int64_t> sizes = {0, 1, 7, 1000, 300001};

  for (auto dt : kDtypes)
    for (auto op : ops_for(dt))
      for (auto len : sizes) {
        if (len == 300001 && dt != at::kFloat && dt != at::kInt && dt != at::kBFloat16) continue;
        auto t = input_of(me, len, dt);
        lspawn::all_reduce(g, t, op);
        expect_equal(
            std::string("all_reduce ") + lspawn::to_string(op) + " " + c10::toString(dt) + " x" + std::to_string(len),
            t, reference(n, len, dt, op));
      }

  // Non-contiguous input: a transposed view, reduced in place through it.
  {
    auto base = input_of(me, 6 * 5, at::kFloat).reshape({6, 5});
    auto view = base.t();
    lspawn::all_reduce(g, view, ReduceOp::Sum);
    expect_equal("all_reduce non-contiguous", base, reference(n, 30, at::kFloat, ReduceOp::Sum).reshape({6, 5}));
    auto strided = input_of(me, 20, at::kLong).slice(0, 0, 20, 2);
    lspawn::all_reduce(g, strided, ReduceOp::Max);
    expect_equal("all_reduce strided", strided, reference(n, 20, at::kLong, ReduceOp::Max).slice(0, 0, 20, 2));
  }

  // Async: two in flight, then wait.
  {
    auto a = input_of(me, 1000, at::kFloat), b = input_of(me, 77, at::kLong);
    auto wa = lspawn::all_reduce_async(g, a, ReduceOp::Sum);
    auto wb = lspawn::all_reduce_async(g, b, ReduceOp::Max);
    wa.wait();
    wb.wait();
    wa.wait();  // idempotent
    expect_equal("async a", a, reference(n, 1000, at::kFloat, ReduceOp::Sum));
    expect_equal("async b", b, reference(n, 77, at::kLong, ReduceOp::Max));
  }

  // Coalesced: a gradient bucket of three shapes.
  {
    std::vector<at::Tensor> bucket = {input_of(me, 12, at::kFloat).reshape({3, 4}), input_of(me, 1, at::kFloat),
                                      input_of(me, 5000, at::kFloat)};
    lspawn::all_reduce_coalesced(g, bucket, ReduceOp::Mean);
    expect_equal("coalesced 0", bucket[0], reference(n, 12, at::kFloat, ReduceOp::Mean).reshape({3, 4}));
    expect_equal("coalesced 1", bucket[1], reference(n, 1, at::kFloat, ReduceOp::Mean));
    expect_equal("coalesced 2", bucket[2], reference(n, 5000, at::kFloat, ReduceOp::Mean));
  }

  for (auto dt : kDtypes)
    for (auto len : sizes) {
      if (len == 300001 && dt != at::kFloat && dt != at::kBool) continue;
      const std::string tag = std::string(c10::toString(dt)) + " x" + std::to_string(len);
      // broadcast from the last rank
      auto b = input_of(me, len, dt);
      lspawn::broadcast(g, b, n - 1);
      expect_equal("broadcast " + tag, b, input_of(n - 1, len, dt));
      // all_gather, stacked and list
      auto stacked = lspawn::all_gather(g, input_of(me, len, dt));
      std::vector<at::Tensor> all;
      for (int r = 0; r < n; ++r) all.push_back(input_of(r, len, dt));
      expect_equal("all_gather " + tag, stacked, at::stack(all));
      if (len <= 7) {
        auto list = lspawn::all_gather_list(g, input_of(me, len, dt));
        check(static_cast<int>(list.size()) == n, "all_gather_list size");
        for (int r = 0; r < n; ++r) expect_equal("all_gather_list " + tag, list[r], all[r]);
      }
    }

  // reduce to the last rank
  for (auto dt : {at::kFloat, at::kLong, at::kBFloat16, at::kBool}) {
    auto t = input_of(me, 7, dt);
    lspawn::reduce(g, t, n - 1, ReduceOp::Sum);
    if (me == n - 1) expect_equal(std::string("reduce ") + c10::toString(dt), t, reference(n, 7, dt, ReduceOp::Sum));
  }

  // gather to 0, scatter from the last, reduce_scatter, all_to_all
  for (auto dt : {at::kFloat, at::kBool, at::kBFloat16, at::kLong})
    for (int64_t len : {0, 1, 7}) {
      const std::string tag = std::string(c10::toString(dt)) + " x" + std::to_string(len);
      std::vector<at::Tensor> all;
      for (int r = 0; r < n; ++r) all.push_back(input_of(r, len, dt));
      auto stacked = at::stack(all);
      at::Tensor gathered = me == 0 ? at::empty({n, len}, at::TensorOptions(dt)) : at::Tensor();
      lspawn::gather(g, input_of(me, len, dt), gathered, 0);
      if (me == 0) expect_equal("gather " + tag, gathered, stacked);

      auto piece = at::empty({len}, at::TensorOptions(dt));
      auto source = me == n - 1 ? (stacked + (dt == at::kBool ? 0 : 1)).to(dt) : at::Tensor();
      lspawn::scatter(g, piece, source, n - 1);
      expect_equal("scatter " + tag, piece, (all[me] + (dt == at::kBool ? 0 : 1)).to(dt));

      if (dt != at::kBool) {
        // input row q on rank r: input_of(r + q); output on rank q: sum over r of input_of(r + q)
        std::vector<at::Tensor> rows;
        for (int q = 0; q < n; ++q) rows.push_back(input_of(me + q, len, dt));
        auto out = at::empty({len}, at::TensorOptions(dt));
        lspawn::reduce_scatter(g, out, at::stack(rows), ReduceOp::Sum);
        auto ref = input_of(me, len, dt);
        for (int r = 1; r < n; ++r) ref = (ref + input_of(r + me, len, dt)).to(dt);
        expect_equal("reduce_scatter " + tag, out, ref);
      }
      // all_to_all: block q of rank r's input is input_of(10 * r + q); rank q receives block r
      // from rank r at position r.
      std::vector<at::Tensor> blocks, expected;
      for (int q = 0; q < n; ++q) {
        blocks.push_back(input_of(10 * me + q, len, dt));
        expected.push_back(input_of(10 * q + me, len, dt));
      }
      auto in = at::cat(blocks), out = at::empty_like(in);
      lspawn::all_to_all(g, out, in);
      expect_equal("all_to_all " + tag, out, at::cat(expected));
    }

  // send / recv around a ring
  if (n > 1) {
    auto out = input_of(me, 100, at::kDouble);
    auto in = at::empty({100}, at::kDouble);
    auto ws = lspawn::send_async(g, out, (me + 1) % n, 7);
    lspawn::recv(g, in, (me + n - 1) % n, 7);
    ws.wait();
    expect_equal("send/recv", in, input_of((me + n - 1) % n, 100, at::kDouble));
  }
  lspawn::barrier(g);

  if (env_int("LSPAWN_TEST_BIG", 0)) {  // 64 MiB of float32
    const int64_t big = 16 << 20;
    auto t = at::full({big}, static_cast<float>(me + 1));
    t[big - 1] = -1.0f * (me + 1);
    lspawn::all_reduce(g, t, ReduceOp::Sum);
    const float s = n * (n + 1) / 2.0f;
    check(t.eq(s).sum().item<int64_t>() == big - 1 && t[big - 1].item<float>() == -s, "64 MiB all_reduce");
  }
}

void scenario_objects(Group& g) {
  const int n = g.size(), me = g.rank();
  // broadcast_object of a dict from the last rank
  c10::Dict<std::string, int64_t> d;
  d.insert("rank", me);
  d.insert("answer", 42);
  auto got = lspawn::broadcast_object(g, me == n - 1 ? c10::IValue(d) : c10::IValue(), n - 1);
  auto gd = got.toGenericDict();
  check(gd.at("rank").toInt() == n - 1 && gd.at("answer").toInt() == 42, "broadcast_object dict");

  // all_gather_object of values of different sizes, including a tensor
  auto mine = c10::ivalue::Tuple::create(
      {c10::IValue(std::string(me * 3 + 1, 'x')), c10::IValue(at::full({me + 1}, me, at::kLong))});
  auto all = lspawn::all_gather_object(g, mine);
  check(static_cast<int>(all.size()) == n, "all_gather_object size");
  for (int r = 0; r < n; ++r) {
    auto tup = all[r].toTuple();
    check(tup->elements()[0].toStringRef() == std::string(r * 3 + 1, 'x'), "all_gather_object string");
    expect_equal("all_gather_object tensor", tup->elements()[1].toTensor(), at::full({r + 1}, r, at::kLong));
  }

  auto gathered = lspawn::gather_object(g, c10::IValue(static_cast<int64_t>(me * me)), 0);
  if (me == 0) {
    check(static_cast<int>(gathered.size()) == n, "gather_object size");
    for (int r = 0; r < n; ++r) check(gathered[r].toInt() == r * r, "gather_object value");
  } else {
    check(gathered.empty(), "gather_object non-dst empty");
  }

  std::vector<c10::IValue> parts;
  if (me == 0)
    for (int r = 0; r < n; ++r) parts.emplace_back(std::string("to ") + std::to_string(r));
  auto part = lspawn::scatter_object(g, parts, 0);
  check(part.toStringRef() == "to " + std::to_string(me), "scatter_object");

  check(lspawn::reduce_boolean_decision(g, true, true), "all true");
  check(lspawn::reduce_boolean_decision(g, me == 0, true) == (n == 1), "all with one true");
  check(lspawn::reduce_boolean_decision(g, me == 0, false), "any with one true");
  check(!lspawn::reduce_boolean_decision(g, false, false), "any false");

  // The Strategy-facing calls.
  lspawn::StrategyCollectives s(std::shared_ptr<Group>(&g, [](Group*) {}));
  auto stacked = s.all_gather(at::full({2, 3}, me, at::kFloat));
  check(stacked.sizes() == at::IntArrayRef({n, 2, 3}), "strategy all_gather shape");
  for (int r = 0; r < n; ++r) check(stacked[r].eq(r).all().item<bool>(), "strategy all_gather values");
  auto loss = s.reduce(c10::IValue(at::full({1}, static_cast<double>(me), at::kDouble)), ReduceOp::Mean);
  check(std::abs(loss.toTensor().item<double>() - (n - 1) / 2.0) < 1e-12, "strategy reduce mean");
  check(s.reduce(c10::IValue(3.5)).toDouble() == 3.5, "strategy reduce passes a non-tensor through");
  check(s.broadcast(me == 0 ? c10::IValue(std::string("cfg")) : c10::IValue(), 0).toStringRef() == "cfg",
        "strategy broadcast");
  check(s.reduce_boolean_decision(true), "strategy decision");
  s.barrier("end");
}

// Subgroups: evens and odds work concurrently, each in its own namespace, then a subgroup of
// a subgroup; the world group still works afterwards.
void scenario_subgroups(Group& g) {
  const int n = g.size(), me = g.rank();
  std::vector<int> evens, odds;
  for (int r = 0; r < n; ++r) (r % 2 ? odds : evens).push_back(r);
  auto ge = g.new_group(evens);
  auto go = g.new_group(odds);
  check((me % 2 == 0) == (ge != nullptr) && (me % 2 == 1) == (go != nullptr), "membership");
  auto& sub = ge ? *ge : *go;
  const auto& members = ge ? evens : odds;
  check(sub.size() == static_cast<int>(members.size()) && members[sub.rank()] == me, "subgroup rank");
  check(sub.root_ranks() == members, "root ranks");
  for (int rep = 0; rep < 20; ++rep) {
    auto t = at::full({1000}, static_cast<float>(me + rep));
    lspawn::all_reduce(sub, t, ReduceOp::Sum);
    float expect = 0;
    for (int r : members) expect += static_cast<float>(r + rep);
    check(t.eq(expect).all().item<bool>(), "subgroup all_reduce");
  }
  auto names = lspawn::all_gather_object(sub, c10::IValue(sub.name()));
  for (auto& v : names) check(v.toStringRef() == sub.name(), "subgroup name");
  // A subgroup of the subgroup, reversed: its rank 0 is the parent's last.
  std::vector<int> rev;
  for (int r = sub.size() - 1; r >= 0; --r) rev.push_back(r);
  auto inner = sub.new_group(rev);
  check(inner != nullptr && inner->rank() == sub.size() - 1 - sub.rank(), "nested subgroup rank");
  auto x = at::full({3}, static_cast<int64_t>(inner->rank()), at::kLong);
  lspawn::broadcast(*inner, x, 0);
  check(x.eq(static_cast<int64_t>(0)).all().item<bool>(), "nested broadcast value");
  auto w = at::full({5}, 1, at::kInt);
  lspawn::all_reduce(g, w);
  check(w.eq(n).all().item<bool>(), "world after subgroups");
}

// Set by main() when this rank's scenario threw: lets a rank that stays out on purpose wait until
// the others have failed (instead of guessing a sleep).
c10::intrusive_ptr<c10d::Store> g_test_store;

// The last rank never calls the all_reduce; it stays alive until the others have failed.
void scenario_timeout(Group& g) {
  if (g.rank() == g.size() - 1) {
    std::vector<std::string> keys;
    for (int r = 0; r < g.size() - 1; ++r) keys.push_back("test/failed/" + std::to_string(r));
    g_test_store->wait(keys, std::chrono::seconds(120));
    return;
  }
  auto t = at::ones({10});
  lspawn::all_reduce(g, t);
  check(false, "all_reduce returned although a rank never joined");
}

// Sums of rank+1 in float, double and int at odd sizes (one more than a 1 MiB shm slot in
// float), a broadcast from the last rank and an all_gather; prints "rank R/N: <backend> all_reduce
// sum = S" (the multi-node tests grep it).
void scenario_sum(Group& g) {
  const int n = g.size(), me = g.rank();
  const double want = n * (n + 1) / 2.0;
  for (auto dt : {at::kFloat, at::kDouble, at::kInt})
    for (int64_t len : {1, 7, 262145}) {
      auto t = at::full({len}, me + 1, at::TensorOptions(dt));
      lspawn::all_reduce(g, t);
      check(t.eq(want).all().item<bool>(), std::string("sum ") + c10::toString(dt) + " x" + std::to_string(len));
    }
  auto b = at::full({262145}, me, at::kFloat);
  lspawn::broadcast(g, b, n - 1);
  check(b.eq(n - 1).all().item<bool>(), "broadcast from the last rank");
  auto all = lspawn::all_gather(g, at::full({7}, me, at::kInt));
  for (int r = 0; r < n; ++r) check(all[r].eq(r).all().item<bool>(), "all_gather row " + std::to_string(r));
  std::cout << "rank " << me << "/" << n << ": " << g.backend() << " all_reduce sum = " << want << std::endl;
}

// A rank (LSPAWN_TEST_KILL_RANK, default the last) dies (SIGKILL) at the all_reduce the others are in.
// The group made SIGPIPE ignored (main set it to SIG_DFL before creating it): a write to a peer
// that has gone is EPIPE, as gloo's writev(2) to a dead rank must be, not a death by signal.
void scenario_sigpipe(Group& g) {
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  check(now.sa_handler == SIG_IGN, "SIGPIPE is not ignored after creating the group");
  int sv[2];
  check(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  ::close(sv[1]);
  char byte = 1;
  const ssize_t n = ::write(sv[0], &byte, 1);
  const int err = errno;
  ::close(sv[0]);
  check(n < 0 && err == EPIPE, "a write to a closed peer is EPIPE");
  lspawn::barrier(g);
  std::cout << "rank " << g.rank() << ": a write to a gone peer is EPIPE" << std::endl;
}

void scenario_kill(Group& g) {
  auto t = at::ones({1 << 20});
  for (int i = 0; i < 3; ++i) lspawn::all_reduce(g, t);
  if (g.rank() == env_int("LSPAWN_TEST_KILL_RANK", g.size() - 1)) ::raise(SIGKILL);
  for (int i = 0; i < 5; ++i) lspawn::all_reduce(g, t);
  check(false, "all_reduce returned although a rank died");
}

// As "kill", and every rank that survives the failure of its all_reduce calls all_reduce again at
// once, as DDP's hook thread does with the next bucket: that call must throw the first failure
// again ("unusable after an earlier failure", the same rank concerned), on the other node too,
// rather than run into a node-mate that is still inside the failed op.
void scenario_kill_retry(Group& g) {
  auto t = at::ones({1 << 20});
  for (int i = 0; i < 3; ++i) lspawn::all_reduce(g, t);
  if (g.rank() == env_int("LSPAWN_TEST_KILL_RANK", g.size() - 1)) ::raise(SIGKILL);
  bool failed = false;
  try {
    for (int i = 0; i < 5; ++i) lspawn::all_reduce(g, t);
  } catch (const lspawn::CollectiveError& e) {
    std::cerr << "rank " << g.rank() << ": first failure: " << e.what() << std::endl;
    failed = true;
  }
  check(failed, "all_reduce returned although a rank died");
  lspawn::all_reduce(g, t);
  check(false, "all_reduce after a failed one completed");
}

// As "kill", and every rank that survives catches its failure and stays alive 12 s, holding its
// group, as a trainer that recovers would (then the failure ends it). Each must still fail within
// seconds of the kill, though its node's leader or the other node's leader lives on: a rank that
// fails leaves the hierarchy (Hierarchy::fail: its shm communicator says so, a leader closes its
// gloo connections). Each prints "failed after <s> s".
void scenario_kill_stay(Group& g) {
  auto t = at::ones({1 << 20});
  for (int i = 0; i < 3; ++i) lspawn::all_reduce(g, t);
  if (g.rank() == env_int("LSPAWN_TEST_KILL_RANK", g.size() - 1)) ::raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 5; ++i) lspawn::all_reduce(g, t);
  } catch (const lspawn::CollectiveError& e) {
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << "rank " << g.rank() << ": failed after " << took << " s: " << e.what() << std::endl;
    std::this_thread::sleep_for(std::chrono::seconds(12));
    throw;
  }
  check(false, "all_reduce returned although a rank died");
}

// Rank 1 calls broadcast where the others call all_reduce.
void scenario_mismatch_op(Group& g) {
  auto t = at::ones({10});
  if (g.rank() == 1)
    lspawn::broadcast(g, t, 0);
  else
    lspawn::all_reduce(g, t);
  check(false, "mismatched collectives completed");
}

// Rank 1 passes 11 elements where the others pass 10.
void scenario_mismatch_shape(Group& g) {
  auto t = at::ones({g.rank() == 1 ? 11 : 10});
  lspawn::all_reduce(g, t);
  check(false, "mismatched shapes completed");
}

int report(int rank);  // maps the exception being handled to the exit status

// all_reduce (every type and op), broadcast and all_gather of tensors on a CUDA device when one is
// visible (cuda:(rank mod devices): ranks share one GPU), else on the CPU, against the CPU
// reference. On CUDA the shm group takes CUDA IPC (collectives/cuda_ipc.hpp) unless
// LSPAWN_SHM_CUDA_IPC=0 (staged through host memory). Growing sizes make the IPC scratch grow
// (peers reopen it); prints the device and whether CUDA IPC is on at the end.
void scenario_device(Group& g) {
  const int n = g.size(), me = g.rank();
  const int devices = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const c10::Device dev =
      devices > 0 ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(me % devices)) : c10::Device(c10::kCPU);
  auto on = [&](const at::Tensor& t) { return t.to(dev); };
  for (int64_t len : {1, 7, 1000, 300001, 3000001, 1000})
    for (auto dt : kDtypes)
      for (auto op : ops_for(dt)) {
        if (len > 1000 && (dt != at::kFloat || op != ReduceOp::Sum) && !(len == 300001 && dt == at::kBFloat16))
          continue;
        auto t = on(input_of(me, len, dt));
        lspawn::all_reduce(g, t, op);
        check(t.device() == dev, "all_reduce kept the device");
        expect_equal(
            std::string("all_reduce ") + lspawn::to_string(op) + " " + c10::toString(dt) + " x" + std::to_string(len),
            t.cpu(), reference(n, len, dt, op));
      }
  {  // in place through a transposed view
    auto base = on(input_of(me, 6 * 5, at::kFloat).reshape({6, 5}));
    auto view = base.t();
    lspawn::all_reduce(g, view, ReduceOp::Mean);
    expect_equal("all_reduce non-contiguous", base.cpu(), reference(n, 30, at::kFloat, ReduceOp::Mean).reshape({6, 5}));
  }
  for (auto dt : kDtypes)
    for (int64_t len : {1, 7, 300001}) {
      const std::string tag = std::string(c10::toString(dt)) + " x" + std::to_string(len);
      auto b = on(input_of(me, len, dt));
      lspawn::broadcast(g, b, n - 1);
      expect_equal("broadcast " + tag, b.cpu(), input_of(n - 1, len, dt));
      auto stacked = lspawn::all_gather(g, on(input_of(me, len, dt)));
      check(stacked.device() == dev, "all_gather's output is on the device");
      std::vector<at::Tensor> all;
      for (int r = 0; r < n; ++r) all.push_back(input_of(r, len, dt));
      expect_equal("all_gather " + tag, stacked.cpu(), at::stack(all));
    }
  auto* ipc = g.cuda_ipc();
  std::cout << "rank " << me << ": device " << dev.str() << ", cuda ipc "
            << (ipc == nullptr ? "absent"
                : ipc->off()   ? "off (" + ipc->why_off() + ")"
                               : "on")
            << std::endl;
}

}  // namespace

int lspawn::test::collectives_worker_main(int argc, char** argv) {
  const int rank = env_int("RANK", -1), size = env_int("WORLD_SIZE", -1), port = env_int("MASTER_PORT", -1);
  if (argc != 3 || rank < 0 || size < 1 || port <= 0) {
    std::cerr << "usage: RANK=r WORLD_SIZE=n MASTER_PORT=p " << argv[0] << " <scenario> <gloo|shm|auto>\n";
    return 64;
  }
  const std::string scenario = argv[1], backend = argv[2];
  std::optional<lspawn::World> world;  // LSPAWN_TEST_FROM_WORLD: outlives the group
  // What a program starts with, whatever the test's parent ignored.
  if (scenario == "sigpipe") ::signal(SIGPIPE, SIG_DFL);
  try {
    lspawn::GroupOptions go;
    go.backend = backend == "gloo"   ? lspawn::Backend::Gloo
                 : backend == "shm"  ? lspawn::Backend::Shm
                 : backend == "nccl" ? lspawn::Backend::Nccl
                                     : lspawn::Backend::Auto;
    go.timeout = std::chrono::milliseconds(env_int("LSPAWN_TEST_TIMEOUT_MS", 30000));
    std::shared_ptr<Group> g;
    if (env_int("LSPAWN_TEST_FROM_WORLD", 0) == 1) {
      world = lspawn::init_process_group();
      g_test_store = world->store;
      g = Group::from_world(*world, go);
    } else {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(port);
      so.isServer = false;
      so.timeout = std::chrono::seconds(30);
      auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
      g_test_store = store;
      g = Group::create(store, rank, size, go);
    }
    if (const char* want = std::getenv("LSPAWN_TEST_EXPECT_BACKEND"); want && *want)
      check(g->backend() == want, "backend is " + g->backend() + ", expected " + want);
    if (const char* want = std::getenv("LSPAWN_TEST_EXPECT_SINGLE_COPY"); want && *want) {
      const bool on = g->shm() && g->shm()->single_copy(), want_on = std::string(want) == "1";
      check(on == want_on,
            std::string("shm single copy is ") + (on ? "on" : "off") + ", expected " + (want_on ? "on" : "off"));
    }
    if (scenario == "suite")
      scenario_suite(*g);
    else if (scenario == "sum")
      scenario_sum(*g);
    else if (scenario == "objects")
      scenario_objects(*g);
    else if (scenario == "subgroups")
      scenario_subgroups(*g);
    else if (scenario == "timeout")
      scenario_timeout(*g);
    else if (scenario == "kill")
      scenario_kill(*g);
    else if (scenario == "sigpipe")
      scenario_sigpipe(*g);
    else if (scenario == "kill_retry")
      scenario_kill_retry(*g);
    else if (scenario == "kill_stay")
      scenario_kill_stay(*g);
    else if (scenario == "mismatch_op")
      scenario_mismatch_op(*g);
    else if (scenario == "mismatch_shape")
      scenario_mismatch_shape(*g);
    else if (scenario == "device")
      scenario_device(*g);
    else
      throw std::invalid_argument("unknown scenario " + scenario);
    // Nobody leaves (and closes sockets) while a peer still checks; failure scenarios that
    // reach here are the rank that stayed out on purpose.
    if (scenario == "suite" || scenario == "sum" || scenario == "objects" || scenario == "subgroups" ||
        scenario == "device")
      lspawn::barrier(*g);
    std::cout << "rank " << rank << ": OK" << std::endl;
    return 0;
  } catch (...) {
    if (g_test_store) {
      try {
        g_test_store->set("test/failed/" + std::to_string(rank), std::vector<uint8_t>{1});
      } catch (...) {}
    }
    return report(rank);
  }
}

namespace {
int report(int rank) {
  try {
    throw;
  } catch (const lspawn::CollectiveMismatch& e) {
    std::cerr << "rank " << rank << ": CollectiveMismatch: " << e.what() << std::endl;
    return 4;
  } catch (const lspawn::CollectiveTimeout& e) {
    std::cerr << "rank " << rank << ": CollectiveTimeout: " << e.what() << std::endl;
    return 3;
  } catch (const lspawn::CollectiveError& e) {
    std::cerr << "rank " << rank << ": CollectiveError: " << e.what() << std::endl;
    return 2;
  } catch (const std::runtime_error& e) {
    std::cerr << "rank " << rank << ": FAILED: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": exception: " << e.what() << std::endl;
    return 5;
  }
}
}  // namespace
