#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "supervisor/output.hpp"
#include "sys/sys.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"

using lspawn::LineSplitter;
using lspawn::OutputSink;
using lspawn::Stream;
using lspawn::test::read_file;
using lspawn::test::TempDir;

namespace {
struct Recorder : OutputSink {
  std::vector<std::string> lines;
  std::string bytes_seen;
  int closes = 0;
  void bytes(int, Stream, std::string_view d) override { bytes_seen.append(d); }
  void line(int rank, Stream s, std::string_view l) override {
    lines.push_back(std::to_string(rank) + (s == Stream::Stdout ? "o:" : "e:") + std::string(l));
  }
  void closed(int, Stream) override { ++closes; }
};

// A console that is a file, DIR/console, for both streams.
struct FileConsole {
  TempDir dir;
  int fd = ::open(dir.file("console").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  lspawn::ConsoleSink::Options options() const {
    lspawn::ConsoleSink::Options co;
    co.stdout_fd = fd;
    co.stderr_fd = fd;
    return co;
  }
  std::string text() const { return read_file(dir.file("console")); }
  ~FileConsole() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

TEST_CASE("LineSplitter: lines across reads - partial last line at EOF", "[output]") {
  Recorder r;
  LineSplitter s(2, Stream::Stderr, {&r});
  s.feed("ab");
  s.feed("c\nde");
  s.feed("f\n\ng");
  CHECK(r.lines == std::vector<std::string>{"2e:abc", "2e:def", "2e:"});
  s.finish();
  CHECK(r.lines.back() == "2e:g");
  CHECK(r.bytes_seen == "abc\ndef\n\ng");  // raw bytes: nothing added
  CHECK(r.closes == 1);
  s.finish();  // idempotent
  CHECK(r.closes == 1);
}

TEST_CASE("LineSplitter: lines over 64 KiB come in 64 KiB pieces - nothing lost", "[output]") {
  Recorder r;
  LineSplitter s(0, Stream::Stdout, {&r});
  const size_t k = LineSplitter::kMaxLine;
  std::string big(2 * k + 10, 'x');
  // In one read, and dribbled in 1000-byte reads.
  s.feed(big + "\n");
  for (size_t off = 0; off < big.size(); off += 1000) s.feed(big.substr(off, 1000));
  s.feed("\n");
  std::string joined;
  size_t pieces = 0;
  for (auto& l : r.lines) {
    CHECK(l.size() - 3 <= k);
    joined += l.substr(3);
    ++pieces;
  }
  CHECK(joined == big + big);
  CHECK(pieces == 6);  // 3 per line, no empty line
  // Exactly kMaxLine then '\n' in a later read: one line, not a piece plus an empty line.
  r.lines.clear();
  s.feed(std::string(k, 'y'));
  s.feed("\n");
  REQUIRE(r.lines.size() == 1);
  CHECK(r.lines[0].size() == 3 + k);
}

TEST_CASE("ConsoleSink: one write per prefixed line - LogDirSink: exact bytes", "[output]") {
  FileConsole file;
  REQUIRE(file.fd >= 0);
  lspawn::ConsoleSink console(file.options());
  lspawn::LogDirSink logs(file.dir.path);
  lspawn::CaptureSink cap;
  LineSplitter s(1, Stream::Stdout, {&console, &logs, &cap});
  s.feed("one\ntw");
  s.finish();
  LineSplitter e(1, Stream::Stderr, {&console, &logs, &cap});
  e.finish();  // silent stream: an empty log file still exists
  CHECK(file.text() == "[rank 1] one\n[rank 1] tw\n");
  CHECK(read_file(logs.path(1, Stream::Stdout)) == "one\ntw");
  CHECK(access(logs.path(1, Stream::Stderr).c_str(), F_OK) == 0);
  CHECK(read_file(logs.path(1, Stream::Stderr)).empty());
  CHECK(cap.text(1, Stream::Stdout) == "one\ntw");
  CHECK(cap.text(5, Stream::Stdout).empty());
}

TEST_CASE("LogDirSink: attempt k > 0 writes rank<N>.attempt<k>.* - the files of attempt 0 are kept", "[output]") {
  const TempDir tmp;
  const std::string dir = tmp.path;
  lspawn::LogDirSink logs(dir);
  auto write = [&](const std::string& text) {
    LineSplitter s(0, Stream::Stdout, {&logs});
    s.feed(text);
    s.finish();
  };
  write("first\n");
  CHECK(logs.path(0, Stream::Stdout) == dir + "/rank0.stdout");
  logs.set_attempt(1);
  CHECK(logs.path(0, Stream::Stdout) == dir + "/rank0.attempt1.stdout");
  CHECK(logs.path(3, Stream::Stderr) == dir + "/rank3.attempt1.stderr");
  write("second\n");
  CHECK(read_file(dir + "/rank0.stdout") == "first\n");
  CHECK(read_file(dir + "/rank0.attempt1.stdout") == "second\n");
}

TEST_CASE("ConsoleSink: a closed console (EPIPE) is dropped - not fatal", "[output]") {
  auto p = lspawn::sys::make_pipe("test");
  p.read.reset();
  signal(SIGPIPE, SIG_IGN);
  lspawn::ConsoleSink::Options co;
  co.stdout_fd = p.write.get();
  lspawn::ConsoleSink console(co);
  console.line(0, Stream::Stdout, "into the void");
  console.line(0, Stream::Stdout, "again");
  SUCCEED();
}

TEST_CASE("LogDirSink: a full log file (ENOSPC) is reported once and dropped - not fatal", "[output]") {
  const TempDir tmp;
  const std::string dir = tmp.path;
  // rank0.stdout is /dev/full: every write fails with ENOSPC, as on a full file system.
  REQUIRE(::symlink("/dev/full", (dir + "/rank0.stdout").c_str()) == 0);
  std::vector<std::string> warnings;
  lspawn::LogDirSink sink(dir, [&](const std::string& w) { warnings.push_back(w); });
  CHECK_NOTHROW(sink.bytes(0, Stream::Stdout, "first\n"));
  CHECK_NOTHROW(sink.bytes(0, Stream::Stdout, "second\n"));
  CHECK_NOTHROW(sink.bytes(0, Stream::Stderr, "other stream still written\n"));
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(dir + "/rank0.stdout") != std::string::npos);
  CHECK(warnings[0].find("No space left on device") != std::string::npos);
  CHECK(warnings[0].find("the rest of this stream is dropped") != std::string::npos);
  sink.closed(0, Stream::Stderr);
  CHECK(read_file(dir + "/rank0.stderr") == "other stream still written\n");
}

TEST_CASE("ConsoleSink: prefix_of (torchrun's --log-line-prefix-template) replaces \"[rank N] \", asked once per rank",
          "[output]") {
  FileConsole file;
  REQUIRE(file.fd >= 0);
  lspawn::ConsoleSink::Options co = file.options();
  co.host = "h1";  // a template wins over the multi-node form too
  int asked = 0;
  co.prefix_of = [&asked](int rank) {
    ++asked;
    return "<" + std::to_string(rank) + ">:";
  };
  CHECK(lspawn::console_prefix(co, 3) == "<3>:");
  asked = 0;
  lspawn::ConsoleSink console(co);
  console.line(3, Stream::Stdout, "a");
  console.line(3, Stream::Stderr, "b");
  console.line(0, Stream::Stdout, "c");
  CHECK(file.text() == "<3>:a\n<3>:b\n<0>:c\n");
  CHECK(asked == 2);
  co.prefix_of = nullptr;
  CHECK(lspawn::console_prefix(co, 3) == "[h1 rank 3] ");
  co.prefix = false;
  CHECK(lspawn::console_prefix(co, 3).empty());
}

TEST_CASE("FilteredCopySink: the lines that contain a filter, prefixed, in one file per stream - attempt k its own",
          "[output]") {
  const TempDir tmp;
  const std::string dir = tmp.path;
  {
    lspawn::FilteredCopySink sink(dir, {"loss", "acc,top1"}, {},
                                  [](int rank) { return "[" + std::to_string(rank) + "] "; });
    CHECK(sink.path(Stream::Stdout) == dir + "/filtered_stdout.log");
    CHECK(access((dir + "/filtered_stdout.log").c_str(), F_OK) == 0);  // at once, before any line
    CHECK(access((dir + "/filtered_stderr.log").c_str(), F_OK) != 0);  // no filter: no file
    LineSplitter r0(0, Stream::Stdout, {&sink});
    LineSplitter r1(1, Stream::Stdout, {&sink});
    LineSplitter e1(1, Stream::Stderr, {&sink});
    r0.feed("step 1 loss 0.5\nstep 1 other\n");
    r1.feed("acc,top1 = 0.9\nacc top1 no\n");
    e1.feed("loss on stderr is not stdout's\n");
    r0.finish();
    r1.finish();
    e1.finish();
    CHECK(read_file(dir + "/filtered_stdout.log") == "[0] step 1 loss 0.5\n[1] acc,top1 = 0.9\n");
    sink.set_attempt(2);
    CHECK(sink.path(Stream::Stdout) == dir + "/filtered_stdout.attempt2.log");
    sink.line(1, Stream::Stdout, "loss again");
    CHECK(read_file(dir + "/filtered_stdout.log") == "[0] step 1 loss 0.5\n[1] acc,top1 = 0.9\n");
    CHECK(read_file(dir + "/filtered_stdout.attempt2.log") == "[1] loss again\n");
  }
  // A directory that cannot take the file: the constructor throws, naming it.
  const std::string missing = dir + "/no/such";
  try {
    lspawn::FilteredCopySink bad(missing, {}, {"x"}, nullptr);
    FAIL("no error");
  } catch (const lspawn::sys::SysError& e) {
    CHECK(std::string(e.what()).find(missing + "/filtered_stderr.log") != std::string::npos);
  }
  // A write error (ENOSPC) is said once and drops the rest of that file.
  REQUIRE(::symlink("/dev/full", (dir + "/filtered_stderr.log").c_str()) == 0);
  std::vector<std::string> warnings;
  lspawn::FilteredCopySink full(dir, {}, {"E"}, nullptr, [&](const std::string& w) { warnings.push_back(w); });
  CHECK_NOTHROW(full.line(0, Stream::Stderr, "E1"));
  CHECK_NOTHROW(full.line(0, Stream::Stderr, "E2"));
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("No space left on device; the rest of this file is dropped") != std::string::npos);
  // A later attempt's file that cannot be opened (its directory is gone): said, not thrown.
  const std::string gone = lspawn::sys::make_temp_dir("lspawn-out-");
  lspawn::FilteredCopySink later(gone, {"x"}, {}, nullptr, [&](const std::string& w) { warnings.push_back(w); });
  lspawn::sys::remove_tree(gone);
  CHECK_NOTHROW(later.set_attempt(1));
  CHECK_NOTHROW(later.line(0, Stream::Stdout, "x"));
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[1].find(gone + "/filtered_stdout.attempt1.log") != std::string::npos);
  CHECK(warnings[1].find("this attempt's filtered lines are dropped") != std::string::npos);
}

