// lspawn_scale_agent: one real lspawn coordinator and K-1 simulated member nodes, on loopback
// (docs/scale.md). The members are not lspawn processes: one process holds K-1 connections and
// speaks the node protocol through the same code a member lspawn uses (cluster/node_channel's
// Link, Message and body_of: the same frames, byte for byte). A member's behaviour is the real
// one's where the coordinator can see it: its join (and the retry with 20 ms..500 ms back-off
// when the coordinator closes it), a status message with its ranks' records once it has its
// assignment, then one per heartbeat interval (launcher/run.cpp's send_status, links.hpp's
// intervals), the answer to "stacks?", and "done" at once when told to stop (its workers stop
// instantly).
//
// Phases, each printed as JSON lines {"bench":"nodes","tool":"lspawn","K":K,"metric":..,"value":..}:
//   formation   the last join sent → every member has its assignment (formation_s); also the
//               first connect → the last assignment (formation_total_s) and retries
//   steady      --steady S seconds of heartbeats: the coordinator's CPU (% of one core) and RSS,
//               and its RSS growth per node over the RSS it had before anyone joined
//   report      SIGURG to the coordinator → the last line of its status report (report_s),
//               the report's size in bytes and lines
//   fan-out     one member's connection reset (its lspawn SIGKILLed) → every other member told to
//               stop (fanout_s) → every member told the job finished (finish_s); the coordinator's
//               exit code (123: a node was lost)
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cluster/links.hpp"
#include "cluster/node_channel.hpp"
#include "proto/node_wire.hpp"
#include "supervisor/port.hpp"
#include "sys/sys.hpp"

namespace {

using namespace lspawn;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Options {
  std::string lspawn;
  int nodes = 16;  // K: the job's nodes, the coordinator included
  int nproc = 1;
  double steady_s = 5;
  int node_timeout_s = 30;
  bool report = true;
  bool fanout = true;
  bool changing = false;  // the ranks' records change (training): status every status_interval
  std::string tool = "lspawn";
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "lspawn_scale_agent: " << why
            << "\nusage: lspawn_scale_agent --lspawn PATH --nodes K [--nproc P] [--steady SECONDS] "
               "[--node-timeout SECONDS] [--changing] [--no-report] [--no-fanout]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--lspawn") {
      o.lspawn = value();
    } else if (a == "--nodes") {
      o.nodes = std::stoi(value());
    } else if (a == "--nproc") {
      o.nproc = std::stoi(value());
    } else if (a == "--steady") {
      o.steady_s = std::stod(value());
    } else if (a == "--node-timeout") {
      o.node_timeout_s = std::stoi(value());
    } else if (a == "--no-report") {
      o.report = false;
    } else if (a == "--no-fanout") {
      o.fanout = false;
    } else if (a == "--changing") {
      o.changing = true;
    } else {
      usage("unknown argument " + a);
    }
  }
  if (o.lspawn.empty()) usage("--lspawn is required");
  if (o.nodes < 2) usage("--nodes must be at least 2");
  return o;
}

// The open-file limit this run needs: a connection per member here, and as many on the
// coordinator (which inherits it); each process has its own count, so K + 256 each (2 x K + 256
// before, which stopped the harness at K = 9,872 under a hard limit of 20,000). Root may raise
// the hard limit (up to fs.nr_open).
void raise_file_limit(int needed) {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  const rlim_t want = static_cast<rlim_t>(needed);
  if (r.rlim_cur >= want) return;
  if (r.rlim_max < want) {
    const rlim_t old_max = r.rlim_max;
    r.rlim_max = want;
    r.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &r) != 0) {
      throw std::runtime_error("the open-file limit " + std::to_string(old_max) + " is below the " +
                               std::to_string(needed) +
                               " this run needs, and raising it failed: " + std::strerror(errno));
    }
    std::cerr << "lspawn_scale_agent: raised the open-file limit (hard) from " << old_max << " to " << want << "\n";
    return;
  }
  r.rlim_cur = want;
  setrlimit(RLIMIT_NOFILE, &r);
}

