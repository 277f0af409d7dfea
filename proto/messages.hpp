// The one schema of every message that crosses an lspawn process boundary: plain C++ structs.
// (The messages between the lspawns of a multi-node job are in node_messages.hpp, framed by
// node_wire.hpp; their fields are listed with these in schema.hpp.)
//
// Encoding (proto/wire.hpp, the only code that (de)serialises them): on pipes and sockets a
// message is a CBOR map from field name to value (RFC 8949, written and read by nlohmann::json),
// framed by a bounded 4-byte length; in files (error reports) it is a JSON object with the same
// field names, one object per file. No protobuf: docs/architecture.md, "Decisions".
//
// Versioning: every top-level message carries `version`. A reader accepts messages whose version
// is <= kSchemaVersion (proto/wire.hpp) and rejects newer ones with an error naming both numbers.
// Fields are only ever added (never renamed or re-typed), and a reader ignores the fields it does
// not know and leaves the fields it does not find at their defaults (those written here), so an
// older reader of a newer message of the same version still parses it. Bump kSchemaVersion when
// a change alters meaning.
//
// This header has no dependency beyond the standard library: it is included by torch-linked code
// (runtime/, spawn/codec.hpp instantiated with tensors) and by the torch-free launcher.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lspawn::proto {

// Written by a worker that dies of an uncaught exception, to the path in TORCHELASTIC_ERROR_FILE
// (or LSPAWN_ERROR_FILE); read by the launcher / spawn() for the failure summary.
// In files the int64 fields are JSON numbers; a reader also accepts them as decimal strings
// (what files written by earlier lspawn builds, through protobuf's JSON mapping, hold).
struct ErrorReport {
  uint32_t version = 0;
  int32_t rank = 0;        // global rank, -1 when unknown
  int32_t local_rank = 0;  // -1 when unknown
  int64_t pid = 0;
  std::string host;
  std::string exception_type;  // demangled C++ type, e.g. "std::runtime_error"
  std::string message;         // what()
  std::string backtrace;       // one frame per line, may be empty
  int64_t timestamp_us = 0;    // wall clock, microseconds since the Unix epoch
  // When the failure happened (wall clock, µs): the time the exception was thrown when the
  // worker knows it (lspawn's runtime records every throw), else 0. Written after unwinding,
  // timestamp_us can be later than a sibling's failure that this one caused; the launcher
  // orders failures by this field to find the root cause.
  int64_t failed_at_us = 0;
};

struct Value;
// std::vector<T>, std::tuple<...>, the arguments of a SpawnCall.
using ValueList = std::vector<Value>;

// A value passed between processes: a spawn() argument or a worker's result. Exactly one kind;
// the member that kind names holds the value, the others stay at their defaults.
// On the wire: CBOR null (kNone), integer, float, boolean, text string, array (kList), byte
// string (kBlob) and byte string with CBOR tag 1 (kTensor, see wire.cpp).
struct Value {
  enum class Kind : uint8_t {
    kNone,    // unset (a default Value, or a kind this build does not know)
    kInt,     // i
    kDouble,  // f
    kBool,    // b
    kString,  // s: text
    kTensor,  // s: torch::pickle_save of one tensor (runtime/spawn/tensor_codec encodes it)
    kList,    // list
    kBlob,    // s: opaque bytes of a user codec
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  ValueList list;

