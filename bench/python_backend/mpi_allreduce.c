/* Open MPI reference for allreduce_bench.py: MPI_Allreduce (sum, float32, in place) with the Python bench's
 * timing rules: 3 warm-ups, an iteration count sized from the fastest of 5 more to last about the budget
 * (max over ranks), then the median of rank 0's per-iteration times. (bench/collectives/mpi_bench.c reports
 * the slowest rank's mean instead, so it is not reused here.) One JSON object per line on stdout.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_allreduce [budget_ms] [bytes ...]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  double budget = (argc > 1 ? atof(argv[1]) : 400.0) / 1e3;
  long defaults[] = {4, 1024, 16384, 262144, 4194304, 16777216, 67108864};
  int nsizes = argc > 2 ? argc - 2 : 7;
  for (int s = 0; s < nsizes; ++s) {
    long bytes = argc > 2 ? atol(argv[2 + s]) : defaults[s];
    long count = bytes / 4 > 0 ? bytes / 4 : 1;
    float* buf = malloc(count * sizeof(float));
    for (long i = 0; i < count; ++i) buf[i] = (float)(rank + 1);
    for (int i = 0; i < 3; ++i) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double fastest = 1e9;
    for (int i = 0; i < 5; ++i) {
      double t = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t = MPI_Wtime() - t;
      if (t < fastest) fastest = t;
    }
    double it = budget / (fastest > 1e-7 ? fastest : 1e-7), agreed;
    if (it < 5) it = 5;
    if (it > 2000) it = 2000;
    MPI_Allreduce(&it, &agreed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long iters = (long)agreed;
    double* times = malloc(iters * sizeof(double));
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < iters; ++i) {
      double t = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times[i] = MPI_Wtime() - t;
    }
    qsort(times, iters, sizeof(double), cmp);
    double median = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
    if (rank == 0) {
      printf("{\"impl\": \"openmpi\", \"op\": \"all_reduce\", \"nprocs\": %d, \"bytes\": %ld, \"iters\": %ld, "
             "\"median_us\": %.3f}\n", n, count * 4, iters, median * 1e6);
      fflush(stdout);
    }
    free(times);
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
