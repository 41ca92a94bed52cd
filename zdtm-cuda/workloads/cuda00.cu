// cuda00: device memory contents survive a checkpoint/restore.
//
// Fills a large cudaMalloc buffer on the GPU (pattern kernel), a host-initialised buffer
// (cudaMemcpy of pseudo-random host data) and a __device__ module global; after the restore
// checks all three word by word, then runs new kernels on the buffer and checks their result.
#include "zdtm_cuda.h"

#include <vector>

#define TABLE_WORDS 4096
__device__ uint32_t g_table[TABLE_WORDS];

__global__ static void xor_kernel(uint32_t *p, size_t n, uint32_t seed_from, uint32_t seed_to) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        p[i] ^= zc_pattern(i, seed_from) ^ zc_pattern(i, seed_to);
    }
}

int main(int argc, char **argv) {
    zc_init(argc, argv);
    zc_require_devices(1);
    const uint32_t seed = 0xC0DA0000u, seed2 = 0xC0DA0001u;
    size_t big_bytes = zc_bytes(256);
    size_t big_n = big_bytes / sizeof(uint32_t);
    const size_t small_n = (1u << 20) / sizeof(uint32_t);

    uint32_t *big = NULL, *small = NULL;
    ZC_CHECK(cudaMalloc((void **)&big, big_bytes));
    ZC_CHECK(cudaMalloc((void **)&small, small_n * sizeof(uint32_t)));
    zc_fill(big, big_n, seed, 0);

    std::vector<uint32_t> host_small(small_n), host_table(TABLE_WORDS);
    uint32_t x = 2463534242u;  // xorshift32
    for (auto &v : host_small) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; v = x; }
    for (auto &v : host_table) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; v = x; }
    ZC_CHECK(cudaMemcpy(small, host_small.data(), small_n * sizeof(uint32_t), cudaMemcpyHostToDevice));
    ZC_CHECK(cudaMemcpyToSymbol(g_table, host_table.data(), TABLE_WORDS * sizeof(uint32_t)));
    ZC_CHECK(cudaDeviceSynchronize());
    zc_verify("before checkpoint: big buffer", big, big_n, seed, 0);

    zc_ready(big_bytes + small_n * sizeof(uint32_t) + TABLE_WORDS * sizeof(uint32_t));
    zc_wait_signal();

    zc_verify("big buffer after restore", big, big_n, seed, 0);
    std::vector<uint32_t> got(small_n), got_table(TABLE_WORDS);
    ZC_CHECK(cudaMemcpy(got.data(), small, small_n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < small_n; i++) {
        if (got[i] != host_small[i]) {
            zc_fail("host-copied buffer after restore: word %zu is 0x%08x, expected 0x%08x", i,
                    got[i], host_small[i]);
        }
    }
    ZC_CHECK(cudaMemcpyFromSymbol(got_table.data(), g_table, TABLE_WORDS * sizeof(uint32_t)));
    for (size_t i = 0; i < TABLE_WORDS; i++) {
        if (got_table[i] != host_table[i]) {
            zc_fail("__device__ global after restore: word %zu is 0x%08x, expected 0x%08x", i,
                    got_table[i], host_table[i]);
        }
    }
    // New work after the restore: re-seed the buffer in place and check the result.
    xor_kernel<<<1024, 256>>>(big, big_n, seed, seed2);
    ZC_CHECK(cudaGetLastError());
    zc_verify("big buffer after a post-restore kernel", big, big_n, seed2, 0);
    ZC_CHECK(cudaFree(small));
    ZC_CHECK(cudaFree(big));
    zc_pass();
}
