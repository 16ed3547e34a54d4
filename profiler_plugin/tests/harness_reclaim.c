/*
 * harness_reclaim.c: ops whose device events never come or come late: the
 * reclaim by lag and by age, a lap over an in-flight record, and the owner's
 * last channel clear racing the reclaim.
 */
#include "harness.h"

/* Ops that never get device events (README "Ops that never get device
 * events"), under the sanitizers: self Send/Recv, reclaim by lag, reclaim by
 * age when the pool is exhausted. */
void test_no_device_events(void) {
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
void test_lap_in_flight(void) {
    clear_env();
    setenv("ARTEMIS_RING_SLOTS", "4", 1);
    setenv("ARTEMIS_RECLAIM_AGE_MS", "0", 1); /* (a) is not reclaimable: no Coll stop yet */
    Comm *cm = fixture("lap", 7, 0x41);
    const ArtemisRingHeader *h = cm->ring.hdr;
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
    kch_end(k0, tstop(1, 0, 1, 0));
    kch_end(k1, tstop(1, 0, 1, 1));
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
    kch_end(k0, tstop(1, 9, 1, 0));
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
    kch_end(k0, tstop(1, 96, 1, 0));
    kch_end(k1, tstop(1, 96, 1, 1)); /* its last stop comes after the hook */
}
void test_kfin_race(void) {
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
        kch_end(k0, tstop(1, 0, 1, 0)); /* deferred to the last stop */
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
