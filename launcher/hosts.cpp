#include "launcher/hosts.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <sstream>

#include "sys/exit_codes.hpp"

namespace lspawn::hosts {
namespace {

[[noreturn]] void usage(const std::string& msg) { throw UsageError(msg); }

// A count of slots, 1..4096, or nullopt.
std::optional<int> parse_count(const std::string& v) {
  if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const int n = std::atoi(v.c_str());
  if (n < 1 || n > 4096) return std::nullopt;
  return n;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

void refuse_duplicates(const std::vector<Host>& hosts, const std::string& where) {
  std::map<std::string, const Host*> seen;
  for (const Host& h : hosts) {
    auto [it, fresh] = seen.emplace(h.name, &h);
    if (fresh) continue;
    if (h.line > 0) {
      usage(where + ":" + std::to_string(h.line) + ": host '" + h.name + "' is listed again (line " +
            std::to_string(it->second->line) + "): lspawn runs one node per host; give its workers with slots=N");
    }
    usage(where + ": host '" + h.name + "' is listed twice: lspawn runs one node per host; give its workers as " +
          h.name + ":N");
  }
}

}  // namespace

std::vector<Host> parse_hostfile(const std::string& text, const std::string& path) {
  std::vector<Host> hosts;
  std::istringstream in(text);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    const std::vector<std::string> w = words(line);
    if (w.empty()) continue;
    const std::string at = path + ":" + std::to_string(line_no) + ": ";
    Host h{w[0], 0, line_no};
    if (h.name.find('=') != std::string::npos) usage(at + "expected a host name first, got '" + h.name + "'");
    for (size_t k = 1; k < w.size(); ++k) {
      const auto eq = w[k].find('=');
      const std::string key = w[k].substr(0, eq), value = eq == std::string::npos ? "" : w[k].substr(eq + 1);
      if (key == "slots" || key == "max_slots" || key == "max-slots") {
        const auto n = parse_count(value);
        if (!n) usage(at + key + ": expected a count 1..4096, got '" + value + "' (" + h.name + " slots=N)");
        if (key == "slots") h.slots = *n;  // max_slots: mpirun's oversubscription bound, nothing here
      } else {
        usage(at + "'" + w[k] + "' is not slots=N or max_slots=N (mpirun's hostfile: NAME [slots=N] [max_slots=M])");
      }
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) usage(path + ": lists no host (one per line: NAME [slots=N])");
  refuse_duplicates(hosts, path);
  return hosts;
}

std::vector<Host> parse_hosts_list(const std::string& list) {
  std::vector<Host> hosts;
  std::string item;
  std::istringstream in(list);
  while (std::getline(in, item, ',')) {
    if (item.empty()) usage("--hosts: an empty host in '" + list + "' (--hosts A[:N],B[:N],...)");
    Host h;
    std::string slots;
    if (item.front() == '[') {  // [v6] or [v6]:N
      const auto close = item.find(']');
      if (close == std::string::npos || close == 1) usage("--hosts: expected [IPV6] or [IPV6]:N, got '" + item + "'");
      h.name = item.substr(1, close - 1);
      if (close + 1 < item.size()) {
        if (item[close + 1] != ':') usage("--hosts: expected [IPV6]:N, got '" + item + "'");
        slots = item.substr(close + 2);
        if (slots.empty()) usage("--hosts: '" + item + "': a count after ':' (--hosts A[:N],B[:N],...)");
      }
    } else if (const auto colon = item.find(':'); colon != std::string::npos) {
      if (item.find(':', colon + 1) != std::string::npos) {
        usage("--hosts: '" + item + "' looks like an IPv6 address: write it [ADDR] or [ADDR]:N");
      }
      h.name = item.substr(0, colon);
      slots = item.substr(colon + 1);
      if (h.name.empty() || slots.empty()) usage("--hosts: expected NAME or NAME:N, got '" + item + "'");
    } else {
      h.name = item;
    }
    if (!slots.empty()) {
      const auto n = parse_count(slots);
      if (!n) usage("--hosts: '" + item + "': expected a count 1..4096 after ':', got '" + slots + "'");
      h.slots = *n;
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) usage("--hosts: names no host (--hosts A[:N],B[:N],...)");
  refuse_duplicates(hosts, "--hosts");
  return hosts;
}

int workers_per_node(const std::vector<Host>& hosts, std::optional<int> nprocs) {
  if (nprocs) return *nprocs;
  int with = 0;
  for (const Host& h : hosts) with += h.slots > 0 ? 1 : 0;
  if (with == 0) return 1;
  auto describe = [](const Host& h) { return h.name + " " + std::to_string(h.slots); };
  const Host* with_slots = nullptr;
  for (const Host& h : hosts) {
    if (h.slots > 0 && !with_slots) with_slots = &h;
  }
  for (const Host& h : hosts) {
    if (h.slots == 0) {
      usage("host '" + h.name + "' has no slots while " + with_slots->name +
            " has slots=" + std::to_string(with_slots->slots) +
            ": give every host the same slots, or --nprocs N (every node "
            "runs as many workers)");
    }
    if (h.slots != hosts[0].slots) {
      usage("the hosts' slots differ (" + describe(hosts[0]) + ", " + describe(h) +
            "): every node of an lspawn job runs as many workers; give --nprocs N or equal slots");
    }
  }
  return hosts[0].slots;
}

std::vector<std::string> rsh_command(const std::string& rsh_flag, const EnvLookup& env) {
  std::string from = "--rsh";
  std::string value = rsh_flag;
  if (value.empty()) {
    if (auto v = env("LSPAWN_RSH"); v && !v->empty()) {
      value = *v;
      from = "LSPAWN_RSH";
    } else {
      return {"ssh"};
    }
  }
  std::vector<std::string> w = words(value);
  if (w.empty()) usage(from + ": '" + value + "' names no command (e.g. ssh, or 'ssh -p 2222')");
  return w;
}

namespace {

bool is_ssh(const std::vector<std::string>& rsh) {
  if (rsh.empty()) return false;
  const std::string& p = rsh[0];
  const auto slash = p.rfind('/');
  return (slash == std::string::npos ? p : p.substr(slash + 1)) == "ssh";
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// What the user's ssh words set: the flags (-t, -X, ...) and the -o option names (lower case).
struct SshWords {
  std::string flags;
  std::vector<std::string> options;
};

SshWords read_ssh_words(const std::vector<std::string>& rsh) {
  static const std::string with_argument = "BbcDEeFIiJLlmOoPpQRSWw";  // ssh(1)'s options that take one
  SshWords out;
  auto add_option = [&](const std::string& kv) { out.options.push_back(lower(kv.substr(0, kv.find('=')))); };
  for (size_t i = 1; i < rsh.size(); ++i) {
    const std::string& w = rsh[i];
    if (w.size() < 2 || w[0] != '-') continue;
    for (size_t k = 1; k < w.size(); ++k) {
      const char c = w[k];
      if (with_argument.find(c) == std::string::npos) {
        out.flags += c;
        continue;
      }
      std::string arg = w.substr(k + 1);
      if (arg.empty() && i + 1 < rsh.size()) arg = rsh[++i];
      if (c == 'o') add_option(arg);
      break;
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> with_ssh_defaults(std::vector<std::string> rsh) {
  if (!is_ssh(rsh)) return rsh;
  const SshWords given = read_ssh_words(rsh);
  auto has_flag = [&](const char* any) { return given.flags.find_first_of(any) != std::string::npos; };
  if (!has_flag("tT")) rsh.push_back("-T");
  if (!has_flag("xXY")) rsh.push_back("-x");
  for (const char* kv : {"BatchMode=yes", "ConnectTimeout=10"}) {
    const std::string key = lower(std::string(kv).substr(0, std::string(kv).find('=')));
    if (std::find(given.options.begin(), given.options.end(), key) != given.options.end()) continue;
    rsh.push_back("-o");
    rsh.push_back(kv);
  }
  return rsh;
}

std::string ssh_failure_hint(const std::vector<std::string>& rsh, const std::string& last_line) {
  if (!is_ssh(rsh)) return "";
  auto has = [&](const char* text) { return last_line.find(text) != std::string::npos; };
  auto given = [&](const std::string& kv) {  // -o KV among the remote shell's words
    for (size_t i = 1; i + 1 < rsh.size(); ++i) {
      if (rsh[i] == "-o" && rsh[i + 1] == kv) return true;
    }
    return false;
  };
  if (has("Host key verification failed") && given("BatchMode=yes")) {
    return "the host's key is not in known_hosts (or differs from it) and ssh may not ask (lspawn runs it with "
           "BatchMode=yes): check the key and add it (ssh-keyscan), or accept the keys of new hosts with --rsh 'ssh "
           "-o StrictHostKeyChecking=accept-new'";
  }
  if (has("Permission denied") && given("BatchMode=yes")) {
    return "ssh may not ask for a password or passphrase (lspawn runs it with BatchMode=yes): the host must accept a "
           "key that ssh offers without a question (ssh-copy-id, ssh-agent)";
  }
  if (has("timed out") && given("ConnectTimeout=10")) {
    return "lspawn gives ssh ConnectTimeout=10; wait longer with --rsh 'ssh -o ConnectTimeout=N'";
  }
  return "";
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.,/:=+@%") ==
                        std::string::npos) {
    return s;
  }
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

std::vector<std::string> remote_lspawn_args(const RemoteJob& job, int node_rank) {
  std::vector<std::string> a = {
      job.lspawn,    "--control-stdin",         "--nnodes",      std::to_string(job.hosts.size()),
      "--node-rank", std::to_string(node_rank), "--master-addr", job.hosts.at(0).name};
  if (job.add_master_port) {
    a.push_back("--master-port");
    a.push_back(std::to_string(job.master_port));
  }
  if (job.add_run_id) {
    a.push_back("--rdzv-id");
    a.push_back(job.run_id);
  }
  if (job.nprocs) {
    a.push_back("--nprocs");
    a.push_back(std::to_string(*job.nprocs));
  }
  a.insert(a.end(), job.forwarded.begin(), job.forwarded.end());
  return a;
}

std::string remote_command(const RemoteJob& job, int node_rank) {
  // `cd DIR || cd`: the caller's directory where that host has it, else the login's home, as
  // mpirun does.
  std::string cmd = "cd " + shell_quote(job.cwd) + " 2>/dev/null || cd; exec";
  for (const std::string& w : remote_lspawn_args(job, node_rank)) cmd += " " + shell_quote(w);
  return cmd;
}

}  // namespace lspawn::hosts
