// A training-like job on NCCL alone, no Python (as a JAX, TensorFlow or C++ trainer
// looks to a launcher), for scripts/device/gpu_plugin_safety.sh. Each step: GPU
// compute (a kernel that runs COMPUTE_MS on the GPU), then an all_reduce of
// BYTES, then a sync. Started by toporun (or torchrun) as one process per GPU: RANK,
// WORLD_SIZE, LOCAL_RANK from the environment; NCCL's unique id passed through the
// file ID_FILE (rank 0 writes it, the others wait for it).
//   CASE=healthy  STEPS steps (or RUN_S s), every rank alike
//   CASE=stuck    rank HOLD_RANK blocks in a read of a pipe nobody writes before step
//                 HOLD_STEP (its CPU idle), the others wait in that step's all_reduce
//   CASE=slow     rank HOLD_RANK's compute takes SLOW_X times as long (its GPU is
//                 the straggler; the others wait for it in every all_reduce)
// Prints `hold: rank R ...` on stderr when it holds, `step N` every 100 steps.
// Build: nvcc -O2 -o nccl_c_job nccl_c_job.cu -I$NCCL/include -L$NCCL/lib -l:libnccl.so.2
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(what, ok)                                                        \
  do {                                                                         \
    if (!(ok)) {                                                               \
      fprintf(stderr, "rank %d: %s failed at %s:%d\n", rank, what, __FILE__, __LINE__); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static int rank = -1;

static long env_long(const char *k, long d) {
  const char *v = getenv(k);
  return v && *v ? atol(v) : d;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

// Runs on the GPU for `ns` by its global timer.
__global__ void compute(long long ns, float *x) {
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    x[threadIdx.x] += 1.0f;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

static void unique_id(ncclUniqueId *id, const char *path) {
  if (rank == 0) {
    CHECK("ncclGetUniqueId", ncclGetUniqueId(id) == ncclSuccess);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    CHECK("write ID_FILE", f && fwrite(id, sizeof *id, 1, f) == 1);
    fclose(f);
    CHECK("rename ID_FILE", rename(tmp, path) == 0);
    return;
  }
  for (int i = 0; i < 60000; i++) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t n = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (n == 1) return;
    }
    usleep(1000);
  }
  CHECK("reading ID_FILE within 60 s", 0);
}

static void block_in_a_read(void) {
  int p[2];
  char c;
  CHECK("pipe", pipe(p) == 0);
  fprintf(stderr, "hold: rank %d blocks in a read\n", rank);
  ssize_t n = read(p[0], &c, 1);  // the write end is ours and never written
  (void)n;
}

int main(void) {
  rank = (int)env_long("RANK", 0);
  int world = (int)env_long("WORLD_SIZE", 1), local = (int)env_long("LOCAL_RANK", 0);
  const char *id_file = getenv("ID_FILE");
  const char *mode = getenv("CASE") ? getenv("CASE") : "healthy";
  long steps = env_long("STEPS", 1000000), seconds = env_long("RUN_S", 60);
  long hold_rank = env_long("HOLD_RANK", 1), hold_step = env_long("HOLD_STEP", 200);
  long compute_ms = env_long("COMPUTE_MS", 10), slow_x = env_long("SLOW_X", 3);
  size_t count = (size_t)env_long("BYTES", 16 << 20) / sizeof(float);
  CHECK("ID_FILE set", id_file != NULL);
  CHECK("cudaSetDevice", cudaSetDevice(local) == cudaSuccess);
  ncclUniqueId id;
  unique_id(&id, id_file);
  ncclComm_t comm;
  CHECK("ncclCommInitRank", ncclCommInitRank(&comm, world, id, rank) == ncclSuccess);
  float *buf, *x;
  cudaStream_t s;
  CHECK("cudaMalloc", cudaMalloc(&buf, count * sizeof(float)) == cudaSuccess);
  CHECK("cudaMalloc", cudaMalloc(&x, 1024 * sizeof(float)) == cudaSuccess);
  CHECK("cudaStreamCreate", cudaStreamCreate(&s) == cudaSuccess);
  int slow = strcmp(mode, "slow") == 0 && rank == hold_rank;
  if (slow) fprintf(stderr, "hold: rank %d computes %ldx as long\n", rank, slow_x);
  long long ns = compute_ms * 1000000LL * (slow ? slow_x : 1);
  double t0 = now_s();
  for (long i = 0; i < steps && now_s() - t0 < seconds; i++) {
    if (strcmp(mode, "stuck") == 0 && rank == hold_rank && i == hold_step) block_in_a_read();
    compute<<<1, 256, 0, s>>>(ns, x);
    CHECK("ncclAllReduce", ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s) == ncclSuccess);
    CHECK("cudaStreamSynchronize", cudaStreamSynchronize(s) == cudaSuccess);
    if (i % 100 == 0) fprintf(stderr, "rank %d step %ld at %.1fs\n", rank, i, now_s() - t0);
  }
  CHECK("ncclCommDestroy", ncclCommDestroy(comm) == ncclSuccess);
  fprintf(stderr, "rank %d done\n", rank);
  return 0;
}