// /proc/PID/stat's utime + stime of the process (its threads; not its children), in seconds.
double process_cpu_s(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double process_rss_mb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// The coordinator: a real lspawn, node 0 of a static job; its workers sleep until stopped.
struct Coordinator {
  pid_t pid = -1;
  sys::Fd err;  // its stderr (and stdout), read by the loop

  void start(const Options& o, int port) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    std::vector<std::string> args{o.lspawn,
                                  "--nnodes",
                                  std::to_string(o.nodes),
                                  "--node-rank",
                                  "0",
                                  "--master-addr",
                                  "127.0.0.1",
                                  "--master-port",
                                  std::to_string(port),
                                  "--nprocs",
                                  std::to_string(o.nproc),
                                  "--node-timeout",
                                  std::to_string(o.node_timeout_s),
                                  "--rdzv-timeout",
                                  "600",
                                  "/bin/sleep",
                                  "3600"};
    pid = fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
      _exit(127);
    }
    ::close(p[1]);
    err = sys::Fd(p[0]);
    sys::set_nonblocking(err.get(), "the coordinator's output");
  }
};

struct Line {
  Clock::time_point at;
  std::string text;
};

// One simulated member node.
struct Member {
  int index = 0;  // 0..K-2; its host name is sim-<index+1>
  std::unique_ptr<node::Link> link;
  bool joined = false, assigned = false, stopped = false, finished = false;
  // While the job forms (read_forming()): the frame being read, what of it is kept, and a
  // checked member's assignment, decoded once every member has one.
  std::string frame;
  size_t frame_got = 0;
  uint32_t frame_len = 0;
  bool keep = false;
  std::string assign_frame;
  int retries = 0;
  milliseconds backoff{20};
  Clock::time_point retry_at{};
  Clock::time_point join_sent{}, assigned_at{}, stopped_at{}, finished_at{};
  int node_rank = -1;
  int round = 0;
  node::Body status;  // encoded once, unless --changing
  uint64_t version = 9;
};

class Agent {
 public:
  explicit Agent(Options o) : o_(std::move(o)) {}
  int run();
  // After a failure: the coordinator's output, and the coordinator SIGKILLed (never left behind).
  int abandon();

 private:
  void emit(const std::string& metric, double value, const std::string& note = "") const;
  void connect(Member& m);
  void drop(Member& m, const std::string& why);
  void on_member_readable(Member& m);
  void read_forming(Member& m);
  void forming_frame_done(Member& m);
  void on_message(Member& m, const node::Message& msg);
  void read_coordinator();
  void loop_once(Clock::time_point until);
  void send_status_due(Clock::time_point now);
  node::Body status_of(const Member& m) const;
  milliseconds status_period() const;
  template <class Pred>
  bool run_until(Pred done, double limit_s, const std::string& what);
  int count(bool Member::*flag) const {
    int n = 0;
    for (auto& m : members_) n += m.*flag;
    return n;
  }

  Options o_;
  Coordinator coord_;
  int port_ = 0;
  sys::Fd epoll_;
  std::vector<Member> members_;
  std::string partial_;      // the coordinator's unfinished output line
  std::vector<Line> lines_;  // its output, timestamped
  size_t next_slot_ = 0;     // status sends: members are spread over 100 slots of 10 ms
  Clock::time_point next_slot_at_ = Clock::time_point::max();  // set once the job has formed
  int64_t t0_us_ = now_us();
  bool forming_ = false;          // read_forming() until a member has its assignment
  Clock::time_point ready_at_{};  // when the current batch of events was returned
  bool coordinator_exited_ = false;
  int coordinator_status_ = 0;
};

constexpr uint64_t kCoordinatorTag = ~0ull;

// Which members' assignments are decoded and checked: every kCheckEvery-th and the last. Each
// decodes K hosts (wire::decode_node_frame parses the whole frame), which a real member does once
// for itself; one process doing it for all K members is O(K^2): ~30 s at K = 9,000 on this
// machine, while no member sent anything and the coordinator's --node-timeout (30 s) ran out.
// The others' frames are consumed unread.
constexpr int kCheckEvery = 97;
bool checked_member(int index, int members) { return index % kCheckEvery == 0 || index == members - 1; }

// Whether `frame` (length prefix included, at least its first bytes) is a frame of `type`.
bool is_frame(const std::string& frame, const std::string& type) {
  const std::string head = std::string("\xa2\x61t", 3) + static_cast<char>(0x60 | type.size()) + type;
  return frame.size() >= 4 + head.size() && frame.compare(4, head.size(), head) == 0;
}

