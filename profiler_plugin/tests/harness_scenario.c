/*
 * harness_scenario.c: the multi-threaded scenario. User-like threads issue the
 * NCCL 2.28+ event sequence, proxy-like threads the KernelCh events of its
 * channels, and a reader thread reads the rings concurrently with the seqlock
 * protocol, checking every record it accepts against the workload.
 */
#include "harness.h"

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
            kch_end(khs[k], tstop(w->kind, w->c, cm->rank, k));
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

/* Reads every slot of every ring until told to stop, then once more: that last pass
 * starts after the writers are done, so it always meets the final records at rest (on
 * a 4-slot ring under load the concurrent passes can land on in-flight records only,
 * which made "accepted nothing" a matter of scheduling). */
static void *reader_main(void *arg) {
    (void)arg;
    for (int last = 0; !last;) {
        last = atomic_load(&g_reader_stop);
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

/* Runs ncomm communicators (versions[]) with nproxy proxy threads. */
void run_scenario(const char *label, int ncomm, const int *versions, uint64_t nops,
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
