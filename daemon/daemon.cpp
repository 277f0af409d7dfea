#include "daemon/daemon.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>

#include "sys/duration_text.hpp"
#include "sys/exit_codes.hpp"
#include "daemon/daemon_client.hpp"
#include "spawn/elf.hpp"
#include "sys/fd_frame.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/forkserver_hook.hpp"
#include "sys/sys.hpp"
#include "proto/wire.hpp"

namespace lspawn::daemon {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMaxRequestBytes = 4u << 20;

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// One line of the daemon's log: to o.log, else to stderr as "lspawn daemon: LINE".
void log_line(const Options& o, const std::string& line) {
  if (o.log) {
    o.log(line);
    return;
  }
  try {
    sys::write_all(2, "lspawn daemon: " + line + "\n", "stderr");
  } catch (const sys::SysError&) {}
}

// The socket's directory: created 0700 when missing; else it must be a directory (not a link)
// of this user with no access for group and others.
void ensure_private_dir(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) throw DaemonError("socket directory " + dir + ": " + std::strerror(errno));
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      throw DaemonError("cannot create the socket directory " + dir + ": " + std::strerror(errno));
    }
    if (::lstat(dir.c_str(), &st) != 0) throw DaemonError("socket directory " + dir + ": " + std::strerror(errno));
  }
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    throw DaemonError("socket directory " + dir + " is not a private directory of uid " + std::to_string(::geteuid()) +
                      " (" + (S_ISDIR(st.st_mode) ? "a directory" : "not a directory") + ", owner uid " +
                      std::to_string(st.st_uid) + ", mode " + mode + "); use a directory of mode 0700 (--socket PATH)");
  }
}

// What makes a program file "unchanged": the same file (device, inode) with the same size and
// times. A rebuilt binary (new inode, or rewritten in place: new size/mtime/ctime) differs.
std::string file_identity(const struct stat& st) {
  std::ostringstream s;
  s << "dev " << st.st_dev << " ino " << st.st_ino << " size " << st.st_size << " mtime " << st.st_mtim.tv_sec << "."
    << st.st_mtim.tv_nsec << " ctime " << st.st_ctim.tv_sec << "." << st.st_ctim.tv_nsec;
  return s.str();
}

// One program's warm forkserver.
struct Warm {
  std::string key;  // path, identity, argv, environment
  std::string path;
  std::string identity;  // file_identity() of path when it was executed
  std::unique_ptr<Forkserver> server;
  std::set<pid_t> runs_alive;  // per-run servers still running
  int64_t runs = 0;
  Clock::time_point last_used;
  bool stale = false;  // its file changed: stopped once its runs are over
};

// A client connection waiting for its request.
struct Conn {
  sys::Fd fd;
  sys::PeerCred peer;
  std::string buf;
  Clock::time_point deadline;
  std::string who() const { return "pid " + std::to_string(peer.pid) + " (uid " + std::to_string(peer.uid) + ")"; }
};

class Server {
 public:
  Server(const Options& o, sys::Fd listener, int sigfd, const sigset_t& stop)
      : o_(o), listener_(std::move(listener)), sigfd_(sigfd), stop_(stop) {}

  void serve() {
    while (!stopping_) {
      std::vector<pollfd> pfds{{listener_.get(), POLLIN, 0}, {sigfd_, POLLIN, 0}};
      for (auto& c : conns_) pfds.push_back({c.fd.get(), POLLIN, 0});
      const size_t first_warm = pfds.size();
      for (auto& w : warm_) pfds.push_back({w->server->exit_fd(), POLLIN, 0});
      const auto due = next_deadline();
      int timeout = -1;
      if (due != Clock::time_point::max()) {
        timeout = static_cast<int>(std::clamp<long long>(
            std::chrono::duration_cast<std::chrono::milliseconds>(due - Clock::now()).count() + 1, 0, 1 << 30));
      }
      const int n = ::poll(pfds.data(), pfds.size(), timeout);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) sys::throw_errno("poll", "lspawn daemon");
      if (pfds[1].revents) {
        signalfd_siginfo si{};
        if (::read(sigfd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
          log("received " + sys::signal_name(static_cast<int>(si.ssi_signo)) + "; stopping");
          stopping_ = true;
          break;
        }
      }
      // Exits of per-run servers (and of forkservers themselves), before new requests.
      std::vector<Warm*> ready;
      for (size_t i = 0; i < warm_.size(); ++i) {
        if (pfds[first_warm + i].revents) ready.push_back(warm_[i].get());
      }
      for (Warm* w : ready) on_exits(*w);
      std::vector<int> readable;
      for (size_t i = 0; i < conns_.size(); ++i) {
        if (pfds[2 + i].revents) readable.push_back(conns_[i].fd.get());
      }
      for (int fd : readable) on_readable(fd);
      if (pfds[0].revents) accept_all();
      expire(Clock::now());
    }
  }

