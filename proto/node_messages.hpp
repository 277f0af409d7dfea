// The control channel's messages: what the lspawn processes of a multi-node job say to each other
// (docs/multi-node.md), as plain structs. cluster/node_channel.hpp carries them over TCP; its
// header lists who sends which, and when.
//
// Encoding (proto/node_wire.hpp, the only code that (de)serialises them): a body is a CBOR map
// from field name to value, as for the messages of proto/messages.hpp; a frame carries one body
// with its type. A reader ignores the fields it does not know and leaves the ones it does not find
// at their defaults (those written here); a field of the wrong type or out of its range is an
// error naming the message and the field.
//
// Versioning: the channel as a whole has one version, kNodeProtocolVersion, which a member sends
// in its join (JoinMsg::version) and the coordinator compares with its own: a node of another
// version is refused, naming both. The bodies carry no version of their own. Bump
// kNodeProtocolVersion whenever the bytes on the channel or their meaning change.
//
// Like messages.hpp, this header depends on the standard library alone: the hang watch's and the
// status records' own types (hang/hang_report.hpp, status/reader.hpp) are a layer up, so the
// records travel as RankStatus / RankRecord / GroupRecord below, converted where the channel
// meets the hang watch (cluster/node_channel.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lspawn::proto {

// 2: the coordinator answers a join at once ("joined"). 3: every round has a workers' store port
// of its own (StartMsg::master_port; docs/security.md, "Rounds"): a node of version 2 would give
// its workers the old round's. Nodes of another version are refused.
inline constexpr int kNodeProtocolVersion = 3;

// What kind of failure a Cause is. On the wire, its name (cause_kind_name(): the strings
// protocol 2 always carried); a name no kind has is refused when the message is read.
enum class CauseKind {
  Worker,      // "worker": a worker failed (exit code, signal, report)
  NodeLost,    // "node-lost": a node's lspawn or link was lost
  Signal,      // "signal": an lspawn received a stopping signal (SIGINT, SIGTERM, ...)
  Hang,        // "hang": --hang-timeout, no rank made progress
  Membership,  // "membership": a node joined an elastic job (the round stops to admit it)
};
const char* cause_kind_name(CauseKind k);
// The kind named `name`, or nullopt.
std::optional<CauseKind> parse_cause_kind(const std::string& name);

// Why a job (or a round) failed: the one root cause every lspawn reports.
struct Cause {
  CauseKind kind = CauseKind::Worker;
  int restart_count = 0;  // the round it happened in
  int rank = -1;          // worker: its global rank
  int node_rank = -1;     // where it happened (node-lost: the node that was lost)
  std::string host;
  int exit_code = 1;               // what every lspawn exits with
  int64_t time_us = 0;             // wall clock when it failed (the earliest failure wins)
  std::string text;                // the report, lines starting "lspawn: ", ending with '\n'
  bool before_rendezvous = false;  // worker: it failed before it entered its rendezvous (status/phase.hpp)
};

// "join", member → coordinator: the first message of a member.
struct JoinMsg {
  int version = kNodeProtocolVersion;
  std::string host;
  int node_rank = -1;  // -1: assign one
  int nnodes = 0;      // --nnodes N, or MAX of MIN:MAX
  int min_nnodes = 0;  // MIN of --nnodes MIN:MAX; 0: a fixed count
  int nproc_per_node = 0;
  int max_restarts = 0;
  std::string run_id;       // empty: none given
  std::string worker_addr;  // where this node's rank 0 would host the workers' store
  int worker_port = 0;      // a port reserved there; 0: none (cannot be node 0)
};

// "joined", coordinator → member: the join is accepted; the assignment follows when the job forms.
struct JoinedMsg {
  int joined = 0;  // nodes that had joined (this one and the coordinator included)
};

