// cuda_graph00: a captured CUDA graph is relaunched after the restore.
//
// Captures on a stream: a memset of y, a kernel x = x + 1, a kernel x = x * 3 + y[i]. The
// executable graph runs once before the dump. After the restore it runs LAUNCHES more times,
// then a fresh instantiation of the same captured graph runs once; x must equal the CPU model
// after each.
#include "zdtm_cuda.h"

#include <vector>

#define LAUNCHES 5

__global__ static void inc_kernel(uint32_t *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] += 1;
    }
}

__global__ static void mix_kernel(uint32_t *x, const uint32_t *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] = x[i] * 3u + y[i];
    }
}

static const uint32_t Y_VALUE = 0x01010101u;  // cudaMemset of byte 0x01

static void model_step(std::vector<uint32_t> &m) {
    for (auto &v : m) v = (v + 1) * 3u + Y_VALUE;
}

static void check(const char *when, const uint32_t *x, const std::vector<uint32_t> &m) {
    std::vector<uint32_t> got(m.size());
    ZC_CHECK(cudaMemcpy(got.data(), x, m.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < m.size(); i++) {
        if (got[i] != m[i]) zc_fail("%s: word %zu is 0x%08x, expected 0x%08x", when, i, got[i], m[i]);
    }
}

int main(int argc, char **argv) {
    zc_init(argc, argv);
    zc_require_devices(1);
    size_t bytes = zc_bytes(32);
    size_t n = bytes / sizeof(uint32_t);
    uint32_t *x = NULL, *y = NULL;
    ZC_CHECK(cudaMalloc((void **)&x, bytes));
    ZC_CHECK(cudaMalloc((void **)&y, bytes));
    cudaStream_t s;
    ZC_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    zc_fill(x, n, 0x6A000001u, s);
    ZC_CHECK(cudaStreamSynchronize(s));
    std::vector<uint32_t> model(n);
    for (size_t i = 0; i < n; i++) model[i] = zc_pattern(i, 0x6A000001u);

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ZC_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ZC_CHECK(cudaMemsetAsync(y, 0x01, bytes, s));
    inc_kernel<<<512, 256, 0, s>>>(x, n);
    mix_kernel<<<512, 256, 0, s>>>(x, y, n);
    ZC_CHECK(cudaStreamEndCapture(s, &graph));
    size_t nodes = 0;
    ZC_CHECK(cudaGraphGetNodes(graph, NULL, &nodes));
    if (nodes != 3) zc_fail("captured graph has %zu nodes, expected 3", nodes);
    ZC_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    ZC_CHECK(cudaGraphLaunch(exec, s));
    ZC_CHECK(cudaStreamSynchronize(s));
    model_step(model);
    check("before checkpoint, 1 launch", x, model);

    zc_ready(2ull * bytes);
    zc_wait_signal();

    check("after restore, before relaunch", x, model);
    for (int i = 0; i < LAUNCHES; i++) {
        ZC_CHECK(cudaGraphLaunch(exec, s));
        model_step(model);
    }
    ZC_CHECK(cudaStreamSynchronize(s));
    check("after restore, relaunched graph", x, model);
    cudaGraphExec_t exec2;
    ZC_CHECK(cudaGraphInstantiate(&exec2, graph, 0));
    ZC_CHECK(cudaGraphLaunch(exec2, s));
    ZC_CHECK(cudaStreamSynchronize(s));
    model_step(model);
    check("after restore, re-instantiated graph", x, model);

    ZC_CHECK(cudaGraphExecDestroy(exec2));
    ZC_CHECK(cudaGraphExecDestroy(exec));
    ZC_CHECK(cudaGraphDestroy(graph));
    ZC_CHECK(cudaStreamDestroy(s));
    ZC_CHECK(cudaFree(y));
    ZC_CHECK(cudaFree(x));
    zc_pass();
}