  // Stops every forkserver (their servers and workers die with them) and drops the clients.
  void shut_down() {
    conns_.clear();
    for (auto& w : warm_) {
      if (!w->runs_alive.empty()) {
        log("stopping the forkserver of " + w->path + " (pid " + std::to_string(w->server->pid()) + ") and " +
            std::to_string(w->runs_alive.size()) + " run(s) still using it");
      }
    }
    warm_.clear();  // ~Forkserver: EOF on its socket, it kills what it forked, reaped
  }

 private:
  void log(const std::string& line) { log_line(o_, line); }

  Clock::time_point next_deadline() const {
    Clock::time_point due = Clock::time_point::max();
    for (const auto& c : conns_) due = std::min(due, c.deadline);
    if (o_.idle_timeout.count() > 0) {
      for (const auto& w : warm_) {
        if (w->runs_alive.empty()) due = std::min(due, w->last_used + o_.idle_timeout);
      }
    }
    return due;
  }

  void expire(Clock::time_point now) {
    for (size_t i = 0; i < conns_.size(); ++i) {
      if (now < conns_[i].deadline) continue;
      log("dropped the connection of " + conns_[i].who() + ": no complete request within " +
          seconds_text(o_.request_timeout) + " (" + std::to_string(conns_[i].buf.size()) + " bytes)");
      conns_.erase(conns_.begin() + static_cast<long>(i--));
    }
    for (size_t i = 0; i < warm_.size(); ++i) {
      Warm& w = *warm_[i];
      if (!w.runs_alive.empty()) continue;
      const bool idle = o_.idle_timeout.count() > 0 && now >= w.last_used + o_.idle_timeout;
      if (!idle && !w.stale) continue;
      log("stopping the forkserver of " + w.path + " (pid " + std::to_string(w.server->pid()) +
          "): " + (w.stale ? "the program file changed" : "unused for " + elapsed_text(now - w.last_used)));
      warm_.erase(warm_.begin() + static_cast<long>(i--));
    }
  }

  void accept_all() {
    while (sys::Fd fd = sys::unix_accept(listener_.get(), "lspawn daemon socket " + o_.socket_path)) {
      Conn c;
      try {
        c.peer = sys::peer_cred(fd.get(), "lspawn daemon");
      } catch (const sys::SysError& e) {
        log(std::string("rejected a connection: ") + e.what());
        continue;
      }
      if (c.peer.uid != ::geteuid()) {
        const std::string why = "refused connection from " + c.who() + ": this daemon (pid " +
                                std::to_string(::getpid()) + ") serves uid " + std::to_string(::geteuid()) + " only";
        log(why);
        c.fd = std::move(fd);
        reply_error(c, why);
        continue;
      }
      c.fd = std::move(fd);
      c.deadline = Clock::now() + o_.request_timeout;
      conns_.push_back(std::move(c));
    }
  }

  void reply_error(Conn& c, const std::string& why) {
    proto::DaemonReply r;
    r.version = wire::kSchemaVersion;
    r.daemon_pid = ::getpid();
    r.error = why;
    send(c, r, nullptr, 0);
  }

  bool send(Conn& c, const proto::DaemonReply& r, const int* fds, size_t nfds) {
    try {
      fd_frame::write(c.fd.get(), r, fds, nfds, "reply to " + c.who());
      return true;
    } catch (const std::exception& e) {
      log(std::string("could not reply to ") + c.who() + ": " + e.what());
      return false;
    }
  }

