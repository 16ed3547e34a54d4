/*
 * harness.c: multi-threaded self-checking test of the Artemis profiler plugin.
 *
 * Built together with abi.c, core.c and ring.c under ASan+UBSan and under TSan
 * (see the Makefile). User-like threads issue the NCCL 2.28+ event sequence
 * for collectives and p2p ops; proxy-like threads issue KernelCh events for
 * them (channels of one op go to different threads, before or after the Coll
 * stop); a reader thread reads the rings concurrently with the seqlock
 * protocol. Every field of a record is derived from (rank, coll_seq), so any
 * torn record that the reader accepted would fail the check.
 *
 * Exit status: 0 when every check passed, 1 otherwise.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../artemis_ring.h"
#include "../nccl_profiler_abi.h"

extern ncclProfiler_v4_t ncclProfiler_v4;
extern ncclProfiler_v5_t ncclProfiler_v5;
extern ncclProfiler_v6_t ncclProfiler_v6;
extern ncclProfiler_v7_t ncclProfiler_v7;

#define A32(p) ((_Atomic uint32_t *)(void *)(p))
#define A64(p) ((_Atomic uint64_t *)(void *)(p))
#define RLX memory_order_relaxed

static _Atomic int failures;
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            if (atomic_fetch_add(&failures, 1) < 20) {                          \
                fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                   \
                fprintf(stderr, "\n");                                          \
            }                                                                   \
        }                                                                       \
    } while (0)

static char g_root[256];
static _Atomic int g_log_lines;
static _Atomic int g_warn_lines;

static void test_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...) {
    (void)flags; (void)file; (void)line;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&g_log_lines, 1);
    if (level == NCCL_LOG_WARN) atomic_fetch_add(&g_warn_lines, 1);
    if (getenv("HARNESS_VERBOSE")) fprintf(stderr, "[log %d] %s\n", (int)level, buf);
}

/* Contexts are kept here for the life of the process (the plugin never frees them). */
static void *g_keep[256];
static _Atomic int g_nkeep;
static void keep(void *p) {
    int i = atomic_fetch_add(&g_nkeep, 1);
    if (i < 256) g_keep[i] = p;
}

/* ------------------------------------------------------------------ */
/* the self-describing workload                                         */

#define T_COLL 1000000000000ull
#define T_P2P 5000000000000ull

static const char *const FUNCS[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast"};
static const uint8_t FUNC_CODES[] = {ARTEMIS_FUNC_ALLREDUCE, ARTEMIS_FUNC_ALLGATHER,
                                     ARTEMIS_FUNC_REDUCESCATTER, ARTEMIS_FUNC_BROADCAST};
static const char *const DTS[] = {"ncclFloat32", "ncclBfloat16", "ncclFloat64"};
static const uint8_t DT_CODES[] = {ARTEMIS_DT_FLOAT32, ARTEMIS_DT_BFLOAT16, ARTEMIS_DT_FLOAT64};
static const uint64_t DT_SIZES[] = {4, 2, 8};
static const char *const ALGOS[] = {"RING", "TREE", "NVLS"};
static const uint8_t ALGO_CODES[] = {ARTEMIS_ALGO_RING, ARTEMIS_ALGO_TREE, ARTEMIS_ALGO_NVLS};
static const char *const PROTOS[] = {"SIMPLE", "LL", "LL128"};
static const uint8_t PROTO_CODES[] = {ARTEMIS_PROTO_SIMPLE, ARTEMIS_PROTO_LL, ARTEMIS_PROTO_LL128};

typedef struct {
    uint8_t kind, func, dtype, algo, proto, nch;
    int32_t peer;
    uint64_t bytes;
    const char *func_s, *dtype_s, *algo_s, *proto_s;
    size_t count;
} Expect;

static int is_p2p(uint64_t i) { return i % 7 == 3; }

static void expect_coll(uint64_t c, int rank, Expect *e) {
    memset(e, 0, sizeof *e);
    e->kind = ARTEMIS_KIND_COLL;
    unsigned f = (unsigned)(c % 4);
    e->func = FUNC_CODES[f];
    e->func_s = FUNCS[f];
    e->count = 16 * (c + 1) + (uint64_t)rank;
    if (f == 1 || f == 3) { /* AllGather / Broadcast: NCCL reports bytes as ncclInt8 */
        e->dtype = ARTEMIS_DT_INT8;
        e->dtype_s = "ncclInt8";
        e->bytes = e->count;
    } else {
        unsigned d = (unsigned)(c % 3);
        e->dtype = DT_CODES[d];
        e->dtype_s = DTS[d];
        e->bytes = e->count * DT_SIZES[d];
    }
    e->algo = ALGO_CODES[c % 3];
    e->algo_s = ALGOS[c % 3];
    e->proto = PROTO_CODES[(c / 3) % 3];
    e->proto_s = PROTOS[(c / 3) % 3];
    e->nch = (c % 5 == 4) ? 0 : (uint8_t)(1 + (c * 7) % 8);
    e->peer = -1;
}

static void expect_p2p(uint64_t c, int rank, int nranks, Expect *e) {
    memset(e, 0, sizeof *e);
    e->kind = ARTEMIS_KIND_P2P;
    e->func = (c % 2) ? ARTEMIS_FUNC_SEND : ARTEMIS_FUNC_RECV;
    e->func_s = (c % 2) ? "Send" : "Recv";
    e->dtype = ARTEMIS_DT_FLOAT16;
    e->dtype_s = "ncclFloat16";
    e->count = 8 * (c + 1) + (uint64_t)rank;
    e->bytes = e->count * 2;
    e->nch = (uint8_t)(1 + c % 2);
    e->peer = (rank + 1) % nranks;
}

static uint64_t tstart(int kind, uint64_t c, int rank, unsigned k) {
    return (kind == ARTEMIS_KIND_COLL ? T_COLL : T_P2P) + c * 1000000ull + (uint64_t)rank * 1000ull +
           10ull * k + 5ull;
}
static uint64_t tstop(int kind, uint64_t c, int rank, unsigned k) {
    return tstart(kind, c, rank, k) + 500ull + k;
}

/* ------------------------------------------------------------------ */
/* ring reading (the agent's protocol)                                  */

typedef struct {
    uint32_t lock;
    uint8_t kind, func, dtype, state, clock, algo, proto, nchannels;
    int32_t peer;
    uint64_t seq, coll_seq, bytes, enqueue_ns, start, end;
} Rec;

/* 1: a whole record copied; 0: torn / being written. */
static int read_slot(const ArtemisSlot *s, Rec *r) {
    uint32_t l1 = atomic_load_explicit(A32(&s->lock), memory_order_acquire);
    if (l1 & 1u) return 0;
    /* acquire loads of the body pair with the writer's release stores: no
     * fence, so ThreadSanitizer sees every edge (see seq_enter in slot.h) */
    const memory_order B = memory_order_acquire;
    uint32_t w4 = atomic_load_explicit(A32(&s->kind), B);
    uint64_t w8 = atomic_load_explicit(A64(&s->clock), B);
    r->seq = atomic_load_explicit(A64(&s->seq), B);
    r->coll_seq = atomic_load_explicit(A64(&s->coll_seq), B);
    r->bytes = atomic_load_explicit(A64(&s->bytes), B);
    r->enqueue_ns = atomic_load_explicit(A64(&s->enqueue_ns), B);
    r->start = atomic_load_explicit(A64(&s->start), B);
    r->end = atomic_load_explicit(A64(&s->end), B);
    uint32_t l2 = atomic_load_explicit(A32(&s->lock), RLX);
    if (l1 != l2) return 0;
    uint8_t b[8];
    memcpy(b, &w4, 4);
    r->kind = b[0]; r->func = b[1]; r->dtype = b[2]; r->state = b[3];
    memcpy(b, &w8, 8);
    r->clock = b[0]; r->algo = b[1]; r->proto = b[2]; r->nchannels = b[3];
    memcpy(&r->peer, b + 4, 4);
    r->lock = l1;
    return 1;
}

typedef struct {
    const ArtemisRingHeader *hdr;
    const ArtemisSlot *slots;
    size_t bytes;
    int device;   /* expected device timing for ops with channels */
} Ring;

static int map_ring(const char *path, Ring *r) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return -1; }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    r->hdr = m;
    r->slots = (const ArtemisSlot *)((const char *)m + ARTEMIS_RING_HEADER_SIZE);
    r->bytes = (size_t)st.st_size;
    return 0;
}

/* Checks one accepted record against the workload model. Returns 1 if DONE. */
static int check_rec(const Ring *ring, const Rec *r, uint64_t slot_idx, const char *where) {
    const ArtemisRingHeader *h = ring->hdr;
    if (r->lock == 0 && r->seq == 0 && r->state == 0) return 0; /* never written */
    CHECK((r->seq & (h->capacity - 1u)) == slot_idx, "%s: seq %llu in slot %llu", where,
          (unsigned long long)r->seq, (unsigned long long)slot_idx);
    Expect e;
    if (r->kind == ARTEMIS_KIND_COLL) expect_coll(r->coll_seq, h->rank, &e);
    else if (r->kind == ARTEMIS_KIND_P2P) expect_p2p(r->coll_seq, h->rank, h->nranks, &e);
    else {
        CHECK(0, "%s: bad kind %u", where, r->kind);
        return 0;
    }
    CHECK(r->func == e.func && r->dtype == e.dtype && r->bytes == e.bytes && r->peer == e.peer &&
              r->nchannels == e.nch,
          "%s: fields of seq %llu coll_seq %llu: func %u/%u dtype %u/%u bytes %llu/%llu peer %d/%d nch %u/%u",
          where, (unsigned long long)r->seq, (unsigned long long)r->coll_seq, r->func, e.func,
          r->dtype, e.dtype, (unsigned long long)r->bytes, (unsigned long long)e.bytes, r->peer,
          e.peer, r->nchannels, e.nch);
    if (r->kind == ARTEMIS_KIND_COLL)
        CHECK(r->algo == e.algo && r->proto == e.proto, "%s: algo/proto %u %u", where, r->algo, r->proto);
    else
        CHECK(r->algo == 0 && r->proto == 0, "%s: p2p algo/proto %u %u", where, r->algo, r->proto);
    CHECK(r->enqueue_ns != 0, "%s: enqueue_ns 0", where);
    if (r->state == ARTEMIS_STATE_IN_FLIGHT) {
        CHECK(r->start == 0 && r->end == 0 && r->clock == 0, "%s: in-flight with times", where);
        return 0;
    }
    CHECK(r->state == ARTEMIS_STATE_DONE, "%s: state %u", where, r->state);
    if (ring->device && e.nch) {
        CHECK(r->clock == ARTEMIS_REC_DEVICE, "%s: clock %u for seq %llu", where, r->clock,
              (unsigned long long)r->seq);
        CHECK(r->start == tstart(e.kind, r->coll_seq, h->rank, 0) &&
                  r->end == tstop(e.kind, r->coll_seq, h->rank, e.nch - 1u),
              "%s: device times %llu %llu of coll_seq %llu", where, (unsigned long long)r->start,
              (unsigned long long)r->end, (unsigned long long)r->coll_seq);
    } else {
        CHECK(r->clock == ARTEMIS_REC_HOST, "%s: clock %u (host expected)", where, r->clock);
        CHECK(r->start == r->enqueue_ns && r->end >= r->start, "%s: host times", where);
    }
    return 1;
}

/* ------------------------------------------------------------------ */
/* multi-threaded scenario                                              */

typedef struct Comm Comm;
typedef struct {
    void *(*start)(Comm *, void **, int type, void *parent, const Expect *, uint64_t ptimer);
} Drv;

struct Comm {
    int version;      /* 4..7 */
    void *ctx;
    int rank, nranks;
    uint64_t hash;
    uint64_t nops;    /* ops to issue */
    _Atomic int outstanding;
    unsigned seed;
    Ring ring;
    char path[512];
};

/* The descriptor's members every version has under the same names: the
 * header, and the Coll, P2p and KernelCh arms (v5+ only append members). */
#define FILL_TASK(d)                                                                        \
    do {                                                                                    \
        memset(&(d), 0, sizeof(d));                                                         \
        (d).parentObj = parent;                                                             \
        (d).rank = cm->rank;                                                                \
        if (type == ncclProfileColl) {                                                      \
            (d).coll.func = e->func_s; (d).coll.datatype = e->dtype_s;                      \
            (d).coll.count = e->count; (d).coll.nChannels = e->nch;                         \
            (d).coll.algo = e->algo_s; (d).coll.proto = e->proto_s;                         \
        } else if (type == ncclProfileP2p) {                                                \
            (d).p2p.func = e->func_s; (d).p2p.datatype = e->dtype_s;                        \
            (d).p2p.count = e->count; (d).p2p.nChannels = e->nch; (d).p2p.peer = e->peer;   \
        } else if (type == ncclProfileKernelCh) {                                           \
            (d).kernelCh.channelId = (uint8_t)channel; (d).kernelCh.pTimer = ptimer;        \
        }                                                                                   \
    } while (0)

