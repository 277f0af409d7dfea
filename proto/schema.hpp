// The schema of every message proto carries: each message's fields, by name, in one place.
// Read by the codec (proto/wire.cpp) alone; the names here are the keys on the wire, so a field
// is only ever added, never renamed (proto/messages.hpp, "Versioning").
#pragma once

#include <type_traits>

#include "proto/messages.hpp"
#include "proto/node_messages.hpp"

namespace lspawn::proto::schema {

template <class T>
inline constexpr bool kAlwaysFalse = false;

// The top-level messages of messages.hpp: each carries `version`, checked when it is read.
template <class T>
inline constexpr bool kIsMessage =
    std::is_same_v<T, ErrorReport> || std::is_same_v<T, SpawnCall> || std::is_same_v<T, SpawnResult> ||
    std::is_same_v<T, ForkRequest> || std::is_same_v<T, ForkReply> || std::is_same_v<T, ChildExit> ||
    std::is_same_v<T, DaemonRequest> || std::is_same_v<T, DaemonReply> || std::is_same_v<T, RunResult>;

// The bodies of the control channel (node_messages.hpp): no version of their own (the join's
// says the channel's).
template <class T>
inline constexpr bool kIsNodeMessage =
    std::is_same_v<T, JoinMsg> || std::is_same_v<T, JoinedMsg> || std::is_same_v<T, AssignMsg> ||
    std::is_same_v<T, RejectMsg> || std::is_same_v<T, FailedMsg> || std::is_same_v<T, StopMsg> ||
    std::is_same_v<T, DoneMsg> || std::is_same_v<T, BusyMsg> || std::is_same_v<T, StartMsg> ||
    std::is_same_v<T, FinishMsg> || std::is_same_v<T, Heartbeat> || std::is_same_v<T, StatusMsg> ||
    std::is_same_v<T, StackAskMsg> || std::is_same_v<T, StacksMsg>;

// Every struct written as a map of its fields: the messages and the records nested in them.
template <class T>
inline constexpr bool kIsRecord =
    kIsMessage<T> || kIsNodeMessage<T> || std::is_same_v<T, Cause> || std::is_same_v<T, GroupRecord> ||
    std::is_same_v<T, RankRecord> || std::is_same_v<T, RankStatus>;

// The name errors give the struct ("AssignMsg").
template <class M>
const char* type_name() {
  using T = std::remove_const_t<M>;
  if constexpr (std::is_same_v<T, ErrorReport>)
    return "ErrorReport";
  else if constexpr (std::is_same_v<T, SpawnCall>)
    return "SpawnCall";
  else if constexpr (std::is_same_v<T, SpawnResult>)
    return "SpawnResult";
  else if constexpr (std::is_same_v<T, ForkRequest>)
    return "ForkRequest";
  else if constexpr (std::is_same_v<T, ForkReply>)
    return "ForkReply";
  else if constexpr (std::is_same_v<T, ChildExit>)
    return "ChildExit";
  else if constexpr (std::is_same_v<T, DaemonRequest>)
    return "DaemonRequest";
  else if constexpr (std::is_same_v<T, DaemonReply>)
    return "DaemonReply";
  else if constexpr (std::is_same_v<T, RunResult>)
    return "RunResult";
  else if constexpr (std::is_same_v<T, Cause>)
    return "Cause";
  else if constexpr (std::is_same_v<T, JoinMsg>)
    return "JoinMsg";
  else if constexpr (std::is_same_v<T, JoinedMsg>)
    return "JoinedMsg";
  else if constexpr (std::is_same_v<T, AssignMsg>)
    return "AssignMsg";
  else if constexpr (std::is_same_v<T, RejectMsg>)
    return "RejectMsg";
  else if constexpr (std::is_same_v<T, FailedMsg>)
    return "FailedMsg";
  else if constexpr (std::is_same_v<T, StopMsg>)
    return "StopMsg";
  else if constexpr (std::is_same_v<T, DoneMsg>)
    return "DoneMsg";
  else if constexpr (std::is_same_v<T, BusyMsg>)
    return "BusyMsg";
  else if constexpr (std::is_same_v<T, StartMsg>)
    return "StartMsg";
  else if constexpr (std::is_same_v<T, FinishMsg>)
    return "FinishMsg";
  else if constexpr (std::is_same_v<T, Heartbeat>)
    return "Heartbeat";
  else if constexpr (std::is_same_v<T, GroupRecord>)
    return "GroupRecord";
  else if constexpr (std::is_same_v<T, RankRecord>)
    return "RankRecord";
  else if constexpr (std::is_same_v<T, RankStatus>)
    return "RankStatus";
  else if constexpr (std::is_same_v<T, StatusMsg>)
    return "StatusMsg";
  else if constexpr (std::is_same_v<T, StackAskMsg>)
    return "StackAskMsg";
  else if constexpr (std::is_same_v<T, StacksMsg>)
    return "StacksMsg";
  else
    static_assert(kAlwaysFalse<T>, "not a message of proto/messages.hpp or proto/node_messages.hpp");
}

// Calls f(name, member) for every field of `m` (const or not), in the order written.
template <class M, class F>
void each_field(M& m, F&& f) {
  using T = std::remove_const_t<M>;
  if constexpr (std::is_same_v<T, ErrorReport>) {
    f("version", m.version);
    f("rank", m.rank);
    f("local_rank", m.local_rank);
    f("pid", m.pid);
    f("host", m.host);
    f("exception_type", m.exception_type);
    f("message", m.message);
    f("backtrace", m.backtrace);
    f("timestamp_us", m.timestamp_us);
    f("failed_at_us", m.failed_at_us);
  } else if constexpr (std::is_same_v<T, SpawnCall>) {
    f("version", m.version);
    f("function", m.function);
    f("index", m.index);
    f("nprocs", m.nprocs);
    f("args", m.args);
    f("want_result", m.want_result);
    f("result_path", m.result_path);
  } else if constexpr (std::is_same_v<T, SpawnResult>) {
    f("version", m.version);
    f("index", m.index);
    f("value", m.value);
    f("returned", m.returned);
  } else if constexpr (std::is_same_v<T, ForkRequest>) {
    f("version", m.version);
    f("index", m.index);
    f("shutdown", m.shutdown);
    f("call", m.call);
    f("env", m.env);
    f("has_stdio", m.has_stdio);
    f("server", m.server);
    f("cwd", m.cwd);
    f("umask", m.umask);
  } else if constexpr (std::is_same_v<T, ForkReply>) {
    f("version", m.version);
    f("index", m.index);
    f("pid", m.pid);
    f("error", m.error);
  } else if constexpr (std::is_same_v<T, ChildExit>) {
    f("version", m.version);
    f("index", m.index);
    f("pid", m.pid);
    f("exit_code", m.exit_code);
    f("signal", m.signal);
  } else if constexpr (std::is_same_v<T, DaemonRequest>) {
    f("version", m.version);
    f("op", m.op);
    f("path", m.path);
    f("argv", m.argv);
    f("env", m.env);
    f("preload", m.preload);
  } else if constexpr (std::is_same_v<T, DaemonReply>) {
    f("version", m.version);
    f("error", m.error);
    f("daemon_pid", m.daemon_pid);
    f("forkserver_pid", m.forkserver_pid);
    f("server_pid", m.server_pid);
    f("reused", m.reused);
    f("runs", m.runs);
    f("forkservers", m.forkservers);
  } else if constexpr (std::is_same_v<T, RunResult>) {
    f("version", m.version);
    f("exit_code", m.exit_code);
    f("hang", m.hang);
    f("root_cause", m.root_cause);
    f("ranks", m.ranks);
    f("pids", m.pids);
    f("exit_codes", m.exit_codes);
    f("signals", m.signals);
    f("stopped", m.stopped);
  } else if constexpr (std::is_same_v<T, Cause>) {
    f("kind", m.kind);
    f("restart_count", m.restart_count);
    f("rank", m.rank);
    f("node_rank", m.node_rank);
    f("host", m.host);
    f("exit_code", m.exit_code);
    f("time_us", m.time_us);
    f("text", m.text);
    f("before_rendezvous", m.before_rendezvous);
  } else if constexpr (std::is_same_v<T, JoinMsg>) {
    f("version", m.version);
    f("host", m.host);
    f("node_rank", m.node_rank);
    f("nnodes", m.nnodes);
    f("min_nnodes", m.min_nnodes);
    f("nproc_per_node", m.nproc_per_node);
    f("max_restarts", m.max_restarts);
    f("run_id", m.run_id);
    f("worker_addr", m.worker_addr);
    f("worker_port", m.worker_port);
  } else if constexpr (std::is_same_v<T, JoinedMsg>) {
    f("joined", m.joined);
  } else if constexpr (std::is_same_v<T, AssignMsg>) {
    f("node_rank", m.node_rank);
    f("nnodes", m.nnodes);
    f("nproc_per_node", m.nproc_per_node);
    f("max_restarts", m.max_restarts);
    f("run_id", m.run_id);
    f("master_addr", m.master_addr);
    f("master_port", m.master_port);
    f("hosts", m.hosts);
    f("coordinator", m.coordinator);
    f("restart_count", m.restart_count);
    f("restarts_used", m.restarts_used);
  } else if constexpr (std::is_same_v<T, RejectMsg>) {
    f("reason", m.reason);
  } else if constexpr (std::is_same_v<T, FailedMsg>) {
    f("cause", m.cause);
  } else if constexpr (std::is_same_v<T, StopMsg>) {
    f("restart_count", m.restart_count);
    f("cause", m.cause);
  } else if constexpr (std::is_same_v<T, DoneMsg>) {
    f("restart_count", m.restart_count);
    f("failed", m.failed);
    f("cause", m.cause);
  } else if constexpr (std::is_same_v<T, BusyMsg>) {
    f("ms", m.ms);
  } else if constexpr (std::is_same_v<T, StartMsg>) {
    f("restart_count", m.restart_count);
    f("restarts_used", m.restarts_used);
    f("cause", m.cause);
    f("master_port", m.master_port);
  } else if constexpr (std::is_same_v<T, FinishMsg>) {
    f("exit_code", m.exit_code);
    f("failed", m.failed);
    f("restart_count", m.restart_count);
    f("cause", m.cause);
  } else if constexpr (std::is_same_v<T, Heartbeat>) {
    (void)m;  // no fields
    (void)f;
  } else if constexpr (std::is_same_v<T, GroupRecord>) {
    f("name", m.name);
    f("group_rank", m.group_rank);
    f("group_size", m.group_size);
    f("in_collective", m.in_collective);
    f("seq", m.seq);
    f("op", m.op);
    f("bytes", m.bytes);
    f("since_us", m.since_us);
    f("completed_seq", m.completed_seq);
    f("completed_op", m.completed_op);
    f("completed_us", m.completed_us);
    f("version", m.version);
  } else if constexpr (std::is_same_v<T, RankRecord>) {
    f("rank", m.rank);
    f("pid", m.pid);
    f("opened_us", m.opened_us);
    f("stack_signal", m.stack_signal);
    f("groups", m.groups);
    f("groups_dropped", m.groups_dropped);
    f("torn", m.torn);
  } else if constexpr (std::is_same_v<T, RankStatus>) {
    f("rank", m.rank);
    f("pid", m.pid);
    f("host", m.host);
    f("exited", m.exited);
    f("exit_text", m.exit_text);
    f("started_us", m.started_us);
    f("record", m.record);
    f("record_problem", m.record_problem);
    f("stack", m.stack);
    f("stack_problem", m.stack_problem);
  } else if constexpr (std::is_same_v<T, StatusMsg>) {
    f("restart_count", m.restart_count);
    f("ranks", m.ranks);
  } else if constexpr (std::is_same_v<T, StackAskMsg>) {
    f("restart_count", m.restart_count);
    f("ranks", m.ranks);
  } else if constexpr (std::is_same_v<T, StacksMsg>) {
    f("restart_count", m.restart_count);
    f("ranks", m.ranks);
  } else {
    static_assert(kAlwaysFalse<T>, "not a message of proto/messages.hpp or proto/node_messages.hpp");
  }
}

}  // namespace lspawn::proto::schema
