#include "launcher/fanout.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher/hosts.hpp"
#include "launcher/say.hpp"
#include "sys/child_setup.hpp"
#include "sys/exit_codes.hpp"
#include "supervisor/install_layout.hpp"
#include "supervisor/job_secret.hpp"
#include "sys/sys.hpp"

extern char** environ;

namespace lspawn::cli {
namespace {

using Clock = std::chrono::steady_clock;

// One host's remote shell, as the caller sees it.
struct Remote {
  hosts::Host host;
  pid_t pid = -1;
  sys::Fd control;                 // its stdin: the channel (control_stdin.hpp)
  sys::Fd out, err;                // its stdout and stderr
  std::string out_part, err_part;  // a line not ended yet
  std::string last_err_line;       // for a message about a remote shell that failed
  bool lspawn_spoke = false;       // a line of its lspawn came ("lspawn: ..."): it ran there
  std::optional<int> status;       // its wait status, once reaped
  bool running() const { return !status || out || err; }
};

// What the caller is told to do, from its options.
struct Plan {
  std::vector<std::string> rsh;  // the remote shell's words
  std::string rsh_path;          // rsh[0] as found on PATH
  hosts::RemoteJob job;          // its hosts, what each runs
  std::string secret;
};

std::string read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("--hostfile: cannot read '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string cwd() {
  char buf[4096];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string(".");
}

// The caller's arguments but the options that choose the hosts (CliOptions::host_option_args).
std::vector<std::string> forwarded(const CliOptions& o, const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (std::find(o.host_option_args.begin(), o.host_option_args.end(), i) == o.host_option_args.end()) {
      out.push_back(args[i]);
    }
  }
  return out;
}

Plan make_plan(const CliOptions& o, const std::vector<std::string>& args) {
  Plan p;
  p.job.hosts = o.hostfile.empty() ? hosts::parse_hosts_list(o.hosts_list)
                                   : hosts::parse_hostfile(read_hostfile(o.hostfile), o.hostfile);
  p.rsh = hosts::with_ssh_defaults(hosts::rsh_command(o.rsh, process_environment()));
  int err = 0;
  const auto rsh_path = sys::find_executable(p.rsh[0], &err);
  if (!rsh_path) {
    throw UsageError("the remote shell '" + p.rsh[0] + "' cannot be run here: " + std::strerror(err) +
                     " (--rsh CMD or LSPAWN_RSH chooses it; default ssh)");
  }
  p.rsh_path = *rsh_path;
  const bool nprocs_given = o.was_given("--nprocs") || !o.nproc_spec.empty();
  const int workers =
      hosts::workers_per_node(p.job.hosts, nprocs_given ? std::optional<int>(o.nproc_per_node) : std::nullopt);
  auto own = job_secret_from_environment();
  p.secret = own ? *own : generate_job_secret();
  p.job.lspawn = layout::program_path();
  if (p.job.lspawn.empty()) p.job.lspawn = "lspawn";
  p.job.cwd = cwd();
  p.job.master_port = o.was_given("--master-port") ? o.master_port : 29500;
  p.job.add_master_port = !o.was_given("--master-port");
  p.job.run_id = o.run_id.empty() ? "hosts-" + random_run_id() : o.run_id;
  p.job.add_run_id = o.run_id.empty();
  if (!nprocs_given) p.job.nprocs = workers;
  p.job.forwarded = forwarded(o, args);
  return p;
}

// The remote shell's words, as one line for a message.
std::string rsh_text(const std::vector<std::string>& rsh) {
  std::string t;
  for (const std::string& w : rsh) t += (t.empty() ? "" : " ") + w;
  return t;
}

// Starts the remote shell of host `i`: its own process group (the terminal's Ctrl-C is the
// caller's to forward), SIGHUP when the caller dies, every signal as an exec'd program expects.
void start(Remote& r, const Plan& p, int i) {
  std::vector<std::string> argv = p.rsh;
  argv.push_back(r.host.name);
  argv.push_back(hosts::remote_command(p.job, i));
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  const std::string& path = p.rsh_path;
  auto in = sys::make_pipe("remote shell stdin");
  auto out = sys::make_pipe("remote shell stdout");
  auto errp = sys::make_pipe("remote shell stderr");
  auto status = sys::make_pipe("remote shell exec status");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) sys::throw_errno("fork", "the remote shell of " + r.host.name);
  if (pid == 0) {
    sys::child_setup(parent, SIGHUP);  // the caller gone: as if its SIGHUP had come
    ::dup2(in.read.get(), 0);
    ::dup2(out.write.get(), 1);
    ::dup2(errp.write.get(), 2);
    ::signal(SIGPIPE, SIG_DFL);  // the caller ignores it; a remote shell must not
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    sys::execve_or_report(path.c_str(), a.data(), environ, status.write.get());
  }
  status.write.reset();
  if (const int e = sys::read_exec_errno(status.read.get())) {
    int st = 0;
    sys::waitpid(pid, &st, 0, "remote shell");
    throw sys::SysError("execve", e, "the remote shell " + path);
  }
  r.pid = pid;
  r.control = std::move(in.write);
  r.out = std::move(out.read);
  r.err = std::move(errp.read);
  sys::set_nonblocking(r.out.get(), "remote shell stdout");
  sys::set_nonblocking(r.err.get(), "remote shell stderr");
  sys::write_all(r.control.get(), p.secret + "\n", "the job secret to " + r.host.name);
}

