// launcher/hosts.hpp: mpirun's hostfile, --hosts, the workers per node, the remote shell, and
// the command line each host's lspawn runs; and the options of --hostfile/--hosts in parse_cli.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/cli_options.hpp"
#include "launcher/hosts.hpp"
#include "support/env_lookup.hpp"

using lspawn::UsageError;
using namespace lspawn::hosts;
using Catch::Matchers::Contains;

namespace {
const auto env_of = lspawn::test::lookup_of;
std::vector<std::string> names(const std::vector<Host>& hs) {
  std::vector<std::string> n;
  for (const auto& h : hs) n.push_back(h.name);
  return n;
}
}  // namespace

TEST_CASE("parse_hostfile: mpirun's format - names, slots, comments, blank lines, IPv6", "[hosts]") {
  const auto hs = parse_hostfile(
      "# the cluster\n"
      "node-a slots=2   # a comment after\n"
      "\n"
      "   10.0.0.2 slots=2 max_slots=4\n"
      "fd00::3\tslots=2\n",
      "hosts.txt");
  REQUIRE(hs.size() == 3);
  CHECK(names(hs) == std::vector<std::string>{"node-a", "10.0.0.2", "fd00::3"});
  CHECK(hs[0].slots == 2);
  CHECK(hs[1].line == 4);
  CHECK(parse_hostfile("a\nb\n", "f")[1].slots == 0);
}

TEST_CASE("parse_hostfile: what is wrong is named with the file and line", "[hosts]") {
  CHECK_THROWS_WITH(parse_hostfile("a slots=2\nb slots=x\n", "h.txt"),
                    Contains("h.txt:2: slots: expected a count 1..4096, got 'x'"));
  CHECK_THROWS_WITH(parse_hostfile("a cpus=2\n", "h.txt"), Contains("h.txt:1: 'cpus=2' is not slots=N or max_slots=N"));
  CHECK_THROWS_WITH(parse_hostfile("a\n# b\na slots=1\n", "h.txt"),
                    Contains("h.txt:3: host 'a' is listed again (line 1): lspawn runs one node per host"));
  CHECK_THROWS_WITH(parse_hostfile("# nothing\n\n", "h.txt"), Contains("h.txt: lists no host"));
  CHECK_THROWS_WITH(parse_hostfile("slots=2 a\n", "h.txt"), Contains("h.txt:1: expected a host name first"));
  CHECK_THROWS_WITH(parse_hostfile("a slots=0\n", "h.txt"), Contains("expected a count 1..4096, got '0'"));
}

TEST_CASE("parse_hosts_list: NAME[:N], [IPV6][:N], errors", "[hosts]") {
  const auto hs = parse_hosts_list("a:2,10.0.0.2:2,[fd00::3]:2,[fd00::4]");
  CHECK(names(hs) == std::vector<std::string>{"a", "10.0.0.2", "fd00::3", "fd00::4"});
  CHECK(hs[2].slots == 2);
  CHECK(hs[3].slots == 0);
  CHECK_THROWS_WITH(parse_hosts_list("a,,b"), Contains("--hosts: an empty host in 'a,,b'"));
  CHECK_THROWS_WITH(parse_hosts_list("fd00::3"), Contains("looks like an IPv6 address: write it [ADDR]"));
  CHECK_THROWS_WITH(parse_hosts_list("a:x"), Contains("expected a count 1..4096 after ':', got 'x'"));
  CHECK_THROWS_WITH(parse_hosts_list("a,a:2"), Contains("host 'a' is listed twice"));
  CHECK_THROWS_WITH(parse_hosts_list("[fd00::1"), Contains("expected [IPV6] or [IPV6]:N"));
}

