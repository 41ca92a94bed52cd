// cuda_cublas00: a cuBLAS handle and its GEMMs across a checkpoint/restore.
//
// cuBLAS is loaded with dlopen ($ZDTM_CUDA_CUBLAS, else libcublas.so.13, .so.12, .so), so the
// workload builds with nvcc and the CUDA runtime alone and skips with the reason when no
// cuBLAS is installed. The matrices hold small integers, so every product is exact in FP32
// (and in TF32) and compared with a CPU GEMM for equality. Before the dump: C = A * B on a
// handle bound to a stream. After the restore, on the same handle: C still holds A * B, then
// C = A * B + C must be 2 * A * B and D = A * B^T must match the CPU.
#include "zdtm_cuda.h"

#include <dlfcn.h>

#include <vector>

// The few cuBLAS v2 entry points used, declared here (stable C ABI since CUDA 4).
typedef int cublasStatus_t;  // CUBLAS_STATUS_SUCCESS == 0
typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef cublasStatus_t (*create_fn)(cublasHandle_t *);
typedef cublasStatus_t (*destroy_fn)(cublasHandle_t);
typedef cublasStatus_t (*set_stream_fn)(cublasHandle_t, cudaStream_t);
typedef cublasStatus_t (*get_version_fn)(cublasHandle_t, int *);
typedef cublasStatus_t (*sgemm_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                   int, const float *, const float *, int, const float *, int,
                                   const float *, float *, int);

static create_fn p_create;
static destroy_fn p_destroy;
static set_stream_fn p_set_stream;
static get_version_fn p_get_version;
static sgemm_fn p_sgemm;

#define CB_CHECK(call)                                                                  \
    do {                                                                                \
        cublasStatus_t st_ = (call);                                                    \
        if (st_ != 0) zc_fail("%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #call, st_); \
    } while (0)

static void load_cublas(void) {
    const char *names[] = {getenv("ZDTM_CUDA_CUBLAS"), "libcublas.so.13", "libcublas.so.12",
                           "libcublas.so"};
    char tried[512] = "";
    void *h = NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && h == NULL; i++) {
        if (names[i] == NULL || *names[i] == '\0') continue;
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) {
            size_t len = strlen(tried);
            snprintf(tried + len, sizeof(tried) - len, "%s%s", len ? ", " : "", names[i]);
        } else {
            zc_info("cuBLAS: %s", names[i]);
        }
    }
    if (h == NULL) zc_skip("cuBLAS not found (tried %s; set ZDTM_CUDA_CUBLAS or LD_LIBRARY_PATH)", tried);
    p_create = (create_fn)dlsym(h, "cublasCreate_v2");
    p_destroy = (destroy_fn)dlsym(h, "cublasDestroy_v2");
    p_set_stream = (set_stream_fn)dlsym(h, "cublasSetStream_v2");
    p_get_version = (get_version_fn)dlsym(h, "cublasGetVersion_v2");
    p_sgemm = (sgemm_fn)dlsym(h, "cublasSgemm_v2");
    if (!p_create || !p_destroy || !p_set_stream || !p_get_version || !p_sgemm) {
        zc_fail("cuBLAS library lacks a v2 entry point: %s", dlerror());
    }
}

#define DIM 384

// Column-major CPU GEMM: C = alpha * op(A) * op(B) + beta * C (square DIM x DIM).
static void cpu_gemm(bool transb, const std::vector<float> &a, const std::vector<float> &b,
                     float beta, std::vector<float> &c) {
    for (int j = 0; j < DIM; j++) {
        for (int i = 0; i < DIM; i++) {
            double acc = 0;
            for (int k = 0; k < DIM; k++) {
                float bv = transb ? b[j + (size_t)k * DIM] : b[k + (size_t)j * DIM];
                acc += (double)a[i + (size_t)k * DIM] * bv;
            }
            c[i + (size_t)j * DIM] = (float)acc + beta * c[i + (size_t)j * DIM];
        }
    }
}

static void compare(const char *what, const float *d, const std::vector<float> &expect) {
    std::vector<float> got(expect.size());
    ZC_CHECK(cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < got.size(); i++) {
        if (got[i] != expect[i]) {
            zc_fail("%s: element (%zu,%zu) is %g, expected %g", what, i % DIM, i / DIM, got[i],
                    expect[i]);
        }
    }
}

int main(int argc, char **argv) {
    zc_init(argc, argv);
    zc_require_devices(1);
    load_cublas();

    const size_t elems = (size_t)DIM * DIM, bytes = elems * sizeof(float);
    std::vector<float> a(elems), b(elems), c(elems, 0.0f), d(elems, 0.0f);
    for (size_t i = 0; i < elems; i++) {
        a[i] = (float)((int)(zc_pattern(i, 0xB1A50001u) % 9u) - 4);
        b[i] = (float)((int)(zc_pattern(i, 0xB1A50002u) % 9u) - 4);
    }
    float *da, *db, *dc, *dd;
    ZC_CHECK(cudaMalloc((void **)&da, bytes));
    ZC_CHECK(cudaMalloc((void **)&db, bytes));
    ZC_CHECK(cudaMalloc((void **)&dc, bytes));
    ZC_CHECK(cudaMalloc((void **)&dd, bytes));
    ZC_CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    ZC_CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
    ZC_CHECK(cudaMemset(dc, 0, bytes));

    cudaStream_t s;
    ZC_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t handle;
    CB_CHECK(p_create(&handle));
    CB_CHECK(p_set_stream(handle, s));
    int version = 0;
    CB_CHECK(p_get_version(handle, &version));
    zc_info("cuBLAS version %d, %dx%d SGEMM", version, DIM, DIM);

    const float one = 1.0f, zero = 0.0f;
    CB_CHECK(p_sgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, DIM, DIM, DIM, &one, da, DIM, db, DIM, &zero, dc, DIM));
    ZC_CHECK(cudaStreamSynchronize(s));
    cpu_gemm(false, a, b, 0.0f, c);
    compare("before checkpoint: C = A * B", dc, c);

    zc_ready(4ull * bytes);
    zc_wait_signal();

    compare("after restore: C (= A * B) kept", dc, c);
    CB_CHECK(p_sgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, DIM, DIM, DIM, &one, da, DIM, db, DIM, &one, dc, DIM));
    CB_CHECK(p_sgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, DIM, DIM, DIM, &one, da, DIM, db, DIM, &zero, dd, DIM));
    ZC_CHECK(cudaStreamSynchronize(s));
    cpu_gemm(false, a, b, 1.0f, c);
    cpu_gemm(true, a, b, 0.0f, d);
    compare("after restore: C = A * B + C on the same handle", dc, c);
    compare("after restore: D = A * B^T on the same handle", dd, d);

    CB_CHECK(p_destroy(handle));
    ZC_CHECK(cudaStreamDestroy(s));
    ZC_CHECK(cudaFree(da));
    ZC_CHECK(cudaFree(db));
    ZC_CHECK(cudaFree(dc));
    ZC_CHECK(cudaFree(dd));
    zc_pass();
}
