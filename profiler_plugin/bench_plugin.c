/*
 * bench_plugin.c: cost of the Artemis plugin per collective.
 *
 * Drives the whole NCCL 2.28+ event sequence of one collective through the v6
 * function table (GroupApi start + state 23, CollApi start/stop, state 24,
 * Group start, Coll start/stop, Group and GroupApi stop, then per channel
 * KernelCh start / KernelChStop state / stop) and reports the margin over a
 * do-nothing plugin measured in the same run: median of RUNS runs.
 * "2 threads" = two threads issuing collectives on the same communicator.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"

extern ncclProfiler_v6_t ncclProfiler_v6;

#define RUNS 7
#define ITERS 200000

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* the do-nothing plugin */
static uint64_t nop_handle = 1;
static ncclResult_t nop_init(void **c, uint64_t id, int *m, const char *n, int a, int b, int r,
                             ncclDebugLogger_t l) {
    (void)id; (void)n; (void)a; (void)b; (void)r; (void)l;
    *c = &nop_handle;
    *m = 70;
    return ncclSuccess;
}
static ncclResult_t nop_start(void *c, void **h, ncclProfilerEventDescr_v6_t *d) {
    (void)c; (void)d;
    *h = &nop_handle;
    return ncclSuccess;
}
static ncclResult_t nop_stop(void *h) { (void)h; return ncclSuccess; }
static ncclResult_t nop_record(void *h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v6_t *a) {
    (void)h; (void)s; (void)a;
    return ncclSuccess;
}
static ncclResult_t nop_finalize(void *c) { (void)c; return ncclSuccess; }
static ncclProfiler_v6_t nop_table = {"nop", nop_init, nop_start, nop_stop, nop_record, nop_finalize};

typedef struct {
    ncclProfiler_v6_t *volatile table;
    void *ctx;
    int nch;
    uint64_t ns;
    pthread_barrier_t *bar;
} Job;

static void one_collective(ncclProfiler_v6_t *p, void *ctx, int nch, uint64_t i) {
    ncclProfilerEventDescr_v6_t d;
    void *ga, *api, *grp, *op, *kh;
    memset(&d, 0, 24);
    d.type = ncclProfileGroupApi;
    d.groupApi.groupDepth = 1;
    p->startEvent(ctx, &ga, &d);
    p->recordEventState(ga, ncclProfilerGroupStartApiStop, NULL);
    d.type = ncclProfileCollApi;
    d.parentObj = ga;
    d.collApi.func = "AllReduce";
    d.collApi.count = 1024;
    d.collApi.datatype = "ncclFloat32";
    p->startEvent(ctx, &api, &d);
    p->stopEvent(api);
    p->recordEventState(ga, ncclProfilerGroupEndApiStart, NULL);
    d.type = ncclProfileGroup;
    d.parentObj = NULL;
    p->startEvent(ctx, &grp, &d);
    d.type = ncclProfileColl;
    d.parentObj = api;
    d.coll.seqNumber = i;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclFloat32";
    d.coll.count = 1024;
    d.coll.nChannels = (uint8_t)nch;
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    d.coll.parentGroup = grp;
    p->startEvent(ctx, &op, &d);
    p->stopEvent(op);
    p->stopEvent(grp);
    p->stopEvent(ga);
    ncclProfilerEventStateArgs_v6_t a;
    for (int k = 0; k < nch; k++) {
        d.type = ncclProfileKernelCh;
        d.parentObj = op;
        d.kernelCh.channelId = (uint8_t)k;
        d.kernelCh.pTimer = 1000000 + i * 100 + (uint64_t)k;
        p->startEvent(ctx, &kh, &d);
        a.kernelCh.pTimer = 1000050 + i * 100 + (uint64_t)k;
        p->recordEventState(kh, ncclProfilerKernelChStop, &a);
        p->stopEvent(kh);
    }
}

static void *worker(void *arg) {
    Job *j = arg;
    ncclProfiler_v6_t *p = j->table;
    for (uint64_t i = 0; i < ITERS / 10; i++) one_collective(p, j->ctx, j->nch, i); /* warm-up */
    pthread_barrier_wait(j->bar);
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < ITERS; i++) one_collective(p, j->ctx, j->nch, i);
    j->ns = now_ns() - t0;
    return NULL;
}

/* ns per collective per thread */
static double measure(ncclProfiler_v6_t *p, void *ctx, int nch, int threads) {
    pthread_t th[8];
    Job jobs[8];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        jobs[t] = (Job){p, ctx, nch, 0, &bar};
        pthread_create(&th[t], NULL, worker, &jobs[t]);
    }
    double sum = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        sum += (double)jobs[t].ns / ITERS;
    }
    pthread_barrier_destroy(&bar);
    return sum / threads;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    char dir[64];
    snprintf(dir, sizeof dir, "/dev/shm/artemis-bench-%d", (int)getpid());
    setenv("ARTEMIS_SHM_DIR", dir, 1);
    setenv("ARTEMIS_JOB", "bench", 1);
    if (getenv("BENCH_SLOTS")) setenv("ARTEMIS_RING_SLOTS", getenv("BENCH_SLOTS"), 1);
    int mask = 0;
    void *ctx = NULL, *nctx = NULL;
    ncclProfiler_v6.init(&ctx, 0xbe4c4ULL, &mask, "bench", 1, 1, 0, NULL);
    nop_table.init(&nctx, 0, &mask, NULL, 1, 1, 0, NULL);
    if (!ctx) {
        fprintf(stderr, "bench: plugin init failed\n");
        return 1;
    }
    printf("Artemis profiler plugin: cost per collective (whole event sequence), median of %d runs x %d collectives\n",
           RUNS, ITERS);
    printf("%-9s %-8s %14s %14s %12s\n", "channels", "threads", "no-op ns", "artemis ns", "margin ns");
    const int chs[] = {2, 8}, ths[] = {1, 2};
    for (int ci = 0; ci < 2; ci++) {
        for (int ti = 0; ti < 2; ti++) {
            double nop[RUNS], art[RUNS], mar[RUNS];
            for (int r = 0; r < RUNS; r++) {
                nop[r] = measure(&nop_table, nctx, chs[ci], ths[ti]);
                art[r] = measure(&ncclProfiler_v6, ctx, chs[ci], ths[ti]);
                mar[r] = art[r] - nop[r];
            }
            qsort(nop, RUNS, sizeof(double), cmp_d);
            qsort(art, RUNS, sizeof(double), cmp_d);
            qsort(mar, RUNS, sizeof(double), cmp_d);
            printf("%-9d %-8d %14.1f %14.1f %12.1f\n", chs[ci], ths[ti], nop[RUNS / 2], art[RUNS / 2],
                   mar[RUNS / 2]);
        }
    }
    ncclProfiler_v6.finalize(ctx);
    char path[160];
    snprintf(path, sizeof path, "%s/bench.%016llx.r0.ring", dir, 0xbe4c4ULL);
    unlink(path);
    rmdir(dir);
    return 0;
}
