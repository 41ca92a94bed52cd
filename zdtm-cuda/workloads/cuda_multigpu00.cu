// cuda_multigpu00: one allocation per GPU; skipped with the reason on fewer than two GPUs.
//
// Every device gets a buffer with a device-specific pattern and a context of its own. After
// the restore (possibly onto other GPUs with a device map): every buffer holds its pattern on
// its device, and a peer copy from device 0 to the last device moves the right data.
#include "zdtm_cuda.h"

#include <vector>

static void uuid_str(int dev, char *out, size_t len) {
    cudaDeviceProp p;
    ZC_CHECK(cudaGetDeviceProperties(&p, dev));
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
             u[13], u[14], u[15]);
}

int main(int argc, char **argv) {
    zc_init(argc, argv);
    int ndev = zc_require_devices(2);
    size_t bytes = zc_bytes(64);
    size_t n = bytes / sizeof(uint32_t);
    std::vector<uint32_t *> buf(ndev, nullptr);
    char uuid[64];
    for (int d = 0; d < ndev; d++) {
        ZC_CHECK(cudaSetDevice(d));
        ZC_CHECK(cudaMalloc((void **)&buf[d], bytes));
        zc_fill(buf[d], n, 0x46000000u + d, 0);
        ZC_CHECK(cudaDeviceSynchronize());
        zc_verify("before checkpoint", buf[d], n, 0x46000000u + d, 0);
        uuid_str(d, uuid, sizeof(uuid));
        zc_info("device %d: %s, %zu bytes", d, uuid, bytes);
    }

    zc_ready((unsigned long long)ndev * bytes);
    zc_wait_signal();

    int ndev_after = 0;
    ZC_CHECK(cudaGetDeviceCount(&ndev_after));
    if (ndev_after != ndev) zc_fail("device count changed across the restore: %d -> %d", ndev, ndev_after);
    char what[96];
    for (int d = 0; d < ndev; d++) {
        ZC_CHECK(cudaSetDevice(d));
        uuid_str(d, uuid, sizeof(uuid));
        zc_info("after restore: device %d is %s", d, uuid);
        snprintf(what, sizeof(what), "after restore: device %d buffer", d);
        zc_verify(what, buf[d], n, 0x46000000u + d, 0);
    }
    // A peer copy of device 0's pattern onto the last device (through the host if P2P is off).
    int last = ndev - 1;
    ZC_CHECK(cudaSetDevice(last));
    uint32_t *scratch = NULL;
    ZC_CHECK(cudaMalloc((void **)&scratch, bytes));
    ZC_CHECK(cudaMemcpyPeer(scratch, last, buf[0], 0, bytes));
    ZC_CHECK(cudaDeviceSynchronize());
    snprintf(what, sizeof(what), "after restore: device 0 buffer copied to device %d", last);
    zc_verify(what, scratch, n, 0x46000000u, 0);
    ZC_CHECK(cudaFree(scratch));
    for (int d = 0; d < ndev; d++) {
        ZC_CHECK(cudaSetDevice(d));
        ZC_CHECK(cudaFree(buf[d]));
    }
    zc_pass();
}