// Writes one line of host `r` to the caller's fd; lspawn's own lines get the host in front.
void emit(Remote& r, bool is_err, const std::string& line) {
  if (is_err) {
    // ssh ends its own messages with "\r\n": the '\r' would send the rest of lspawn's message
    // about it back over its start on a terminal.
    r.last_err_line = line;
    while (!r.last_err_line.empty() && r.last_err_line.back() == '\r') r.last_err_line.pop_back();
  }
  const bool own = line.rfind("lspawn:", 0) == 0;
  r.lspawn_spoke = r.lspawn_spoke || own;
  const std::string text = (own ? "[" + r.host.name + "] " + line : line) + "\n";
  try {
    sys::write_all(is_err ? 2 : 1, text, "the console");
  } catch (const sys::SysError&) {
    // a console reader gone: the job goes on (as lspawn's own console sinks)
  }
}

// Reads what `fd` has; relays whole lines. At its end, a last unended line gets its '\n'.
void pump(Remote& r, bool is_err) {
  sys::Fd& fd = is_err ? r.err : r.out;
  std::string& part = is_err ? r.err_part : r.out_part;
  char buf[65536];
  for (;;) {
    const ssize_t n = sys::read_some(fd.get(), buf, sizeof buf, "remote shell output");
    if (n < 0) return;  // nothing more now
    if (n == 0) {
      if (!part.empty()) emit(r, is_err, part);
      part.clear();
      fd.reset();
      return;
    }
    part.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = part.find('\n')) != std::string::npos;) {
      emit(r, is_err, part.substr(0, nl));
      part.erase(0, nl + 1);
    }
  }
}

// A line on every running host's channel (a signal to raise there).
void tell_all(std::vector<Remote>& rs, const std::string& line) {
  for (Remote& r : rs) {
    if (!r.control || r.status) continue;
    try {
      sys::write_all(r.control.get(), line + "\n", "the channel of " + r.host.name);
    } catch (const sys::SysError&) {
      r.control.reset();  // that host is gone already
    }
  }
}

void kill_all(std::vector<Remote>& rs) {
  for (Remote& r : rs) {
    if (!r.status) sys::kill(r.pid, SIGKILL, "remote shell");
    r.control.reset();
  }
}

// The caller's event loop: output, exits, signals, deadlines. Returns the exit status.
class Fanout {
 public:
  Fanout(Plan plan, const CliOptions& o) : p_(std::move(plan)), o_(o) {}
  int run();

 private:
  void reap();
  void on_exit(Remote& r);
  void on_signal(int sig);
  void check_deadlines();
  int outcome() const;
  // `s` seconds from now.
  static Clock::time_point in(double s) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  Plan p_;
  const CliOptions& o_;
  std::vector<Remote> rs_;
  int signal_ = 0;                            // the caller's first stop signal
  std::optional<Clock::time_point> stop_at_;  // then: stop every host still running
  std::optional<Clock::time_point> kill_at_;  // then: SIGKILL the remote shells
  const Remote* failed_shell_ = nullptr;      // a remote shell that failed (exit 255)
};

void Fanout::on_exit(Remote& r) {
  const int code = sys::shell_exit_code(*r.status);
  if (code == 0) return;
  // ssh's own failure is 255; a shell that could not run lspawn there (not installed at this
  // path: 127) exits before lspawn said anything. ssh also exits 255 when its connection ends
  // mid-job, or when the remote command was killed by a signal (sshd's exit-signal).
  if ((code == 255 || !r.lspawn_spoke) && !failed_shell_ && !signal_) {
    failed_shell_ = &r;
    say("host " + r.host.name + ": the remote shell '" + p_.rsh[0] + "' failed (exit " + std::to_string(code) + ") " +
        (r.lspawn_spoke
             ? "after lspawn had started there (its connection ended, or lspawn there was killed by a signal)"
             : "before lspawn ran there") +
        (r.last_err_line.empty() ? std::string() : ": " + r.last_err_line) + "; stopping the other hosts");
    if (const std::string hint = hosts::ssh_failure_hint(p_.rsh, r.last_err_line); !hint.empty()) {
      say("host " + r.host.name + ": " + hint);
    }
    tell_all(rs_, "SIGTERM");
    kill_at_ = in(o_.grace_period_s + 10);
  } else if (!stop_at_ && !signal_) {
    // Its job failed: every node stops by itself (the node group); a host that does not is told.
    stop_at_ = in(o_.node_timeout_s + 10);
  }
}

