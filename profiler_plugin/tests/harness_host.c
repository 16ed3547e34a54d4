/*
 * harness_host.c: the host side of a communicator: the TSC host clock,
 * concurrent init of many communicators, and the env sidecar.
 */
#include "harness.h"

#include <sys/file.h>

/* The TSC host clock (README "Host clock"): over ~60 ms of starts on the
 * owner thread, every enqueue time lies within 20 us of a CLOCK_MONOTONIC read
 * taken just before and just after its start, and they never go back. Where
 * the TSC is not usable the plugin reads clock_gettime, and this holds
 * trivially (said in the output). */
int art_tsc_usable(void); /* ring.c, linked into the harness */

void test_host_clock(int tsc) {
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

void test_concurrent_init(void) {
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
void test_env_sidecar(void) {
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

/* Lifetime (artemis_ring.h): at finalize a ring no reader marked, in a folder no
 * agent serves, goes with its sidecars; a reader's mark or an agent's lock keeps it. */
void test_retire(void) {
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