void Agent::emit(const std::string& metric, double value, const std::string& note) const {
  std::printf(
      "{\"bench\": \"nodes\", \"tool\": \"%s\", \"K\": %d, \"nproc\": %d, \"metric\": \"%s\", \"value\": %.6g%s%s%s}\n",
      o_.tool.c_str(), o_.nodes, o_.nproc, metric.c_str(), value, note.empty() ? "" : ", \"note\": \"", note.c_str(),
      note.empty() ? "" : "\"");
  std::fflush(stdout);
}

// A member's records: every rank waits in all_reduce #5 on the world group, except the job's last
// rank, which has not entered it (the report's "behind" rank, whose stack is asked for).
node::Body Agent::status_of(const Member& m) const {
  node::StatusMsg st;
  const int world = o_.nodes * o_.nproc;
  for (int l = 0; l < o_.nproc; ++l) {
    RankInput in;
    in.rank = (m.index + 1) * o_.nproc + l;
    in.pid = 100000 + in.rank;
    in.host = "sim-" + std::to_string(m.index + 1);
    in.started_us = t0_us_;
    status::RankView v;
    v.rank = in.rank;
    v.pid = in.pid;
    v.opened_us = t0_us_;
    status::GroupView g;
    g.name = "world";
    g.group_rank = in.rank;
    g.group_size = world;
    const bool behind = in.rank == world - 1;
    g.in_collective = !behind;
    g.seq = behind ? 4 : 5;
    g.op = "all_reduce";
    g.bytes = 16;
    g.since_us = t0_us_;
    g.completed_seq = 4;
    g.completed_op = "all_reduce";
    g.completed_us = t0_us_;
    g.version = m.version;
    v.groups.push_back(g);
    in.record = v;
    st.ranks.push_back(in);
  }
  return node::body_of(st);
}

void Agent::connect(Member& m) {
  int err = 0;
  sys::Fd fd = sys::tcp_connect("127.0.0.1", port_, milliseconds(5000), &err);
  if (!fd) {
    m.retry_at = Clock::now() + m.backoff;
    m.backoff = std::min(m.backoff * 2, milliseconds(500));
    ++m.retries;
    return;
  }
  sys::set_nonblocking(fd.get(), "member");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = static_cast<uint64_t>(m.index);
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) throw std::runtime_error("epoll_ctl add");
  m.link = std::make_unique<node::Link>(std::move(fd), "the coordinator");
  node::JoinMsg j;
  j.host = "sim-" + std::to_string(m.index + 1);
  j.node_rank = m.index + 1;
  j.nnodes = o_.nodes;
  j.nproc_per_node = o_.nproc;
  m.join_sent = Clock::now();
  m.retry_at = {};
  m.link->send("join", j);
}

void Agent::drop(Member& m, const std::string& why) {
  if (!m.link) return;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, m.link->fd(), nullptr);
  m.link.reset();
  if (m.joined) throw std::runtime_error("member sim-" + std::to_string(m.index + 1) + " lost the coordinator: " + why);
  // Closed before its join was answered (the coordinator's bound on unjoined connections): a
  // real member tries again after its back-off.
  m.retry_at = Clock::now() + m.backoff;
  m.backoff = std::min(m.backoff * 2, milliseconds(500));
  ++m.retries;
}

// Arrival times are the batch's (ready_at_): the messages were there when epoll_wait returned,
// and handling the batch's earlier ones must not count.
void Agent::on_message(Member& m, const node::Message& msg) {
  const auto now = ready_at_;
  if (msg.type == "joined") {
    m.joined = true;
  } else if (msg.type == "assign") {
    const auto a = msg.as<node::AssignMsg>();
    if (a.nnodes != o_.nodes || static_cast<int>(a.hosts.size()) != o_.nodes) {
      throw std::runtime_error("sim-" + std::to_string(m.index + 1) + ": an assignment for " +
                               std::to_string(a.nnodes) + " nodes, expected " + std::to_string(o_.nodes));
    }
    m.joined = m.assigned = true;
    m.assigned_at = now;
    m.node_rank = a.node_rank;
  } else if (msg.type == "reject") {
    throw std::runtime_error("sim-" + std::to_string(m.index + 1) + " rejected: " + msg.as<node::RejectMsg>().reason);
  } else if (msg.type == "stop") {
    const auto s = msg.as<node::StopMsg>();
    if (!m.stopped) {
      m.stopped = true;
      m.stopped_at = now;
      node::DoneMsg d;
      d.restart_count = s.restart_count;
      m.link->send("done", d);
    }
  } else if (msg.type == "finish") {
    m.finished = true;
    m.finished_at = now;
  } else if (msg.type == "stacks?") {
    const auto ask = msg.as<node::StackAskMsg>();
    if (std::getenv("LSPAWN_SCALE_SHOW_REPORT"))
      std::cerr << "  stacks? to sim-" << m.index + 1 << " at " << now.time_since_epoch().count() / 1e9 << "\n";
    node::StacksMsg r;
    r.restart_count = ask.restart_count;
    for (int rank : ask.ranks) {
      RankInput in;
      in.rank = rank;
      in.stack = {"0x7f0000001000 in nanosleep () from libc.so.6", "0x55d000002000 in train_step() at train.cpp:42",
                  "0x55d000003000 in main () at train.cpp:90"};
      r.ranks.push_back(in);
    }
    m.link->send("stacks", r);
  }
}

