// zdtm_cuda.h: the protocol shared by the zdtm-cuda workloads (ZDTM static-test style).
//
// A workload:
//   1. calls zc_init(argc, argv) first (before any CUDA call: it blocks SIGUSR1 so that the
//      CUDA runtime's threads inherit the mask and the signal is left for zc_wait_signal),
//   2. sets up its CUDA state and checks it once,
//   3. calls zc_ready(bytes), which prints "READY bytes=<device bytes>" to stdout and appends
//      it to the status file,
//   4. calls zc_wait_signal(), which returns when SIGUSR1 arrives (the runner sends it after
//      the restore),
//   5. verifies its state with data and ends with zc_pass() or zc_fail("reason").
//
// Status file: "--status=FILE" or "--status FILE" on the command line, else $ZDTM_CUDA_STATUS,
// else none (stdout only). Every line is appended with open/write/close, so no descriptor of it
// is held across the checkpoint.
//
// Exit codes: 0 PASS, 1 FAIL, 77 SKIP (a precondition is missing; the line says which).
// Environment: ZDTM_CUDA_MIB (buffer size in MiB, per workload default), ZDTM_CUDA_TIMEOUT
// (seconds to wait for SIGUSR1, default 3600).
#ifndef ZDTM_CUDA_H
#define ZDTM_CUDA_H

#include <cuda_runtime.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ZC_EXIT_PASS 0
#define ZC_EXIT_FAIL 1
#define ZC_EXIT_SKIP 77

static const char *zc_status_path = NULL;

// Writes one line to stdout and appends it to the status file.
static inline void zc_emit_line(const char *text) {
    char line[1024];
    size_t len = strnlen(text, sizeof(line) - 2);  // room for '\n' and NUL
    memcpy(line, text, len);
    line[len] = '\0';
    // One line, no embedded newlines (the runner reads line by line).
    for (char *p = line; *p != '\0'; p++) {
        if (*p == '\n' || *p == '\r') *p = ' ';
    }
    printf("%s\n", line);
    fflush(stdout);
    if (zc_status_path != NULL) {
        int fd = open(zc_status_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            line[len] = '\n';
            ssize_t w = write(fd, line, len + 1);
            (void)w;
            close(fd);
        }
    }
}

static inline void zc_vemit(const char *prefix, const char *fmt, va_list ap) {
    char line[1024];
    int n = snprintf(line, sizeof(line), "%s", prefix);
    if (n >= 0 && (size_t)n < sizeof(line)) vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    zc_emit_line(line);
}

// Prints an informational line ("INFO: ...").
__attribute__((format(printf, 1, 2))) static inline void zc_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    zc_vemit("INFO: ", fmt, ap);
    va_end(ap);
}

__attribute__((noreturn)) static inline void zc_pass(void) {
    zc_emit_line("PASS");
    exit(ZC_EXIT_PASS);
}

__attribute__((noreturn, format(printf, 1, 2))) static inline void zc_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    zc_vemit("FAIL: ", fmt, ap);
    va_end(ap);
    exit(ZC_EXIT_FAIL);
}

__attribute__((noreturn, format(printf, 1, 2))) static inline void zc_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    zc_vemit("SKIP: ", fmt, ap);
    va_end(ap);
    exit(ZC_EXIT_SKIP);
}

// Fails with the call, its location and the CUDA error string.
#define ZC_CHECK(call)                                                                     \
    do {                                                                                   \
        cudaError_t zc_e_ = (call);                                                        \
        if (zc_e_ != cudaSuccess) {                                                        \
            zc_fail("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,                       \
                    cudaGetErrorName(zc_e_), cudaGetErrorString(zc_e_));                   \
        }                                                                                  \
    } while (0)

static inline void zc_init(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    zc_status_path = getenv("ZDTM_CUDA_STATUS");
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--status=", 9) == 0) {
            zc_status_path = argv[i] + 9;
        } else if (strcmp(argv[i], "--status") == 0 && i + 1 < argc) {
            zc_status_path = argv[++i];
        } else {
            zc_fail("unknown argument '%s' (usage: %s [--status FILE])", argv[i], argv[0]);
        }
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) zc_fail("pthread_sigmask: %s", strerror(errno));
}

static inline unsigned long long zc_env_ull(const char *name, unsigned long long dflt) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long r = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0') zc_fail("invalid %s='%s' (want a number)", name, v);
    return r;
}

