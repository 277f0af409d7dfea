#include "cluster/node_group_checks.hpp"

#include <catch2/catch.hpp>

#include <cerrno>
#include <set>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace lspawn::test {

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void check_fenced_port(LoopbackJob& job, const std::vector<size_t>& indices, int earlier_port) {
  const int port = job[indices.front()].view().assignment.master_port;
  CHECK(port > 0);
  CHECK(port != earlier_port);
  for (size_t i : indices) CHECK(job[i].view().assignment.master_port == port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(earlier_port));
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  const int err = errno;
  ::close(fd);
  CHECK(rc == -1);
  CHECK(err == ECONNREFUSED);
}

void check_one_job(LoopbackJob& job, int nnodes) {
  const NodeView first = job[0].view();
  std::set<int> ranks;
  int coordinators = 0;
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.assignment.nnodes == nnodes);
    CHECK_FALSE(v.assignment.run_id.empty());
    CHECK(v.assignment.run_id == first.assignment.run_id);
    CHECK(v.assignment.master_addr == "127.0.0.1");
    CHECK(v.assignment.master_port > 0);
    CHECK(v.assignment.master_port != job.port());
    CHECK(v.assignment.master_port == first.assignment.master_port);
    CHECK(v.assignment.hosts == first.assignment.hosts);
    REQUIRE(v.assignment.hosts.size() == static_cast<size_t>(nnodes));
    CHECK(v.assignment.hosts[static_cast<size_t>(v.assignment.node_rank)] == n->host());
    CHECK(v.assignment.coordinator == first.assignment.coordinator);
    ranks.insert(v.assignment.node_rank);
    coordinators += v.coordinator;
    if (v.coordinator) CHECK(v.assignment.node_rank == v.assignment.coordinator);
  }
  CHECK(coordinators == 1);
  CHECK(ranks.size() == static_cast<size_t>(nnodes));
  CHECK(*ranks.begin() == 0);
  CHECK(*ranks.rbegin() == nnodes - 1);
}

void succeed_everywhere(LoopbackJob& job, int round) {
  for (auto& n : job.nodes()) n->succeed();
  REQUIRE(job.await_all(finished, kSettle));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.finish->exit_code == 0);
    CHECK_FALSE(v.finish->failed);
    CHECK(v.finish->restart_count == round);
  }
}

void check_worker_finish(const NodeView& v, int exit_code, int node_rank, int rank, const std::string& host) {
  REQUIRE(v.finish);
  CHECK(v.finish->failed);
  CHECK(v.finish->exit_code == exit_code);
  CHECK(v.finish->cause.kind == node::CauseKind::Worker);
  CHECK(v.finish->cause.node_rank == node_rank);
  CHECK(v.finish->cause.rank == rank);
  CHECK(v.finish->cause.host == host);
}

}  // namespace lspawn::test
