/*
 * api_probe: a minimal, independent client of the CUDA driver checkpoint API.
 *
 * It dlopen()s libcuda.so.1 (so LD_LIBRARY_PATH picks the mock world's copy), calls
 * cuInit(0), then performs one operation on a target process and prints one line:
 *
 *     api_probe getstate   PID         ->  result=<CUresult> state=<CUprocessState>
 *     api_probe tid        PID         ->  result=<CUresult> tid=<restore thread id>
 *     api_probe lock       PID [MS]    ->  result=<CUresult>
 *     api_probe checkpoint PID         ->  result=<CUresult>
 *     api_probe restore    PID         ->  result=<CUresult>
 *     api_probe unlock     PID         ->  result=<CUresult>
 *
 * (the value field only on success). Exit status: 0 when the line was printed, 2 for a usage
 * error, 3 when libcuda.so.1 or a symbol is missing, 4 when cuInit fails (its code printed as
 * init=<CUresult>). Compiled by the integration tests at test time; not part of the product.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef struct { unsigned int timeoutMs; unsigned int reserved0; unsigned long long reserved1[7]; } LockArgs;

static void *sym(void *lib, const char *name)
{
	void *p = dlsym(lib, name);
	if (!p) {
		fprintf(stderr, "api_probe: %s: %s\n", name, dlerror());
		exit(3);
	}
	return p;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: api_probe getstate|tid|lock|checkpoint|restore|unlock PID [MS]\n");
		return 2;
	}
	const char *op = argv[1];
	int pid = atoi(argv[2]);
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "api_probe: %s\n", dlerror());
		return 3;
	}
	CUresult (*init)(unsigned int) = (CUresult (*)(unsigned int))sym(lib, "cuInit");
	CUresult r = init(0);
	if (r != 0) {
		printf("init=%d\n", r);
		return 4;
	}
	if (!strcmp(op, "getstate")) {
		CUresult (*f)(int, int *) = (CUresult (*)(int, int *))sym(lib, "cuCheckpointProcessGetState");
		int state = -1;
		r = f(pid, &state);
		if (r == 0)
			printf("result=%d state=%d\n", r, state);
		else
			printf("result=%d\n", r);
	} else if (!strcmp(op, "tid")) {
		CUresult (*f)(int, int *) = (CUresult (*)(int, int *))sym(lib, "cuCheckpointProcessGetRestoreThreadId");
		int tid = -1;
		r = f(pid, &tid);
		if (r == 0)
			printf("result=%d tid=%d\n", r, tid);
		else
			printf("result=%d\n", r);
	} else if (!strcmp(op, "lock")) {
		CUresult (*f)(int, LockArgs *) = (CUresult (*)(int, LockArgs *))sym(lib, "cuCheckpointProcessLock");
		LockArgs a;
		memset(&a, 0, sizeof a);
		a.timeoutMs = argc > 3 ? (unsigned int)strtoul(argv[3], NULL, 10) : 0;
		printf("result=%d\n", f(pid, &a));
	} else if (!strcmp(op, "checkpoint") || !strcmp(op, "restore") || !strcmp(op, "unlock")) {
		const char *name = !strcmp(op, "checkpoint") ? "cuCheckpointProcessCheckpoint"
				 : !strcmp(op, "restore")    ? "cuCheckpointProcessRestore"
							     : "cuCheckpointProcessUnlock";
		/* NULL args: the optional argument struct, all defaults. */
		CUresult (*f)(int, void *) = (CUresult (*)(int, void *))sym(lib, name);
		printf("result=%d\n", f(pid, NULL));
	} else {
		fprintf(stderr, "api_probe: unknown operation %s\n", op);
		return 2;
	}
	fflush(stdout);
	return 0;
}