// The buffer size in bytes: $ZDTM_CUDA_MIB MiB, else dflt_mib.
static inline size_t zc_bytes(unsigned long long dflt_mib) {
    unsigned long long mib = zc_env_ull("ZDTM_CUDA_MIB", dflt_mib);
    if (mib == 0) zc_fail("ZDTM_CUDA_MIB must be > 0");
    return (size_t)(mib << 20);
}

// Skips unless at least min_devices CUDA devices are usable; returns their count.
static inline int zc_require_devices(int min_devices) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        zc_skip("no usable CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
                cudaGetErrorString(e));
    }
    if (n < min_devices) zc_skip("needs %d CUDA device(s), found %d", min_devices, n);
    return n;
}

static inline void zc_ready(unsigned long long device_bytes) {
    char line[64];
    snprintf(line, sizeof(line), "READY bytes=%llu", device_bytes);
    zc_emit_line(line);
}

// Waits for SIGUSR1 (blocked by zc_init); fails after $ZDTM_CUDA_TIMEOUT seconds.
static inline void zc_wait_signal(void) {
    unsigned long long limit = zc_env_ull("ZDTM_CUDA_TIMEOUT", 3600);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    // Counted in 1 s slices rather than by clock: a checkpoint/restore in between must not
    // count as waiting time.
    for (unsigned long long waited = 0; waited < limit;) {
        struct timespec ts = {1, 0};
        int s = sigtimedwait(&set, NULL, &ts);
        if (s == SIGUSR1) return;
        if (s < 0 && errno == EAGAIN) waited++;
        else if (s < 0 && errno != EINTR) zc_fail("sigtimedwait: %s", strerror(errno));
    }
    zc_fail("no SIGUSR1 within %llu s", limit);
}

// A cheap, well-mixed value for element i of a buffer seeded with seed.
__host__ __device__ static inline uint32_t zc_pattern(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

__global__ static void zc_fill_kernel(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        p[i] = zc_pattern(i, seed);
    }
}

// result[0]: mismatches; result[1]: first mismatching index (~0 if none).
__global__ static void zc_check_kernel(const uint32_t *p, size_t n, uint32_t seed,
                                       unsigned long long *result) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (p[i] != zc_pattern(i, seed)) {
            atomicAdd(&result[0], 1ull);
            atomicMin(&result[1], (unsigned long long)i);
        }
    }
}

static inline void zc_fill(uint32_t *d, size_t n, uint32_t seed, cudaStream_t s) {
    zc_fill_kernel<<<1024, 256, 0, s>>>(d, n, seed);
    ZC_CHECK(cudaGetLastError());
}

// Counts the elements of device buffer d (n words) that differ from zc_pattern(i, seed).
// Fails with "what" in the reason when any does.
static inline void zc_verify(const char *what, const uint32_t *d, size_t n, uint32_t seed,
                      cudaStream_t s) {
    unsigned long long *res = NULL;
    unsigned long long init[2] = {0, ~0ull}, got[2];
    ZC_CHECK(cudaMalloc((void **)&res, sizeof(init)));
    ZC_CHECK(cudaMemcpyAsync(res, init, sizeof(init), cudaMemcpyHostToDevice, s));
    zc_check_kernel<<<1024, 256, 0, s>>>(d, n, seed, res);
    ZC_CHECK(cudaGetLastError());
    ZC_CHECK(cudaMemcpyAsync(got, res, sizeof(got), cudaMemcpyDeviceToHost, s));
    ZC_CHECK(cudaStreamSynchronize(s));
    ZC_CHECK(cudaFree(res));
    if (got[0] != 0) {
        uint32_t v = 0;
        ZC_CHECK(cudaMemcpy(&v, d + got[1], sizeof(v), cudaMemcpyDeviceToHost));
        zc_fail("%s: %llu of %zu words differ; first at index %llu: 0x%08x, expected 0x%08x",
                what, got[0], n, got[1], v, zc_pattern(got[1], seed));
    }
}

#endif  // ZDTM_CUDA_H