// While the job forms, a member's frames are read here, exactly up to the end of its assignment,
// and not decoded: one process decoding K assignments of K hosts each (O(K^2), seconds at 4,096)
// would otherwise delay the last stamps by its own work, which K real members do in parallel. An
// assignment is stamped when its last byte has been read. The first bytes of a frame say its type
// (node_channel.cpp's encode(): a map of two, "t" and the type); an unchecked member's assignment
// (kCheckEvery) is read past unkept, so the agent holds no K frames of K hosts at once. The
// socket is read as a member's Link reads it, so its receive window stays open: peeking until the
// whole frame was there (before) held up to one frame per socket in the kernel, and beyond
// ~12,000 nodes a frame was larger than the receive buffer: the coordinator's sends stalled until
// TCP_USER_TIMEOUT (30 s) broke the links. What follows the assignment is left to Link::read().
void Agent::read_forming(Member& m) {
  constexpr size_t kHead = 16;  // enough of a body to see the frame's type
  static std::string skipped(256 << 10, '\0');
  while (m.link && !m.assigned) {
    const size_t total = m.frame_got < 4 ? 4 : 4 + size_t{m.frame_len};
    size_t want = total - m.frame_got;
    const bool in_head = m.frame_got < 4 + kHead;
    if (in_head) want = std::min(want, 4 + kHead - m.frame_got);
    char* into = nullptr;
    if (in_head || m.keep) {
      m.frame.resize(m.frame_got + want);
      into = &m.frame[m.frame_got];
    } else {
      want = std::min(want, skipped.size());
      into = skipped.data();
    }
    const ssize_t n = ::recv(m.link->fd(), into, want, 0);
    if (in_head || m.keep) m.frame.resize(m.frame_got + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      drop(m, std::string("connection broken (") + std::strerror(errno) + ")");
      return;
    }
    if (n == 0) {
      drop(m, "connection closed");
      return;
    }
    m.frame_got += static_cast<size_t>(n);
    if (m.frame_got == 4) {
      m.frame_len = 0;
      for (int k = 0; k < 4; ++k)
        m.frame_len = (m.frame_len << 8) | static_cast<uint8_t>(m.frame[static_cast<size_t>(k)]);
      if (m.frame_len > node::kMaxFrame)
        throw std::runtime_error("sim-" + std::to_string(m.index + 1) + ": a frame of " + std::to_string(m.frame_len) +
                                 " bytes");
    }
    if (m.frame_got < 4) continue;
    if (m.frame_got == std::min(4 + size_t{m.frame_len}, 4 + kHead)) {
      m.keep = !is_frame(m.frame, "assign") || checked_member(m.index, static_cast<int>(members_.size()));
    }
    if (m.frame_got == 4 + size_t{m.frame_len}) forming_frame_done(m);
  }
}

void Agent::forming_frame_done(Member& m) {
  if (is_frame(m.frame, "joined")) {
    m.joined = true;
  } else if (is_frame(m.frame, "assign")) {
    m.joined = m.assigned = true;
    m.assigned_at = ready_at_;
    if (m.keep) m.assign_frame = std::move(m.frame);
  } else {  // a "reject"?: as Link::read would hand it over
    wire::NodeFrame f;
    wire::decode_node_frame(m.frame.data(), m.frame.size(), f, node::kMaxFrame);
    on_message(m, node::Message{std::move(f.type), node::Body{std::move(f.body)}});
  }
  m.frame.clear();
  m.frame_got = 0;
  m.keep = false;
}

