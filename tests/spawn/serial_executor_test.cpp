#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "spawn/serial_executor.hpp"
#include "spawn/spawn.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"

using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {
// Appends "enter i" / "leave i" to a log (O_APPEND: one write each), with a pause inside.
void t_serial(int index, std::string log) {
  lspawn::SerialExecutor exec;  // $LSPAWN_RUN_DIR/serial.lock
  exec.run([&] {
    const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    const std::string enter = "enter " + std::to_string(index) + "\n";
    const std::string leave = "leave " + std::to_string(index) + "\n";
    (void)!::write(fd, enter.data(), enter.size());
    std::this_thread::sleep_for(50ms);
    (void)!::write(fd, leave.data(), leave.size());
    ::close(fd);
  });
}
LSPAWN_REGISTER(t_serial);
}  // namespace

TEST_CASE("SerialExecutor runs one local worker at a time") {
  TempDir dir;
  const std::string log = dir.path + "/log";
  lspawn::SpawnOptions o;
  o.nprocs = 4;
  o.start_method = lspawn::StartMethod::Forkserver;
  o.on_info = [](const std::string&) {};
  lspawn::spawn(t_serial, std::make_tuple(log), o);
  std::istringstream in(read_file(log));
  std::string word, who, inside;
  int entries = 0;
  while (in >> word >> who) {
    if (word == "enter") {
      CHECK(inside.empty());  // nobody else inside
      inside = who;
      ++entries;
    } else {
      CHECK(inside == who);
      inside.clear();
    }
  }
  CHECK(entries == 4);
}

TEST_CASE("SerialExecutor: a holder that dies does not block the others") {
  TempDir dir;
  const std::string lock = dir.path + "/serial.lock";
  auto held = lspawn::sys::make_pipe("held");
  std::fflush(nullptr);
  const pid_t holder = ::fork();
  if (holder == 0) {
    lspawn::SerialExecutor exec(lock);
    exec.run([&] {
      (void)!::write(held.write.get(), "x", 1);
      ::pause();  // killed while holding the lock
    });
    std::_Exit(0);
  }
  held.write.reset();
  char c;
  REQUIRE(lspawn::sys::read_some(held.read.get(), &c, 1, "held") == 1);
  lspawn::sys::kill(holder, SIGKILL, "test");
  int status;
  lspawn::sys::waitpid(holder, &status, 0, "test");
  lspawn::SerialExecutor exec(lock);
  CHECK(exec.run([] { return 42; }) == 42);  // does not hang
}

TEST_CASE("SerialExecutor without a run dir names the missing variable") {
  const char* saved = std::getenv("LSPAWN_RUN_DIR");
  const std::string keep = saved ? saved : "";
  ::unsetenv("LSPAWN_RUN_DIR");
  CHECK_THROWS_WITH(lspawn::SerialExecutor(), Catch::Contains("LSPAWN_RUN_DIR is not set"));
  if (saved) ::setenv("LSPAWN_RUN_DIR", keep.c_str(), 1);
}
