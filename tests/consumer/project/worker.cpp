// The worker side, built against an installed lspawn from its public face alone: spawn() starts 2
// workers (exec, StartMethod::Spawn); each joins the job (init_process_group), makes a Group and
// all_reduces its rank + 1, so each returns 1 + 2 = 3. The strategies' face is compiled in too
// (TrainerOptions), so every public header is known to build from an install.
#include <lspawn/collectives.hpp>
#include <lspawn/runtime.hpp>
#include <lspawn/spawn.hpp>
#include <lspawn/strategies.hpp>

#include <cstdio>

double sum_of_ranks(int index) {
  lspawn::World world = lspawn::init_process_group();
  auto group = lspawn::Group::from_world(world);
  at::Tensor t = at::full({4}, static_cast<double>(index + 1), at::kDouble);
  lspawn::all_reduce(*group, t, lspawn::ReduceOp::Sum);
  return t[3].item<double>();
}
LSPAWN_REGISTER(sum_of_ranks);

int consumer_main(int argc, char** argv) {
  lspawn::init(argc, argv);  // in a worker: runs sum_of_ranks() and exits
  lspawn::TrainerOptions trainer;
  lspawn::SpawnOptions o;
  o.nprocs = 2;
  o.start_method = lspawn::StartMethod::Spawn;
  const auto results = lspawn::spawn(sum_of_ranks, o).results<double>();
  int bad = 0;
  for (int i = 0; i < 2; ++i) {
    std::printf("rank %d: all_reduce gave %g\n", i, results[i] ? *results[i] : -1.0);
    bad += !results[i] || *results[i] != 3.0;
  }
  std::printf("trainer max_epochs default: %d\n", static_cast<int>(trainer.max_epochs));
  std::printf(bad ? "consumer worker: FAILED\n" : "consumer worker: OK\n");
  return bad ? 1 : 0;
}

int main(int argc, char** argv) { return lspawn::run_main(argc, argv, consumer_main); }