void Agent::on_member_readable(Member& m) {
  if (!m.link) return;
  if (forming_ && !m.assigned) {
    read_forming(m);
    return;
  }
  try {
    for (auto& msg : m.link->read()) on_message(m, msg);
    if (m.link && m.link->pending()) m.link->flush();
  } catch (const node::LinkError& e) {
    if (m.finished) {  // the coordinator exits after the finish: expected
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, m.link->fd(), nullptr);
      m.link.reset();
      return;
    }
    drop(m, e.what());
  }
}

void Agent::read_coordinator() {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(coord_.err.get(), buf, sizeof buf);
    if (n <= 0) {
      if (n == 0) {
        epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, coord_.err.get(), nullptr);
        coord_.err.reset();
      }
      return;
    }
    const auto now = Clock::now();
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines_.push_back({now, partial_.substr(start, nl - start)});
    }
    partial_.erase(0, start);
  }
}

// A real member's cadence (launcher/run.cpp's send_status, with links.hpp's intervals):
// unchanged records once per max(1 s, heartbeat interval); changing ones every status_interval.
milliseconds Agent::status_period() const {
  if (o_.changing) return node::status_interval(o_.nodes);
  return std::max(milliseconds(1000), node::heartbeat_interval(o_.nodes, std::chrono::seconds(o_.node_timeout_s)));
}

// The period is cut in 100 slots; each slot's members (1/100 of them) send their status at its
// start, so sends are spread over the period as independent nodes' clocks are.
void Agent::send_status_due(Clock::time_point now) {
  while (now >= next_slot_at_) {
    for (size_t i = next_slot_; i < members_.size(); i += 100) {
      Member& m = members_[i];
      if (!m.link || !m.assigned || m.stopped) continue;
      try {
        if (o_.changing) {
          ++m.version;
          m.status = status_of(m);
        }
        m.link->send("status", m.status);
      } catch (const node::LinkError& e) {
        drop(m, e.what());
      }
    }
    next_slot_ = (next_slot_ + 1) % 100;
    next_slot_at_ += status_period() / 100;
  }
}

void Agent::loop_once(Clock::time_point until) {
  const auto now = Clock::now();
  auto wake = std::min(until, next_slot_at_);
  for (auto& m : members_) {
    if (!m.link && m.retry_at != Clock::time_point{}) {
      if (m.retry_at <= now) {
        connect(m);
      } else {
        wake = std::min(wake, m.retry_at);
      }
    }
  }
  const int timeout =
      static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<milliseconds>(wake - Clock::now()).count() + 1));
  epoll_event evs[512];
  const int n = epoll_wait(epoll_.get(), evs, 512, timeout);
  ready_at_ = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.u64 == kCoordinatorTag) {
      read_coordinator();
    } else {
      on_member_readable(members_[evs[i].data.u64]);
    }
  }
  send_status_due(Clock::now());
  if (!coordinator_exited_) {
    int st = 0;
    if (waitpid(coord_.pid, &st, WNOHANG) == coord_.pid) {
      coordinator_exited_ = true;
      coordinator_status_ = st;
    }
  }
}

template <class Pred>
bool Agent::run_until(Pred done, double limit_s, const std::string& what) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  while (!done()) {
    if (Clock::now() >= end) {
      if (what.empty()) return true;  // a wait for its own sake
      std::cerr << "lspawn_scale_agent: K=" << o_.nodes << ": " << what << " did not happen within " << limit_s
                << " s\n";
      return false;
    }
    // The coordinator exits once it has sent every finish: those may still be unread here (a
    // member whose link closes without one says so: drop()).
    if (coordinator_exited_ && what != "the coordinator's exit" && what != "every member's finish") {
      std::cerr << "lspawn_scale_agent: K=" << o_.nodes << ": the coordinator exited ("
                << sys::describe_wait_status(coordinator_status_) << ") while waiting for " << what << "\n";
      return false;
    }
    loop_once(std::min(end, Clock::now() + milliseconds(50)));
  }
  return true;
}

