// cuda_zerocopy00: mapped pinned host memory (zero-copy) survives a checkpoint/restore.
//
// Two mapped regions: one from cudaHostAlloc(cudaHostAllocMapped), filled by a kernel through
// its device alias, and an anonymous mmap registered with cudaHostRegister(Mapped), filled by
// the CPU. After the restore: the CPU checks both, kernels check both through their device
// aliases, then a kernel writes a new pattern that the CPU checks and the CPU writes one that a
// kernel checks.
#include "zdtm_cuda.h"

#include <sys/mman.h>

static void host_check(const char *what, const uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] != zc_pattern(i, seed)) {
            zc_fail("%s: word %zu is 0x%08x, expected 0x%08x", what, i, p[i], zc_pattern(i, seed));
        }
    }
}

static void host_fill(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = zc_pattern(i, seed);
}

int main(int argc, char **argv) {
    zc_init(argc, argv);
    zc_require_devices(1);
    int can_map = 0;
    ZC_CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
    if (!can_map) zc_skip("device 0 cannot map host memory (cudaDevAttrCanMapHostMemory = 0)");
    ZC_CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));

    size_t bytes = zc_bytes(64);
    size_t n = bytes / sizeof(uint32_t);
    uint32_t *h_alloc = NULL, *d_alloc = NULL, *d_reg = NULL;
    ZC_CHECK(cudaHostAlloc((void **)&h_alloc, bytes, cudaHostAllocMapped));
    ZC_CHECK(cudaHostGetDevicePointer((void **)&d_alloc, h_alloc, 0));
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) zc_fail("mmap %zu bytes: %s", bytes, strerror(errno));
    uint32_t *h_reg = (uint32_t *)m;
    host_fill(h_reg, n, 0x2C000002u);
    ZC_CHECK(cudaHostRegister(h_reg, bytes, cudaHostRegisterMapped));
    ZC_CHECK(cudaHostGetDevicePointer((void **)&d_reg, h_reg, 0));

    zc_fill(d_alloc, n, 0x2C000001u, 0);
    ZC_CHECK(cudaDeviceSynchronize());
    host_check("before checkpoint: cudaHostAlloc region (kernel-written)", h_alloc, n, 0x2C000001u);
    zc_verify("before checkpoint: registered region (CPU-written)", d_reg, n, 0x2C000002u, 0);

    // No device-resident bytes to speak of: the data lives in pinned host memory.
    zc_info("pinned host bytes: %zu", 2 * bytes);
    zc_ready(0);
    zc_wait_signal();

    host_check("after restore: cudaHostAlloc region seen by the CPU", h_alloc, n, 0x2C000001u);
    host_check("after restore: registered region seen by the CPU", h_reg, n, 0x2C000002u);
    zc_verify("after restore: cudaHostAlloc region seen by a kernel", d_alloc, n, 0x2C000001u, 0);
    zc_verify("after restore: registered region seen by a kernel", d_reg, n, 0x2C000002u, 0);
    zc_fill(d_alloc, n, 0x2C000003u, 0);
    ZC_CHECK(cudaDeviceSynchronize());
    host_check("after restore: kernel write seen by the CPU", h_alloc, n, 0x2C000003u);
    host_fill(h_reg, n, 0x2C000004u);
    zc_verify("after restore: CPU write seen by a kernel", d_reg, n, 0x2C000004u, 0);

    ZC_CHECK(cudaHostUnregister(h_reg));
    munmap(m, bytes);
    ZC_CHECK(cudaFreeHost(h_alloc));
    zc_pass();
}