  void on_readable(int fd) {
    auto it = std::find_if(conns_.begin(), conns_.end(), [fd](const Conn& c) { return c.fd.get() == fd; });
    if (it == conns_.end()) return;
    Conn& c = *it;
    char buf[64 * 1024];
    bool eof = false;
    proto::DaemonRequest req;
    bool have = false;
    try {
      for (;;) {
        const ssize_t n = sys::read_some(c.fd.get(), buf, sizeof buf, "request of " + c.who());
        if (n < 0) break;
        if (n == 0) {
          eof = true;
          break;
        }
        c.buf.append(buf, static_cast<size_t>(n));
        if (c.buf.size() > kMaxRequestBytes + 4) break;
      }
      have = wire::try_decode_frame(c.buf, req, "daemon request", kMaxRequestBytes);
      if (have) wire::check_version(req.version, "DaemonRequest");
    } catch (const std::exception& e) {
      log("rejected the request of " + c.who() + ": bad frame (" + e.what() + ")");
      reply_error(c, std::string("bad request: ") + e.what());
      conns_.erase(it);
      return;
    }
    if (!have) {
      if (eof) {
        if (!c.buf.empty()) {
          log("the connection of " + c.who() + " closed after " + std::to_string(c.buf.size()) +
              " bytes of an incomplete request");
        }
        conns_.erase(it);
      }
      return;
    }
    Conn mine = std::move(c);
    conns_.erase(it);
    handle(mine, req);
  }

  void handle(Conn& c, const proto::DaemonRequest& req) {
    proto::DaemonReply r;
    r.version = wire::kSchemaVersion;
    r.daemon_pid = ::getpid();
    if (req.op == "status") {
      const auto now = Clock::now();
      for (const auto& w : warm_) {
        std::ostringstream line;
        line << "forkserver pid " << w->server->pid() << ", runs " << w->runs << ", running " << w->runs_alive.size()
             << ", idle " << (w->runs_alive.empty() ? elapsed_text(now - w->last_used) : std::string("no")) << ": "
             << w->path << " (" << w->identity << ")" << (w->stale ? " [changed; stopping]" : "");
        r.forkservers.push_back(line.str());
      }
      send(c, r, nullptr, 0);
      return;
    }
    if (req.op == "stop") {
      log("stop requested by " + c.who());
      send(c, r, nullptr, 0);
      stopping_ = true;
      return;
    }
    if (req.op != "forkserver") {
      log("rejected the request of " + c.who() + ": unknown operation '" + req.op.substr(0, 64) + "'");
      reply_error(c, "unknown operation '" + req.op.substr(0, 64) + "' (forkserver, status or stop)");
      return;
    }
    try {
      serve_forkserver(c, req, r);
    } catch (const ForkserverInterrupted& e) {
      log("received " + sys::signal_name(e.signal()) + " while a forkserver started; stopping");
      reply_error(c, "the daemon is stopping");
      stopping_ = true;
    } catch (const std::exception& e) {
      log("forkserver for " + c.who() + " failed: " + e.what());
      reply_error(c, e.what());
    }
  }