TEST_CASE("workers_per_node: --nprocs, else equal slots, else 1 - unequal slots are refused", "[hosts]") {
  CHECK(workers_per_node(parse_hosts_list("a:2,b:2"), std::nullopt) == 2);
  CHECK(workers_per_node(parse_hosts_list("a,b"), std::nullopt) == 1);
  CHECK(workers_per_node(parse_hosts_list("a:2,b:3"), 4) == 4);
  CHECK_THROWS_WITH(workers_per_node(parse_hosts_list("a:2,b:3"), std::nullopt),
                    Contains("the hosts' slots differ (a 2, b 3)"));
  CHECK_THROWS_WITH(workers_per_node(parse_hosts_list("a,b:3"), std::nullopt),
                    Contains("host 'a' has no slots while b has slots=3"));
}

TEST_CASE("rsh_command: --rsh, else LSPAWN_RSH, else ssh, split at blanks", "[hosts]") {
  CHECK(rsh_command("", env_of({})) == std::vector<std::string>{"ssh"});
  CHECK(rsh_command("", env_of({{"LSPAWN_RSH", "ssh -p 2222"}})) == std::vector<std::string>{"ssh", "-p", "2222"});
  CHECK(rsh_command("rsh", env_of({{"LSPAWN_RSH", "ssh"}})) == std::vector<std::string>{"rsh"});
  CHECK_THROWS_WITH(rsh_command("", env_of({{"LSPAWN_RSH", "   "}})), Contains("LSPAWN_RSH: '   ' names no command"));
}

