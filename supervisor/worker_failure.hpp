// A worker's failure, reported faithfully: what its failure path needs below LibTorch, shared by
// the runtime's record()/run_main() (runtime/error_report.hpp) and spawn()'s worker
// (spawn/worker.hpp).
//
// TermHold: while one lives, a SIGTERM that lands on a thread with an exception in flight
// (std::uncaught_exceptions() > 0) is held until the last TermHold ends, then delivered. A rank
// that throws closes its sockets while it unwinds (its process group's destructor) before its
// catch can write the error report; a peer dies of the closed connection first, the launcher
// stops the others with SIGTERM, and without the hold the rank that failed first would die
// without a report, so the root cause would name the peer (docs/error-reports.md, "Root
// cause"). Any other SIGTERM acts at once, as SIG_DFL does; the launcher's SIGKILL after its
// grace period still ends an unwinding that hangs. Active only when SIGTERM is SIG_DFL when the
// first TermHold starts: a program's own handler (or SIG_IGN) is left alone. Nests, and may be
// used from several threads.
// The catch that writes the report has no exception in flight any more (uncaught_exceptions() is
// 0 inside a handler): a TermHold::Reporting there holds a SIGTERM the same way until the report
// is written, on whichever thread the signal lands.
//
//   int run() {
//     TermHold hold;
//     try { return body(); } catch (...) { TermHold::Reporting r; write_report(); return 1; }
//   }
#pragma once

#include <cstdint>
#include <exception>

namespace lspawn {

class TermHold {
 public:
  TermHold();
  ~TermHold();  // the last one restores SIG_DFL, then raises a held SIGTERM
  TermHold(const TermHold&) = delete;
  TermHold& operator=(const TermHold&) = delete;

  // Whether this hold took effect (SIGTERM was SIG_DFL, or another hold is active).
  bool active() const { return active_; }

  // Whether a SIGTERM is being held: it came while an exception unwound and acts when the last
  // hold ends. An unwinding that waits (a peer's reply, a flush) may end its wait early on it,
  // since the process is being stopped; reading it needs no lock (async-signal-safe).
  static bool held();

  // While one lives (inside an active TermHold), any SIGTERM is held, exception or not.
  class Reporting {
   public:
    Reporting();
    ~Reporting();
    Reporting(const Reporting&) = delete;
    Reporting& operator=(const Reporting&) = delete;
  };

 private:
  bool active_ = false;
};

// Sets SIGPIPE to SIG_IGN when it is SIG_DFL, as Python does at start-up; a handler the program
// installed is left alone. Returns whether SIGPIPE is ignored afterwards. gloo writes to its
// sockets with writev(2), which raises SIGPIPE when the peer has gone: without this, a rank
// whose peer died mid-collective is killed by the signal, with no error and no report, instead
// of failing with gloo's "Connection closed by peer" (docs/runtime.md). init_process_group()
// calls it.
bool ignore_sigpipe_if_default();

// When an exception was thrown (µs since the epoch), or 0 when unknown: the error report's
// failed_at_us, by which the launcher orders failures (docs/error-reports.md, "Root cause"). The
// clock is the runtime's throw-site record (runtime/throw_trace.hpp), which init_process_group()
// installs here; the torch-free parts cannot see a throw themselves. Without it, 0.
using ThrowClock = int64_t (*)(const std::exception_ptr&);
void set_throw_clock(ThrowClock clock);
int64_t throw_time_us(const std::exception_ptr& error);

}  // namespace lspawn
