/* Open MPI reference for lspawn_bench_collectives: the same op x size sweep with MPI_Allreduce,
 * MPI_Bcast and MPI_Allgather on float32, same timing rules (3 warm-ups, an op count sized from
 * the fastest of 5 more to last about the budget, the slowest rank's time). Prints one JSON object per line.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_bench [max_bytes] [step] [budget_ms] [min_bytes]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run(const char* op, float* in, float* out, long count) {
  if (!strcmp(op, "all_reduce")) MPI_Allreduce(MPI_IN_PLACE, in, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(op, "broadcast")) MPI_Bcast(in, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else MPI_Allgather(in, (int)count, MPI_FLOAT, out, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
}

static double slowest(double v) {
  double m;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  long max_bytes = argc > 1 ? atol(argv[1]) : 64L << 20;
  long step = argc > 2 ? atol(argv[2]) : 4;
  double budget = (argc > 3 ? atof(argv[3]) : 300.0) / 1e3;
  long min_bytes = argc > 4 ? atol(argv[4]) : 4;
  const char* ops[] = {"all_reduce", "broadcast", "all_gather"};
  for (int o = 0; o < 3; ++o) {
    for (long bytes = min_bytes; bytes <= max_bytes; bytes *= step) {
      long count = bytes / 4 > 0 ? bytes / 4 : 1;
      float* in = malloc(count * sizeof(float));
      float* out = malloc(count * sizeof(float) * n);
      for (long i = 0; i < count; ++i) in[i] = (float)(rank + 1);
      for (int i = 0; i < 3; ++i) run(ops[o], in, out, count);
      MPI_Barrier(MPI_COMM_WORLD);
      double fastest = 1e9;
      for (int i = 0; i < 5; ++i) {
        double t = MPI_Wtime();
        run(ops[o], in, out, count);
        t = MPI_Wtime() - t;
        if (t < fastest) fastest = t;
      }
      double one = slowest(fastest);
      long iters = (long)(budget / (one > 1e-7 ? one : 1e-7));
      if (iters < 5) iters = 5;
      if (iters > 2000) iters = 2000;
      MPI_Bcast(&iters, 1, MPI_LONG, 0, MPI_COMM_WORLD);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (long i = 0; i < iters; ++i) run(ops[o], in, out, count);
      double secs = slowest((MPI_Wtime() - t0) / iters);
      double algbw = count * 4.0 / secs / 1e9;
      double factor = !strcmp(ops[o], "all_reduce") ? 2.0 * (n - 1) / n : !strcmp(ops[o], "all_gather") ? (double)(n - 1) : 1.0;
      if (rank == 0) {
        printf("{\"impl\": \"openmpi\", \"op\": \"%s\", \"bytes\": %ld, \"nprocs\": %d, \"backend\": \"mpi\", "
               "\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f}\n",
               ops[o], count * 4, n, secs * 1e6, algbw, algbw * factor);
        fflush(stdout);
      }
      free(in);
      free(out);
    }
  }
  MPI_Finalize();
  return 0;
}
