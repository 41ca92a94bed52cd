// cuda_streams00: streams and events with ordered work still in flight at the dump.
//
// NSTREAMS non-blocking streams each run a chain of STEPS steps on their own buffer: a spin
// kernel (SPIN_MS of GPU time, so the work is still queued when READY is printed) followed by
// an affine update x = x * a_k + b_k. Halfway, every stream snapshots word 0 of its buffer and
// records an event; its neighbour waits on that event and adds the snapshot to its buffer, so
// the result depends on the cross-stream order. After the restore: the events must be
// complete and timed, every buffer must equal the CPU model, and a second round on the same
// streams must again equal the model.
#include "zdtm_cuda.h"

#include <vector>

#define NSTREAMS 4
#define STEPS 8
#define SPIN_MS 150

__global__ static void spin_kernel(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

__global__ static void affine_kernel(uint32_t *p, size_t n, uint32_t a, uint32_t b) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        p[i] = p[i] * a + b;
    }
}

__global__ static void snapshot_kernel(const uint32_t *p, uint32_t *slot) { *slot = p[0]; }

__global__ static void add_slot_kernel(uint32_t *p, size_t n, const uint32_t *slot) {
    uint32_t v = *slot;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        p[i] += v;
    }
}

static uint32_t step_a(int round, int s, int k) { return 2u * (uint32_t)(round * 131 + s * 17 + k) + 1u; }
static uint32_t step_b(int round, int s, int k) { return (uint32_t)(round * 7919 + s * 104729 + k * 31); }

struct Stream {
    cudaStream_t stream;
    cudaEvent_t start, end, half;
    uint32_t *buf;
    std::vector<uint32_t> model;
};

// Enqueues one round on every stream (no synchronisation).
static void enqueue_round(Stream *st, size_t n, uint32_t *slots, int round) {
    for (int s = 0; s < NSTREAMS; s++) ZC_CHECK(cudaEventRecord(st[s].start, st[s].stream));
    for (int k = 0; k < STEPS; k++) {
        for (int s = 0; s < NSTREAMS; s++) {
            cudaStream_t q = st[s].stream;
            spin_kernel<<<1, 1, 0, q>>>((unsigned long long)SPIN_MS * 1000000ull / STEPS);
            affine_kernel<<<512, 256, 0, q>>>(st[s].buf, n, step_a(round, s, k), step_b(round, s, k));
            if (k == STEPS / 2) {
                snapshot_kernel<<<1, 1, 0, q>>>(st[s].buf, &slots[round * NSTREAMS + s]);
                ZC_CHECK(cudaEventRecord(st[s].half, q));
            }
        }
        if (k == STEPS / 2) {
            for (int s = 0; s < NSTREAMS; s++) {
                int nb = (s + 1) % NSTREAMS;
                ZC_CHECK(cudaStreamWaitEvent(st[s].stream, st[nb].half, 0));
                add_slot_kernel<<<512, 256, 0, st[s].stream>>>(st[s].buf, n, &slots[round * NSTREAMS + nb]);
            }
        }
        ZC_CHECK(cudaGetLastError());
    }
    for (int s = 0; s < NSTREAMS; s++) ZC_CHECK(cudaEventRecord(st[s].end, st[s].stream));
}

// The same round on the CPU models.
static void model_round(Stream *st, size_t n, int round) {
    uint32_t snap[NSTREAMS];
    for (int k = 0; k < STEPS; k++) {
        for (int s = 0; s < NSTREAMS; s++) {
            uint32_t a = step_a(round, s, k), b = step_b(round, s, k);
            for (size_t i = 0; i < n; i++) st[s].model[i] = st[s].model[i] * a + b;
            if (k == STEPS / 2) snap[s] = st[s].model[0];
        }
        if (k == STEPS / 2) {
            for (int s = 0; s < NSTREAMS; s++) {
                uint32_t v = snap[(s + 1) % NSTREAMS];
                for (size_t i = 0; i < n; i++) st[s].model[i] += v;
            }
        }
    }
}

static void check_round(Stream *st, size_t n, const char *when) {
    std::vector<uint32_t> got(n);
    for (int s = 0; s < NSTREAMS; s++) {
        ZC_CHECK(cudaStreamSynchronize(st[s].stream));
        cudaError_t q = cudaEventQuery(st[s].end);
        if (q != cudaSuccess) zc_fail("%s: stream %d: end event not complete: %s", when, s, cudaGetErrorName(q));
        float ms = -1.0f;
        ZC_CHECK(cudaEventElapsedTime(&ms, st[s].start, st[s].end));
        if (!(ms >= 0.0f)) zc_fail("%s: stream %d: elapsed time %f ms", when, s, ms);
        ZC_CHECK(cudaMemcpy(got.data(), st[s].buf, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) {
            if (got[i] != st[s].model[i]) {
                zc_fail("%s: stream %d: word %zu is 0x%08x, expected 0x%08x", when, s, i, got[i],
                        st[s].model[i]);
            }
        }
        zc_info("%s: stream %d: %zu words ok, %.1f ms between its events", when, s, n, ms);
    }
}

int main(int argc, char **argv) {
    zc_init(argc, argv);
    zc_require_devices(1);
    size_t total = zc_bytes(64);
    size_t n = total / NSTREAMS / sizeof(uint32_t);
    Stream st[NSTREAMS];
    uint32_t *slots = NULL;
    ZC_CHECK(cudaMalloc((void **)&slots, 2 * NSTREAMS * sizeof(uint32_t)));
    for (int s = 0; s < NSTREAMS; s++) {
        ZC_CHECK(cudaStreamCreateWithFlags(&st[s].stream, cudaStreamNonBlocking));
        ZC_CHECK(cudaEventCreate(&st[s].start));
        ZC_CHECK(cudaEventCreate(&st[s].end));
        ZC_CHECK(cudaEventCreateWithFlags(&st[s].half, cudaEventDisableTiming));
        ZC_CHECK(cudaMalloc((void **)&st[s].buf, n * sizeof(uint32_t)));
        zc_fill(st[s].buf, n, 0x57000000u + s, st[s].stream);
        st[s].model.resize(n);
        for (size_t i = 0; i < n; i++) st[s].model[i] = zc_pattern(i, 0x57000000u + s);
    }
    for (int s = 0; s < NSTREAMS; s++) ZC_CHECK(cudaStreamSynchronize(st[s].stream));

    enqueue_round(st, n, slots, 0);
    int in_flight = 0;
    for (int s = 0; s < NSTREAMS; s++) in_flight += cudaEventQuery(st[s].end) == cudaErrorNotReady;
    zc_info("%d of %d streams still busy at READY", in_flight, NSTREAMS);
    zc_ready((unsigned long long)n * sizeof(uint32_t) * NSTREAMS + 2 * NSTREAMS * sizeof(uint32_t));
    model_round(st, n, 0);  // CPU work while the GPU (or the checkpoint) runs
    zc_wait_signal();

    check_round(st, n, "after restore, round 0");
    enqueue_round(st, n, slots, 1);
    model_round(st, n, 1);
    check_round(st, n, "after restore, round 1");
    for (int s = 0; s < NSTREAMS; s++) {
        ZC_CHECK(cudaFree(st[s].buf));
        ZC_CHECK(cudaEventDestroy(st[s].start));
        ZC_CHECK(cudaEventDestroy(st[s].end));
        ZC_CHECK(cudaEventDestroy(st[s].half));
        ZC_CHECK(cudaStreamDestroy(st[s].stream));
    }
    ZC_CHECK(cudaFree(slots));
    zc_pass();
}
