/*
 * harness_failures.c: the single-threaded failure paths and edge cases: bad
 * folders and settings, NULL and unknown arguments and events, the string codes
 * and their cache, pool exhaustion, events after finalize, the v4 and v5
 * tables, ring naming.
 */
#include "harness.h"

/* A v6 Coll descriptor as NCCL fills it (the strings may be NULL or unknown:
 * these tests feed the plugin's string codes). */
static ncclProfilerEventDescr_v6_t coll_descr(const char *func, const char *dtype,
                                              const char *algo, const char *proto, size_t count,
                                              int nch) {
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileColl;
    d.coll.func = func;
    d.coll.datatype = dtype;
    d.coll.algo = algo;
    d.coll.proto = proto;
    d.coll.count = count;
    d.coll.nChannels = (uint8_t)nch;
    return d;
}

void test_failures(void) {
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
    ncclProfilerEventDescr_v6_t d = coll_descr("AllReduce", "ncclFloat32", NULL, NULL, 1, 1);
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
    kch_end(k0, tstop(1, 0, 1, 0));
    stop_ev(k0); /* duplicate: must not complete the op early */
    Rec r = slot_rec(cm, 0);
    CHECK(r.state == ARTEMIS_STATE_IN_FLIGHT, "double stop completed early");
    kch_end(k1, tstop(1, 0, 1, 1));
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
    kch_end(k0, tstop(1, 1, 1, 0));
    r = slot_rec(cm, 1);
    check_done(&r, 1, 1, "channel-first record, before the Coll stop");

    /* unknown strings: codes 0, bytes = count (started before op's Coll stop) */
    d = coll_descr("PutSignal", "Unknown", "Unknown", NULL, 12345, 0);
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
        d = coll_descr(fn[i % 11], dn[i % 12], an[i % 7], pn[i % 3], 10, 0);
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
    d = coll_descr("AllReduce", "ncclInt8", NULL, NULL, 1, 64);
    ncclProfiler_v6.startEvent(cm->ctx, &op, &d);
    int got = 0;
    for (int k = 0; k < 64; k++) {
        void *kh = start_ev(cm, ncclProfileKernelCh, op, NULL, 1000 + (uint64_t)k, k);
        if (kh) got++;
        kch_end(kh, 2000 + (uint64_t)k);
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
        kch_end(kh, 0);
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
    kch_end(k0, tstop(1, 0, 1, 0));
    kch_end(k1, tstop(1, 0, 1, 1));
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
                kch_end(kh, tstop(1, c, 1, k));
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
            kch_end(kh, tstop(2, 3, 1, k));
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