TEST_CASE("with_ssh_defaults: BatchMode, ConnectTimeout, -T, -x for ssh only, an option of the user wins", "[hosts]") {
  using V = std::vector<std::string>;
  const V added = {"-T", "-x", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"};
  auto plus = [](V a, const V& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  CHECK(with_ssh_defaults({"ssh"}) == plus({"ssh"}, added));
  CHECK(with_ssh_defaults({"/usr/bin/ssh", "-p", "2222"}) == plus({"/usr/bin/ssh", "-p", "2222"}, added));
  // -F's value is not read as flags (a file named -tX is still a file)
  CHECK(with_ssh_defaults({"ssh", "-F", "-tX"}) == plus({"ssh", "-F", "-tX"}, added));
  // another program gets nothing, even one whose name ends in ssh
  CHECK(with_ssh_defaults({"rsh"}) == V{"rsh"});
  CHECK(with_ssh_defaults({"/opt/nsrsh", "-x"}) == V{"/opt/nsrsh", "-x"});
  CHECK(with_ssh_defaults({"autossh"}) == V{"autossh"});
  CHECK(with_ssh_defaults({"sshpass", "-p", "pw", "ssh"}) == V{"sshpass", "-p", "pw", "ssh"});
  // the user's -o KEY (any case, -oKEY=V or -o KEY=V) wins: not added again
  CHECK(with_ssh_defaults({"ssh", "-o", "batchmode=no"}) ==
        V{"ssh", "-o", "batchmode=no", "-T", "-x", "-o", "ConnectTimeout=10"});
  CHECK(with_ssh_defaults({"ssh", "-oConnectTimeout=60", "-q"}) ==
        V{"ssh", "-oConnectTimeout=60", "-q", "-T", "-x", "-o", "BatchMode=yes"});
  // a user's -t (a terminal) or -X/-Y (X11) wins over -T and -x, also inside a group of flags
  CHECK(with_ssh_defaults({"ssh", "-tt"}) == V{"ssh", "-tt", "-x", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"});
  CHECK(with_ssh_defaults({"ssh", "-CY"}) == V{"ssh", "-CY", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"});
  CHECK(with_ssh_defaults({"ssh", "-qxl", "me"}) ==
        V{"ssh", "-qxl", "me", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"});
}

TEST_CASE("ssh_failure_hint: what BatchMode=yes and ConnectTimeout turned into an error", "[hosts]") {
  const auto ssh = with_ssh_defaults({"ssh"});
  CHECK_THAT(ssh_failure_hint(ssh, "Host key verification failed."), Contains("not in known_hosts") &&
                                                                         Contains("BatchMode=yes") &&
                                                                         Contains("StrictHostKeyChecking=accept-new"));
  CHECK_THAT(ssh_failure_hint(ssh, "root@10.0.0.2: Permission denied (publickey,password)."),
             Contains("may not ask for a password") && Contains("ssh-copy-id"));
  CHECK_THAT(ssh_failure_hint(ssh, "ssh: connect to host n9 port 22: Connection timed out"),
             Contains("ConnectTimeout=10") && Contains("-o ConnectTimeout=N"));
  CHECK(ssh_failure_hint(ssh, "ssh: connect to host n9 port 22: No route to host").empty());
  // the user chose otherwise, or it is not ssh: no hint about lspawn's defaults
  CHECK(ssh_failure_hint(with_ssh_defaults({"ssh", "-o", "BatchMode=no"}), "Permission denied (password).").empty());
  CHECK(ssh_failure_hint({"rsh"}, "Permission denied.").empty());
}

TEST_CASE("shell_quote and remote_command: what the remote login shell parses back", "[hosts]") {
  CHECK(shell_quote("plain-word_1.2/x:y=z") == "plain-word_1.2/x:y=z");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's $HOME") == "'it'\\''s $HOME'");
  RemoteJob job;
  job.lspawn = "/opt/lspawn/bin/lspawn";
  job.cwd = "/home/me/my project";
  job.hosts = parse_hosts_list("n0:2,n1:2");
  job.run_id = "r1";
  job.nprocs = 2;
  job.forwarded = {"--grace-period", "1", "train.py", "--lr", "0.1 x"};
  CHECK(remote_command(job, 1) ==
        "cd '/home/me/my project' 2>/dev/null || cd; exec /opt/lspawn/bin/lspawn --control-stdin --nnodes 2 "
        "--node-rank 1 --master-addr n0 --master-port 29500 --rdzv-id r1 --nprocs 2 --grace-period 1 train.py --lr "
        "'0.1 x'");
  job.add_master_port = false;
  job.add_run_id = false;
  job.nprocs.reset();
  CHECK(remote_lspawn_args(job, 0) == std::vector<std::string>{"/opt/lspawn/bin/lspawn", "--control-stdin", "--nnodes",
                                                               "2", "--node-rank", "0", "--master-addr", "n0",
                                                               "--grace-period", "1", "train.py", "--lr", "0.1 x"});
}

TEST_CASE("parse_cli: --hostfile/--hosts/--rsh, where they are, and what they refuse", "[hosts][cli]") {
  auto o = lspawn::parse_cli({"--hosts", "a,b", "--grace-period", "1", "--rsh=ssh -x", "prog", "--hosts", "x"});
  CHECK(o.hosts_list == "a,b");
  CHECK(o.rsh == "ssh -x");
  CHECK(o.host_option_args == std::vector<size_t>{0, 1, 4});  // the program's own --hosts is its
  CHECK(o.program == std::vector<std::string>{"prog", "--hosts", "x"});
  CHECK(lspawn::parse_cli({"--hostfile=h", "prog"}).hostfile == "h");
  CHECK(lspawn::parse_cli({"--control-stdin", "prog"}).control_stdin);
  CHECK_THROWS_WITH(lspawn::parse_cli({"--hostfile", "h", "--nnodes", "2", "prog"}),
                    Contains("--nnodes: --hostfile decides the nodes"));
  CHECK_THROWS_WITH(lspawn::parse_cli({"--hosts", "a", "--master-addr", "x", "prog"}),
                    Contains("--master-addr: --hosts decides the nodes"));
  CHECK_THROWS_WITH(lspawn::parse_cli({"--hosts", "a", "--hostfile", "h", "prog"}), Contains("give one of them"));
  CHECK_THROWS_WITH(lspawn::parse_cli({"--rsh", "ssh", "prog"}),
                    Contains("--rsh: only with --hostfile FILE or --hosts"));
  CHECK_THROWS_WITH(lspawn::parse_cli({"--rsh", " ", "prog"}), Contains("--rsh: empty command"));
  // From the environment (torchrun's PET_*), the indices are still those of the command line.
  auto e = lspawn::parse_cli({"--hosts", "a", "prog"}, env_of({{"PET_MAX_RESTARTS", "1"}}));
  CHECK(e.host_option_args == std::vector<size_t>{0, 1});
  CHECK(e.max_restarts == 1);
}
