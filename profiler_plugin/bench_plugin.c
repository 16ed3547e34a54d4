/*
 * bench_plugin.c: cost of the Artemis plugin per collective.
 *
 * Drives the whole event sequence of one collective through the v4..v7
 * function tables (v5+: GroupApi start + state 23, CollApi start/stop, state
 * 24, Group start, Coll start/stop, Group stop, KernelLaunch start/stop,
 * GroupApi stop; v4: Group start, Coll start/stop, Group stop; then per
 * channel KernelCh start / KernelChStop state / stop, in the proxy loop's
 * order: all starts, then record + stop each), calling each exactly when NCCL
 * does (src/plugin/profiler.cc, 2.27-2.30): a start only when the mask the
 * plugin's init returned holds the event or one below it, a stop or a state
 * only on a handle that is not NULL, and on v4 (2.27) Coll only under a Group
 * handle that is not NULL. It reports the margin over a do-nothing plugin measured in
 * the same run, and in units of one clock_gettime(CLOCK_MONOTONIC) read
 * measured in the same run too: median of RUNS interleaved runs, per-thread
 * CPU time (the machine is shared; preemption does not count).
 * "2" = two threads issuing collectives on the same communicator at once
 * (which NCCL's user guide, "Thread Safety", does not allow: a correct job
 * never does it); "2 turns" = two threads taking turns on it, TURN
 * collectives each (the multi-threaded use NCCL allows: DDP's gradient
 * hooks on an autograd thread, its other calls on the main thread), CPU time
 * counted over each thread's turns only; "1+proxy" = NCCL's own threading,
 * one launching thread and a proxy thread delivering the KernelCh events, in
 * phases of TURN collectives, the two pinned to two CPUs, CPU time over each
 * thread's phases (the 1-thread rows deliver KernelCh on the launching
 * thread: no line moves between cores); "1 hop" = one thread in phases of
 * TURN collectives, moved to the other CPU between phases, CPU time over the
 * phases: the single-mode path paying what "2 turns" pays for its lines
 * moving between cores, and nothing for a second thread (the two turn rows
 * use the same two CPUs). "line ns": one cache line's move from one of
 * those CPUs to the other, measured in the same run (a ping-pong, half its
 * round trip).
 *
 *   bench_plugin                  the table
 *   bench_plugin callgrind V NCH [N]  2000 + N (default 20000) collectives
 *                                 through run_artemis and through run_nop, for
 *                                 valgrind --tool=callgrind
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"

extern ncclProfiler_v4_t ncclProfiler_v4;
extern ncclProfiler_v5_t ncclProfiler_v5;
extern ncclProfiler_v6_t ncclProfiler_v6;
extern ncclProfiler_v7_t ncclProfiler_v7;

#define RUNS 9
#define ITERS 100000
#define TURN 64

static uint64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* the do-nothing plugin */
static uint64_t nop_handle = 1;
static ncclResult_t nop_init(void **c, uint64_t id, int *m, const char *n, int a, int b, int r,
                             ncclDebugLogger_t l) {
    (void)id; (void)n; (void)a; (void)b; (void)r; (void)l;
    *c = &nop_handle;
    *m = ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh; /* the same as Artemis */
    return ncclSuccess;
}
/* A handle for every event (so NCCL makes every stop and state call on it), or
 * with BENCH_NOP_NULL=1 NULL for every event (NCCL then calls no stop and no
 * state on it: the floor of any plugin with this mask). */
static ncclResult_t nop_start(void *c, void **h, ncclProfilerEventDescr_v6_t *d) {
    (void)c; (void)d;
    *h = &nop_handle;
    return ncclSuccess;
}
static ncclResult_t nop_start_null(void *c, void **h, ncclProfilerEventDescr_v6_t *d) {
    (void)c; (void)d;
    *h = NULL;
    return ncclSuccess;
}
static ncclResult_t nop_stop(void *h) { (void)h; return ncclSuccess; }
static ncclResult_t nop_record(void *h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v6_t *a) {
    (void)h; (void)s; (void)a;
    return ncclSuccess;
}
static ncclResult_t nop_finalize(void *c) { (void)c; return ncclSuccess; }
static ncclProfiler_v6_t nop_table = {"nop", nop_init, nop_start, nop_stop, nop_record, nop_finalize};

