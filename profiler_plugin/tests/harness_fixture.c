/*
 * harness_fixture.c: what the harness's tests share: the check counter and the
 * NCCL logger, the self-describing workload, ring reading (the agent's
 * protocol), the event driver of every ABI version and the one-comm fixture.
 */
#include "harness.h"

_Atomic int failures;

char g_root[256];
_Atomic int g_log_lines;
static _Atomic int g_warn_lines;

void test_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
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
void keep(void *p) {
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

int is_p2p(uint64_t i) { return i % 7 == 3; }

void expect_coll(uint64_t c, int rank, Expect *e) {
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

void expect_p2p(uint64_t c, int rank, int nranks, Expect *e) {
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

uint64_t tstart(int kind, uint64_t c, int rank, unsigned k) {
    return (kind == ARTEMIS_KIND_COLL ? T_COLL : T_P2P) + c * 1000000ull + (uint64_t)rank * 1000ull +
           10ull * k + 5ull;
}
uint64_t tstop(int kind, uint64_t c, int rank, unsigned k) {
    return tstart(kind, c, rank, k) + 500ull + k;
}

/* ------------------------------------------------------------------ */
/* ring reading (the agent's protocol)                                  */

/* 1: a whole record copied; 0: torn / being written. */
int read_slot(const ArtemisSlot *s, Rec *r) {
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


int map_ring(const char *path, Ring *r) {
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
int check_rec(const Ring *ring, const Rec *r, uint64_t slot_idx, const char *where) {
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
void *start_ev(Comm *cm, int type, void *parent, const Expect *e, uint64_t ptimer,
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

void stop_ev(void *h) { ncclProfiler_v6.stopEvent(h); }
void record_ev(void *h, int state, ncclProfilerEventStateArgs_t *a) {
    ncclProfiler_v6.recordEventState(h, (ncclProfilerEventState_t)state, a);
}

/* A kernel channel's end as NCCL reports it: KernelChStop with the channel's stop
 * timer, then the event's stop. */
void kch_end(void *kh, uint64_t ptimer) {
    ncclProfilerEventStateArgs_t a;
    memset(&a, 0, sizeof a);
    a.kernelCh.pTimer = ptimer;
    record_ev(kh, ncclProfilerKernelChStop, &a);
    stop_ev(kh);
}

void ring_path(char *out, size_t n, const char *dir, const char *job, uint64_t hash, int rank) {
    snprintf(out, n, "%s/%s.%016llx.r%d.ring", dir, job, (unsigned long long)hash, rank);
}

void *init_comm(int version, uint64_t hash, const char *name, int nnodes, int nranks,
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

int finalize_ctx(int version, void *ctx) {
    switch (version) {
    case 4: return ncclProfiler_v4.finalize(ctx);
    case 5: return ncclProfiler_v5.finalize(ctx);
    case 6: return ncclProfiler_v6.finalize(ctx);
    default: return ncclProfiler_v7.finalize(ctx);
    }
}


/* ------------------------------------------------------------------ */
/* the single-threaded fixture                                         */

int count_files(const char *dir) {
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

void set_dir(const char *label, char *dir, size_t n) {
    snprintf(dir, n, "%s/%s", g_root, label);
    setenv("ARTEMIS_SHM_DIR", dir, 1);
}

void clear_env(void) {
    const char *vars[] = {"ARTEMIS_JOB", "ARTEMIS_SHM_DIR", "ARTEMIS_RING_SLOTS",
                          "ARTEMIS_DEVICE_TIMING", "ARTEMIS_DISABLE", "ARTEMIS_CLOCK",
                          "ARTEMIS_TICK_HZ", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID",
                          "ARTEMIS_RECLAIM_AGE_MS", "ARTEMIS_HOST_TSC"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* A one-comm fixture used by the single-threaded tests. */
Comm *fixture(const char *label, int version, uint64_t hash) {
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

Rec slot_rec(Comm *cm, uint64_t ticket) {
    Rec r;
    memset(&r, 0, sizeof r);
    CHECK(read_slot(&cm->ring.slots[ticket & (cm->ring.hdr->capacity - 1u)], &r), "slot busy");
    return r;
}

void coll_expect(uint64_t c, Expect *e, uint8_t nch) {
    expect_coll(c, 1, e);
    e->nch = nch;
}

/* A done collective of rank 1 with nch timed channels (the single-threaded tests). */
int check_done(const Rec *r, uint64_t c, unsigned nch, const char *where) {
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

/* Runs one collective of rank 1 (coll c, nch channels) to completion: starts
 * of all channels, then their stops, as NCCL's proxy loop does. */
void run_coll(Comm *cm, uint64_t c, unsigned nch) {
    Expect e;
    coll_expect(c, &e, (uint8_t)nch);
    void *op = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
    stop_ev(op);
    void *kh[64];
    for (unsigned k = 0; k < nch; k++)
        kh[k] = start_ev(cm, ncclProfileKernelCh, op, NULL, tstart(1, c, 1, k), (int)k);
    for (unsigned k = 0; k < nch; k++) {
        kch_end(kh[k], tstop(1, c, 1, k));
    }
}

/* CLOCK_MONOTONIC, for the enqueue-time checks */
uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
