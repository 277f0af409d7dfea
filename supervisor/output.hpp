// Where worker output goes: line splitting and the sinks (console with prefixes, log files,
// in-memory capture).
//
// The Supervisor reads each worker's stdout and stderr pipes and hands the bytes to a
// LineSplitter per stream, which delivers them to every sink:
//   - bytes(): the raw bytes exactly as read (log files, capture: nothing added or lost);
//   - line():  one whole line without its '\n', for consoles shared by several ranks. A last
//              line without '\n' is delivered at EOF; a line longer than kMaxLine is delivered
//              in kMaxLine pieces, each as its own line (so a huge line neither stalls other
//              ranks nor grows memory without bound).
// Sinks are called from the supervisor's one thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sys/sys.hpp"

namespace lspawn {

enum class Stream { Stdout = 0, Stderr = 1 };
const char* stream_name(Stream s);  // "stdout" / "stderr"

class OutputSink {
 public:
  virtual ~OutputSink() = default;
  virtual void bytes(int rank, Stream stream, std::string_view data) { (void)rank, (void)stream, (void)data; }
  virtual void line(int rank, Stream stream, std::string_view line) { (void)rank, (void)stream, (void)line; }
  // The stream of `rank` reached EOF (after its last bytes()/line()).
  virtual void closed(int rank, Stream stream) { (void)rank, (void)stream; }
  // The line() calls of one read of a worker's stream come between begin_lines() and
  // end_lines(): a sink may hold them until end_lines() (ConsoleSink writes them together).
  virtual void begin_lines() {}
  virtual void end_lines() {}
};

// Writes each line to stdout_fd / stderr_fd (the worker's stream picks the fd), as
// "[rank N] " + line + "\n" ("[HOST rank N] " when Options::host is set). Whole lines only, and
// never more than kWriteMax bytes in one write(2) unless one line is longer: on a pipe shared with
// other writers (several lspawns into one `| tee`), a write of at most PIPE_BUF bytes is atomic,
// so lines never interleave mid-line. The lines of one read (begin_lines()..end_lines()) share
// writes up to that size; a line() outside them is written at once. A write error (EPIPE: the
// reader went away) disables that console stream silently; the run goes on.
class ConsoleSink : public OutputSink {
 public:
  struct Options {
    bool prefix = true;  // "[rank N] " before each line
    std::string host;    // non-empty (multi-node jobs): "[HOST rank N] " instead
    // Set: the prefix of `rank`'s lines instead (torchrun's --log-line-prefix-template), asked
    // once per rank.
    std::function<std::string(int rank)> prefix_of;
    int stdout_fd = 1;
    int stderr_fd = 2;
  };
  static constexpr size_t kWriteMax = 4096;  // PIPE_BUF on Linux
  explicit ConsoleSink(Options opts) : opts_(std::move(opts)) {}
  void line(int rank, Stream stream, std::string_view line) override;
  void begin_lines() override { holding_ = true; }
  void end_lines() override;

 private:
  void flush(int idx);
  Options opts_;
  bool broken_[2] = {false, false};
  bool holding_ = false;
  std::string pending_[2];                            // whole lines not yet written, per console stream
  std::vector<std::optional<std::string>> prefixes_;  // index rank: its prefix, made once
};

// The prefix of `rank` in a console line as ConsoleSink::Options make it: prefix_of(rank) when
// set, else "[rank N] " or "[HOST rank N] "; empty when !prefix.
std::string console_prefix(const ConsoleSink::Options& o, int rank);

// torchrun's --duplicate-stdout-filters/--duplicate-stderr-filters: each line of a stream that
// contains one of that stream's filters (substrings) is also written, with `prefix_of(rank)`
// before it, to DIR/filtered_<stream>.log, one file for every rank of this node; restart attempt
// k > 0 (set_attempt) writes DIR/filtered_<stream>.attempt<k>.log. A stream with filters has its
// file created (truncated) at once, so it exists when nothing matched. The constructor throws
// sys::SysError when a file cannot be opened; later (set_attempt, a write) an error is reported
// once through `warn` and drops the rest of that file, as LogDirSink's.
class FilteredCopySink : public OutputSink {
 public:
  using Warn = std::function<void(const std::string&)>;
  FilteredCopySink(std::string dir, std::vector<std::string> stdout_filters, std::vector<std::string> stderr_filters,
                   std::function<std::string(int rank)> prefix_of, Warn warn = {});
  void line(int rank, Stream stream, std::string_view line) override;
  void begin_lines() override { holding_ = true; }
  void end_lines() override;  // the lines of one read: one write(2) per file
  std::string path(Stream stream) const;
  void set_attempt(int k);  // between attempts, as LogDirSink::set_attempt