/* One table of any version, seen through the v6 layout: the function
 * pointers sit at the same places in v5..v7 (v4's init differs, and is not
 * called through this). The descriptor is a v7 one, the largest; v5/v6 read
 * its prefix, whose union arms we fill have the same offsets (v4 too, except
 * its uint8 type: filled separately). */
typedef struct {
    ncclProfiler_v6_t *table;
    int v4;
    void *ctx;
    int mask; /* what its init returned */
} Plug;

typedef struct {
    const Plug *plug;
    int nch;
    uint64_t ns;
    pthread_barrier_t *bar;
} Job;

static void start(const Plug *pl, void **h, ncclProfilerEventDescr_v7_t *d, uint64_t type) {
    if (pl->v4) {
        ncclProfilerEventDescr_v4_t *d4 = (ncclProfilerEventDescr_v4_t *)(void *)d;
        ((uint8_t *)d)[0] = (uint8_t)type; /* v4: uint8 type, same union offset (24) */
        (void)d4;
    } else {
        d->type = type;
    }
    pl->table->startEvent(pl->ctx, h, (ncclProfilerEventDescr_v6_t *)(void *)d);
}

/* The masks under which NCCL starts each event (src/plugin/profiler.cc): an
 * event is started when the plugin asked for it or for an event below it. */
#define BELOW_TASK (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
#define CE (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)
#define NEEDS_GROUP_API                                                                       \
    (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch | \
     ncclProfileGroup | ncclProfileColl | ncclProfileP2p | BELOW_TASK | CE)
#define NEEDS_COLL_API (ncclProfileCollApi | ncclProfileColl | BELOW_TASK | CE)
#define NEEDS_GROUP (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | BELOW_TASK)
#define NEEDS_COLL (ncclProfileColl | BELOW_TASK)

/* NCCL's stop / state calls: only on a handle that is not NULL */
static inline void stop_if(const Plug *pl, void *h) {
    if (h) pl->table->stopEvent(h);
}
static inline void record_if(const Plug *pl, void *h, ncclProfilerEventState_t s,
                             ncclProfilerEventStateArgs_v6_t *a) {
    if (h) pl->table->recordEventState(h, s, a);
}

/* The launching thread's part of one collective: the API, Group and Coll
 * events; returns the Coll handle (the KernelCh events' parent). */
static void *launch(const Plug *pl, int nch, uint64_t i) {
    ncclProfilerEventDescr_v7_t d;
    void *ga = NULL, *api = NULL, *grp = NULL, *op = NULL, *kl = NULL;
    int mask = pl->mask;
    memset(&d, 0, 24);
    if (!pl->v4) {
        if (mask & NEEDS_GROUP_API) {
            d.groupApi.groupDepth = 1;
            start(pl, &ga, &d, ncclProfileGroupApi);
            record_if(pl, ga, ncclProfilerGroupStartApiStop, NULL);
        }
        if (mask & NEEDS_COLL_API) {
            d.parentObj = ga;
            d.collApi.func = "AllReduce";
            d.collApi.count = 1024;
            d.collApi.datatype = "ncclFloat32";
            start(pl, &api, &d, ncclProfileCollApi);
            stop_if(pl, api);
        }
        record_if(pl, ga, ncclProfilerGroupEndApiStart, NULL);
    }
    if (mask & NEEDS_GROUP) {
        d.parentObj = NULL;
        start(pl, &grp, &d, ncclProfileGroup);
    }
    /* 2.27 (v4) starts the plan's tasks only under a Group handle */
    if ((mask & NEEDS_COLL) && (!pl->v4 || grp)) {
        d.parentObj = pl->v4 ? grp : api;
        d.coll.seqNumber = i;
        d.coll.func = "AllReduce";
        d.coll.datatype = "ncclFloat32";
        d.coll.count = 1024;
        d.coll.nChannels = (uint8_t)nch;
        d.coll.algo = "RING";
        d.coll.proto = "SIMPLE";
        d.coll.parentGroup = grp;
        start(pl, &op, &d, ncclProfileColl);
        stop_if(pl, op);
    }
    stop_if(pl, grp);
    if (!pl->v4) {
        if (mask & ncclProfileKernelLaunch) {
            d.parentObj = ga;
            start(pl, &kl, &d, ncclProfileKernelLaunch);
            stop_if(pl, kl);
        }
        stop_if(pl, ga);
    }
    return op;
}

