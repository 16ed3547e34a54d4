/*
 * standin_runtime.c: a stand-in for the NCCL or RCCL library around the plugin,
 * for tests and sim/nccl.py. Built twice (see the Makefile):
 *   build/standin/libnccl.so.2  exports ncclGetVersion (NCCL 2.30.3 by default);
 *   build/standin/librccl.so    exports ncclGetVersion and RCCL's own
 *                               ncclAllReduceWithBias, and depends on the
 *                               stand-in libamdhip64.so (standin_hip.c).
 * artemis_standin_init calls a plugin's init from inside this library, as
 * NCCL/RCCL do, so the plugin's caller lookup (dladdr on its return address)
 * finds this library even when it was loaded RTLD_LOCAL.
 * ARTEMIS_STANDIN_NCCL_VERSION overrides the version code.
 */
#include <stdint.h>
#include <stdlib.h>

#include "../nccl_profiler_abi.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int ncclGetVersion(int *version) {
    const char *v = getenv("ARTEMIS_STANDIN_NCCL_VERSION");
    *version = v && *v ? atoi(v) : STANDIN_DEFAULT_VERSION;
    return 0;
}

#ifdef STANDIN_RCCL
extern int hipGetDevice(int *device);

/* RCCL's extension; never called, only looked up. */
EXPORT int ncclAllReduceWithBias(const void *s, void *r, size_t n, int t, int op, void *c,
                                 void *st, const void *acc) {
    (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st; (void)acc;
    int dev;
    return hipGetDevice(&dev); /* keeps the DT_NEEDED on the stand-in HIP */
}
#endif

/* version 4: init(ctx, mask, name, hash, nnodes, nranks, rank, log);
 * 5..7: init(ctx, hash, mask, name, nnodes, nranks, rank, log). */
EXPORT int artemis_standin_init(void *init, int version, void **ctx, uint64_t hash, int *mask,
                                const char *name, int nnodes, int nranks, int rank, void *logfn) {
    ncclDebugLogger_t log;
    *(void **)&log = logfn;
    ncclResult_t rc;
    if (version == 4) {
        ncclProfiler_v4_t t;
        *(void **)&t.init = init;
        rc = t.init(ctx, mask, name, hash, nnodes, nranks, rank, log);
    } else {
        ncclProfiler_v6_t t;
        *(void **)&t.init = init;
        rc = t.init(ctx, hash, mask, name, nnodes, nranks, rank, log);
    }
    __asm__ volatile("" ::: "memory"); /* no tail call: the return address stays in here */
    return (int)rc;
}
