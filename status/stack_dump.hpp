// Main-thread stack on request: the worker side of lspawn's hang report.
//
// install_stack_dump(path) installs a handler for kStackSignal. When the signal arrives, the
// handler (on the main thread: a process-directed signal taken by another thread is redirected
// there with tgkill) writes the main thread's backtrace, one frame per line in
// backtrace_symbols_fd's format, to `path`.tmp and renames it to `path`, so a reader sees either
// no file or a complete one. It only calls async-signal-safe functions (open, write, close,
// rename, tgkill) plus glibc's backtrace()/backtrace_symbols_fd(), made safe by calling
// backtrace() once at install (that loads libgcc_s; later calls neither allocate nor lock).
//
// The signal is SIGURG: its default action is to be ignored, so a process that never installed
// the handler is unaffected by a stray request, and the kernel only generates it for sockets a
// process has given F_SETOWN, which neither lspawn's runtime nor gloo does. The handler is not
// installed over a handler the program set itself; the launcher only sends the signal to ranks
// whose record says the handler is there (FileHeader::stack_signal).
#pragma once

#include <csignal>
#include <string>

namespace lspawn::status {

inline constexpr int kStackSignal = SIGURG;

// Installs the handler (process-wide) and unblocks the signal in the calling thread. Returns
// false when the program already handles kStackSignal (left alone). `path` is copied.
bool install_stack_dump(const std::string& path);

// The last line of a complete stack file.
inline constexpr const char* kStackEnd = "-- end of stack --";

// A Python worker's stack file (python/lspawn_hang.py writes it, from a thread of its own, on the
// same signal): "pid N python", this line, then the main thread's Python traceback as Python
// prints one ("  File "train.py", line 12, in step" and the source line), then kStackEnd. The
// report shows those lines as they are (hang/hang_report.cpp).
inline constexpr const char* kPythonStackHead = "Python main thread (most recent call last):";

}  // namespace lspawn::status