 private:
  static constexpr size_t kHoldMax = 64 * 1024;
  void open_files();
  void flush(int idx);
  std::string dir_;
  std::vector<std::string> filters_[2];
  std::function<std::string(int)> prefix_of_;
  Warn warn_;
  int attempt_ = 0;
  sys::Fd fds_[2];
  bool broken_[2] = {false, false};
  bool holding_ = false;
  std::string pending_[2];
  std::vector<std::optional<std::string>> prefixes_;
};

// Writes raw bytes to DIR/rank<N>.stdout and DIR/rank<N>.stderr (created, truncated, 0644,
// on the first output or at EOF, so every rank has both files). DIR must exist.
// Restart attempt k > 0 (set_attempt) writes DIR/rank<N>.attempt<k>.std{out,err}: an attempt
// never overwrites the files of the one before (which explain why it failed), and an elastic
// round's renumbered ranks get files of their own.
// A log file that cannot be written (the directory is full, a quota, EIO) does not stop the run:
// the error is reported once per file through `warn` ("lspawn: write (log file DIR/rank1.stdout):
// No space left on device; the rest of this stream is dropped"), and that stream's
// output is dropped from then on, while the workers go on and are supervised as before.
class LogDirSink : public OutputSink {
 public:
  using Warn = std::function<void(const std::string&)>;
  // `warn` defaults to one "lspawn: ..." line on stderr.
  explicit LogDirSink(std::string dir, Warn warn = {}) : dir_(std::move(dir)), warn_(std::move(warn)) {}
  void bytes(int rank, Stream stream, std::string_view data) override;
  void closed(int rank, Stream stream) override;
  std::string path(int rank, Stream stream) const;
  // The files from now on are attempt k's (0: the first). Call between attempts, once every
  // stream of the last one has closed.
  void set_attempt(int k);

 private:
  int fd_for(int rank, Stream stream);
  std::string dir_;
  int attempt_ = 0;
  Warn warn_;
  std::vector<sys::Fd> fds_;  // index 2*rank + stream
  std::vector<bool> broken_;  // index 2*rank + stream: a write failed, output dropped
};

// Keeps all output in memory: text(rank, stream) returns the raw bytes.
class CaptureSink : public OutputSink {
 public:
  void bytes(int rank, Stream stream, std::string_view data) override;
  const std::string& text(int rank, Stream stream) const;

 private:
  std::vector<std::string> bufs_;
  std::string empty_;
};

// Splits one worker stream into lines for the sinks. Not copyable (sinks are borrowed).
class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;
  LineSplitter(int rank, Stream stream, std::vector<OutputSink*> sinks)
      : rank_(rank), stream_(stream), sinks_(std::move(sinks)) {}
  void feed(std::string_view data);
  // EOF: flushes a partial last line (as a line; its missing '\n' is not invented in bytes()).
  void finish();

 private:
  void emit_line(std::string_view line);
  void feed_lines(std::string_view data);
  int rank_;
  Stream stream_;
  std::vector<OutputSink*> sinks_;
  std::string partial_;
  bool finished_ = false;
};

}  // namespace lspawn