/* Builds a descriptor of the comm's version and calls its startEvent. */
static void *start_ev(Comm *cm, int type, void *parent, const Expect *e, uint64_t ptimer,
                      int channel) {
    void *h = (void *)0x1; /* must be overwritten */
    if (cm->version == 4) {
        ncclProfilerEventDescr_v4_t d;
        FILL_TASK(d);
        d.type = (uint8_t)type;
        ncclProfiler_v4.startEvent(cm->ctx, &h, &d);
    } else if (cm->version == 7) {
        ncclProfilerEventDescr_v7_t d;
        FILL_TASK(d);
        d.type = (uint64_t)type;
        if (type == ncclProfileColl) {
            d.coll.userTag = 77;
        } else if (type == ncclProfileCollApi && e) {
            d.collApi.func = e->func_s; d.collApi.count = e->count; d.collApi.datatype = e->dtype_s;
        } else if (type == ncclProfileGroupApi) {
            d.groupApi.groupDepth = 1;
        }
        ncclProfiler_v7.startEvent(cm->ctx, &h, &d);
    } else {
        ncclProfilerEventDescr_v6_t d; /* v5 has the same layout for the arms we use */
        FILL_TASK(d);
        d.type = (uint64_t)type;
        if (type == ncclProfileCollApi && e) {
            d.collApi.func = e->func_s; d.collApi.count = e->count; d.collApi.datatype = e->dtype_s;
        }
        if (cm->version == 5)
            ncclProfiler_v5.startEvent(cm->ctx, &h, (ncclProfilerEventDescr_v5_t *)(void *)&d);
        else
            ncclProfiler_v6.startEvent(cm->ctx, &h, &d);
    }
    CHECK(h != (void *)0x1, "startEvent did not write *eHandle (type %d)", type);
    return h;
}

static void stop_ev(void *h) { ncclProfiler_v6.stopEvent(h); }
static void record_ev(void *h, int state, ncclProfilerEventStateArgs_t *a) {
    ncclProfiler_v6.recordEventState(h, (ncclProfilerEventState_t)state, a);
}

/* proxy work: one item per channel */
typedef struct OpWork {
    Comm *cm;
    void *handle;
    int kind;
    uint64_t c;
    unsigned nch;
    _Atomic unsigned left;
} OpWork;
typedef struct { OpWork *w; unsigned ch; } Item;
#define ALL_CH 0xffffffffu

#define QCAP 65536
static Item g_q[QCAP];
static unsigned g_qh, g_qt;
static int g_qdone;
static pthread_mutex_t g_qm = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_qc = PTHREAD_COND_INITIALIZER;

static void q_push(OpWork *w, unsigned ch) {
    pthread_mutex_lock(&g_qm);
    g_q[g_qt++ % QCAP] = (Item){w, ch};
    pthread_cond_signal(&g_qc);
    pthread_mutex_unlock(&g_qm);
}

static void *proxy_main(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_qm);
        while (g_qh == g_qt && !g_qdone) pthread_cond_wait(&g_qc, &g_qm);
        if (g_qh == g_qt && g_qdone) {
            pthread_mutex_unlock(&g_qm);
            return NULL;
        }
        Item it = g_q[g_qh++ % QCAP];
        pthread_mutex_unlock(&g_qm);
        OpWork *w = it.w;
        Comm *cm = w->cm;
        /* ALL_CH: every channel of the op on this thread, all started, then
         * all stopped (NCCL's proxy loop order); else one channel. */
        unsigned lo = it.ch == ALL_CH ? 0 : it.ch, hi = it.ch == ALL_CH ? w->nch : it.ch + 1;
        void *khs[64];
        for (unsigned k = lo; k < hi; k++) {
            khs[k] = start_ev(cm, ncclProfileKernelCh, w->handle, NULL,
                              tstart(w->kind, w->c, cm->rank, k), (int)k);
            if (w->handle && cm->ring.device) CHECK(khs[k] != NULL, "KernelCh handle NULL");
        }
        for (unsigned k = lo; k < hi; k++) {
            ncclProfilerEventStateArgs_t a;
            a.kernelCh.pTimer = tstop(w->kind, w->c, cm->rank, k);
            record_ev(khs[k], ncclProfilerKernelChStop, &a);
            stop_ev(khs[k]);
        }
        if (atomic_fetch_sub(&w->left, hi - lo) == hi - lo) {
            atomic_fetch_sub(&cm->outstanding, 1);
            free(w);
        }
    }
}

static int g_max_outstanding = 200;
static int g_expect_drops;

static void *user_main(void *arg) {
    Comm *cm = arg;
    uint64_t c = 0;
    for (uint64_t i = 0; i < cm->nops; i++) {
        while (atomic_load(&cm->outstanding) >= g_max_outstanding) sched_yield();
        Expect e;
        int p2p = is_p2p(i);
        if (p2p) expect_p2p(c, cm->rank, cm->nranks, &e);
        else expect_coll(c, cm->rank, &e);
        void *ga = start_ev(cm, ncclProfileGroupApi, NULL, NULL, 0, 0);
        record_ev(ga, ncclProfilerGroupStartApiStop, NULL);
        void *api = start_ev(cm, p2p ? ncclProfileP2pApi : ncclProfileCollApi, ga, &e, 0, 0);
        stop_ev(api);
        record_ev(ga, ncclProfilerGroupEndApiStart, NULL);
        void *grp = start_ev(cm, ncclProfileGroup, NULL, NULL, 0, 0);
        void *op = start_ev(cm, p2p ? ncclProfileP2p : ncclProfileColl, cm->version == 4 ? grp : api,
                            &e, 0, 0);
        if (!g_expect_drops) CHECK(op != NULL, "op handle NULL at i=%llu", (unsigned long long)i);
        OpWork *w = NULL;
        int r = rand_r(&cm->seed);
        int early = (r & 3) == 0; /* channels may run before Coll stop */
        int whole = (r & 4) != 0; /* all channels on one proxy thread, starts first */
        if (e.nch && op) {
            w = calloc(1, sizeof *w);
            w->cm = cm; w->handle = op; w->kind = e.kind; w->c = c; w->nch = e.nch;
            atomic_store(&w->left, e.nch);
            atomic_fetch_add(&cm->outstanding, 1);
            if (early && whole) q_push(w, ALL_CH);
            else if (early)
                for (unsigned k = 0; k < e.nch; k++) q_push(w, k);
        }
        stop_ev(op);
        if (w && !early && whole) q_push(w, ALL_CH);
        else if (w && !early)
            for (unsigned k = 0; k < e.nch; k++) q_push(w, k);
        stop_ev(grp);
        stop_ev(ga);
        if (!p2p) c++;
    }
    return NULL;
}

static Comm *g_comms[8];
static int g_ncomms;
static _Atomic int g_reader_stop;
static _Atomic long g_accepted_done, g_accepted_inflight, g_rejected;

static void *reader_main(void *arg) {
    (void)arg;
    while (!atomic_load(&g_reader_stop)) {
        for (int ci = 0; ci < g_ncomms; ci++) {
            Ring *rg = &g_comms[ci]->ring;
            uint32_t cap = rg->hdr->capacity;
            for (uint32_t s = 0; s < cap; s++) {
                Rec r;
                if (!read_slot(&rg->slots[s], &r)) {
                    atomic_fetch_add_explicit(&g_rejected, 1, RLX);
                    continue;
                }
                if (check_rec(rg, &r, s, "reader"))
                    atomic_fetch_add_explicit(&g_accepted_done, 1, RLX);
                else
                    atomic_fetch_add_explicit(&g_accepted_inflight, 1, RLX);
            }
        }
    }
    return NULL;
}

static void ring_path(char *out, size_t n, const char *dir, const char *job, uint64_t hash, int rank) {
    snprintf(out, n, "%s/%s.%016llx.r%d.ring", dir, job, (unsigned long long)hash, rank);
}

static void *init_comm(int version, uint64_t hash, const char *name, int nnodes, int nranks,
                       int rank, int *mask) {
    void *ctx = (void *)0x1;
    ncclResult_t rc;
    if (version == 4)
        rc = ncclProfiler_v4.init(&ctx, mask, name, hash, nnodes, nranks, rank, test_logger);
    else if (version == 5)
        rc = ncclProfiler_v5.init(&ctx, hash, mask, name, nnodes, nranks, rank, test_logger);
    else if (version == 6)
        rc = ncclProfiler_v6.init(&ctx, hash, mask, name, nnodes, nranks, rank, test_logger);
    else
        rc = ncclProfiler_v7.init(&ctx, hash, mask, name, nnodes, nranks, rank, test_logger);
    CHECK(rc == ncclSuccess, "init rc %d", rc);
    CHECK(ctx != (void *)0x1, "init did not write *context");
    if (ctx) keep(ctx);
    return ctx;
}

static int finalize_ctx(int version, void *ctx) {
    switch (version) {
    case 4: return ncclProfiler_v4.finalize(ctx);
    case 5: return ncclProfiler_v5.finalize(ctx);
    case 6: return ncclProfiler_v6.finalize(ctx);
    default: return ncclProfiler_v7.finalize(ctx);
    }
}

/* Runs ncomm communicators (versions[]) with nproxy proxy threads. */
static void run_scenario(const char *label, int ncomm, const int *versions, uint64_t nops,
                         int nproxy, const char *slots, int device, int expect_drops) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", g_root, label);
    setenv("ARTEMIS_SHM_DIR", dir, 1);
    setenv("ARTEMIS_JOB", "job", 1);
    if (slots) setenv("ARTEMIS_RING_SLOTS", slots, 1);
    else unsetenv("ARTEMIS_RING_SLOTS");
    setenv("ARTEMIS_DEVICE_TIMING", device ? "1" : "0", 1);
    /* The proxy threads here hand one op's channels to several threads in any
     * order, unlike NCCL's one ordered proxy thread: an item can sit behind a
     * descheduled thread while 64 later ops complete. A reclaim age far above
     * any such delay keeps every op device-timed (the scan still runs). */
    setenv("ARTEMIS_RECLAIM_AGE_MS", "600000", 1);

    g_ncomms = ncomm;
    g_expect_drops = expect_drops;
    for (int i = 0; i < ncomm; i++) {
        Comm *cm = calloc(1, sizeof *cm);
        keep(cm);
        cm->version = versions[i];
        cm->rank = i % 4;
        cm->nranks = 4;
        cm->hash = 0xabc0000000000000ull + (uint64_t)i * 0x1111ull;
        cm->nops = nops;
        cm->seed = (unsigned)(i * 7919 + 1);
        int mask = -1;
        cm->ctx = init_comm(cm->version, cm->hash, "harness", 2, cm->nranks, cm->rank, &mask);
        CHECK(cm->ctx != NULL, "%s: init failed", label);
        CHECK(mask == (device ? 70 : 6), "%s: mask %d", label, mask);
        ring_path(cm->path, sizeof cm->path, dir, "job", cm->hash, cm->rank);
        if (map_ring(cm->path, &cm->ring) != 0) {
            CHECK(0, "%s: cannot map %s", label, cm->path);
            return;
        }
        cm->ring.device = device;
        const ArtemisRingHeader *h = cm->ring.hdr;
        CHECK(h->magic == ARTEMIS_RING_MAGIC && h->version == ARTEMIS_RING_VERSION &&
                  h->header_size == ARTEMIS_RING_HEADER_SIZE && h->slot_size == ARTEMIS_RING_SLOT_SIZE,
              "%s: header constants", label);
        CHECK(h->rank == cm->rank && h->nranks == 4 && h->nnodes == 2 && h->comm_hash == cm->hash &&
                  h->pid == (int32_t)getpid() && (uint32_t)h->plugin_version == (uint32_t)cm->version,
              "%s: header identity", label);
        CHECK(h->clock_kind == (uint32_t)(device ? ARTEMIS_CLOCK_DEVICE_NS : ARTEMIS_CLOCK_HOST),
              "%s: clock kind %u", label, h->clock_kind);
        CHECK(!strcmp(h->job, "job") && !strcmp(h->comm_name, "harness") && h->created_ns > 0,
              "%s: header names", label);
        g_comms[i] = cm;
    }

    g_qh = g_qt = 0;
    g_qdone = 0;
    atomic_store(&g_reader_stop, 0);
    atomic_store(&g_accepted_done, 0);
    atomic_store(&g_accepted_inflight, 0);
    atomic_store(&g_rejected, 0);
    pthread_t users[8], proxies[8], reader;
    pthread_create(&reader, NULL, reader_main, NULL);
    for (int p = 0; p < nproxy; p++) pthread_create(&proxies[p], NULL, proxy_main, NULL);
    for (int i = 0; i < ncomm; i++) pthread_create(&users[i], NULL, user_main, g_comms[i]);
    for (int i = 0; i < ncomm; i++) pthread_join(users[i], NULL);
    pthread_mutex_lock(&g_qm);
    g_qdone = 1;
    pthread_cond_broadcast(&g_qc);
    pthread_mutex_unlock(&g_qm);
    for (int p = 0; p < nproxy; p++) pthread_join(proxies[p], NULL);
    atomic_store(&g_reader_stop, 1);
    pthread_join(reader, NULL);

    long total_done = 0;
    for (int i = 0; i < ncomm; i++) {
        Comm *cm = g_comms[i];
        const ArtemisRingHeader *h = cm->ring.hdr;
        CHECK(finalize_ctx(cm->version, cm->ctx) == ncclSuccess, "finalize");
        uint32_t flags = atomic_load(A32(&h->flags));
        CHECK((flags & ARTEMIS_RING_FINISHED) && h->finished_ns >= h->created_ns,
              "%s: finished flag/time", label);
        uint64_t W = atomic_load(A64(&h->write_index));
        uint64_t dropped = atomic_load(A64(&h->dropped));
        CHECK(W == cm->nops, "%s: write_index %llu != ops %llu", label, (unsigned long long)W,
              (unsigned long long)cm->nops);
        uint32_t cap = h->capacity;
        uint64_t done = 0, inflight = 0;
        for (uint32_t s = 0; s < cap; s++) {
            Rec r;
            CHECK(read_slot(&cm->ring.slots[s], &r), "%s: slot %u locked at rest", label, s);
            if (check_rec(&cm->ring, &r, s, label)) done++;
            else if (r.state) inflight++;
        }
        if (!expect_drops) {
            CHECK(dropped == 0, "%s: dropped %llu", label, (unsigned long long)dropped);
            uint64_t want = W < cap ? W : cap;
            CHECK(done == want && inflight == 0, "%s: %llu done / %llu in flight, want %llu done",
                  label, (unsigned long long)done, (unsigned long long)inflight,
                  (unsigned long long)want);
        } else {
            CHECK(dropped > 0 && dropped <= W, "%s: dropped %llu of %llu", label,
                  (unsigned long long)dropped, (unsigned long long)W);
            CHECK(inflight <= cap, "%s: in flight", label);
        }
        total_done += (long)done;
        printf("  %-10s comm %d v%d: %llu ops, %u slots, dropped %llu, final done %llu\n", label, i,
               cm->version, (unsigned long long)W, cap, (unsigned long long)dropped,
               (unsigned long long)done);
    }
    printf("  %-10s reader: %ld done + %ld in-flight records accepted and verified, %ld torn/busy rejected\n",
           label, atomic_load(&g_accepted_done), atomic_load(&g_accepted_inflight),
           atomic_load(&g_rejected));
    CHECK(atomic_load(&g_accepted_done) > 0, "%s: reader accepted nothing", label);
    (void)total_done;
}

