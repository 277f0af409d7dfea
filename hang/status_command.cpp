#include "hang/status_command.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <dirent.h>
#include <unistd.h>

#include "sys/exit_codes.hpp"
#include "hang/hang_watch.hpp"
#include "sys/sys.hpp"
#include "status/reader.hpp"

namespace lspawn {

std::optional<std::string> find_status_dir(pid_t pid) {
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(fds.c_str());
  if (!d) return std::nullopt;
  std::optional<std::string> found;
  const std::string suffix = std::string("/") + kStatusDirName;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char buf[4096];
    const ssize_t n = ::readlink((fds + "/" + e->d_name).c_str(), buf, sizeof buf - 1);
    if (n <= 0) continue;
    const std::string target(buf, static_cast<size_t>(n));
    if (target.size() > suffix.size() && target.compare(target.size() - suffix.size(), suffix.size(), suffix) == 0) {
      found = target;
      break;
    }
  }
  ::closedir(d);
  return found;
}

int run_status_command(const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0].empty() || args[0].find_first_not_of("0123456789") != std::string::npos ||
      args[0].size() > 9) {
    std::fprintf(stderr, "lspawn status: expected the pid of a running lspawn (lspawn status PID)\n");
    return exit_codes::kUsage;
  }
  const pid_t pid = static_cast<pid_t>(std::strtol(args[0].c_str(), nullptr, 10));
  const auto dir = find_status_dir(pid);
  if (!dir) {
    std::fprintf(stderr,
                 "lspawn status: process %d is not a running lspawn job this user may inspect "
                 "(no %s directory among /proc/%d/fd)\n",
                 pid, kStatusDirName, pid);
    return 1;
  }
  // The ranks: every record in the directory, with the pid that writes it.
  std::vector<WorkerResult> workers;
  if (DIR* d = ::opendir(dir->c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      int rank = -1;
      char tail[16] = {};
      if (std::sscanf(e->d_name, "rank-%d.statu%1s", &rank, tail) != 2 || std::strcmp(tail, "s") != 0) continue;
      if (std::to_string(rank).size() + 12 != std::strlen(e->d_name)) continue;  // rank-N.status only
      WorkerResult w;
      w.rank = rank;
      try {
        if (auto r = status::RecordReader::open(status::record_path(*dir, rank))) w.pid = r->read().pid;
      } catch (const std::exception&) {}
      workers.push_back(w);
    }
    ::closedir(d);
  }
  std::sort(workers.begin(), workers.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  HangWatchOptions o;
  o.dir = *dir;
  std::string report;
  o.print = [&](const std::string& text) { report = text; };
  HangWatch watch(o);
  watch.request_report();
  while (report.empty()) {
    const auto due = watch.next_deadline();
    const auto now = sys::Clock::now();
    if (due > now)
      ::usleep(static_cast<useconds_t>(std::chrono::duration_cast<std::chrono::microseconds>(due - now).count()));
    watch.poll(sys::Clock::now(), workers);
  }
  std::fputs(report.c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace lspawn
