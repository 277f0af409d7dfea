#include "supervisor/output.hpp"

#include <cerrno>

#include <fcntl.h>
#include <unistd.h>

namespace lspawn {

const char* stream_name(Stream s) { return s == Stream::Stdout ? "stdout" : "stderr"; }

namespace {
// The answer of `make(rank)`, asked once per rank (a template: no std::function per line).
template <class Make>
const std::string& cached_prefix(std::vector<std::optional<std::string>>& cache, int rank, const Make& make) {
  const size_t i = rank < 0 ? 0 : static_cast<size_t>(rank);
  if (cache.size() <= i) cache.resize(i + 1);
  if (!cache[i]) cache[i] = make(rank);
  return *cache[i];
}
// A log file's write error: through `warn`, else one "lspawn: ..." line on stderr.
void warn_or_say(const std::function<void(const std::string&)>& warn, const std::string& msg) {
  if (warn) {
    warn(msg);
    return;
  }
  try {
    sys::write_all(2, "lspawn: " + msg + "\n", "stderr");
  } catch (const sys::SysError&) {}
}
}  // namespace

std::string console_prefix(const ConsoleSink::Options& o, int rank) {
  if (!o.prefix) return {};
  if (o.prefix_of) return o.prefix_of(rank);
  return (o.host.empty() ? "[rank " : "[" + o.host + " rank ") + std::to_string(rank) + "] ";
}

void ConsoleSink::line(int rank, Stream stream, std::string_view line) {
  const int idx = static_cast<int>(stream);
  if (broken_[idx]) return;
  static const std::string kNoPrefix;
  const std::string& prefix =
      opts_.prefix ? cached_prefix(prefixes_, rank, [this](int r) { return console_prefix(opts_, r); }) : kNoPrefix;
  std::string& out = pending_[idx];
  if (!out.empty() && out.size() + prefix.size() + line.size() + 1 > kWriteMax) flush(idx);
  out += prefix;
  out.append(line.data(), line.size());
  out += '\n';
  if (!holding_) flush(idx);
}

void ConsoleSink::end_lines() {
  holding_ = false;
  flush(0);
  flush(1);
}

void ConsoleSink::flush(int idx) {
  std::string& out = pending_[idx];
  if (out.empty()) return;
  const int fd = idx == 0 ? opts_.stdout_fd : opts_.stderr_fd;
  try {
    if (!broken_[idx]) sys::write_all(fd, out, "console");
  } catch (const sys::SysError&) {
    broken_[idx] = true;  // EPIPE or a closed console: drop output, keep supervising
  }
  out.clear();
}

std::string LogDirSink::path(int rank, Stream stream) const {
  return dir_ + "/rank" + std::to_string(rank) + (attempt_ > 0 ? ".attempt" + std::to_string(attempt_) : "") + "." +
         stream_name(stream);
}

void LogDirSink::set_attempt(int k) {
  if (k == attempt_) return;
  attempt_ = k;
  fds_.clear();
  broken_.clear();
}

int LogDirSink::fd_for(int rank, Stream stream) {
  const size_t idx = 2 * static_cast<size_t>(rank) + static_cast<size_t>(stream);
  if (fds_.size() <= idx) fds_.resize(idx + 1);
  if (!fds_[idx]) {
    const std::string p = path(rank, stream);
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
    if (fd < 0) sys::throw_errno("open", "log file " + p);
    fds_[idx].reset(fd);
  }
  return fds_[idx].get();
}

void LogDirSink::bytes(int rank, Stream stream, std::string_view data) {
  const size_t idx = 2 * static_cast<size_t>(rank) + static_cast<size_t>(stream);
  if (idx < broken_.size() && broken_[idx]) return;
  try {
    sys::write_all(fd_for(rank, stream), data, "log file " + path(rank, stream));
  } catch (const sys::SysError& e) {
    if (broken_.size() <= idx) broken_.resize(idx + 1);
    broken_[idx] = true;
    warn_or_say(warn_, std::string(e.what()) + "; the rest of this stream is dropped");
  }
}

void LogDirSink::closed(int rank, Stream stream) {
  fd_for(rank, stream);  // create an empty file for a silent stream
  const size_t idx = 2 * static_cast<size_t>(rank) + static_cast<size_t>(stream);
  fds_[idx].reset();
}

FilteredCopySink::FilteredCopySink(std::string dir, std::vector<std::string> stdout_filters,
                                   std::vector<std::string> stderr_filters, std::function<std::string(int)> prefix_of,
                                   Warn warn)
    : dir_(std::move(dir)), prefix_of_(std::move(prefix_of)), warn_(std::move(warn)) {
  if (!prefix_of_) prefix_of_ = [](int) { return std::string(); };
  filters_[0] = std::move(stdout_filters);
  filters_[1] = std::move(stderr_filters);
  open_files();
}

std::string FilteredCopySink::path(Stream stream) const {
  return dir_ + "/filtered_" + stream_name(stream) + (attempt_ > 0 ? ".attempt" + std::to_string(attempt_) : "") +
         ".log";
}

void FilteredCopySink::open_files() {
  for (Stream s : {Stream::Stdout, Stream::Stderr}) {
    const int idx = static_cast<int>(s);
    fds_[idx].reset();
    broken_[idx] = false;
    if (filters_[idx].empty()) continue;
    const std::string p = path(s);
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
    if (fd < 0) sys::throw_errno("open", "filtered log file " + p);
    fds_[idx].reset(fd);
  }
}

void FilteredCopySink::set_attempt(int k) {
  if (k == attempt_) return;
  flush(0);
  flush(1);
  attempt_ = k;
  try {
    open_files();
  } catch (const sys::SysError& e) {  // a later attempt's file: said, and the run goes on without it
    warn_or_say(warn_, std::string(e.what()) + "; this attempt's filtered lines are dropped");
  }
}

void FilteredCopySink::line(int rank, Stream stream, std::string_view line) {
  const int idx = static_cast<int>(stream);
  if (!fds_[idx] || broken_[idx]) return;
  bool match = false;
  for (const std::string& f : filters_[idx]) match = match || line.find(f) != std::string_view::npos;
  if (!match) return;
  std::string& out = pending_[idx];
  out += cached_prefix(prefixes_, rank, prefix_of_);
  out.append(line.data(), line.size());
  out += '\n';
  if (!holding_ || out.size() >= kHoldMax) flush(idx);
}

void FilteredCopySink::end_lines() {
  holding_ = false;
  flush(0);
  flush(1);
}

void FilteredCopySink::flush(int idx) {
  std::string& out = pending_[idx];
  if (out.empty()) return;
  try {
    if (fds_[idx] && !broken_[idx]) sys::write_all(fds_[idx].get(), out, "filtered log file " + path(Stream(idx)));
  } catch (const sys::SysError& e) {
    broken_[idx] = true;
    warn_or_say(warn_, std::string(e.what()) + "; the rest of this file is dropped");
  }
  out.clear();
}

void CaptureSink::bytes(int rank, Stream stream, std::string_view data) {
  const size_t idx = 2 * static_cast<size_t>(rank) + static_cast<size_t>(stream);
  if (bufs_.size() <= idx) bufs_.resize(idx + 1);
  bufs_[idx].append(data.data(), data.size());
}

const std::string& CaptureSink::text(int rank, Stream stream) const {
  const size_t idx = 2 * static_cast<size_t>(rank) + static_cast<size_t>(stream);
  return idx < bufs_.size() ? bufs_[idx] : empty_;
}

void LineSplitter::emit_line(std::string_view line) {
  for (auto* s : sinks_) s->line(rank_, stream_, line);
}

void LineSplitter::feed(std::string_view data) {
  if (data.empty()) return;
  for (auto* s : sinks_) s->bytes(rank_, stream_, data);
  for (auto* s : sinks_) s->begin_lines();
  feed_lines(data);
  for (auto* s : sinks_) s->end_lines();
}

void LineSplitter::feed_lines(std::string_view data) {
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t nl = data.find('\n', pos);
    if (nl == std::string_view::npos) {
      partial_.append(data.data() + pos, data.size() - pos);
      break;
    }
    if (partial_.empty()) {
      // Fast path: a whole line inside this read.
      std::string_view line = data.substr(pos, nl - pos);
      while (line.size() > kMaxLine) {
        emit_line(line.substr(0, kMaxLine));
        line.remove_prefix(kMaxLine);
      }
      emit_line(line);
    } else {
      partial_.append(data.data() + pos, nl - pos);
      std::string_view line = partial_;
      while (line.size() > kMaxLine) {
        emit_line(line.substr(0, kMaxLine));
        line.remove_prefix(kMaxLine);
      }
      emit_line(line);
      partial_.clear();
    }
    pos = nl + 1;
  }
  // A line still growing past the bound: flush whole pieces now, keep the rest.
  // Keep at least one byte back so a '\n' right after a piece does not make an empty line.
  if (partial_.size() > kMaxLine) {
    size_t off = 0;
    while (partial_.size() - off > kMaxLine) {
      emit_line(std::string_view(partial_).substr(off, kMaxLine));
      off += kMaxLine;
    }
    partial_.erase(0, off);
  }
}

void LineSplitter::finish() {
  if (finished_) return;
  finished_ = true;
  if (!partial_.empty()) {
    emit_line(partial_);
    partial_.clear();
  }
  for (auto* s : sinks_) s->closed(rank_, stream_);
}

}  // namespace lspawn
