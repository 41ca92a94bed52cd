// cuda_mempool00: stream-ordered allocations (cudaMallocAsync, memory pools).
//
// Allocates from the device's default pool and from an explicit pool whose release threshold
// keeps freed memory reserved; frees one block before the dump. After the restore: the live
// blocks hold their patterns, the pool's used-memory counter still covers them, and new
// stream-ordered allocations from both pools work and hold data.
#include "zdtm_cuda.h"

int main(int argc, char **argv) {
    zc_init(argc, argv);
    zc_require_devices(1);
    int pools = 0;
    ZC_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0));
    if (!pools) zc_skip("device 0 has no stream-ordered allocator (cudaDevAttrMemoryPoolsSupported = 0)");

    size_t bytes = zc_bytes(64) / 4;
    size_t n = bytes / sizeof(uint32_t);
    cudaStream_t s;
    ZC_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    cudaMemPool_t pool;
    cudaMemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    ZC_CHECK(cudaMemPoolCreate(&pool, &props));
    unsigned long long keep = ~0ull;
    ZC_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

    uint32_t *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    ZC_CHECK(cudaMallocAsync((void **)&a, bytes, s));
    ZC_CHECK(cudaMallocFromPoolAsync((void **)&b, bytes, pool, s));
    ZC_CHECK(cudaMallocFromPoolAsync((void **)&c, bytes, pool, s));
    ZC_CHECK(cudaMallocFromPoolAsync((void **)&d, bytes, pool, s));
    zc_fill(a, n, 0x3E000001u, s);
    zc_fill(b, n, 0x3E000002u, s);
    zc_fill(c, n, 0x3E000003u, s);
    zc_fill(d, n, 0x3E000004u, s);
    ZC_CHECK(cudaFreeAsync(c, s));  // its memory stays reserved in the pool
    ZC_CHECK(cudaStreamSynchronize(s));
    zc_verify("before checkpoint: default-pool block", a, n, 0x3E000001u, s);
    zc_verify("before checkpoint: pool block b", b, n, 0x3E000002u, s);
    zc_verify("before checkpoint: pool block d", d, n, 0x3E000004u, s);
    unsigned long long used_before = 0, reserved_before = 0;
    ZC_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used_before));
    ZC_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved_before));
    zc_info("pool: used %llu, reserved %llu bytes", used_before, reserved_before);

    zc_ready(4ull * bytes);
    zc_wait_signal();

    zc_verify("after restore: default-pool block", a, n, 0x3E000001u, s);
    zc_verify("after restore: pool block b", b, n, 0x3E000002u, s);
    zc_verify("after restore: pool block d", d, n, 0x3E000004u, s);
    unsigned long long used = 0, reserved = 0;
    ZC_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    ZC_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    zc_info("pool after restore: used %llu, reserved %llu bytes", used, reserved);
    if (used < 2ull * bytes) {
        zc_fail("pool used-memory counter %llu after restore is below its two live blocks (%zu bytes; %llu before)",
                used, 2 * bytes, used_before);
    }

    uint32_t *e = NULL, *f = NULL;
    ZC_CHECK(cudaMallocFromPoolAsync((void **)&e, bytes, pool, s));
    ZC_CHECK(cudaMallocAsync((void **)&f, bytes, s));
    zc_fill(e, n, 0x3E000005u, s);
    zc_fill(f, n, 0x3E000006u, s);
    zc_verify("after restore: new pool block", e, n, 0x3E000005u, s);
    zc_verify("after restore: new default-pool block", f, n, 0x3E000006u, s);
    zc_verify("after restore: pool block b next to new blocks", b, n, 0x3E000002u, s);
    zc_verify("after restore: pool block d next to new blocks", d, n, 0x3E000004u, s);

    ZC_CHECK(cudaFreeAsync(a, s));
    ZC_CHECK(cudaFreeAsync(b, s));
    ZC_CHECK(cudaFreeAsync(d, s));
    ZC_CHECK(cudaFreeAsync(e, s));
    ZC_CHECK(cudaFreeAsync(f, s));
    ZC_CHECK(cudaStreamSynchronize(s));
    ZC_CHECK(cudaMemPoolTrimTo(pool, 0));
    ZC_CHECK(cudaMemPoolDestroy(pool));
    ZC_CHECK(cudaStreamDestroy(s));
    zc_pass();
}
