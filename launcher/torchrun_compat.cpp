#include "launcher/torchrun_compat.hpp"

#include <cctype>
#include <cerrno>
#include <cstring>

#include "launcher/cli_options.hpp"

namespace lspawn {
namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 6 && s.find_first_not_of("0123456789") == std::string::npos;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::vector<std::string> split_commas(const std::string& v) {
  std::vector<std::string> items;
  size_t pos = 0;
  for (size_t comma = v.find(','); comma != std::string::npos; comma = v.find(',', pos)) {
    items.push_back(v.substr(pos, comma - pos));
    pos = comma + 1;
  }
  items.push_back(v.substr(pos));
  return items;
}

int StdSpec::mask_for(int local_rank) const {
  if (!mapped) return all;
  const auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? 0 : it->second;
}

bool StdSpec::any() const {
  if (!mapped) return all != 0;
  for (const auto& [lr, m] : per_rank)
    if (m != 0) return true;
  return false;
}

std::optional<StdSpec> parse_std_spec(const std::string& v) {
  StdSpec s;
  if (v.size() == 1 && v[0] >= '0' && v[0] <= '3') {
    s.all = v[0] - '0';
    return s;
  }
  if (v.empty()) return std::nullopt;
  s.mapped = true;
  for (const std::string& item : split_commas(v)) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) return std::nullopt;
    const std::string lr = item.substr(0, colon), m = item.substr(colon + 1);
    if (!all_digits(lr) || m.size() != 1 || m[0] < '0' || m[0] > '3') return std::nullopt;
    s.per_rank[std::stoi(lr)] = m[0] - '0';
  }
  return s;
}

StdRoute std_route(const StdSpec& redirects, const StdSpec& tee, int local_rank, bool is_stderr) {
  const int bit = is_stderr ? 2 : 1;
  const bool redirected = (redirects.mask_for(local_rank) & bit) != 0;
  const bool teed = (tee.mask_for(local_rank) & bit) != 0;
  StdRoute r;
  r.file = redirected || teed;
  r.console = teed || !redirected;
  return r;
}

std::optional<std::set<int>> parse_local_ranks(const std::string& v) {
  std::set<int> ranks;
  for (const std::string& item : split_commas(v)) {
    if (!all_digits(item)) return std::nullopt;
    ranks.insert(std::stoi(item));
  }
  return ranks;
}

StdRoute filter_route(StdRoute route, const std::set<int>& shown, int local_rank) {
  if (shown.count(local_rank)) return route;
  return StdRoute{false, true};
}

int resolve_nproc_spec(const std::string& spec, int gpus, int cpus, const char* cuda_visible_devices, int max_procs,
                       std::string* how) {
  const std::string flag = "--nproc-per-node " + spec;
  int n = 0;
  std::string what;
  if (spec == "gpu" || (spec == "auto" && gpus > 0)) {
    if (gpus <= 0) {
      const std::string visible = cuda_visible_devices == nullptr
                                      ? "CUDA_VISIBLE_DEVICES unset and no /dev/nvidiaN device"
                                      : "CUDA_VISIBLE_DEVICES='" + std::string(cuda_visible_devices) + "'";
      throw UsageError(flag + ": no NVIDIA GPU is visible to this process (" + visible +
                       "); give a count (--nproc-per-node N) or cpu|auto");
    }
    n = gpus;
    what = std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s");
  } else if (spec == "cpu" || spec == "auto") {
    n = cpus < 1 ? 1 : cpus;
    what = std::to_string(n) + " CPU" + (n == 1 ? "" : "s") + " usable by this process";
  } else {
    throw UsageError(
        "--nproc-per-node: expected a positive integer, gpu, cpu or auto "
        "(--nproc-per-node N|gpu|cpu|auto), got '" +
        spec + "'");
  }
  if (n > max_procs) {
    throw UsageError(flag + ": " + what + ", more than " + std::to_string(max_procs) +
                     " workers; give a count (--nproc-per-node N)");
  }
  if (how) *how = what;
  return n;
}