  void serve_forkserver(Conn& c, const proto::DaemonRequest& req, proto::DaemonReply& r) {
    if (req.path.empty() || req.path[0] != '/')
      throw DaemonError("the program path '" + req.path + "' is not absolute");
    if (req.argv.empty()) throw DaemonError("empty argv for " + req.path);
    struct stat st;
    if (::stat(req.path.c_str(), &st) != 0) {
      throw DaemonError("cannot stat '" + req.path + "': " + std::strerror(errno));
    }
    const std::string identity = file_identity(st);
    std::string key = req.path + '\0' + identity + '\0';
    key += req.preload ? "preload" : "hook";
    key += '\0';
    for (const auto& a : req.argv) key += a + '\x1e';
    key += '\0';
    std::vector<std::string> env = req.env;
    std::sort(env.begin(), env.end());
    for (const auto& kv : env) key += kv + '\x1e';

    Warm* w = nullptr;
    for (auto& x : warm_) {
      if (x->key == key && !x->stale) w = x.get();
    }
    r.reused = w != nullptr;
    if (!w) {
      for (auto& x : warm_) {
        if (x->path == req.path && x->identity != identity && !x->stale) {
          x->stale = true;
          log("the program file " + req.path + " changed (forkserver pid " + std::to_string(x->server->pid()) +
              " is stopped once its runs end)");
        }
      }
      expire(Clock::now());
      make_room();
      if (req.preload) {
        // lspawn --preload: the interpreter runs lspawn's server script, which serves or refuses.
        if (req.argv.size() < 2 || req.argv[1].size() < 18 ||
            req.argv[1].compare(req.argv[1].size() - 18, 18, "/lspawn_preload.py") != 0) {
          throw DaemonError("a preload request must run lspawn's lspawn_preload.py (argv[1])");
        }
      } else if (!elf::has_section(req.path, kForkserverNoteSection)) {
        throw DaemonError("'" + req.path + "' does not link lspawn's forkserver hook (no " +
                          std::string(kForkserverNoteSection) + " section)");
      }
      const auto t0 = Clock::now();
      auto nw = std::make_unique<Warm>();
      nw->key = key;
      nw->path = req.path;
      nw->identity = identity;
      nw->server = Forkserver::exec(req.path, req.argv, req.env, o_.ready_timeout, &stop_);
      log("started the forkserver of " + req.path + (req.preload ? " preloading " + req.argv.back() : std::string()) +
          " (pid " + std::to_string(nw->server->pid()) + ", ready after " + elapsed_text(Clock::now() - t0) + ") for " +
          c.who());
      warm_.push_back(std::move(nw));
      w = warm_.back().get();
    }
    Forkserver::Handle run = w->server->fork_server();
    w->runs_alive.insert(run.pid);
    w->runs += 1;
    w->last_used = Clock::now();
    r.forkserver_pid = w->server->pid();
    r.server_pid = run.pid;
    r.runs = w->runs;
    const int fds[2] = {run.requests.get(), run.exits.get()};
    send(c, r, fds, 2);
    // Our copies close here: the client holds the server's only request socket now (or, when
    // the reply failed, nobody does and the server exits).
  }

  // At most max_forkservers - 1 before a new one: the idle ones used longest ago go first.
  void make_room() {
    while (warm_.size() >= o_.max_forkservers) {
      auto oldest = warm_.end();
      for (auto it = warm_.begin(); it != warm_.end(); ++it) {
        if (!(*it)->runs_alive.empty()) continue;
        if (oldest == warm_.end() || (*it)->last_used < (*oldest)->last_used) oldest = it;
      }
      if (oldest == warm_.end()) return;  // every one is in use: one more for now
      log("stopping the forkserver of " + (*oldest)->path + " (pid " + std::to_string((*oldest)->server->pid()) +
          "): --max-forkservers " + std::to_string(o_.max_forkservers) + " reached");
      warm_.erase(oldest);
    }
  }

  void on_exits(Warm& w) {
    bool gone = false;
    for (const auto& e : w.server->read_exits(&gone)) {
      w.runs_alive.erase(static_cast<pid_t>(e.pid));
      w.last_used = Clock::now();
    }
    if (!gone) return;
    log("the forkserver of " + w.path + " (pid " + std::to_string(w.server->pid()) + ") exited" +
        (w.runs_alive.empty() ? "" : "; " + std::to_string(w.runs_alive.size()) + " run(s) lost their workers"));
    for (size_t i = 0; i < warm_.size(); ++i) {
      if (warm_[i].get() == &w) {
        warm_.erase(warm_.begin() + static_cast<long>(i));
        break;
      }
    }
  }

  const Options& o_;
  sys::Fd listener_;
  int sigfd_;
  sigset_t stop_;
  std::vector<Conn> conns_;
  std::vector<std::unique_ptr<Warm>> warm_;
  bool stopping_ = false;
};

}  // namespace

std::string default_socket_path() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg == '/') return std::string(xdg) + "/lspawn/daemon.sock";
  return "/tmp/lspawn-" + std::to_string(::geteuid()) + "/daemon.sock";
}