/* NCCL's proxy loop (src/transport/profiler.cc) starts the KernelCh of every
 * channel of the op, then, as the kernel's completion counters pass, records
 * and stops each one (proxy ops exist only with KernelCh in the mask; the
 * parent is the Coll handle, NULL or not). */
static void channels(const Plug *pl, int nch, uint64_t i, void *op) {
    if (!(pl->mask & ncclProfileKernelCh)) return;
    ncclProfilerEventDescr_v7_t d;
    memset(&d, 0, 24);
    ncclProfilerEventStateArgs_v6_t a;
    void *khs[64];
    for (int k = 0; k < nch; k++) {
        d.parentObj = op;
        d.kernelCh.channelId = (uint8_t)k;
        d.kernelCh.pTimer = 1000000 + i * 100 + (uint64_t)k;
        start(pl, &khs[k], &d, ncclProfileKernelCh);
    }
    for (int k = 0; k < nch; k++) {
        a.kernelCh.pTimer = 1000050 + i * 100 + (uint64_t)k;
        record_if(pl, khs[k], ncclProfilerKernelChStop, &a);
        stop_if(pl, khs[k]);
    }
}

static void one_collective(const Plug *pl, int nch, uint64_t i) {
    channels(pl, nch, i, launch(pl, nch, i));
}

static void *worker(void *arg) {
    Job *j = arg;
    for (uint64_t i = 0; i < ITERS / 10; i++) one_collective(j->plug, j->nch, i); /* warm-up */
    pthread_barrier_wait(j->bar);
    uint64_t t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint64_t i = 0; i < ITERS; i++) one_collective(j->plug, j->nch, i);
    j->ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
    return NULL;
}

/* Two threads in phases of TURN collectives on one communicator, turn saying
 * whose phase it is; each thread's CPU time counts over its own phases only
 * (a thread waiting for its phase is not the plugin's cost). "2 turns": each
 * phase is TURN whole collectives. "1+proxy", NCCL's own threading: thread 0
 * launches TURN collectives (API, Group and Coll events), then thread 1, the
 * proxy, makes their KernelCh events, so the op's lines move between the two
 * threads as under NCCL. */
typedef struct {
    Job job;
    int me;    /* 0 or 1 */
    int proxy; /* "1+proxy": 0 launches, 1 is the proxy */
    _Atomic int *turn;
    void **ops; /* proxy: TURN Coll handles, from the launcher to the proxy */
    int cpu;    /* pinned to it (-1: not pinned) */
} PhaseJob;

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
}

static void *phase_worker(void *arg) {
    PhaseJob *pj = arg;
    Job *j = &pj->job;
    pin(pj->cpu);
    uint64_t ns = 0;
    for (uint64_t i = 0; i < ITERS / TURN; i++) {
        while (atomic_load_explicit(pj->turn, memory_order_acquire) % 2 != pj->me) sched_yield();
        uint64_t t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (uint64_t k = 0; k < TURN; k++) {
            uint64_t c = i * TURN + k;
            if (!pj->proxy) one_collective(j->plug, j->nch, c);
            else if (pj->me == 0) pj->ops[k] = launch(j->plug, j->nch, c);
            else channels(j->plug, j->nch, c, pj->ops[k]);
        }
        ns += clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
        atomic_fetch_add_explicit(pj->turn, 1, memory_order_release);
    }
    j->ns = ns;
    return NULL;
}

/* The first two CPUs this process may run on (-1, -1 if it has one), the
 * calling thread's affinity saved in was. */
static int two_cpus(int cpus[2], cpu_set_t *was) {
    int found = 0;
    cpus[0] = cpus[1] = -1;
    if (sched_getaffinity(0, sizeof *was, was) == 0)
        for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
            if (CPU_ISSET(c, was)) cpus[found++] = c;
    if (found < 2) cpus[0] = cpus[1] = -1;
    return found == 2;
}