/* ------------------------------------------------------------------ */
/* single-threaded failure paths                                        */

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || (e->d_name[1] && e->d_name[1] != '.' && e->d_name[1] != '\0'))
            n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void set_dir(const char *label, char *dir, size_t n) {
    snprintf(dir, n, "%s/%s", g_root, label);
    setenv("ARTEMIS_SHM_DIR", dir, 1);
}

static void clear_env(void) {
    const char *vars[] = {"ARTEMIS_JOB", "ARTEMIS_SHM_DIR", "ARTEMIS_RING_SLOTS",
                          "ARTEMIS_DEVICE_TIMING", "ARTEMIS_DISABLE", "ARTEMIS_CLOCK",
                          "ARTEMIS_TICK_HZ", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID",
                          "ARTEMIS_RECLAIM_AGE_MS", "ARTEMIS_HOST_TSC"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* A one-comm fixture used by the single-threaded tests. */
static Comm *fixture(const char *label, int version, uint64_t hash) {
    char dir[300];
    set_dir(label, dir, sizeof dir);
    setenv("ARTEMIS_JOB", "fx", 1);
    Comm *cm = calloc(1, sizeof *cm);
    keep(cm);
    cm->version = version;
    cm->rank = 1;
    cm->nranks = 2;
    cm->hash = hash;
    int mask = 0;
    cm->ctx = init_comm(version, hash, NULL, 1, 2, 1, &mask);
    CHECK(cm->ctx, "%s: fixture init", label);
    ring_path(cm->path, sizeof cm->path, dir, "fx", hash, 1);
    CHECK(map_ring(cm->path, &cm->ring) == 0, "%s: map %s", label, cm->path);
    cm->ring.device = getenv("ARTEMIS_DEVICE_TIMING") == NULL;
    return cm;
}

/* Lifetime (artemis_ring.h): at finalize a ring no reader marked, in a folder no
 * agent serves, goes with its sidecars; a reader's mark or an agent's lock keeps it. */
static void test_retire(void) {
    unsetenv("ARTEMIS_KEEP_RINGS"); /* read at init */
    char side[600], lock[400];
    Comm *a = fixture("retire", 6, 0x31);
    CHECK(a->ring.hdr->life_flags & ARTEMIS_LIFE_FLOCK, "retire: lock flag");
    int probe = open(a->path, O_RDONLY);
    CHECK(probe >= 0 && flock(probe, LOCK_EX | LOCK_NB) != 0, "retire: writer's lock held");
    CHECK(finalize_ctx(6, a->ctx) == ncclSuccess, "retire: finalize");
    snprintf(side, sizeof side, "%s.env", a->path);
    CHECK(access(a->path, F_OK) != 0 && access(side, F_OK) != 0, "retire: unread ring removed");
    close(probe);
    Comm *b = fixture("retire", 6, 0x32);
    snprintf(side, sizeof side, "%s.reader", b->path);
    close(open(side, O_WRONLY | O_CREAT, 0644));
    CHECK(finalize_ctx(6, b->ctx) == ncclSuccess, "retire: finalize marked");
    CHECK(access(b->path, F_OK) == 0 && access(side, F_OK) == 0, "retire: marked ring kept");
    Comm *c = fixture("retire", 6, 0x33);
    snprintf(lock, sizeof lock, "%s/retire/agent.lock", g_root);
    int agent = open(lock, O_RDWR | O_CREAT, 0644);
    CHECK(agent >= 0 && flock(agent, LOCK_EX) == 0, "retire: agent lock");
    CHECK(finalize_ctx(6, c->ctx) == ncclSuccess, "retire: finalize served");
    CHECK(access(c->path, F_OK) == 0, "retire: ring kept while an agent serves");
    close(agent);
    setenv("ARTEMIS_KEEP_RINGS", "1", 1);
}

static Rec slot_rec(Comm *cm, uint64_t ticket) {
    Rec r;
    memset(&r, 0, sizeof r);
    CHECK(read_slot(&cm->ring.slots[ticket & (cm->ring.hdr->capacity - 1u)], &r), "slot busy");
    return r;
}

static void coll_expect(uint64_t c, Expect *e, uint8_t nch) {
    expect_coll(c, 1, e);
    e->nch = nch;
}

/* A done collective of rank 1 with nch timed channels (the single-threaded tests). */
static int check_done(const Rec *r, uint64_t c, unsigned nch, const char *where) {
    Expect e;
    expect_coll(c, 1, &e);
    int ok = r->state == ARTEMIS_STATE_DONE && r->clock == ARTEMIS_REC_DEVICE && r->coll_seq == c &&
             r->func == e.func && r->dtype == e.dtype && r->bytes == e.bytes && r->nchannels == nch &&
             r->start == tstart(ARTEMIS_KIND_COLL, c, 1, 0) &&
             r->end == tstop(ARTEMIS_KIND_COLL, c, 1, nch - 1u);
    CHECK(ok, "%s: state %u clock %u coll_seq %llu start %llu end %llu", where, r->state, r->clock,
          (unsigned long long)r->coll_seq, (unsigned long long)r->start, (unsigned long long)r->end);
    return ok;
}

static void test_failures(void) {
    char dir[300];
    int mask;
    void *ctx;

    /* unwritable ring folder: one WARN line, NULL context, success, normal mask */
    clear_env();
    setenv("ARTEMIS_SHM_DIR", "/dev/null/artemis", 1);
    atomic_store(&g_log_lines, 0);
    mask = -1;
    ctx = init_comm(6, 0x11, "x", 1, 1, 0, &mask);
    CHECK(ctx == NULL && atomic_load(&g_log_lines) == 1 && mask == 70,
          "unwritable dir: ctx %p lines %d mask %d", ctx, atomic_load(&g_log_lines), mask);
    /* the same with logfn NULL (stderr) must not crash */
    ctx = (void *)0x1;
    fprintf(stderr, "  (expected warning on stderr follows)\n");
    ncclProfiler_v6.init(&ctx, 0x12, &mask, NULL, 1, 1, 0, NULL);
    CHECK(ctx == NULL, "NULL logfn");

    /* ARTEMIS_DISABLE=1: no ring, mask 0, and one line saying so */
    clear_env();
    set_dir("disabled", dir, sizeof dir);
    setenv("ARTEMIS_DISABLE", "1", 1);
    atomic_store(&g_log_lines, 0);
    mask = -1;
    ctx = init_comm(7, 0x13, "x", 1, 1, 0, &mask);
    CHECK(ctx == NULL && mask == 0 && atomic_load(&g_log_lines) == 1 && count_files(dir) <= 0,
          "disable: ctx %p mask %d lines %d", ctx, mask, atomic_load(&g_log_lines));

    /* bad values: one WARN line each, plugin off */
    const char *bad[][2] = {{"ARTEMIS_RING_SLOTS", "abc"}, {"ARTEMIS_RING_SLOTS", "-4"},
                            {"ARTEMIS_DEVICE_TIMING", "maybe"}, {"ARTEMIS_CLOCK", "sundial"},
                            {"ARTEMIS_TICK_HZ", "0"}, {"ARTEMIS_DISABLE", "2"},
                            {"ARTEMIS_RECLAIM_AGE_MS", "3600001"}, {"ARTEMIS_RECLAIM_AGE_MS", "1s"},
                            {"ARTEMIS_HOST_TSC", "maybe"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        clear_env();
        set_dir("badenv", dir, sizeof dir);
        setenv(bad[i][0], bad[i][1], 1);
        atomic_store(&g_log_lines, 0);
        mask = -1;
        ctx = init_comm(6, 0x14, "x", 1, 1, 0, &mask);
        CHECK(ctx == NULL && atomic_load(&g_log_lines) == 1 && mask == 0, "bad %s=%s", bad[i][0],
              bad[i][1]);
    }
    CHECK(count_files(dir) <= 0, "bad env created files");

    /* NULL arguments everywhere */
    clear_env();
    set_dir("nulls", dir, sizeof dir);
    CHECK(ncclProfiler_v6.init(NULL, 1, &mask, "x", 1, 1, 0, test_logger) == ncclSuccess, "init NULL ctx");
    ctx = NULL;
    CHECK(ncclProfiler_v6.init(&ctx, 2, NULL, "x", 1, 1, 0, test_logger) == ncclSuccess, "init NULL mask");
    if (ctx) keep(ctx);
    CHECK(ctx != NULL, "init with NULL mask still profiles");
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileColl;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclFloat32";
    d.coll.count = 1;
    d.coll.nChannels = 1;
    void *h = (void *)0x1;
    CHECK(ncclProfiler_v6.startEvent(NULL, &h, &d) == ncclSuccess && h == NULL, "NULL context");
    h = (void *)0x1;
    CHECK(ncclProfiler_v6.startEvent(ctx, &h, NULL) == ncclSuccess && h == NULL, "NULL descr");
    CHECK(ncclProfiler_v6.startEvent(ctx, NULL, &d) == ncclSuccess, "NULL eHandle");
    CHECK(ncclProfiler_v6.stopEvent(NULL) == ncclSuccess, "stop NULL");
    ncclProfilerEventStateArgs_t a = {.kernelCh = {5}};
    CHECK(ncclProfiler_v6.recordEventState(NULL, ncclProfilerKernelChStop, &a) == ncclSuccess, "record NULL");
    CHECK(ncclProfiler_v6.finalize(NULL) == ncclSuccess, "finalize NULL");
    /* KernelCh with NULL or foreign parents is ignored */
    memset(&d, 0, sizeof d);
    d.type = ncclProfileKernelCh;
    d.kernelCh.pTimer = 9;
    h = (void *)0x1;
    ncclProfiler_v6.startEvent(ctx, &h, &d);
    CHECK(h == NULL, "KernelCh without parent");
    /* API-level events get NULL (NCCL then makes no stop or state call on
     * them); so does Group from v5 on (on NCCL), a static dummy under v4 */
    static const int api_types[] = {ncclProfileGroupApi, ncclProfileCollApi, ncclProfileP2pApi,
                                    ncclProfileKernelLaunch};
    for (int i = 0; i < 4; i++) {
        d.type = (uint64_t)api_types[i];
        h = (void *)0x1;
        ncclProfiler_v6.startEvent(ctx, &h, &d);
        CHECK(h == NULL, "API event type %d gets NULL", api_types[i]);
    }
    d.type = ncclProfileGroup;
    void *grp = NULL;
    ncclProfiler_v6.startEvent(ctx, &grp, &d);
    /* v5+ on NCCL: NULL (NCCL 2.28+ gates no task on it; core.c dummy_group) */
    CHECK(grp == NULL, "Group under v6 on NCCL gets NULL");
    /* v4: the static dummy (NCCL 2.27 starts Coll/P2p only under a Group
     * handle that is not NULL); the descriptor's type is at offset 0 in both */
    ncclProfiler_v4.startEvent(ctx, &grp, (ncclProfilerEventDescr_v4_t *)(void *)&d);
    CHECK(grp != NULL, "Group dummy under v4");
    d.type = ncclProfileKernelCh;
    d.parentObj = grp;
    h = (void *)0x1;
    ncclProfiler_v6.startEvent(ctx, &h, &d);
    CHECK(h == NULL, "KernelCh with Group parent");
    /* stale Group handles: stop and record any number of times */
    for (int i = 0; i < 3; i++) {
        ncclProfiler_v6.stopEvent(grp);
        ncclProfiler_v6.recordEventState(grp, ncclProfilerKernelChStop, &a);
        ncclProfiler_v6.recordEventState(grp, ncclProfilerGroupEndApiStart, NULL);
    }
    /* unknown event types get NULL */
    d.type = ncclProfileProxyOp;
    h = (void *)0x1;
    ncclProfiler_v6.startEvent(ctx, &h, &d);
    CHECK(h == NULL, "ProxyOp not tracked");
    d.type = ncclProfileCeColl;
    h = (void *)0x1;
    ncclProfiler_v6.startEvent(ctx, &h, &d);
    CHECK(h == NULL, "CeColl not tracked");

    /* double stop, KernelCh record with NULL args, stop order variations */
    clear_env();
    Comm *cm = fixture("doublestop", 6, 0x21);
    Expect e;
    coll_expect(0, &e, 2);
    void *op = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    void *k0 = start_ev(cm, ncclProfileKernelCh, op, NULL, tstart(1, 0, 1, 0), 0);
    void *k1 = start_ev(cm, ncclProfileKernelCh, op, NULL, tstart(1, 0, 1, 1), 1);
    void *k2 = start_ev(cm, ncclProfileKernelCh, op, NULL, 1, 2);
    CHECK(op && k0 && k1 && !k2, "extra KernelCh beyond nChannels gets NULL");
    stop_ev(op);
    stop_ev(op); /* duplicate */
    ncclProfiler_v6.recordEventState(k0, ncclProfilerKernelChStop, NULL); /* NULL args */
    a.kernelCh.pTimer = tstop(1, 0, 1, 0);
    record_ev(k0, ncclProfilerKernelChStop, &a);
    stop_ev(k0);
    stop_ev(k0); /* duplicate: must not complete the op early */
    Rec r = slot_rec(cm, 0);
    CHECK(r.state == ARTEMIS_STATE_IN_FLIGHT, "double stop completed early");
    a.kernelCh.pTimer = tstop(1, 0, 1, 1);
    record_ev(k1, ncclProfilerKernelChStop, &a);
    stop_ev(k1);
    r = slot_rec(cm, 0);
    check_done(&r, 0, 2, "double stop record");
    stop_ev(k1);
    stop_ev(op);
    CHECK(cm->ring.hdr->dropped == 0, "double stop dropped");

    /* KernelCh stops before the Coll stop: the channels complete the record
     * with its device times (the stop of an op claimed in single mode takes
     * no part in a device-timed completion), but the handle stays taken
     * until the Coll stop: a start in between gets another one, and the late
     * Coll stop changes nothing in the record */
    coll_expect(1, &e, 1);
    op = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    k0 = start_ev(cm, ncclProfileKernelCh, op, NULL, tstart(1, 1, 1, 0), 0);
    a.kernelCh.pTimer = tstop(1, 1, 1, 0);
    record_ev(k0, ncclProfilerKernelChStop, &a);
    stop_ev(k0);
    r = slot_rec(cm, 1);
    check_done(&r, 1, 1, "channel-first record, before the Coll stop");

    /* unknown strings: codes 0, bytes = count (started before op's Coll stop) */
    memset(&d, 0, sizeof d);
    d.type = ncclProfileColl;
    d.coll.func = "PutSignal";
    d.coll.datatype = "Unknown";
    d.coll.algo = "Unknown";
    d.coll.proto = NULL;
    d.coll.count = 12345;
    ncclProfiler_v6.startEvent(cm->ctx, &h, &d);
    CHECK(h && h != op, "a handle reused before its Coll stop (%p, %p)", h, op);
    ncclProfiler_v6.stopEvent(h);
    stop_ev(op);
    r = slot_rec(cm, 1);
    check_done(&r, 1, 1, "channel-first record, after the Coll stop");
    stop_ev(op); /* duplicate */
    r = slot_rec(cm, 2);
    CHECK(r.func == 0 && r.dtype == 0 && r.algo == 0 && r.proto == 0 && r.bytes == 12345 &&
              r.state == ARTEMIS_STATE_DONE && r.clock == ARTEMIS_REC_HOST && r.coll_seq == 2,
          "unknown strings");
    /* every NCCL string maps to its code */
    const char *fn[] = {"AllGather", "AllReduce", "AlltoAll", "Broadcast", "Gather", "Recv",
                        "Reduce", "ReduceScatter", "Scatter", "SendRecv", "Send"};
    const uint8_t fc[] = {2, 1, 6, 4, 7, 10, 5, 3, 8, 11, 9};
    const char *dn[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64",
                        "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64",
                        "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
    const uint64_t dsz[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    const char *an[] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
    const char *pn[] = {"LL", "LL128", "SIMPLE"};
    uint64_t t = 3;
    /* pass 0 fills the plugin's pointer cache, pass 1 reads codes from it */
    for (unsigned i = 0; i < 24; i++, t++) {
        memset(&d, 0, sizeof d);
        d.type = ncclProfileColl;
        d.coll.func = fn[i % 11];
        d.coll.datatype = dn[i % 12];
        d.coll.algo = an[i % 7];
        d.coll.proto = pn[i % 3];
        d.coll.count = 10;
        ncclProfiler_v6.startEvent(cm->ctx, &h, &d);
        ncclProfiler_v6.stopEvent(h);
        r = slot_rec(cm, t);
        CHECK(r.func == fc[i % 11] && r.dtype == i % 12 + 1 && r.bytes == 10 * dsz[i % 12] &&
                  r.algo == i % 7 + 1 && r.proto == i % 3 + 1,
              "string codes %u: func %u dtype %u algo %u proto %u bytes %llu", i, r.func, r.dtype,
              r.algo, r.proto, (unsigned long long)r.bytes);
    }
    /* The cache is keyed by pointer and table: one pointer in two tables,
     * and the same text at other addresses, still map by their own table.
     * (NCCL's strings are literals: the plugin may assume the text at a
     * pointer never changes, so each case below uses its own buffers.) */
    {
        char fbufs[3][16], dbufs[3][16], abufs[3][16], pbufs[3][16];
        for (unsigned i = 0; i < 3; i++, t++) {
            memset(&d, 0, sizeof d);
            d.type = ncclProfileColl;
            if (i == 0) {
                d.coll.func = dn[7]; /* "ncclFloat32" is no func: 0 */
                d.coll.datatype = dn[7];
                d.coll.algo = pn[2]; /* "SIMPLE" is no algo: 0 */
                d.coll.proto = pn[2];
            } else {
                char *fbuf = fbufs[i], *dbuf = dbufs[i], *abuf = abufs[i], *pbuf = pbufs[i];
                snprintf(fbuf, 16, "%s", i == 1 ? "Broadcast" : "Bogus");
                snprintf(dbuf, 16, "%s", "ncclFloat32");
                snprintf(abuf, 16, "%s", "RING");
                snprintf(pbuf, 16, "%s", "LL128");
                d.coll.func = fbuf;
                d.coll.datatype = dbuf;
                d.coll.algo = abuf;
                d.coll.proto = pbuf;
            }
            d.coll.count = 3;
            ncclProfiler_v6.startEvent(cm->ctx, &h, &d);
            ncclProfiler_v6.stopEvent(h);
            r = slot_rec(cm, t);
            CHECK(i == 0 ? (r.func == 0 && r.dtype == ARTEMIS_DT_FLOAT32 && r.algo == 0 &&
                            r.proto == ARTEMIS_PROTO_SIMPLE)
                         : (r.func == (i == 1 ? ARTEMIS_FUNC_BROADCAST : 0) &&
                            r.dtype == ARTEMIS_DT_FLOAT32 && r.algo == ARTEMIS_ALGO_RING &&
                            r.proto == ARTEMIS_PROTO_LL128 && r.bytes == 12),
                  "string cache %u: func %u dtype %u algo %u proto %u", i, r.func, r.dtype, r.algo,
                  r.proto);
        }
    }

    /* more than ART_MAX_CH channels: the first 62 time the op */
    memset(&d, 0, sizeof d);
    d.type = ncclProfileColl;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclInt8";
    d.coll.count = 1;
    d.coll.nChannels = 64;
    ncclProfiler_v6.startEvent(cm->ctx, &op, &d);
    int got = 0;
    for (int k = 0; k < 64; k++) {
        void *kh = start_ev(cm, ncclProfileKernelCh, op, NULL, 1000 + (uint64_t)k, k);
        if (kh) got++;
        a.kernelCh.pTimer = 2000 + (uint64_t)k;
        record_ev(kh, ncclProfilerKernelChStop, &a);
        stop_ev(kh);
    }
    stop_ev(op);
    r = slot_rec(cm, t);
    CHECK(got == 62 && r.state == ARTEMIS_STATE_DONE && r.clock == ARTEMIS_REC_DEVICE &&
              r.start == 1000 && r.end == 2061 && r.nchannels == 64,
          "64 channels: got %d start %llu end %llu", got, (unsigned long long)r.start,
          (unsigned long long)r.end);
    t++;

    /* pool exhaustion: NULL handles, counted */
    uint64_t before = cm->ring.hdr->dropped;
    static void *held[600];
    int nulls = 0;
    coll_expect(100, &e, 1);
    for (int i = 0; i < 600; i++) {
        held[i] = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
        nulls += held[i] == NULL;
    }
    CHECK(nulls == 600 - 512 && cm->ring.hdr->dropped - before == (uint64_t)nulls,
          "pool exhaustion: %d NULL, dropped %llu", nulls,
          (unsigned long long)(cm->ring.hdr->dropped - before));
    for (int i = 0; i < 600; i++) stop_ev(held[i]); /* host-complete with no timer later */
    for (int i = 0; i < 600; i++) {
        void *kh = start_ev(cm, ncclProfileKernelCh, held[i], NULL, 0, 0); /* no timer */
        record_ev(kh, ncclProfilerKernelChStop, NULL);
        stop_ev(kh);
    }
    h = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    CHECK(h != NULL, "pool usable again after completions");
    stop_ev(h);

    /* KernelCh never carries a timer: host timing, then host mode for the context */
    Comm *nt = fixture("notimer", 7, 0x22);
    coll_expect(0, &e, 2);
    op = start_ev(nt, ncclProfileColl, NULL, &e, 0, 0);
    stop_ev(op);
    for (int k = 0; k < 2; k++) {
        void *kh = start_ev(nt, ncclProfileKernelCh, op, NULL, 0, k);
        a.kernelCh.pTimer = 0;
        record_ev(kh, ncclProfilerKernelChStop, &a);
        stop_ev(kh);
    }
    r = slot_rec(nt, 0);
    CHECK(r.state == ARTEMIS_STATE_DONE && r.clock == ARTEMIS_REC_HOST && r.start == r.enqueue_ns &&
              r.end >= r.start,
          "no-timer record");
    coll_expect(1, &e, 2);
    op = start_ev(nt, ncclProfileColl, NULL, &e, 0, 0);
    void *kh = start_ev(nt, ncclProfileKernelCh, op, NULL, 0, 0);
    CHECK(kh == NULL, "no-timer context ignores KernelCh");
    stop_ev(op);
    r = slot_rec(nt, 1);
    CHECK(r.state == ARTEMIS_STATE_DONE && r.clock == ARTEMIS_REC_HOST, "no-timer host mode");

    /* events after finalize */
    Comm *fin = fixture("finalize", 6, 0x23);
    coll_expect(0, &e, 2);
    op = start_ev(fin, ncclProfileColl, NULL, &e, 0, 0);
    k0 = start_ev(fin, ncclProfileKernelCh, op, NULL, tstart(1, 0, 1, 0), 0);
    CHECK(ncclProfiler_v6.finalize(fin->ctx) == ncclSuccess, "finalize");
    CHECK(ncclProfiler_v6.finalize(fin->ctx) == ncclSuccess, "finalize twice");
    CHECK((fin->ring.hdr->flags & ARTEMIS_RING_FINISHED) && fin->ring.hdr->finished_ns > 0,
          "finished flag");
    uint64_t fns = fin->ring.hdr->finished_ns;
    stop_ev(op);
    k1 = start_ev(fin, ncclProfileKernelCh, op, NULL, tstart(1, 0, 1, 1), 1);
    a.kernelCh.pTimer = tstop(1, 0, 1, 0);
    record_ev(k0, ncclProfilerKernelChStop, &a);
    stop_ev(k0);
    a.kernelCh.pTimer = tstop(1, 0, 1, 1);
    record_ev(k1, ncclProfilerKernelChStop, &a);
    stop_ev(k1);
    h = start_ev(fin, ncclProfileColl, NULL, &e, 0, 0);
    CHECK(h == NULL, "start after finalize");
    stop_ev(h);
    CHECK(fin->ring.hdr->finished_ns == fns && fin->ring.hdr->write_index == 1, "finalize state");
    CHECK(access(fin->path, F_OK) == 0, "ring kept after finalize");
    r = slot_rec(fin, 0);
    check_done(&r, 0, 2, "late completion");

    /* v4 and v5 tables */
    Comm *v4 = fixture("v4", 4, 0x24);
    Comm *v5 = fixture("v5", 5, 0x25);
    Comm *vs[2] = {v4, v5};
    for (int v = 0; v < 2; v++) {
        Comm *x = vs[v];
        for (uint64_t c = 0; c < 3; c++) {
            expect_coll(c, 1, &e);
            void *g = start_ev(x, ncclProfileGroup, NULL, NULL, 0, 0);
            op = start_ev(x, ncclProfileColl, g, &e, 0, 0);
            stop_ev(op);
            for (unsigned k = 0; k < e.nch; k++) {
                kh = start_ev(x, ncclProfileKernelCh, op, NULL, tstart(1, c, 1, k), (int)k);
                a.kernelCh.pTimer = tstop(1, c, 1, k);
                record_ev(kh, ncclProfilerKernelChStop, &a);
                stop_ev(kh);
            }
            stop_ev(g);
            r = slot_rec(x, c);
            CHECK(check_rec(&x->ring, &r, c, v ? "v5" : "v4") == 1, "v%d record %llu", 4 + v,
                  (unsigned long long)c);
        }
        expect_p2p(3, 1, 2, &e);
        op = start_ev(x, ncclProfileP2p, NULL, &e, 0, 0);
        stop_ev(op);
        for (unsigned k = 0; k < e.nch; k++) {
            kh = start_ev(x, ncclProfileKernelCh, op, NULL, tstart(2, 3, 1, k), (int)k);
            a.kernelCh.pTimer = tstop(2, 3, 1, k);
            record_ev(kh, ncclProfilerKernelChStop, &a);
            stop_ev(kh);
        }
        r = slot_rec(x, 3);
        CHECK(check_rec(&x->ring, &r, 3, "p2p") == 1 && r.coll_seq == 3 && r.peer == 0,
              "v%d p2p record", 4 + v);
        CHECK(x->ring.hdr->plugin_version == (uint32_t)x->version, "plugin_version");
    }

    /* naming, clock kinds, slots rounding, stale ring replaced */
    clear_env();
    set_dir("naming", dir, sizeof dir);
    setenv("ARTEMIS_JOB", "my job/1", 1);
    setenv("ARTEMIS_RING_SLOTS", "1000", 1);
    setenv("ARTEMIS_CLOCK", "ticks", 1);
    setenv("ARTEMIS_TICK_HZ", "25000000", 1);
    mask = 0;
    ctx = init_comm(6, 0xfeedULL, "a-very-long-communicator-name-that-does-not-fit-in-sixty-four-bytes-at-all", 1, 8, 3, &mask);
    char p[512];
    ring_path(p, sizeof p, dir, "my_job_1", 0xfeedULL, 3);
    Ring rg;
    CHECK(ctx && map_ring(p, &rg) == 0, "sanitised job name %s", p);
    if (ctx && rg.hdr) {
        CHECK(rg.hdr->capacity == 1024 && rg.hdr->clock_kind == ARTEMIS_CLOCK_DEVICE_TICKS &&
                  rg.hdr->tick_hz == 25000000 && strlen(rg.hdr->comm_name) == 63 &&
                  !strcmp(rg.hdr->job, "my_job_1") && rg.hdr->host[0] && mask == 70,
              "naming header");
        /* stale ring from an earlier process is replaced atomically */
        void *ctx2 = init_comm(6, 0xfeedULL, "b", 1, 8, 3, &mask);
        Ring rg2;
        CHECK(ctx2 && map_ring(p, &rg2) == 0 && !strcmp(rg2.hdr->comm_name, "b"), "stale replaced");
        CHECK(!strcmp(rg.hdr->comm_name, rg.hdr->comm_name), "old mapping still valid");
    }
    unsetenv("ARTEMIS_JOB");
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("TORCHELASTIC_RUN_ID", "te", 1);
    setenv("ARTEMIS_RING_SLOTS", "1", 1);
    setenv("ARTEMIS_CLOCK", "host", 1);
    ctx = init_comm(6, 0xbeefULL, NULL, 1, 8, 0, &mask);
    ring_path(p, sizeof p, dir, "4242", 0xbeefULL, 0);
    CHECK(ctx && map_ring(p, &rg) == 0 && rg.hdr->capacity == ARTEMIS_RING_MIN_SLOTS &&
              rg.hdr->clock_kind == ARTEMIS_CLOCK_HOST && rg.hdr->tick_hz == 0 && mask == 6,
          "slurm job, host clock");
    unsetenv("SLURM_JOB_ID");
    setenv("ARTEMIS_RING_SLOTS", "99999999", 1);
    unsetenv("ARTEMIS_CLOCK");
    ctx = init_comm(5, 0xcafeULL, NULL, 1, 8, 0, &mask);
    ring_path(p, sizeof p, dir, "te", 0xcafeULL, 0);
    CHECK(ctx && map_ring(p, &rg) == 0 && rg.hdr->capacity == ARTEMIS_RING_MAX_SLOTS &&
              rg.hdr->clock_kind == ARTEMIS_CLOCK_DEVICE_NS && mask == 70,
          "torchelastic job, max slots");
    unsetenv("TORCHELASTIC_RUN_ID");
    unsetenv("ARTEMIS_RING_SLOTS");
    ctx = init_comm(5, 0xd00dULL, NULL, 1, 8, 0, &mask);
    ring_path(p, sizeof p, dir, "000000000000d00d", 0xd00dULL, 0);
    CHECK(ctx && access(p, F_OK) == 0, "hash job name");
    clear_env();
}

/* Runs one collective of rank 1 (coll c, nch channels) to completion: starts
 * of all channels, then their stops, as NCCL's proxy loop does. */
static void run_coll(Comm *cm, uint64_t c, unsigned nch) {
    Expect e;
    coll_expect(c, &e, (uint8_t)nch);
    void *op = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    stop_ev(op);
    void *kh[64];
    for (unsigned k = 0; k < nch; k++)
        kh[k] = start_ev(cm, ncclProfileKernelCh, op, NULL, tstart(1, c, 1, k), (int)k);
    for (unsigned k = 0; k < nch; k++) {
        ncclProfilerEventStateArgs_t a;
        a.kernelCh.pTimer = tstop(1, c, 1, k);
        record_ev(kh[k], ncclProfilerKernelChStop, &a);
        stop_ev(kh[k]);
    }
}

/* Ops that never get device events (README "Ops that never get device
 * events"), under the sanitizers: self Send/Recv, reclaim by lag, reclaim by
 * age when the pool is exhausted. */
static void test_no_device_events(void) {
    clear_env();
    setenv("ARTEMIS_RECLAIM_AGE_MS", "0", 1);
    Comm *cm = fixture("nodev", 6, 0x31);
    const ArtemisRingHeader *h = cm->ring.hdr;
    /* self Send (peer == rank 1) with channels: host-timed at its stop, counted */
    Expect e;
    expect_p2p(0, 1, 2, &e);
    e.peer = 1;
    void *op = start_ev(cm, ncclProfileP2p, NULL, &e, 0, 0);
    CHECK(start_ev(cm, ncclProfileKernelCh, op, NULL, 5, 0) == NULL, "self p2p takes no KernelCh");
    stop_ev(op);
    Rec r = slot_rec(cm, 0);
    CHECK(r.state == ARTEMIS_STATE_DONE && r.clock == ARTEMIS_REC_HOST && r.peer == 1 &&
              r.nchannels == e.nch && r.start == r.enqueue_ns && r.end >= r.start &&
              h->host_fallback == 1,
          "self p2p: state %u clock %u host_fallback %llu", r.state, r.clock,
          (unsigned long long)h->host_fallback);
    /* a collective whose KernelCh never come, then 80 device-timed ones */
    Expect lost;
    coll_expect(0, &lost, 2);
    op = start_ev(cm, ncclProfileColl, NULL, &lost, 0, 0);
    stop_ev(op);
    for (uint64_t c = 1; c <= 80; c++) run_coll(cm, c, 2);
    r = slot_rec(cm, 1);
    CHECK(r.state == ARTEMIS_STATE_DONE && r.clock == ARTEMIS_REC_HOST && r.start == r.enqueue_ns &&
              r.end == r.start && h->host_fallback == 2,
          "reclaimed: state %u clock %u host_fallback %llu", r.state, r.clock,
          (unsigned long long)h->host_fallback);
    for (uint64_t c = 1; c <= 80; c++) {
        r = slot_rec(cm, c + 1);
        CHECK(check_done(&r, c, 2, "after reclaim"), "device record %llu", (unsigned long long)c);
    }
    /* events after the reclaim change nothing */
    void *late = start_ev(cm, ncclProfileKernelCh, op, NULL, 7, 0);
    stop_ev(late);
    r = slot_rec(cm, 1);
    CHECK(r.end == r.start && h->dropped == 0, "late KernelCh after reclaim");
    /* 700 ops whose KernelCh never come and no device-timed op after them: the
     * pool (512) runs out and the age reclaim frees it (age 0 here) */
    for (unsigned i = 0; i < 700; i++) {
        coll_expect(81 + i, &lost, 2);
        op = start_ev(cm, ncclProfileColl, NULL, &lost, 0, 0);
        CHECK(op != NULL, "start %u after pool exhaustion", i);
        stop_ev(op);
    }
    CHECK(h->dropped == 0 && h->host_fallback >= 2 + 512,
          "age reclaim: dropped %llu host_fallback %llu", (unsigned long long)h->dropped,
          (unsigned long long)h->host_fallback);
    clear_env();
}

/* A start never overwrites an in-flight record (README "Slot writers"), on a
 * 4-slot ring that laps op 0 while it is in flight:
 * (a) op 0's Coll stop has not come: the lapping start is dropped and counted,
 *     and op 0's completion lands whole, with its device times;
 * (b) op 0 only waits for its KernelCh and is older than the reclaim age (0
 *     here): it is reclaimed at the lap (a host record, counted in
 *     host_fallback), the lapping start takes the slot, and op 0's late
 *     KernelCh stops change nothing.
 * (Before, the lapping start overwrote op 0's record in both cases and op 0's
 * completion was the one dropped.) */
static void test_lap_in_flight(void) {
    clear_env();
    setenv("ARTEMIS_RING_SLOTS", "4", 1);
    setenv("ARTEMIS_RECLAIM_AGE_MS", "0", 1); /* (a) is not reclaimable: no Coll stop yet */
    Comm *cm = fixture("lap", 7, 0x41);
    const ArtemisRingHeader *h = cm->ring.hdr;
    ncclProfilerEventStateArgs_t a;
    /* (a) */
    Expect e;
    coll_expect(0, &e, 2);
    void *op0 = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    void *k0 = start_ev(cm, ncclProfileKernelCh, op0, NULL, tstart(1, 0, 1, 0), 0);
    void *k1 = start_ev(cm, ncclProfileKernelCh, op0, NULL, tstart(1, 0, 1, 1), 1);
    for (uint64_t c = 1; c <= 3; c++) run_coll(cm, c, 2);
    coll_expect(4, &e, 2); /* ticket 4 maps to op 0's slot */
    void *op4 = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    CHECK(op4 == NULL && h->dropped == 1, "lap (a): start over an in-flight record: handle %p dropped %llu",
          op4, (unsigned long long)h->dropped);
    Rec r = slot_rec(cm, 0);
    CHECK(r.seq == 0 && r.state == ARTEMIS_STATE_IN_FLIGHT, "lap (a): op 0 still there (seq %llu state %u)",
          (unsigned long long)r.seq, r.state);
    a.kernelCh.pTimer = tstop(1, 0, 1, 0);
    record_ev(k0, ncclProfilerKernelChStop, &a);
    stop_ev(k0);
    a.kernelCh.pTimer = tstop(1, 0, 1, 1);
    record_ev(k1, ncclProfilerKernelChStop, &a);
    stop_ev(k1);
    stop_ev(op0);
    r = slot_rec(cm, 0);
    CHECK(r.seq == 0 && check_done(&r, 0, 2, "lap (a): op 0 completed"), "lap (a): op 0 record");
    /* the next ops (coll_seq 5..: the dropped one counted as issued), a later
     * lap finds op 0's slot free again */
    for (uint64_t c = 5; c <= 8; c++) run_coll(cm, c, 2);
    r = slot_rec(cm, 8);
    CHECK(r.seq == 8 && check_done(&r, 8, 2, "lap (a): next lap") && h->dropped == 1,
          "lap (a): ticket 8 in op 0's slot, dropped %llu", (unsigned long long)h->dropped);
    /* (b): ticket 9 (coll 9) waits for its KernelCh; tickets 10..12 run; 13 laps it */
    uint64_t fb = h->host_fallback;
    coll_expect(9, &e, 2);
    void *op9 = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    stop_ev(op9);
    k0 = start_ev(cm, ncclProfileKernelCh, op9, NULL, tstart(1, 9, 1, 0), 0);
    for (uint64_t c = 10; c <= 12; c++) run_coll(cm, c, 2);
    run_coll(cm, 13, 2);
    r = slot_rec(cm, 13);
    CHECK(r.seq == 13 && check_done(&r, 13, 2, "lap (b): the lapping op") && h->dropped == 1 &&
              h->host_fallback == fb + 1,
          "lap (b): seq %llu dropped %llu host_fallback %llu", (unsigned long long)r.seq,
          (unsigned long long)h->dropped, (unsigned long long)(h->host_fallback - fb));
    a.kernelCh.pTimer = tstop(1, 9, 1, 0);
    record_ev(k0, ncclProfilerKernelChStop, &a);
    stop_ev(k0);
    r = slot_rec(cm, 13);
    CHECK(r.seq == 13 && check_done(&r, 13, 2, "lap (b): after late KernelCh") && h->dropped == 1,
          "lap (b): late KernelCh of the reclaimed op");
    clear_env();
}

/* The channel owner's last clear without a locked RMW against the reclaim
 * (README "Single writer"): an asymmetric Dekker, the owner's kfin then rclm
 * against the reclaimer's rclm, membarrier, kfin. Forced with a test hook in
 * the owner's last KernelCh stop of op 0 (its Coll stop came, both channels
 * claimed by this thread, the first stopped), which makes the start of
 * ticket 96 whose reclaim scan takes op 0 (older than the reclaim age, 64
 * device-timed ops after it) at one of three places:
 *   0 before kfin: the reclaim wins (a host record, counted in host_fallback)
 *     and the owner, reading CLAIM, falls back to the RMW, which finds its
 *     bits clear: nothing more;
 *   1 between kfin and rclm: the reclaim sees kfin and leaves the op; the
 *     owner reads CLAIM and completes it with the RMW (device times);
 *   2 after rclm (the owner's plain path): the reclaim sees kfin and leaves
 *     the op; the owner completes it (device times).
 * In every case op 0 is completed exactly once. Fails with the reclaim's kfin
 * check left out (cases 1, 2: a host record, or two completions) or with the
 * owner's rclm check left out (case 0: two completions). */
extern void (*_Atomic art_test_kfin_hook)(int where);
int art_test_plain_start(void *context);
static Comm *g_kfin_cm;
static int g_kfin_where, g_kfin_fired;
static void kfin_hook(int where) {
    if (where != g_kfin_where) return;
    atomic_store(&art_test_kfin_hook, NULL); /* once */
    g_kfin_fired = 1;
    Expect e;
    coll_expect(96, &e, 2);
    void *op = start_ev(g_kfin_cm, ncclProfileColl, NULL, &e, 0, 0); /* scans: reclaims op 0? */
    CHECK(op != NULL, "kfin %d: ticket 96 not started", where);
    stop_ev(op);
    void *k0 = start_ev(g_kfin_cm, ncclProfileKernelCh, op, NULL, tstart(1, 96, 1, 0), 0);
    void *k1 = start_ev(g_kfin_cm, ncclProfileKernelCh, op, NULL, tstart(1, 96, 1, 1), 1);
    ncclProfilerEventStateArgs_t a;
    a.kernelCh.pTimer = tstop(1, 96, 1, 0);
    record_ev(k0, ncclProfilerKernelChStop, &a);
    stop_ev(k0);
    a.kernelCh.pTimer = tstop(1, 96, 1, 1);
    record_ev(k1, ncclProfilerKernelChStop, &a); /* its last stop comes after the hook */
    stop_ev(k1);
}
static void test_kfin_race(void) {
    for (int where = 0; where < 3; where++) {
        clear_env();
        setenv("ARTEMIS_RING_SLOTS", "256", 1);
        setenv("ARTEMIS_RECLAIM_AGE_MS", "20", 1);
        char label[32];
        snprintf(label, sizeof label, "kfin%d", where);
        Comm *cm = fixture(label, 6, 0x51u + (uint64_t)where);
        if (!art_test_plain_start(cm->ctx)) {
            printf("  owner's plain last clear: no membarrier here, not tested\n");
            clear_env();
            return;
        }
        const ArtemisRingHeader *h = cm->ring.hdr;
        Expect e;
        coll_expect(0, &e, 2);
        void *op0 = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
        stop_ev(op0);
        void *k0 = start_ev(cm, ncclProfileKernelCh, op0, NULL, tstart(1, 0, 1, 0), 0);
        void *k1 = start_ev(cm, ncclProfileKernelCh, op0, NULL, tstart(1, 0, 1, 1), 1);
        ncclProfilerEventStateArgs_t a;
        a.kernelCh.pTimer = tstop(1, 0, 1, 0);
        record_ev(k0, ncclProfilerKernelChStop, &a);
        stop_ev(k0); /* deferred to the last stop */
        for (uint64_t c = 1; c <= 95; c++) run_coll(cm, c, 2); /* op 0 too young: kept */
        struct timespec ts = {0, 30 * 1000 * 1000};
        nanosleep(&ts, NULL); /* now older than the reclaim age */
        uint64_t fb = h->host_fallback;
        g_kfin_cm = cm;
        g_kfin_where = where;
        g_kfin_fired = 0;
        a.kernelCh.pTimer = tstop(1, 0, 1, 1);
        record_ev(k1, ncclProfilerKernelChStop, &a);
        atomic_store(&art_test_kfin_hook, kfin_hook);
        stop_ev(k1); /* the last stop: the hook runs ticket 96 inside it */
        atomic_store(&art_test_kfin_hook, NULL);
        CHECK(g_kfin_fired, "kfin %d: the hook did not run", where);
        Rec r = slot_rec(cm, 0);
        if (where == 0) {
            CHECK(r.seq == 0 && r.state == ARTEMIS_STATE_DONE && r.clock == ARTEMIS_REC_HOST &&
                      r.start == r.enqueue_ns && r.end == r.start && h->host_fallback == fb + 1,
                  "kfin 0: op 0 reclaimed once: seq %llu state %u clock %u host_fallback +%llu",
                  (unsigned long long)r.seq, r.state, r.clock,
                  (unsigned long long)(h->host_fallback - fb));
        } else {
            CHECK(r.seq == 0 && check_done(&r, 0, 2, "kfin: op 0 by its owner") &&
                      h->host_fallback == fb,
                  "kfin %d: op 0 completed by its owner, not reclaimed (host_fallback +%llu)",
                  where, (unsigned long long)(h->host_fallback - fb));
        }
        r = slot_rec(cm, 96);
        CHECK(r.seq == 96 && check_done(&r, 96, 2, "kfin: ticket 96") && h->dropped == 0,
              "kfin %d: ticket 96, dropped %llu", where, (unsigned long long)h->dropped);
        /* the pool is whole: a full ring of ops later, nothing is left in flight */
        for (uint64_t c = 97; c < 97 + 256; c++) run_coll(cm, c, 2);
        for (uint64_t t = 97; t < 97 + 256; t++) {
            r = slot_rec(cm, t);
            CHECK(r.seq == t && r.state == ARTEMIS_STATE_DONE, "kfin %d: ticket %llu", where,
                  (unsigned long long)t);
        }
        CHECK(h->dropped == 0, "kfin %d: dropped %llu", where, (unsigned long long)h->dropped);
    }
    printf("  owner's plain last clear against the reclaim: 3 interleavings, each op completed once\n");
    clear_env();
}

/* Two threads starting ops on one communicator at the same time (a CUDA
 * host-callback thread beside the launching thread; shared mode): the starts'
 * CAS and the completions' plain stores (README "Slot writers") on a 64-slot
 * ring that laps all the time, read by a third thread. Every accepted record
 * must be one op's, whole: its times and bytes are derived from its count. */
#define TS_OPS 20000u
typedef struct {
    Comm *cm;
    unsigned t;
    unsigned ops;
} TsArg;
static _Atomic int g_ts_stop;
static _Atomic long g_ts_accepted, g_ts_done;

static uint64_t ts_t0(size_t count) { return 1000000ull + (uint64_t)count * 1000ull; }

static void *ts_user(void *arg) {
    TsArg *a = arg;
    Comm *cm = a->cm;
    for (unsigned i = 0; i < a->ops; i++) {
        Expect e;
        memset(&e, 0, sizeof e);
        e.func_s = "AllReduce";
        e.dtype_s = "ncclInt8";
        e.algo_s = "RING";
        e.proto_s = "SIMPLE";
        e.count = ((size_t)a->t << 20) + i + 1u;
        e.nch = 2;
        void *op = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
        int early = (i % 3) == 0; /* channels before the Coll stop */
        if (!early) stop_ev(op);
        void *kh[2];
        for (unsigned k = 0; k < 2; k++)
            kh[k] = start_ev(cm, ncclProfileKernelCh, op, NULL, ts_t0(e.count) + k, (int)k);
        for (unsigned k = 0; k < 2; k++) {
            ncclProfilerEventStateArgs_t sa;
            sa.kernelCh.pTimer = ts_t0(e.count) + 500u + k;
            record_ev(kh[k], ncclProfilerKernelChStop, &sa);
            stop_ev(kh[k]);
        }
        if (early) stop_ev(op);
    }
    return NULL;
}

static int ts_check(const Rec *r) {
    if (r->lock == 0 && r->seq == 0 && r->state == 0) return 0;
    int ok = r->kind == ARTEMIS_KIND_COLL && r->func == ARTEMIS_FUNC_ALLREDUCE &&
             r->dtype == ARTEMIS_DT_INT8 && r->nchannels == 2 && r->enqueue_ns != 0;
    if (r->state == ARTEMIS_STATE_IN_FLIGHT) ok = ok && r->start == 0 && r->end == 0;
    else
        ok = ok && r->state == ARTEMIS_STATE_DONE && r->clock == ARTEMIS_REC_DEVICE &&
             r->start == ts_t0(r->bytes) && r->end == ts_t0(r->bytes) + 501u;
    CHECK(ok, "two starters: torn record seq %llu state %u bytes %llu start %llu end %llu",
          (unsigned long long)r->seq, r->state, (unsigned long long)r->bytes,
          (unsigned long long)r->start, (unsigned long long)r->end);
    return r->state == ARTEMIS_STATE_DONE;
}

static void *ts_reader(void *arg) {
    Comm *cm = arg;
    while (!atomic_load(&g_ts_stop)) {
        for (uint32_t s = 0; s < cm->ring.hdr->capacity; s++) {
            Rec r;
            if (!read_slot(&cm->ring.slots[s], &r)) continue;
            atomic_fetch_add_explicit(&g_ts_accepted, 1, RLX);
            if (ts_check(&r)) atomic_fetch_add_explicit(&g_ts_done, 1, RLX);
        }
    }
    return NULL;
}

static void test_two_starters(void) {
    clear_env();
    setenv("ARTEMIS_RING_SLOTS", "64", 1);
    setenv("ARTEMIS_RECLAIM_AGE_MS", "600000", 1);
    Comm *cm = fixture("twostart", 6, 0x51);
    const ArtemisRingHeader *h = cm->ring.hdr;
    atomic_store(&g_ts_stop, 0);
    pthread_t th[2], rd;
    TsArg args[2] = {{cm, 1, TS_OPS}, {cm, 2, TS_OPS}};
    pthread_create(&rd, NULL, ts_reader, cm);
    for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, ts_user, &args[t]);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    atomic_store(&g_ts_stop, 1);
    pthread_join(rd, NULL);
    uint64_t w = atomic_load(A64(&h->write_index)), dropped = atomic_load(A64(&h->dropped));
    unsigned done = 0;
    for (uint32_t s = 0; s < h->capacity; s++) {
        Rec r;
        CHECK(read_slot(&cm->ring.slots[s], &r), "two starters: slot %u locked at rest", s);
        done += (unsigned)ts_check(&r);
    }
    /* every op ran to its end on its own thread: nothing stays in flight.
     * The owner's starts all take a ticket; the other thread's are dropped
     * while the owner is inside a start at its switch, which under load can
     * be all of them (the owner preempted there for the other's whole run:
     * seen at load average 9, on main too, as 11 900 of 20 000), so the check
     * is that the switch then completes: a later start of a third thread is
     * recorded. */
    CHECK(done == h->capacity && w >= TS_OPS && w <= 2u * TS_OPS,
          "two starters: %u of %u slots done, write_index %llu, dropped %llu", done, h->capacity,
          (unsigned long long)w, (unsigned long long)dropped);
    TsArg late = {cm, 3, 1};
    pthread_t lt;
    pthread_create(&lt, NULL, ts_user, &late);
    pthread_join(lt, NULL);
    Rec lr;
    uint64_t lw = atomic_load(A64(&h->write_index));
    CHECK(lw == w + 1u && read_slot(&cm->ring.slots[w & (h->capacity - 1u)], &lr) && lr.seq == w &&
              ts_check(&lr),
          "two starters: a later start of a third thread recorded (write_index %llu -> %llu)",
          (unsigned long long)w, (unsigned long long)lw);
    printf("  two starters: %llu tickets, %llu dropped, reader accepted %ld (%ld done)\n",
           (unsigned long long)w, (unsigned long long)dropped, atomic_load(&g_ts_accepted),
           atomic_load(&g_ts_done));
    CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "two starters: finalize");
    clear_env();
}

/* Shared mode's lanes (README "Shared mode"): after the switch, six threads
 * start ops on one communicator at once, each with its own KernelCh: four get
 * a lane (their own TSC line, strings memo, KernelCh guess and claim place),
 * two use the shared fallbacks. Each thread alternates two collectives (other
 * strings per thread, each by its own rule), so a lane's memo both hits and
 * misses. At rest every ticket holds one whole DONE record of one start, with
 * the strings, bytes and device times of that start, an enqueue time between
 * the clock reads around it, and a coll_seq of its own; tickets plus drops
 * are the starts. */
/* codes.h's string tables (in core.c), linked into the harness */
uint8_t art_func_code(const char *s);
uint8_t art_dtype_code(const char *s);
uint8_t art_algo_code(const char *s);
uint8_t art_proto_code(const char *s);
uint32_t art_dtype_size(uint8_t code);
uint32_t art_test_lanes(void *context); /* lanes taken (core.c, test hooks) */
static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#define LN_THREADS 6
#define LN_OPS 1000u
typedef struct {
    Comm *cm;
    unsigned t;
    pthread_barrier_t *bar;
    uint64_t t0[LN_OPS], t1[LN_OPS];
} LnArg;

static Expect ln_expect(unsigned t, unsigned i) {
    Expect e;
    memset(&e, 0, sizeof e);
    /* each string by its own rule, so that consecutive starts repeat all four
     * (a memo hit) or change one alone: a memo that compared fewer would hand
     * a start the codes of the one before */
    int b = ((i >> 1) & 1u) != 0;
    e.func_s = i % 5u == 0 ? "AllGather" : "AllReduce";
    e.dtype_s = (t & 1u) ? (b ? "ncclFloat32" : "ncclInt8") : (b ? "ncclInt8" : "ncclFloat64");
    e.algo_s = (t & 2u) ? "TREE" : "RING";
    e.proto_s = i % 3u == 0 ? "LL" : "SIMPLE";
    e.count = ((size_t)t << 20) + i + 1u;
    e.nch = 2;
    return e;
}

static void *ln_user(void *arg) {
    LnArg *a = arg;
    pthread_barrier_wait(a->bar);
    for (unsigned i = 0; i < LN_OPS; i++) {
        Expect e = ln_expect(a->t, i);
        a->t0[i] = mono_ns();
        void *op = start_ev(a->cm, ncclProfileColl, NULL, &e, 0, 0);
        a->t1[i] = mono_ns();
        stop_ev(op);
        void *kh[2];
        for (unsigned k = 0; k < 2; k++)
            kh[k] = start_ev(a->cm, ncclProfileKernelCh, op, NULL, ts_t0(e.count) + k, (int)k);
        for (unsigned k = 0; k < 2; k++) {
            ncclProfilerEventStateArgs_t sa;
            sa.kernelCh.pTimer = ts_t0(e.count) + 500u + k;
            record_ev(kh[k], ncclProfilerKernelChStop, &sa);
            stop_ev(kh[k]);
        }
    }
    return NULL;
}

static void test_lanes(void) {
    clear_env();
    setenv("ARTEMIS_RING_SLOTS", "8192", 1); /* every ticket stays in the ring */
    setenv("ARTEMIS_RECLAIM_AGE_MS", "600000", 1);
    Comm *cm = fixture("lanes", 6, 0x71);
    const ArtemisRingHeader *h = cm->ring.hdr;
    Expect e0 = ln_expect(0, 0);
    e0.count = 1; /* the owner's one start, in single mode; no KernelCh: host-timed */
    e0.nch = 0;
    stop_ev(start_ev(cm, ncclProfileColl, NULL, &e0, 0, 0));
    static LnArg args[LN_THREADS];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, LN_THREADS);
    pthread_t th[LN_THREADS];
    for (unsigned t = 0; t < LN_THREADS; t++) {
        args[t].cm = cm, args[t].t = t + 1u, args[t].bar = &bar;
        pthread_create(&th[t], NULL, ln_user, &args[t]);
    }
    for (unsigned t = 0; t < LN_THREADS; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    uint64_t w = atomic_load(A64(&h->write_index)), d = atomic_load(A64(&h->dropped));
    const uint64_t starts = 1u + (uint64_t)LN_THREADS * LN_OPS;
    CHECK(w + d == starts && w <= h->capacity, "lanes: write_index %llu + dropped %llu != %llu starts",
          (unsigned long long)w, (unsigned long long)d, (unsigned long long)starts);
    CHECK(art_test_lanes(cm->ctx) == 4u, "lanes: %u lanes taken, want 4 (six starting threads)",
          art_test_lanes(cm->ctx));
    static uint8_t seen[LN_THREADS + 1][LN_OPS];
    static uint8_t cseen[1u + LN_THREADS * LN_OPS];
    memset(seen, 0, sizeof seen);
    memset(cseen, 0, sizeof cseen);
    uint64_t worst = 0;
    for (uint64_t k = 1; k < w; k++) {
        Rec r;
        CHECK(read_slot(&cm->ring.slots[k], &r), "lanes: ticket %llu locked at rest", (unsigned long long)k);
        CHECK(r.seq == k && r.state == ARTEMIS_STATE_DONE && r.kind == ARTEMIS_KIND_COLL &&
                  r.clock == ARTEMIS_REC_DEVICE && r.nchannels == 2,
              "lanes: ticket %llu: seq %llu state %u clock %u", (unsigned long long)k,
              (unsigned long long)r.seq, r.state, r.clock);
        uint32_t sz = art_dtype_size(r.dtype);
        CHECK(sz != 0, "lanes: ticket %llu: datatype code %u has no size",
              (unsigned long long)k, r.dtype);
        uint64_t count = r.bytes / sz;
        unsigned t = (unsigned)(count >> 20), i = (unsigned)(count & 0xfffffu) - 1u;
        CHECK(t >= 1 && t <= LN_THREADS && i < LN_OPS && !seen[t][i],
              "lanes: ticket %llu: bytes %llu name no start, or one recorded twice",
              (unsigned long long)k, (unsigned long long)r.bytes);
        seen[t][i] = 1;
        Expect e = ln_expect(t, i);
        CHECK(r.func == art_func_code(e.func_s) && r.dtype == art_dtype_code(e.dtype_s) &&
                  r.algo == art_algo_code(e.algo_s) && r.proto == art_proto_code(e.proto_s) &&
                  r.bytes == count * art_dtype_size(r.dtype) && r.start == ts_t0(count) &&
                  r.end == ts_t0(count) + 501u,
              "lanes: ticket %llu (thread %u op %u): fields are another start's", (unsigned long long)k,
              t, i);
        const LnArg *a = &args[t - 1u];
        uint64_t q = r.enqueue_ns;
        uint64_t dev = q < a->t0[i] ? a->t0[i] - q : q > a->t1[i] ? q - a->t1[i] : 0;
        if (dev > worst) worst = dev;
        CHECK(r.coll_seq < starts && !cseen[r.coll_seq], "lanes: coll_seq %llu twice or out of range",
              (unsigned long long)r.coll_seq);
        cseen[r.coll_seq] = 1;
    }
    CHECK(worst <= 20000, "lanes: an enqueue time %llu ns off the clock reads around its start",
          (unsigned long long)worst);
    printf("  lanes: %d threads, 4 lanes, %llu tickets, %llu dropped, every record one start's, "
           "enqueue times within %llu ns\n", LN_THREADS, (unsigned long long)w,
           (unsigned long long)d, (unsigned long long)worst);
    CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "lanes: finalize");
    clear_env();
}

/* The single -> shared switch, many times (README "Single writer"): fresh
 * communicators, each with two threads that start at once (the first start of
 * the second thread lands while the owner is inside its plain-store starts),
 * a reader checking every record it accepts; at rest every slot whole and
 * DONE. With the membarrier switch no ticket is taken twice, so the tickets
 * plus the drops never exceed the starts. */
static void test_switch_rounds(void) {
    enum { ROUNDS = 40, OPS = 300 };
    uint64_t tickets = 0, drops = 0;
    for (int round = 0; round < ROUNDS; round++) {
        clear_env();
        setenv("ARTEMIS_RING_SLOTS", "64", 1);
        setenv("ARTEMIS_RECLAIM_AGE_MS", "600000", 1);
        Comm *cm = fixture("switch", 6, 0x900u + (uint64_t)round);
        const ArtemisRingHeader *h = cm->ring.hdr;
        atomic_store(&g_ts_stop, 0);
        pthread_t th[2], rd;
        TsArg args[2] = {{cm, 1, OPS}, {cm, 2, OPS}};
        pthread_create(&rd, NULL, ts_reader, cm);
        for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, ts_user, &args[t]);
        for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
        atomic_store(&g_ts_stop, 1);
        pthread_join(rd, NULL);
        uint64_t w = atomic_load(A64(&h->write_index)), d = atomic_load(A64(&h->dropped));
        unsigned done = 0, seen = 0;
        for (uint32_t s = 0; s < h->capacity; s++) {
            Rec r;
            CHECK(read_slot(&cm->ring.slots[s], &r), "switch: slot %u locked at rest", s);
            if (r.state) seen++;
            done += (unsigned)ts_check(&r);
        }
        CHECK(done == seen && w <= 2u * OPS, "switch round %d: %u of %u slots done, write_index %llu",
              round, done, seen, (unsigned long long)w);
        tickets += w, drops += d;
        CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "switch: finalize");
    }
    printf("  switch: %d rounds, %llu tickets, %llu dropped\n", ROUNDS, (unsigned long long)tickets,
           (unsigned long long)drops);
    clear_env();
}

