// The example of docs/spawn.md, built against an installed lspawn: 4 workers started by exec
// (StartMethod::Spawn), each gets its index first and the arguments, and returns a value.
#include <lspawn/spawn.hpp>

#include <cstdio>
#include <string>

std::string train(int index, int epochs, std::string name) {
  return name + "-" + std::to_string(index) + "x" + std::to_string(epochs);
}
LSPAWN_REGISTER(train);

int main(int argc, char** argv) {
  lspawn::init(argc, argv);  // in a worker: runs train() and exits
  lspawn::SpawnOptions o;
  o.nprocs = 4;
  o.start_method = lspawn::StartMethod::Spawn;
  auto ctx = lspawn::spawn(train, std::make_tuple(10, std::string("run")), o);
  const auto results = ctx.results<std::string>();
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    const std::string want = "run-" + std::to_string(i) + "x10";
    std::printf("rank %d returned %s\n", i, results[i] ? results[i]->c_str() : "(nothing)");
    bad += !results[i] || *results[i] != want;
  }
  try {
    o.nprocs = 0;
    lspawn::spawn(train, std::make_tuple(1, std::string("x")), o);
    bad += 1;
  } catch (const lspawn::SpawnError& e) {
    std::printf("invalid nprocs refused: %s\n", e.what());
  }
  std::printf(bad ? "consumer: FAILED\n" : "consumer: OK\n");
  return bad ? 1 : 0;
}