// The coordinator's output is read to its end first: what it said about the event that ended the
// run (a link it closed, and why) may still be in the pipe when that event reached a member.
int Agent::abandon() {
  if (coord_.err) {
    pollfd p{coord_.err.get(), POLLIN, 0};
    ::poll(&p, 1, 200);  // a moment for the line that goes with what just happened
    read_coordinator();
  }
  if (coord_.pid > 0 && !coordinator_exited_) {
    ::kill(coord_.pid, SIGKILL);
    waitpid(coord_.pid, nullptr, 0);
    coordinator_exited_ = true;
  }
  if (coord_.err) read_coordinator();  // what it wrote before it died (its workers may hold the pipe)
  for (auto& l : lines_) std::cerr << "  coordinator: " << l.text << "\n";
  if (!partial_.empty()) std::cerr << "  coordinator: " << partial_ << "\n";
  return 1;
}

int Agent::run() {
  raise_file_limit(o_.nodes + 256);
  signal(SIGPIPE, SIG_IGN);
  PortReservation port("127.0.0.1", 0);
  port_ = port.port();
  epoll_ = sys::Fd(epoll_create1(EPOLL_CLOEXEC));
  coord_.start(o_, port_);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kCoordinatorTag;
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, coord_.err.get(), &ev);
  members_.resize(static_cast<size_t>(o_.nodes - 1));
  for (size_t i = 0; i < members_.size(); ++i) {
    members_[i].index = static_cast<int>(i);
    members_[i].status = status_of(members_[i]);
  }
  auto dump = [&] { return abandon(); };
  // The coordinator listens once it says it waits for the others.
  auto said = [&](const std::string& what) {
    for (auto& l : lines_)
      if (l.text.find(what) != std::string::npos) return true;
    return false;
  };
  if (!run_until([&] { return said("rendezvous: waiting for"); }, 30, "the coordinator's rendezvous")) return dump();
  const double rss_before_mb = process_rss_mb(coord_.pid);

  // Formation: every member connects and joins at once (a job's nodes start together).
  const auto first_connect = Clock::now();
  forming_ = true;
  for (auto& m : members_) connect(m);
  if (!run_until([&] { return count(&Member::assigned) == static_cast<int>(members_.size()); }, 300, "the formation"))
    return dump();
  forming_ = false;
  const auto stamped = [&] {
    std::vector<Clock::time_point> at;
    for (auto& m : members_) at.push_back(m.assigned_at);
    return at;
  }();
  for (auto& m : members_) {  // the checked members' assignments, decoded now (in on_message)
    if (m.assign_frame.empty()) continue;
    wire::NodeFrame f;
    wire::decode_node_frame(m.assign_frame.data(), m.assign_frame.size(), f, node::kMaxFrame);
    on_message(m, node::Message{std::move(f.type), node::Body{std::move(f.body)}});
    std::string().swap(m.assign_frame);
  }
  for (size_t i = 0; i < members_.size(); ++i) members_[i].assigned_at = stamped[i];
  // Every member's first status now, as a real member sends its ranks' records once its workers
  // start (launcher/run.cpp's send_status: new records go out at once); then one per period,
  // spread over it (send_status_due). Spreading the first ones too left the members of the
  // period's last slots without a record at the coordinator for up to a period (7.5 s beyond
  // 7,500 nodes): a report asked before then missed their ranks.
  for (auto& m : members_) {
    try {
      if (m.link) m.link->send("status", m.status);
    } catch (const node::LinkError& e) {
      drop(m, e.what());
    }
  }
  next_slot_at_ = Clock::now() + status_period() / 100;
  Clock::time_point last_join{}, last_assign{};
  int retries = 0;
  for (auto& m : members_) {
    last_join = std::max(last_join, m.join_sent);
    last_assign = std::max(last_assign, m.assigned_at);
    retries += m.retries;
  }
  emit("formation_s", seconds_between(last_join, last_assign));
  emit("formation_total_s", seconds_between(first_connect, last_assign));
  emit("join_retries", retries);
  // Steady state: the coordinator's CPU and memory while every member heartbeats (its records
  // unchanged: a status per heartbeat interval), then while every member's records change (a
  // job in training: a status every status_interval).
  if (o_.steady_s > 0 || o_.report) {
    run_until([] { return false; }, 1.0, "");  // settle: every member's first status arrives
  }
  // "rendezvous: 4096 nodes joined after 1.2 s", said as the coordinator's rendezvous returns: read
  // by now (it may not have been when the last assignment came).
  run_until([&] { return said(" nodes joined after "); }, 5, "the coordinator's rendezvous line");
  for (auto& l : lines_) {
    const auto at = l.text.find(" nodes joined after ");
    if (at != std::string::npos) emit("coordinator_formed_s", std::atof(l.text.c_str() + at + 20));
  }
  if (o_.steady_s > 0) {
    auto measure = [&](const std::string& name) {
      const double cpu0 = process_cpu_s(coord_.pid);
      const auto s0 = Clock::now();
      run_until([] { return false; }, o_.steady_s, "");
      const double wall = seconds_between(s0, Clock::now());
      if (coordinator_exited_) return false;
      emit(name + "_cpu_pct", 100.0 * (process_cpu_s(coord_.pid) - cpu0) / wall);
      return true;
    };
    const bool changing = o_.changing;
    o_.changing = false;
    if (!measure("steady")) return dump();
    const double rss_mb = process_rss_mb(coord_.pid);
    emit("steady_rss_mb", rss_mb);
    emit("rss_per_node_kb", 1024.0 * (rss_mb - rss_before_mb) / static_cast<double>(members_.size()));
    if (changing) {
      o_.changing = true;
      if (!measure("changing")) return dump();
    }
  }

  // The report on request: SIGURG → its last line, the last frame of the stack this agent sent
  // for the job's rank that is behind ("main () at train.cpp:90"; anything else the coordinator
  // says meanwhile is not counted).
  if (o_.report) {
    const size_t from = lines_.size();
    const auto t = Clock::now();
    ::kill(coord_.pid, SIGURG);
    if (std::getenv("LSPAWN_SCALE_SHOW_REPORT"))
      std::cerr << "  SIGURG at " << t.time_since_epoch().count() / 1e9 << "\n";
    size_t last = 0;  // the report's last line
    auto ended = [&] {
      for (size_t i = std::max(from, last); i < lines_.size(); ++i) {
        if (lines_[i].text.find("main () at train.cpp:90") != std::string::npos) last = i + 1;
      }
      return last > 0;
    };
    if (!run_until(ended, 60, "the status report's last line")) return dump();
    size_t bytes = 0, first = lines_.size();
    for (size_t i = from; i < last; ++i) {
      if (lines_[i].text.find("status of ") != std::string::npos && first == lines_.size()) first = i;
      if (i >= first) bytes += lines_[i].text.size() + 1;
    }
    {
      emit("report_s", seconds_between(t, lines_[last - 1].at));
      emit("report_bytes", static_cast<double>(bytes));
      emit("report_lines", static_cast<double>(last - first));
      if (std::getenv("LSPAWN_SCALE_SHOW_REPORT")) {
        for (size_t i = from; i < last; ++i)
          std::cerr << "  +" << seconds_between(t, lines_[i].at) << " s " << lines_[i].text << "\n";
      }
    }
  }

  // Fan-out: one member's lspawn dies (its connection is reset) → every other member is told to
  // stop → and the job's finish.
  if (o_.fanout) {
    Member& victim = members_.back();
    linger l{1, 0};  // close() sends a reset, as the kernel does for a SIGKILLed process's socket
    setsockopt(victim.link->fd(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, victim.link->fd(), nullptr);
    const auto t = Clock::now();
    victim.link.reset();
    victim.stopped = victim.finished = true;
    const int others = static_cast<int>(members_.size()) - 1;
    if (!run_until([&] { return count(&Member::stopped) - 1 == others; }, 120, "every member's stop")) return dump();
    Clock::time_point last_stop{};
    for (auto& m : members_)
      if (&m != &victim) last_stop = std::max(last_stop, m.stopped_at);
    emit("fanout_s", seconds_between(t, last_stop));
    if (!run_until([&] { return count(&Member::finished) - 1 == others; }, 120, "every member's finish")) return dump();
    Clock::time_point last_finish{};
    for (auto& m : members_)
      if (&m != &victim) last_finish = std::max(last_finish, m.finished_at);
    emit("finish_s", seconds_between(t, last_finish));
    run_until([&] { return coordinator_exited_; }, 60, "the coordinator's exit");
    emit("coordinator_exit", coordinator_exited_ ? sys::shell_exit_code(coordinator_status_) : -1);
  } else {
    ::kill(coord_.pid, SIGTERM);
    run_until([&] { return coordinator_exited_; }, 60, "the coordinator's exit");
  }
  if (!coordinator_exited_) return dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Agent a(parse(argc, argv));
  try {
    return a.run();
  } catch (const std::exception& e) {
    std::cerr << "lspawn_scale_agent: " << e.what() << "\n";
    a.abandon();
    return 1;
  }
}
