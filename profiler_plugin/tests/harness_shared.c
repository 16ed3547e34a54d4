/*
 * harness_shared.c: shared mode: two starters on one communicator, the lanes,
 * and the single -> shared switch (repeated, raced inside a start, and with
 * failing membarriers).
 */
#include "harness.h"

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

/* An AllReduce of `count` int8 on 2 ring channels: the threaded tests tell their
 * records apart by the count alone. */
static Expect int8_expect(size_t count) {
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

static void *ts_user(void *arg) {
    TsArg *a = arg;
    Comm *cm = a->cm;
    for (unsigned i = 0; i < a->ops; i++) {
        Expect e = int8_expect(((size_t)a->t << 20) + i + 1u);
        void *op = start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
        int early = (i % 3) == 0; /* channels before the Coll stop */
        if (!early) stop_ev(op);
        void *kh[2];
        for (unsigned k = 0; k < 2; k++)
            kh[k] = start_ev(cm, ncclProfileKernelCh, op, NULL, ts_t0(e.count) + k, (int)k);
        for (unsigned k = 0; k < 2; k++) {
            kch_end(kh[k], ts_t0(e.count) + 500u + k);
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

/* Threads 1 and 2 each start ops on cm at once while ts_reader checks every
 * record it accepts; returns when all three have ended. */
static void ts_run(Comm *cm, unsigned ops) {
    atomic_store(&g_ts_stop, 0);
    pthread_t th[2], rd;
    TsArg args[2] = {{cm, 1, ops}, {cm, 2, ops}};
    pthread_create(&rd, NULL, ts_reader, cm);
    for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, ts_user, &args[t]);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    atomic_store(&g_ts_stop, 1);
    pthread_join(rd, NULL);
}

void test_two_starters(void) {
    clear_env();
    setenv("ARTEMIS_RING_SLOTS", "64", 1);
    setenv("ARTEMIS_RECLAIM_AGE_MS", "600000", 1);
    Comm *cm = fixture("twostart", 6, 0x51);
    const ArtemisRingHeader *h = cm->ring.hdr;
    ts_run(cm, TS_OPS);
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

static void ln_op(LnArg *a, unsigned i) {
    Expect e = ln_expect(a->t, i);
    a->t0[i] = mono_ns();
    void *op = start_ev(a->cm, ncclProfileColl, NULL, &e, 0, 0);
    a->t1[i] = mono_ns();
    stop_ev(op);
    void *kh[2];
    for (unsigned k = 0; k < 2; k++)
        kh[k] = start_ev(a->cm, ncclProfileKernelCh, op, NULL, ts_t0(e.count) + k, (int)k);
    for (unsigned k = 0; k < 2; k++) {
        kch_end(kh[k], ts_t0(e.count) + 500u + k);
    }
}

static void *ln_user(void *arg) {
    LnArg *a = arg;
    /* The first thread's first start is the switch to shared mode, done before the
     * others start: the starts that race a switch are dropped until its membarrier
     * returns (README "Single writer"), and on a loaded machine, under TSan, five
     * threads once ran all their starts inside it and took no lane */
    unsigned first = a->t == 1u;
    if (first) ln_op(a, 0);
    pthread_barrier_wait(a->bar);
    for (unsigned i = first; i < LN_OPS; i++) ln_op(a, i);
    return NULL;
}

void test_lanes(void) {
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
void test_switch_rounds(void) {
    enum { ROUNDS = 40, OPS = 300 };
    uint64_t tickets = 0, drops = 0;
    for (int round = 0; round < ROUNDS; round++) {
        clear_env();
        setenv("ARTEMIS_RING_SLOTS", "64", 1);
        setenv("ARTEMIS_RECLAIM_AGE_MS", "600000", 1);
        Comm *cm = fixture("switch", 6, 0x900u + (uint64_t)round);
        const ArtemisRingHeader *h = cm->ring.hdr;
        ts_run(cm, OPS);
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
/* A collective's start of `count` bytes (the switch tests tell tickets apart by it). */
static void *sw_start(Comm *cm, size_t count) {
    Expect e = int8_expect(count);
    return start_ev(cm, ncclProfileColl, NULL, &e, 0, 0);
}
/* The switch tests' communicator: host timing only, so a start writes one slot. */
static Comm *sw_fixture(const char *label, uint64_t hash) {
    clear_env();
    setenv("ARTEMIS_DEVICE_TIMING", "0", 1);
    return fixture(label, 6, hash);
}
static void sw_finish(Comm *cm, const char *what) {
    CHECK(finalize_ctx(6, cm->ctx) == ncclSuccess, "%s: finalize", what);
    clear_env();
}
static void *sw_owner(void *arg) {
    Comm *cm = arg;
    stop_ev(sw_start(cm, 11)); /* ticket 0: the owner */
    atomic_store(&art_test_ticket_hook, hook_block);
    stop_ev(sw_start(cm, 22)); /* ticket 1, stopped in the hook */
    return NULL;
}
void test_switch_in_start(void) {
    Comm *cm = sw_fixture("switchhook", 0x77);
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
        sw_finish(cm, "switch hook");
        return;
    }
    void *y = sw_start(cm, 33);
    CHECK(y == NULL && atomic_load(A64(&h->dropped)) == 1,
          "switch in a start: the second thread's start during the owner's was recorded (handle %p, "
          "dropped %llu)", y, (unsigned long long)atomic_load(A64(&h->dropped)));
    stop_ev(y);
    atomic_store(&g_hook_go, 1);
    pthread_join(th, NULL);
    void *z = sw_start(cm, 44);
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
    sw_finish(cm, "switch hook");
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
    stop_ev(sw_start(cm, 11)); /* ticket 0, plain */
    atomic_store(&g_mbf_step, 1);
    while (atomic_load(&g_mbf_step) != 2) sched_yield();
    stop_ev(sw_start(cm, 22)); /* shared: acknowledges */
    atomic_store(&g_mbf_step, 3);
    return NULL;
}
void test_switch_mb_fail(void) {
    Comm *cm = sw_fixture("switchmbfail", 0x78);
    const ArtemisRingHeader *h = cm->ring.hdr;
    if (!art_test_plain_start(cm->ctx)) {
        printf("  switch, membarrier failed: skipped (no plain starts here: no membarrier)\n");
        sw_finish(cm, "switch mb fail");
        return;
    }
    atomic_store(&g_mbf_step, 0);
    pthread_t th;
    pthread_create(&th, NULL, mbf_owner, cm);
    while (atomic_load(&g_mbf_step) != 1) sched_yield();
    atomic_store(&art_test_membarrier_fail, 1);
    void *y1 = sw_start(cm, 33);
    stop_ev(y1);
    void *y2 = sw_start(cm, 33);
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
    void *z = sw_start(cm, 44);
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
    sw_finish(cm, "switch mb fail");
}