/* The switch's race made to happen (README "Single writer"): the owner is
 * stopped inside a start, between the load and the store of its ticket (a
 * test hook, built into the harness only), while a second thread makes its
 * first start. That start must write nothing (NULL handle, counted as
 * dropped): with a plain ticket store it would otherwise take the owner's
 * ticket, and both would write one slot at once (the owner with plain stores).
 * After the owner's start has ended, the second thread's next start is
 * recorded under the next ticket. Fails if the drop is left out. */
extern void (*_Atomic art_test_ticket_hook)(void);
static _Atomic int g_hook_inside, g_hook_go;
static void hook_block(void) {
    atomic_store(&art_test_ticket_hook, NULL); /* once */
    atomic_store(&g_hook_inside, 1);
    while (!atomic_load(&g_hook_go)) sched_yield();
}
static Expect sw_expect(size_t count) {
    Expect e;
    memset(&e, 0, sizeof e);
    e.func_s = "AllReduce";
    e.dtype_s = "ncclInt8";
    e.algo_s = "RING";
    e.proto_s = "SIMPLE";
    e.count = count;
    e.nch = 2;
    return e;
}
static void *sw_owner(void *arg) {
    Comm *cm = arg;
    Expect e = sw_expect(11);
    stop_ev(start_ev(cm, ncclProfileColl, NULL, &e, 0, 0)); /* ticket 0: the owner */
    atomic_store(&art_test_ticket_hook, hook_block);
    e = sw_expect(22);
    stop_ev(start_ev(cm, ncclProfileColl, NULL, &e, 0, 0)); /* ticket 1, stopped in the hook */
    return NULL;
}
static void test_switch_in_start(void) {
    clear_env();
    setenv("ARTEMIS_DEVICE_TIMING", "0", 1);
    Comm *cm = fixture("switchhook", 6, 0x77);
    const ArtemisRingHeader *h = cm->ring.hdr;
    atomic_store(&g_hook_inside, 0);
    atomic_store(&g_hook_go, 0);
    pthread_t th;
    pthread_create(&th, NULL, sw_owner, cm);
    for (int i = 0; i < 2000 && !atomic_load(&g_hook_inside); i++) usleep(1000);
    if (!atomic_load(&g_hook_inside)) {
        /* no plain starts here (no membarrier): the hook never runs */
        atomic_store(&art_test_ticket_hook, NULL);
        pthread_join(th, NULL);
        printf("  switch in a start: skipped (the owner's starts use the CAS here: no membarrier)\n");
        CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "switch hook: finalize");
        clear_env();
        return;
    }
    Expect e = sw_expect(33);
    void *y = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    CHECK(y == NULL && atomic_load(A64(&h->dropped)) == 1,
          "switch in a start: the second thread's start during the owner's was recorded (handle %p, "
          "dropped %llu)", y, (unsigned long long)atomic_load(A64(&h->dropped)));
    stop_ev(y);
    atomic_store(&g_hook_go, 1);
    pthread_join(th, NULL);
    e = sw_expect(44);
    void *z = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    CHECK(z != NULL, "switch in a start: the second thread's start after it got no handle");
    stop_ev(z);
    uint64_t w = atomic_load(A64(&h->write_index));
    Rec r1 = slot_rec(cm, 1), r2 = slot_rec(cm, 2);
    CHECK(w == 3 && r1.seq == 1 && r1.bytes == 22 && r1.state == ARTEMIS_STATE_DONE &&
              r1.coll_seq == 1 && r2.seq == 2 && r2.bytes == 44 && r2.state == ARTEMIS_STATE_DONE &&
              r2.coll_seq == 3,
          "switch in a start: write_index %llu, ticket 1 bytes %llu coll_seq %llu, ticket 2 bytes %llu "
          "coll_seq %llu", (unsigned long long)w, (unsigned long long)r1.bytes,
          (unsigned long long)r1.coll_seq, (unsigned long long)r2.bytes,
          (unsigned long long)r2.coll_seq);
    printf("  switch in a start: the second thread's start dropped, the owner's whole\n");
    CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "switch hook: finalize");
    clear_env();
}