std::vector<std::string> worker_command(const std::vector<std::string>& program, const ProgramConvention& c,
                                        const std::string& python, std::string* reason) {
  if (reason) reason->clear();
  if (c.no_python) {
    if (c.module) throw UsageError("--no-python: cannot be combined with -m/--module (as torchrun)");
    if (!c.run_path) return program;
  }
  std::string why;
  if (c.module) {
    why = "-m";
  } else if (c.run_path) {
    why = "--run-path";
  } else if (!program.empty() && ends_with(program[0], ".py")) {
    why = "a .py program";
  } else {
    return program;
  }
  std::vector<std::string> argv{python};
  if (c.unbuffered) argv.push_back("-u");
  if (c.module) argv.push_back("-m");
  argv.insert(argv.end(), program.begin(), program.end());
  if (reason) *reason = why;
  return argv;
}

std::string python_interpreter(const std::function<std::optional<std::string>(const std::string&)>& env,
                               std::string* source) {
  for (const char* name : {"LSPAWN_PYTHON", "PYTHON_EXEC"}) {
    if (auto v = env(name); v && !v->empty()) {
      if (source) *source = name;
      return *v;
    }
  }
  if (source) *source = "default";
  return "python3";
}

std::vector<std::pair<std::string, std::string>> parse_rdzv_conf(const std::string& opt, const std::string& v) {
  std::vector<std::pair<std::string, std::string>> out;
  if (v.empty()) return out;
  for (const std::string& item : split_commas(v)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError(opt + ": expected KEY=VALUE entries separated by commas (" + opt +
                       " join_timeout=900,KEY=VALUE), got '" + item + "' in '" + v + "'");
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

std::string expand_prefix_template(const std::string& tmpl, const PrefixFields& f) {
  auto value_of = [&](const std::string& name) -> std::optional<std::string> {
    if (name == "role_name") return f.role_name;
    if (name == "rank") return std::to_string(f.rank);
    if (name == "local_rank") return std::to_string(f.local_rank);
    if (name == "hostname") return f.hostname;
    return std::nullopt;
  };
  // Python's Template identifier: [_a-zA-Z][_a-zA-Z0-9]* (ASCII).
  auto ident_start = [](char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)); };
  auto ident_char = [](char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)); };
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    const char c = tmpl[i];
    if (c != '$' || i + 1 >= tmpl.size()) {
      out += c;
      ++i;
      continue;
    }
    if (tmpl[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = tmpl[i + 1] == '{';
    size_t start = i + (braced ? 2 : 1), end = start;
    if (end < tmpl.size() && ident_start(tmpl[end])) {
      ++end;
      while (end < tmpl.size() && ident_char(tmpl[end])) ++end;
    }
    const bool ok = end > start && (!braced || (end < tmpl.size() && tmpl[end] == '}'));
    const auto v = ok ? value_of(tmpl.substr(start, end - start)) : std::nullopt;
    if (!v) {  // safe_substitute: left as it is
      out += c;
      ++i;
      continue;
    }
    out += *v;
    i = braced ? end + 1 : end;
  }
  return out;
}

std::vector<std::string> parse_filter_list(const std::string& opt, const std::string& v) {
  if (v.empty()) return {};
  std::vector<std::string> items(1);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != ',') {
      items.back() += v[i];
    } else if (i + 1 < v.size() && v[i + 1] == ',') {
      items.back() += ',';
      ++i;
    } else {
      items.emplace_back();
    }
  }
  for (const std::string& item : items) {
    if (item.empty()) {
      throw UsageError(opt + ": an empty filter in '" + v + "' would copy every line (" + opt +
                       " ERROR,Traceback; ',,' for a comma inside a filter)");
    }
  }
  return items;
}

std::optional<std::string> refused_torchrun_flag(const std::string& name) {
  struct Refusal {
    const char* name;
    const char* instead;
  };
  static const Refusal kRefused[] = {
      {"--logs-specs", "lspawn has no log plugins; its own files are --log-dir DIR with --redirects/--tee"},
      {"--event-log-handler", "lspawn has no event log; its info lines and the failure summary go to stderr"},
      {"--use-env",
       "that is torch.distributed.launch's flag; lspawn (like torchrun) always sets LOCAL_RANK in the environment"},
  };
  for (const auto& r : kRefused) {
    if (name == r.name) {
      return name + ": torchrun's flag is not supported by lspawn (" + r.instead + ")";
    }
  }
  return std::nullopt;
}