/* CPU ns per collective, the calling thread being thread 0 (the launcher, as
 * a training loop's). Both rows pin the two threads to two CPUs (the first
 * two allowed), so the lines always cross cores: between NCCL's launching
 * and proxy threads ("1+proxy"), or between the turns ("2 turns"), as in
 * "1 hop"; "1+proxy" splits its collectives between the threads, a turn's
 * are whole on each. */
static double measure_phases(const Plug *pl, int nch, int proxy) {
    _Atomic int turn = 0;
    void *ops[TURN];
    PhaseJob pj[2];
    cpu_set_t was;
    int cpus[2], pinned = two_cpus(cpus, &was);
    for (int t = 0; t < 2; t++)
        pj[t] = (PhaseJob){{pl, nch, 0, NULL}, t, proxy, &turn, ops, cpus[t]};
    pthread_t th;
    pthread_create(&th, NULL, phase_worker, &pj[1]);
    phase_worker(&pj[0]);
    pthread_join(th, NULL);
    if (pinned) sched_setaffinity(0, sizeof was, &was);
    double collectives = (double)(ITERS / TURN) * TURN * (proxy ? 1.0 : 2.0);
    return ((double)pj[0].job.ns + (double)pj[1].job.ns) / collectives;
}

/* "1 hop": the calling thread alone, in 2 x ITERS/TURN phases of TURN
 * collectives, moved to the other CPU before each (sched_setaffinity moves
 * it before returning); CPU time over the phases only. */
static double measure_hop(const Plug *pl, int nch) {
    cpu_set_t was;
    int cpus[2], pinned = two_cpus(cpus, &was);
    uint64_t ns = 0, phases = 2 * (ITERS / TURN);
    for (uint64_t i = 0; i < phases; i++) {
        pin(cpus[i & 1]);
        uint64_t t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (uint64_t k = 0; k < TURN; k++) one_collective(pl, nch, i * TURN + k);
        ns += clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
    }
    if (pinned) sched_setaffinity(0, sizeof was, &was);
    return (double)ns / (double)(phases * TURN);
}

/* One cache line's move between the two CPUs: a ping-pong of PING round
 * trips on one word, each side waiting for the other's store; half a round
 * trip (wall time: both threads are busy throughout). 0 with one CPU. */
#define PING 20000u
typedef struct {
    _Alignas(64) _Atomic uint64_t word;
    int cpu;
} Ping;

static void ping_side(Ping *p, int cpu, uint64_t me) {
    pin(cpu);
    for (uint64_t i = 0; i < PING; i++) {
        while (atomic_load_explicit(&p->word, memory_order_acquire) != 2 * i + me) {
        }
        atomic_store_explicit(&p->word, 2 * i + me + 1u, memory_order_release);
    }
}

static void *ping_thread(void *arg) {
    Ping *p = arg;
    ping_side(p, p->cpu, 1);
    return NULL;
}

static double measure_line(void) {
    cpu_set_t was;
    int cpus[2];
    if (!two_cpus(cpus, &was)) return 0.0;
    static Ping p;
    atomic_store_explicit(&p.word, 0, memory_order_relaxed);
    p.cpu = cpus[1];
    pthread_t th;
    pthread_create(&th, NULL, ping_thread, &p);
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    ping_side(&p, cpus[0], 0);
    uint64_t t1 = clock_ns(CLOCK_MONOTONIC);
    pthread_join(th, NULL);
    sched_setaffinity(0, sizeof was, &was);
    return (double)(t1 - t0) / (2.0 * PING);
}

/* a few collectives from another thread (BENCH_SHARED) */
static void *one_job(void *arg) {
    Job *j = arg;
    for (uint64_t i = 0; i < 10; i++) one_collective(j->plug, j->nch, i);
    return NULL;
}

/* CPU ns per collective per thread. The calling thread is always one of the
 * workers (a launching thread stays the same, as in a training loop); with 2
 * threads a second one runs beside it. */