/* Both membarriers fail at the switch (a test hook): the owner's plain
 * starts give no proof of having ended, so the second thread's starts are
 * dropped (counted, the failure counted once) until the owner's next start,
 * made in shared mode, acknowledges; after that they are recorded. Fails if a
 * start is recorded before the acknowledgement, or never after it. */
extern _Atomic int art_test_membarrier_fail;
uint32_t art_test_mb_failed(void *context);
int art_test_plain_start(void *context);
static _Atomic int g_mbf_step;
static void *mbf_owner(void *arg) {
    Comm *cm = arg;
    Expect e = sw_expect(11);
    stop_ev(start_ev(cm, ncclProfileColl, NULL, &e, 0, 0)); /* ticket 0, plain */
    atomic_store(&g_mbf_step, 1);
    while (atomic_load(&g_mbf_step) != 2) sched_yield();
    e = sw_expect(22);
    stop_ev(start_ev(cm, ncclProfileColl, NULL, &e, 0, 0)); /* shared: acknowledges */
    atomic_store(&g_mbf_step, 3);
    return NULL;
}
static void test_switch_mb_fail(void) {
    clear_env();
    setenv("ARTEMIS_DEVICE_TIMING", "0", 1);
    Comm *cm = fixture("switchmbfail", 6, 0x78);
    const ArtemisRingHeader *h = cm->ring.hdr;
    if (!art_test_plain_start(cm->ctx)) {
        printf("  switch, membarrier failed: skipped (no plain starts here: no membarrier)\n");
        CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "switch mb fail: finalize");
        clear_env();
        return;
    }
    atomic_store(&g_mbf_step, 0);
    pthread_t th;
    pthread_create(&th, NULL, mbf_owner, cm);
    while (atomic_load(&g_mbf_step) != 1) sched_yield();
    atomic_store(&art_test_membarrier_fail, 1);
    Expect e = sw_expect(33);
    void *y1 = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    stop_ev(y1);
    void *y2 = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    stop_ev(y2);
    CHECK(y1 == NULL && y2 == NULL && atomic_load(A64(&h->dropped)) == 2 &&
              art_test_mb_failed(cm->ctx) == 1 && atomic_load(A64(&h->write_index)) == 1,
          "switch, membarrier failed: before the owner's acknowledgement (handles %p %p, dropped "
          "%llu, failures %u, write_index %llu)", y1, y2,
          (unsigned long long)atomic_load(A64(&h->dropped)), art_test_mb_failed(cm->ctx),
          (unsigned long long)atomic_load(A64(&h->write_index)));
    atomic_store(&g_mbf_step, 2);
    pthread_join(th, NULL);
    atomic_store(&art_test_membarrier_fail, 0);
    e = sw_expect(44);
    void *z = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    CHECK(z != NULL, "switch, membarrier failed: no handle after the owner's acknowledgement");
    stop_ev(z);
    Rec r1 = slot_rec(cm, 1), r2 = slot_rec(cm, 2);
    CHECK(atomic_load(A64(&h->write_index)) == 3 && r1.bytes == 22 && r1.coll_seq == 3 &&
              r1.state == ARTEMIS_STATE_DONE && r2.bytes == 44 && r2.coll_seq == 4 &&
              r2.state == ARTEMIS_STATE_DONE,
          "switch, membarrier failed: ticket 1 bytes %llu coll_seq %llu, ticket 2 bytes %llu "
          "coll_seq %llu", (unsigned long long)r1.bytes, (unsigned long long)r1.coll_seq,
          (unsigned long long)r2.bytes, (unsigned long long)r2.coll_seq);
    printf("  switch, membarrier failed: 2 starts dropped until the owner's acknowledgement, "
           "then recorded\n");
    CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "switch mb fail: finalize");
    clear_env();
}