  static Value of_int(int64_t x);
  static Value of_double(double x);
  static Value of_bool(bool x);
  static Value of_string(std::string x);
  static Value of_tensor(std::string bytes);
  static Value of_blob(std::string bytes);
  static Value of_list(ValueList items = {});
};

// "int64", "string", ... for error messages.
const char* kind_name(Value::Kind kind);

// Hand-off from spawn()'s parent to a child that it started by exec (StartMethod::Spawn):
// which registered function to run, with which index and arguments, and where to put the result.
struct SpawnCall {
  uint32_t version = 0;
  std::string function;  // name given to LSPAWN_REGISTER
  int32_t index = 0;
  int32_t nprocs = 0;
  ValueList args;
  bool want_result = false;
  std::string result_path;  // file for the SpawnResult frame when want_result (spawn's temp dir)
};

// What a spawn() child sends back to the parent on its result channel.
struct SpawnResult {
  uint32_t version = 0;
  int32_t index = 0;
  Value value;
  bool returned = false;  // false when the function returned void (value unset)
};

// Forkserver protocol: parent → server requests; server → parent replies.
struct ForkRequest {
  uint32_t version = 0;
  int32_t index = 0;             // worker index to run
  bool shutdown = false;         // ask the server to exit (no worker is forked)
  SpawnCall call;                // what the forked worker runs (function, args, result path)
  std::vector<std::string> env;  // "NAME=value" set in the worker before it runs (env contract)
  bool has_stdio = false;        // the request carries the worker's stdout and stderr fds
                                 // (SCM_RIGHTS on the unix socket, in that order)
  // Fork a server of its own (the same fork_loop, a child of this one) instead of a worker: the
  // request carries the new server's request socket and exit pipe (SCM_RIGHTS, in that order)
  // instead of stdio. How the warm daemon gives each run a server of its own (docs/warm-start.md).
  bool server = false;
  std::string cwd;     // the worker's working directory; empty: the server's
  int32_t umask = -1;  // the worker's umask; -1: the server's
};

struct ForkReply {
  uint32_t version = 0;
  int32_t index = 0;
  int64_t pid = 0;    // pid of the forked worker, 0 on failure
  std::string error;  // why the fork failed, empty on success
};

// Forkserver → parent: a worker the server forked has exited (the server is its parent, and
// the only process that can wait for it).
struct ChildExit {
  uint32_t version = 0;
  int32_t index = 0;
  int64_t pid = 0;
  int32_t exit_code = 0;  // valid when signal == 0
  int32_t signal = 0;     // terminating signal number, 0 if it exited
};

// Client → warm daemon (`lspawn daemon`, docs/warm-start.md), on its unix socket.
struct DaemonRequest {
  uint32_t version = 0;
  std::string op;  // "forkserver" | "status" | "stop"
  // forkserver: the program (absolute path), its argv (argv[0] included) and the environment
  // it is executed with; together with the file's identity they key the warm forkserver.
  std::string path;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  // The program is a Python interpreter running lspawn's preload server (argv[1], lspawn_preload.py;
  // `lspawn --preload`, launcher/python_preload.hpp), not a program linking the forkserver hook.
  bool preload = false;
};

// Warm daemon → client. For "forkserver" with no error, the reply carries this run's server's
// request socket and exit pipe (SCM_RIGHTS, in that order): the client uses them as a
// Forkserver of its own.
struct DaemonReply {
  uint32_t version = 0;
  std::string error;  // why the request was refused or failed; empty: done
  int64_t daemon_pid = 0;
  int64_t forkserver_pid = 0;            // the warm forkserver (kept between runs)
  int64_t server_pid = 0;                // this run's server, a fork of the warm forkserver
  bool reused = false;                   // the warm forkserver existed before this request
  int64_t runs = 0;                      // runs the warm forkserver has served, this one included
  std::vector<std::string> forkservers;  // status: one line per warm forkserver
};

// Written by `lspawn --result-file PATH` when a run ends (lspawn.spawn() in Python reads it:
// docs/python.md), as a JSON file. One entry per worker of this node, by local rank, in each
// vector (columns, not rows: a row would be a nested message, which this schema does not have).
struct RunResult {
  uint32_t version = 0;
  int32_t exit_code = 0;       // lspawn's own exit code
  bool hang = false;           // ended by --hang-timeout
  int32_t root_cause = -1;     // local rank of this node's root cause, -1 when none
  std::vector<int64_t> ranks;  // global rank
  std::vector<int64_t> pids;
  std::vector<int64_t> exit_codes;  // WEXITSTATUS, 0 when killed by a signal
  std::vector<int64_t> signals;     // the terminating signal, 0 when it exited
  std::vector<int64_t> stopped;     // 1: stopped by lspawn (a consequence, not its own failure)
};

// Field-by-field equality (tests, and callers that compare a round trip).
bool operator==(const ErrorReport& a, const ErrorReport& b);
bool operator==(const Value& a, const Value& b);
bool operator==(const SpawnCall& a, const SpawnCall& b);
bool operator==(const SpawnResult& a, const SpawnResult& b);
bool operator==(const ForkRequest& a, const ForkRequest& b);
bool operator==(const ForkReply& a, const ForkReply& b);
bool operator==(const ChildExit& a, const ChildExit& b);
bool operator==(const DaemonRequest& a, const DaemonRequest& b);
bool operator==(const DaemonReply& a, const DaemonReply& b);

}  // namespace lspawn::proto