void Fanout::reap() {
  for (Remote& r : rs_) {
    if (r.status) continue;
    int st = 0;
    if (sys::waitpid(r.pid, &st, WNOHANG, "remote shell") == r.pid) {
      // Its output first: a line written before the exit is relayed before what follows.
      if (r.out) pump(r, false);
      if (r.err) pump(r, true);
      r.status = st;
      r.control.reset();
      on_exit(r);
    }
  }
}

void Fanout::on_signal(int sig) {
  if (signal_) {
    say("second " + sys::signal_name(sig) + ": ending every host's remote shell now (SIGKILL)");
    kill_all(rs_);
    return;
  }
  signal_ = sig;
  say(sys::signal_name(sig) + ": forwarded to every host; a second one ends them at once");
  tell_all(rs_, sys::signal_name(sig));
  kill_at_ = in(o_.grace_period_s + 10);
}

void Fanout::check_deadlines() {
  const auto now = Clock::now();
  if (stop_at_ && now >= *stop_at_) {
    stop_at_.reset();
    say("a host's job failed and some hosts are still running after --node-timeout + 10 s: stopping them");
    tell_all(rs_, "SIGTERM");
    kill_at_ = in(o_.grace_period_s + 10);
  }
  if (kill_at_ && now >= *kill_at_) {
    kill_at_.reset();
    say("hosts still running past the grace period + 10 s: ending their remote shells (SIGKILL)");
    kill_all(rs_);
  }
}

int Fanout::outcome() const {
  if (failed_shell_) return 255;
  if (signal_) return 128 + signal_;
  for (const Remote& r : rs_) {
    const int code = sys::shell_exit_code(*r.status);
    if (code != 0) return code;  // node 0 first: hosts are in node order
  }
  return exit_codes::kSuccess;
}

int Fanout::run() {
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&stop, sig);
  sigset_t old;
  ::sigprocmask(SIG_BLOCK, &stop, &old);
  sys::Fd sfd(::signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sfd) sys::throw_errno("signalfd", "the hosts' caller");
  rs_.resize(p_.job.hosts.size());
  for (size_t i = 0; i < rs_.size(); ++i) {
    rs_[i].host = p_.job.hosts[i];
    try {
      start(rs_[i], p_, static_cast<int>(i));
    } catch (const sys::SysError& e) {
      say("host " + rs_[i].host.name + ": cannot start the remote shell: " + e.what() + "; stopping the other hosts");
      rs_.resize(i);
      tell_all(rs_, "SIGTERM");
      for (Remote& r : rs_) {
        int st = 0;
        sys::waitpid(r.pid, &st, 0, "remote shell");
      }
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      return exit_codes::kInternal;
    }
  }
  for (;;) {
    reap();
    check_deadlines();
    if (std::none_of(rs_.begin(), rs_.end(), [](const Remote& r) { return r.running(); })) break;
    std::vector<pollfd> pfd{{sfd.get(), POLLIN, 0}};
    std::vector<std::pair<Remote*, bool>> what{{nullptr, false}};
    for (Remote& r : rs_) {
      for (bool is_err : {false, true}) {
        const sys::Fd& fd = is_err ? r.err : r.out;
        if (!fd) continue;
        pfd.push_back({fd.get(), POLLIN, 0});
        what.emplace_back(&r, is_err);
      }
    }
    const int n = ::poll(pfd.data(), pfd.size(), 200);  // deadlines and exits are checked at least this often
    if (n < 0 && errno != EINTR) sys::throw_errno("poll", "the hosts' caller");
    for (size_t k = 1; n > 0 && k < pfd.size(); ++k) {
      if (pfd[k].revents) pump(*what[k].first, what[k].second);
    }
    signalfd_siginfo si;
    while (::read(sfd.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      if (si.ssi_signo != SIGCHLD) on_signal(static_cast<int>(si.ssi_signo));
    }
  }
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  const int code = outcome();
  if (code != 0) {
    std::string line = "hosts:";
    for (const Remote& r : rs_) line += " " + r.host.name + " " + sys::describe_wait_status(*r.status) + ";";
    line.pop_back();
    say(line);
  }
  return code;
}

}  // namespace

int run_on_hosts(const CliOptions& o, const std::vector<std::string>& args) {
  Plan p;
  try {
    p = make_plan(o, args);
  } catch (const UsageError& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  if (!o.quiet) {
    std::string names;
    const auto& hosts = p.job.hosts;
    for (const auto& h : hosts) names += (names.empty() ? "" : ", ") + h.name;
    say(std::string(o.hostfile.empty() ? "--hosts" : "--hostfile " + o.hostfile) + ": " + std::to_string(hosts.size()) +
        " host" + (hosts.size() == 1 ? "" : "s") + " (" + names + ") through '" + rsh_text(p.rsh) + "', node 0 " +
        hosts[0].name + ":" + std::to_string(p.job.master_port) + ", run id " + p.job.run_id);
  }
  return Fanout(std::move(p), o).run();
}

}  // namespace lspawn::cli