/* The TSC host clock (README "Host clock"): over ~60 ms of starts on the
 * owner thread, every enqueue time lies within 20 us of a CLOCK_MONOTONIC read
 * taken just before and just after its start, and they never go back. Where
 * the TSC is not usable the plugin reads clock_gettime, and this holds
 * trivially (said in the output). */
int art_tsc_usable(void); /* ring.c, linked into the harness */

static void test_host_clock(int tsc) {
    clear_env();
    setenv("ARTEMIS_DEVICE_TIMING", "0", 1);
    setenv("ARTEMIS_RING_SLOTS", "4", 1);
    if (!tsc) setenv("ARTEMIS_HOST_TSC", "0", 1);
    Comm *cm = fixture(tsc ? "hostclock" : "hostclock0", 6, tsc ? 0x61 : 0x62);
    const uint64_t tol = 20000;
    uint64_t prev = 0, worst = 0, t_end = mono_ns() + 60000000ull;
    unsigned n = 0, bad = 0;
    for (uint64_t c = 0; mono_ns() < t_end; c++, n++) {
        Expect e;
        coll_expect(c, &e, 0);
        uint64_t t0 = mono_ns();
        void *op = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
        uint64_t t1 = mono_ns();
        Rec r = slot_rec(cm, c);
        stop_ev(op);
        uint64_t q = r.enqueue_ns;
        if (q + tol < t0 || q > t1 + tol || q < prev) bad++;
        uint64_t dev = q < t0 ? t0 - q : q > t1 ? q - t1 : 0;
        if (dev > worst) worst = dev;
        prev = q;
        if ((c & 1023) == 0) { /* let the clock run on between bursts */
            uint64_t w = mono_ns() + 200000;
            while (mono_ns() < w) {
            }
        }
    }
    CHECK(bad == 0 && n > 1000, "host clock: %u of %u enqueue times off by > 20 us or going back "
          "(worst %llu ns)", bad, n, (unsigned long long)worst);
    printf("  host clock (%s): %u starts, worst distance from CLOCK_MONOTONIC %llu ns\n",
           tsc && art_tsc_usable() ? "TSC" : "clock_gettime", n, (unsigned long long)worst);
    clear_env();
}