// "assign", coordinator → member: its node rank, the run id, the workers' master; a round starts.
struct AssignMsg {
  int node_rank = 0;
  int nnodes = 1;
  int nproc_per_node = 1;
  int max_restarts = 0;
  std::string run_id;
  std::string master_addr;  // MASTER_ADDR / MASTER_PORT of every worker
  int master_port = 0;
  std::vector<std::string> hosts;  // by node rank
  int coordinator = 0;             // node rank of the coordinator
  // The round this assignment starts: 0 at the rendezvous. An elastic job sends a new
  // assignment before each round whose nodes changed (and to a node admitted later).
  int restart_count = 0;
  int restarts_used = 0;  // of --max-restarts: rounds started after a failure
};

// "reject", coordinator → member: the rendezvous failed; the member exits.
struct RejectMsg {
  std::string reason;
};

// "failed", member → coordinator: a local worker failed (a provisional root cause).
struct FailedMsg {
  Cause cause;
};

// "stop", coordinator → member: stop this round's workers (grace, then SIGKILL).
struct StopMsg {
  int restart_count = 0;
  Cause cause;
};

// "done", member → coordinator: every local worker of the round has exited.
struct DoneMsg {
  int restart_count = 0;
  bool failed = false;
  Cause cause;  // this node's settled root cause when failed
};

// "busy", both ways: the sender blocks up to ms without heartbeats; its next message ends that.
struct BusyMsg {
  int64_t ms = 0;
};

// "start", coordinator → member: a restart, round restart_count begins.
struct StartMsg {
  int restart_count = 0;
  int restarts_used = 0;  // of --max-restarts (a round that admits a node counts none)
  Cause cause;            // the root cause of the attempt that failed
  // The workers' MASTER_PORT in this round: a port node 0 reserved for it (the previous round's
  // stays reserved, never listening, until the next round begins). 0: the previous round's (node 0 is not
  // the coordinator; cluster/node_group.hpp).
  int master_port = 0;
};

// "finish", coordinator → member: the job is over.
struct FinishMsg {
  int exit_code = 0;
  bool failed = false;
  int restart_count = 0;  // the last round
  Cause cause;
};

// "hb", both ways: a heartbeat has no fields.
struct Heartbeat {};

// One process group of a rank's status record, as read (status::GroupView, field for field).
struct GroupRecord {
  std::string name;
  int group_rank = 0;
  int group_size = 0;
  bool in_collective = false;
  uint64_t seq = 0;  // current op (in_collective) or the last one entered, 0: none
  std::string op;
  uint64_t bytes = 0;
  int64_t since_us = 0;        // entered (in_collective) / left (idle), CLOCK_REALTIME µs
  uint64_t completed_seq = 0;  // 0: none completed yet
  std::string completed_op;
  int64_t completed_us = 0;
  uint64_t version = 0;  // changes on every update: progress
};

// A rank's status record, as read (status::RankView, field for field).
struct RankRecord {
  int rank = -1;
  int pid = 0;
  int64_t opened_us = 0;
  int stack_signal = 0;
  std::vector<GroupRecord> groups;
  uint32_t groups_dropped = 0;
  bool torn = false;
};

// What a node knows of one of its ranks (lspawn::RankInput of hang/hang_report.hpp, field for
// field).
struct RankStatus {
  int rank = -1;
  int pid = 0;                       // the supervisor's pid for it; 0 unknown
  std::string host;                  // the node's
  bool exited = false;               // its process is gone
  std::string exit_text;             // "exited with code 0", when exited
  int64_t started_us = 0;            // when it was started (CLOCK_REALTIME µs), 0 unknown
  std::optional<RankRecord> record;  // none (null on the wire): no status record (yet)
  std::string record_problem;        // a record that exists but could not be read
  std::vector<std::string> stack;    // its main thread's frames, when fetched
  std::string stack_problem;         // why there is no stack
};

// "status", member → coordinator: this node's ranks' status records (host set, no stacks).
struct StatusMsg {
  int restart_count = 0;
  std::vector<RankStatus> ranks;
};

// "stacks?", coordinator → member: ask these ranks (global ranks of the receiver) for their stacks.
struct StackAskMsg {
  int restart_count = 0;
  std::vector<int> ranks;
};

// "stacks", member → coordinator: their main-thread stacks (rank, stack or stack_problem).
struct StacksMsg {
  int restart_count = 0;
  std::vector<RankStatus> ranks;
};

}  // namespace lspawn::proto