int run(const Options& in) {
  Options o = in;
  if (o.socket_path.empty()) o.socket_path = default_socket_path();
  auto say = [&](const std::string& line) { log_line(o, line); };
  sigset_t stop, old;
  sigemptyset(&stop);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop, sig);
  ::sigprocmask(SIG_BLOCK, &stop, &old);
  ::signal(SIGPIPE, SIG_IGN);
  struct Restore {
    sigset_t mask;
    ~Restore() { ::sigprocmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old};
  sys::Fd sigfd(::signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd) {
    say(std::string("signalfd: ") + std::strerror(errno));
    return 1;
  }
  sys::Fd listener;
  try {
    ensure_private_dir(dir_of(o.socket_path));
    int err = 0;
    if (sys::Fd other = sys::unix_connect(o.socket_path, &err)) {
      std::string pid, why;
      if (auto r = ask(o.socket_path, "status", &why)) pid = " (pid " + std::to_string(r->daemon_pid) + ")";
      throw DaemonError("a daemon" + pid + " already listens on " + o.socket_path);
    }
    ::unlink(o.socket_path.c_str());  // a socket left by a daemon that died
    const mode_t old_mask = ::umask(0177);
    try {
      listener = sys::unix_listen(o.socket_path);
    } catch (...) {
      ::umask(old_mask);
      throw;
    }
    ::umask(old_mask);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
  say("listening on " + o.socket_path + " (pid " + std::to_string(::getpid()) + ", uid " + std::to_string(::geteuid()) +
      ")");
  Server server(o, std::move(listener), sigfd.get(), stop);
  int code = 0;
  try {
    server.serve();
  } catch (const std::exception& e) {
    say(std::string("internal error: ") + e.what());
    code = exit_codes::kInternal;
  }
  server.shut_down();
  ::unlink(o.socket_path.c_str());
  say("stopped");
  return code;
}

int run_command(const std::vector<std::string>& args) {
  Options o;
  std::string query;
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr,
                 "lspawn daemon: %s\nusage: lspawn daemon [--socket PATH] [--max-forkservers N] "
                 "[--idle-timeout SECONDS] | lspawn daemon --status|--stop [--socket PATH]\n",
                 msg.c_str());
    return exit_codes::kUsage;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* what) -> const std::string* {
      if (i + 1 >= args.size()) return nullptr;
      (void)what;
      return &args[++i];
    };
    if (a == "--socket") {
      const std::string* v = value("PATH");
      if (!v || v->empty()) return bad("--socket: expected a path (--socket PATH)");
      o.socket_path = *v;
    } else if (a == "--max-forkservers") {
      const std::string* v = value("N");
      char* end = nullptr;
      const long n = v ? std::strtol(v->c_str(), &end, 10) : 0;
      if (!v || v->empty() || *end || n < 1 || n > 1024) return bad("--max-forkservers: expected an integer 1..1024");
      o.max_forkservers = static_cast<size_t>(n);
    } else if (a == "--idle-timeout") {
      const std::string* v = value("SECONDS");
      char* end = nullptr;
      const long n = v ? std::strtol(v->c_str(), &end, 10) : -1;
      if (!v || v->empty() || *end || n < 0) return bad("--idle-timeout: expected whole seconds >= 0 (0: never)");
      o.idle_timeout = std::chrono::seconds(n);
    } else if (a == "--status" || a == "--stop") {
      query = a.substr(2);
    } else {
      return bad("unknown option '" + a + "'");
    }
  }
  if (query.empty()) return run(o);
  const std::string path = o.socket_path.empty() ? default_socket_path() : o.socket_path;
  std::string why;
  const auto r = ask(path, query, &why);
  if (!r) {
    std::fprintf(stderr, "lspawn daemon: no daemon on %s (%s)\n", path.c_str(), why.c_str());
    return 1;
  }
  if (!r->error.empty()) {
    std::fprintf(stderr, "lspawn daemon: %s\n", r->error.c_str());
    return 1;
  }
  if (query == "status") {
    std::printf("lspawn daemon pid %lld on %s: %zu forkserver%s\n", static_cast<long long>(r->daemon_pid), path.c_str(),
                r->forkservers.size(), r->forkservers.size() == 1 ? "" : "s");
    for (const auto& line : r->forkservers) std::printf("  %s\n", line.c_str());
  } else {
    std::printf("lspawn daemon pid %lld on %s: stopping\n", static_cast<long long>(r->daemon_pid), path.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace lspawn::daemon