/* concurrent init of many comms (NCCL async init threads) */
static void *init_thread(void *arg) {
    uintptr_t i = (uintptr_t)arg;
    int mask = 0;
    void *ctx = init_comm(6, 0x5000 + i, "conc", 1, 16, (int)i, &mask);
    CHECK(ctx && mask == 70, "concurrent init %lu", (unsigned long)i);
    if (ctx) {
        ncclProfiler_v6.finalize(ctx);
    }
    return NULL;
}

static void test_concurrent_init(void) {
    char dir[300];
    clear_env();
    set_dir("concinit", dir, sizeof dir);
    setenv("ARTEMIS_RING_SLOTS", "64", 1);
    pthread_t th[8];
    for (uintptr_t i = 0; i < 8; i++) pthread_create(&th[i], NULL, init_thread, (void *)i);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    /* 8 rings and their 8 env sidecars, no temp file left behind */
    CHECK(count_files(dir) == 16, "8 rings + 8 sidecars, got %d files", count_files(dir));
    clear_env();
}

/* The env sidecar (artemis_ring.h "Env sidecar"): the kept variables in name order,
 * a value cut at ARTEMIS_ENV_VALUE_MAX, no name holding KEY/TOKEN/SECRET/PASSWORD;
 * and a sidecar that cannot be written costs the ring nothing but the flag. */