static double measure(const Plug *pl, int nch, int threads) {
    pthread_t th[8];
    Job jobs[8];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) jobs[t] = (Job){pl, nch, 0, &bar};
    for (int t = 1; t < threads; t++) pthread_create(&th[t], NULL, worker, &jobs[t]);
    worker(&jobs[0]);
    double sum = (double)jobs[0].ns / ITERS;
    for (int t = 1; t < threads; t++) {
        pthread_join(th[t], NULL);
        sum += (double)jobs[t].ns / ITERS;
    }
    pthread_barrier_destroy(&bar);
    return sum / threads;
}

/* CPU ns per collective of row ti of the table (rows[] in main): 0 and 2
 * free-running (1 and 2 threads), 1 and 3 in phases (1: the proxy), 4
 * hopping */
static double measure_row(const Plug *pl, int nch, int ti) {
    if (ti == 4) return measure_hop(pl, nch);
    if (ti & 1) return measure_phases(pl, nch, ti == 1);
    return measure(pl, nch, ti == 0 ? 1 : 2);
}

/* CPU ns of one clock_gettime(CLOCK_MONOTONIC), the plugin's host clock read */
static double measure_clock(void) {
    volatile uint64_t sink = 0;
    uint64_t t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < ITERS; i++) sink += clock_ns(CLOCK_MONOTONIC);
    (void)sink;
    return (double)(clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / ITERS;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *init_plugin(int version, uint64_t hash, int *mask) {
    void *ctx = NULL;
    *mask = 0;
    switch (version) {
    case 4: ncclProfiler_v4.init(&ctx, mask, "bench", hash, 1, 1, 0, NULL); break;
    case 5: ncclProfiler_v5.init(&ctx, hash, mask, "bench", 1, 1, 0, NULL); break;
    case 6: ncclProfiler_v6.init(&ctx, hash, mask, "bench", 1, 1, 0, NULL); break;
    default: ncclProfiler_v7.init(&ctx, hash, mask, "bench", 1, 1, 0, NULL); break;
    }
    return ctx;
}

static ncclProfiler_v6_t *table_of(int version) {
    switch (version) {
    case 4: return (ncclProfiler_v6_t *)(void *)&ncclProfiler_v4;
    case 5: return (ncclProfiler_v6_t *)(void *)&ncclProfiler_v5;
    case 6: return &ncclProfiler_v6;
    default: return (ncclProfiler_v6_t *)(void *)&ncclProfiler_v7;
    }
}

/* kept out of line so that callgrind's inclusive cost of each is one side */
__attribute__((noinline)) void run_artemis(const Plug *pl, int nch, int n) {
    for (int i = 0; i < n; i++) one_collective(pl, nch, (uint64_t)i);
}
__attribute__((noinline)) void run_nop(const Plug *pl, int nch, int n) {
    for (int i = 0; i < n; i++) one_collective(pl, nch, (uint64_t)i);
}

int main(int argc, char **argv) {
    char dir[64];
    snprintf(dir, sizeof dir, "/dev/shm/artemis-bench-%d", (int)getpid());
    setenv("ARTEMIS_SHM_DIR", dir, 1);
    setenv("ARTEMIS_JOB", "bench", 1);
    if (getenv("BENCH_SLOTS")) setenv("ARTEMIS_RING_SLOTS", getenv("BENCH_SLOTS"), 1);
    int mask = 0;
    void *nctx = NULL;
    if (getenv("BENCH_NOP_NULL") && !strcmp(getenv("BENCH_NOP_NULL"), "1")) nop_table.startEvent = nop_start_null;
    nop_table.init(&nctx, 0, &mask, NULL, 1, 1, 0, NULL);
    Plug nop = {&nop_table, 0, nctx, mask}, nop4 = {&nop_table, 1, nctx, mask};
    /* per version, one communicator for the 1-thread rows, one for the
     * 2-thread rows, one for the turns and one for the launcher + proxy: a
     * second starting thread switches a context to shared mode */
    void *ctxs[32] = {0};
    Plug art[32];
    for (int v = 4; v <= 7; v++) {
        for (int t = 0; t < 4; t++) {
            int i = v + 8 * t;
            int amask = 0;
            ctxs[i] = init_plugin(v, 0xbe4c0ULL + (uint64_t)i, &amask);
            if (!ctxs[i]) {
                fprintf(stderr, "bench: plugin init failed (v%d)\n", v);
                return 1;
            }
            art[i] = (Plug){table_of(v), v == 4, ctxs[i], amask};
        }
    }
    if (argc >= 4 && !strcmp(argv[1], "callgrind")) {
        int v = atoi(argv[2]), nch = atoi(argv[3]);
        int n = argc >= 5 ? atoi(argv[4]) : 20000;
        if (v < 4 || v > 7 || n < 1) return 2;
        /* BENCH_SHARED=1: the two-thread rows' context, switched to shared
         * mode by one collective of a second thread first (callgrind runs the
         * threads one at a time: the shared path's instructions, not its
         * cache-line moves) */
        const Plug *pa = &art[v];
        if (getenv("BENCH_SHARED") && !strcmp(getenv("BENCH_SHARED"), "1")) {
            pa = &art[v + 8];
            run_artemis(pa, nch, 10);
            pthread_t t;
            Job j = {pa, nch, 0, NULL};
            pthread_create(&t, NULL, one_job, &j);
            pthread_join(t, NULL);
        }
        run_nop(v == 4 ? &nop4 : &nop, nch, 2000); /* warm-up of both paths */
        run_artemis(pa, nch, 2000);
        run_nop(v == 4 ? &nop4 : &nop, nch, n);
        run_artemis(pa, nch, n);
    } else {
        printf("Artemis profiler plugin: CPU time per collective (whole event sequence), median of %d "
               "interleaved runs x %d collectives\n", RUNS, ITERS);
        printf("%-4s %-9s %-8s %10s %12s %11s %9s %13s %8s\n", "ABI", "channels", "threads",
               "no-op ns", "artemis ns", "margin ns", "clock ns", "margin/clock", "line ns");
        const int chs[] = {2, 8};
        const char *const rows[] = {"1", "1+proxy", "2", "2 turns", "1 hop"};
        /* its context: art[v + 8 * row_ctx] ("1 hop" is the 1-thread rows'
         * thread: that context stays in single mode) */
        const int row_ctx[] = {0, 3, 1, 2, 0};
        for (int v = 4; v <= 7; v++) {
            for (int ci = 0; ci < 2; ci++) {
                for (int ti = 0; ti < 5; ti++) {
                    double n[RUNS], a[RUNS], m[RUNS], c[RUNS], r[RUNS], l[RUNS];
                    const Plug *pn = v == 4 ? &nop4 : &nop, *pa = &art[v + 8 * row_ctx[ti]];
                    for (int k = 0; k < RUNS; k++) {
                        c[k] = measure_clock();
                        l[k] = measure_line();
                        n[k] = measure_row(pn, chs[ci], ti);
                        a[k] = measure_row(pa, chs[ci], ti);
                        m[k] = a[k] - n[k];
                        r[k] = m[k] / c[k];
                    }
                    qsort(n, RUNS, sizeof(double), cmp_d);
                    qsort(a, RUNS, sizeof(double), cmp_d);
                    qsort(m, RUNS, sizeof(double), cmp_d);
                    qsort(c, RUNS, sizeof(double), cmp_d);
                    qsort(r, RUNS, sizeof(double), cmp_d);
                    qsort(l, RUNS, sizeof(double), cmp_d);
                    printf("v%-3d %-9d %-8s %10.1f %12.1f %11.1f %9.1f %13.2f %8.1f\n", v, chs[ci],
                           rows[ti], n[RUNS / 2], a[RUNS / 2], m[RUNS / 2], c[RUNS / 2], r[RUNS / 2],
                           l[RUNS / 2]);
                }
            }
        }
    }
    for (int i = 4; i < 32; i++) {
        if (!ctxs[i]) continue;
        table_of(i & 7)->finalize(ctxs[i]);
        char path[160];
        snprintf(path, sizeof path, "%s/bench.%016llx.r0.ring", dir, 0xbe4c0ULL + (uint64_t)i);
        unlink(path);
        /* and its env sidecar (README.md "The env sidecar") */
        strncat(path, ".env", sizeof path - strlen(path) - 1);
        unlink(path);
    }
    rmdir(dir);
    return 0;
}
