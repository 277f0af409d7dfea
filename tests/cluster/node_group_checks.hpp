// What the node-group cases check over a LoopbackJob's views (node_group_harness.hpp), written
// once for the three case files (node_group_{rendezvous,round,elastic}_test.cpp). Each check is
// Catch assertions, named by the node they fail on. Tests only.
#pragma once

#include <chrono>
#include <string>

#include "cluster/node_group_harness.hpp"

namespace lspawn::test {

inline constexpr std::chrono::milliseconds kForm{5000};    // the rendezvous on loopback takes milliseconds
inline constexpr std::chrono::milliseconds kSettle{5000};  // a round's end, a stop, a start

inline bool formed(const NodeView& v) { return v.formed; }
inline bool finished(const NodeView& v) { return v.finish.has_value(); }
inline bool ended(const NodeView& v) { return v.ended; }

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Microseconds since the epoch, as a Cause's time_us.
int64_t wall_us();

// Every node's assignment names the same job: run id, workers' master (127.0.0.1, a port that is
// not the endpoint's), node count, hosts; node ranks 0..n-1, each once; the coordinator is the
// one node that says it is.
void check_one_job(LoopbackJob& job, int nnodes);

// Rounds are fenced (cluster/node_group.hpp): the nodes at `indices` all give their workers the
// same store port in this round, another than `earlier_port` (an earlier round's), and a
// connection to the earlier one is refused at once (ECONNREFUSED: node 0 holds it, never listening).
void check_fenced_port(LoopbackJob& job, const std::vector<size_t>& indices, int earlier_port);

// Every node's workers exit 0: the job finishes 0 everywhere, in round `round`.
void succeed_everywhere(LoopbackJob& job, int round);

// The finish of a job that failed with a worker's exit code: `rank` on node `node_rank` (`host`).
void check_worker_finish(const NodeView& v, int exit_code, int node_rank, int rank, const std::string& host);

}  // namespace lspawn::test