static void test_env_sidecar(void) {
    static const char *const vars[] = {"NCCL_HX_B", "NCCL_HX_A", "TORCH_NCCL_HX", "HSA_HX",
                                       "RCCL_HX", "CUDA_HX", "NCCL_HX_API_KEY", "CUDA_HX_token",
                                       "HSA_HX_SECRET", "NCCL_HX_PASSWORD", "NCCL_HX_LONG", "HX_NCCL"};
    char dir[300], path[600], env_path[620];
    clear_env();
    set_dir("env", dir, sizeof dir);
    setenv("ARTEMIS_JOB", "env", 1);
    char longv[ARTEMIS_ENV_VALUE_MAX + 100];
    memset(longv, 'v', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        setenv(vars[i], i == 10 ? longv : "1", 1);
    int mask = 0;
    void *ctx = init_comm(6, 0x71, "env", 1, 2, 0, &mask);
    ring_path(path, sizeof path, dir, "env", 0x71, 0);
    snprintf(env_path, sizeof env_path, "%s.env", path);
    Ring ring;
    CHECK(ctx && map_ring(path, &ring) == 0, "env: ring %s", path);
    if (ctx && ring.hdr) CHECK(ring.hdr->writer_flags & ARTEMIS_WRITER_ENV, "env: flag not set");
    static char buf[ARTEMIS_ENV_MAX_BYTES + 1];
    int fd = open(env_path, O_RDONLY);
    CHECK(fd >= 0, "env: sidecar %s", env_path);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    size_t len = n > 0 ? (size_t)n : 0;
    char pid[32];
    snprintf(pid, sizeof pid, "pid=%d", (int)getpid());
    CHECK(len > 0 && !strcmp(buf, "artemis-env=1") && !strcmp(buf + 14, pid), "env: head");
    const char *want[] = {"env.HSA_HX=1", "env.NCCL_HX_A=1", "env.NCCL_HX_B=1", "env.RCCL_HX=1",
                          "env.TORCH_NCCL_HX=1", "env.CUDA_HX=1"};
    int seen[6] = {0}, secrets = 0, longs = 0;
    const char *prev = "";
    for (size_t off = 0; off < len; off += strlen(buf + off) + 1) {
        const char *r = buf + off;
        for (int i = 0; i < 6; i++) seen[i] += !strcmp(r, want[i]);
        secrets += strstr(r, "KEY") || strstr(r, "token") || strstr(r, "SECRET") ||
                   strstr(r, "PASSWORD") || strstr(r, "HX_NCCL");
        if (!strncmp(r, "env.NCCL_HX_LONG=", 17)) longs += strlen(r) == 17 + ARTEMIS_ENV_VALUE_MAX;
        if (!strncmp(r, "env.", 4)) {
            CHECK(strcmp(prev, r) < 0, "env: %s not after %s", r, prev);
            prev = r;
        }
    }
    for (int i = 0; i < 6; i++) CHECK(seen[i] == 1, "env: %s seen %d times", want[i], seen[i]);
    CHECK(secrets == 0 && longs == 1, "env: secrets %d, cut long value %d", secrets, longs);
    if (ctx) finalize_ctx(6, ctx);

    /* the sidecar's path taken by a folder: the ring still comes, without the flag */
    ring_path(path, sizeof path, dir, "env", 0x72, 1);
    snprintf(env_path, sizeof env_path, "%s.env", path);
    CHECK(mkdir(env_path, 0755) == 0, "env: mkdir %s", env_path);
    atomic_store(&g_log_lines, 0);
    ctx = init_comm(6, 0x72, "env", 1, 2, 1, &mask);
    Ring r2;
    CHECK(ctx && map_ring(path, &r2) == 0, "env: ring without sidecar");
    if (ctx && r2.hdr) CHECK(!(r2.hdr->writer_flags & ARTEMIS_WRITER_ENV), "env: flag set");
    CHECK(atomic_load(&g_log_lines) >= 2, "env: no warning for the sidecar");
    if (ctx) finalize_ctx(6, ctx);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t scale = argc > 1 ? strtoull(argv[1], NULL, 10) : 20000;
    snprintf(g_root, sizeof g_root, "/tmp/artemis-harness-XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    printf("artemis plugin harness (root %s, %llu ops per comm)\n", g_root, (unsigned long long)scale);
    /* the tests read rings after finalize: kept (test_retire checks removal) */
    setenv("ARTEMIS_KEEP_RINGS", "1", 1);
    test_retire();
    printf("  ring lifetime done\n");

    test_failures();
    printf("  failure paths done\n");
    test_no_device_events();
    printf("  ops without device events done\n");
    test_concurrent_init();
    printf("  concurrent init done\n");
    test_lap_in_flight();
    printf("  lapping an in-flight record done\n");
    test_kfin_race();
    test_two_starters();
    test_lanes();
    test_switch_rounds();
    test_switch_in_start();
    test_switch_mb_fail();
    test_host_clock(1);
    test_host_clock(0);
    test_env_sidecar();
    printf("  env sidecar done\n");

    clear_env();
    int one6[] = {6};
    run_scenario("one", 1, one6, scale, 3, NULL, 1, 0);
    int multi[] = {6, 7, 6};
    run_scenario("multi", 3, multi, scale, 3, NULL, 1, 0);
    int host5[] = {5, 4};
    run_scenario("host", 2, host5, scale / 2, 2, "1024", 0, 0);
    clear_env();
    int tiny[] = {7, 6};
    run_scenario("tiny", 2, tiny, scale / 2, 3, "4", 1, 1);

    int f = atomic_load(&failures);
    if (f) printf("FAILED: %d check(s)\n", f);
    else printf("PASSED\n");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", g_root);
    return f ? 1 : 0;
}