TEST_CASE(
    "ConsoleSink: the lines of one read share writes of at most 4096 bytes, whole lines each - a longer line "
    "is one write alone",
    "[output]") {
  // SOCK_SEQPACKET keeps each write(2) as one message: the test sees the writes themselves.
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  int big = 1 << 20;
  ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  ::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  lspawn::ConsoleSink::Options co;
  co.stdout_fd = sv[0];
  co.stderr_fd = sv[0];
  lspawn::ConsoleSink console(co);
  std::string data, want;
  for (int i = 0; i < 1000; ++i) {
    const std::string line = "line " + std::to_string(i) + " " + std::string(64, 'x');
    data += line + "\n";
    want += "[rank 2] " + line + "\n";
  }
  const std::string huge(10000, 'h');
  data += huge + "\nlast\n";
  want += "[rank 2] " + huge + "\n[rank 2] last\n";
  LineSplitter s(2, Stream::Stdout, {&console});
  s.feed(data);                              // one read
  console.line(2, Stream::Stdout, "alone");  // outside a read: written at once
  ::shutdown(sv[0], SHUT_WR);
  std::vector<std::string> writes;
  std::vector<char> msg(1 << 16);
  for (ssize_t n; (n = ::recv(sv[1], msg.data(), msg.size(), 0)) > 0;)
    writes.emplace_back(msg.data(), static_cast<size_t>(n));
  ::close(sv[0]);
  ::close(sv[1]);
  std::string got;
  size_t over = 0;
  for (const auto& w : writes) {
    got += w;
    CHECK(w.back() == '\n');                          // whole lines only
    if (w.size() > lspawn::ConsoleSink::kWriteMax) {  // only the 10000-byte line, alone
      ++over;
      CHECK(w == "[rank 2] " + huge + "\n");
    }
  }
  CHECK(over == 1);
  CHECK(got == want + "[rank 2] alone\n");
  CHECK(writes.back() == "[rank 2] alone\n");
  CHECK(writes.size() < 40);  // ~80 KB of lines in 4 KiB writes, not 1002 writes
}