EnvFlags torchrun_env_flags(const std::function<std::optional<std::string>(const std::string&)>& env,
                            const std::set<std::string>& given) {
  // torchrun 2.15's flags with an environment default that lspawn has (canonical '-' names).
  static const char* const kValued[] = {"--rdzv-backend",
                                        "--rdzv-endpoint",
                                        "--rdzv-conf",
                                        "--max-restarts",
                                        "--monitor-interval",
                                        "--start-method",
                                        "--role",
                                        "--log-dir",
                                        "--redirects",
                                        "--tee",
                                        "--local-ranks-filter",
                                        "--local-addr",
                                        "--signals-to-handle",
                                        "--shutdown-timeout",
                                        "--log-line-prefix-template",
                                        "--duplicate-stdout-filters",
                                        "--duplicate-stderr-filters",
                                        "--numa-binding"};
  static const char* const kSwitches[] = {"--standalone", "--module", "--no-python", "--run-path",
                                          "--virtual-local-rank"};
  // ... and those lspawn does not have: their variables are noted, not read.
  static const char* const kAbsent[] = {"--event-log-handler"};
  auto var_of = [](const std::string& flag) {
    std::string v = "PET_";
    for (size_t i = 2; i < flag.size(); ++i) {
      v += flag[i] == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(flag[i])));
    }
    return v;
  };
  EnvFlags out;
  std::vector<EnvFlag> switches;
  bool standalone = given.count("--standalone") != 0;
  for (const char* flag : kSwitches) {
    const std::string var = var_of(flag);
    const auto v = env(var);
    if (!v || v->empty() || given.count(flag) != 0) continue;
    // torchrun: bool(int(value)).
    const bool integer =
        v->find_first_not_of("0123456789") == std::string::npos ||
        ((*v)[0] == '-' && v->size() > 1 && v->find_first_not_of("0123456789", 1) == std::string::npos);
    if (!integer) {
      throw UsageError(var + "='" + *v + "': expected an integer (torchrun's switch " + flag +
                       ": 0 off, any other integer on)");
    }
    const bool on = v->find_first_not_of("-0") != std::string::npos;
    standalone = standalone || (on && std::string(flag) == "--standalone");
    switches.push_back({var, flag, *v, on ? std::vector<std::string>{flag} : std::vector<std::string>{}});
  }
  // --grace-period is lspawn's name of --shutdown-timeout: either on the command line wins.
  const bool grace_given = given.count("--grace-period") != 0 || given.count("--shutdown-timeout") != 0;
  for (const char* flag : kValued) {
    std::string var = var_of(flag);
    auto v = env(var);
    const bool shutdown = std::string(flag) == "--shutdown-timeout";
    if (shutdown && (!v || v->empty())) {
      // torchrun's own fallback when neither the flag nor PET_SHUTDOWN_TIMEOUT is given.
      var = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
      v = env(var);
    }
    if (!v || v->empty() || given.count(flag) != 0 || (shutdown && grace_given)) continue;
    // --standalone replaces the rendezvous, as torchrun's does (which overrides these).
    if (standalone && (std::string(flag) == "--rdzv-endpoint" || std::string(flag) == "--rdzv-backend")) {
      out.notes.push_back(var + "='" + *v + "': ignored with --standalone (one node, a local rendezvous)");
      continue;
    }
    out.flags.push_back({var, flag, *v, {std::string(flag) + "=" + *v}});
  }
  out.flags.insert(out.flags.end(), switches.begin(), switches.end());
  for (const char* flag : kAbsent) {
    const std::string var = var_of(flag);
    if (const auto v = env(var); v && !v->empty()) {
      out.notes.push_back(var + "='" + *v + "': ignored (torchrun's " + flag + ", which lspawn does not have)");
    }
  }
  return out;
}

}  // namespace lspawn
