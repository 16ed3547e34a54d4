/*
 * dlopen_check.c: loads the built library the way NCCL and RCCL do (dlopen +
 * dlsym of the function tables) and checks what only a real shared object
 * shows: the four tables resolve, no internal symbol is visible, and the
 * runtime around it decides the clock. Init called from inside the stand-in
 * NCCL (build/standin/libnccl.so.2) gives device ns and NCCL's version; from
 * inside the stand-in RCCL (librccl.so, loaded RTLD_LOCAL like a Python
 * extension's library) device ticks at the stand-in HIP's wall-clock rate.
 * Both leave the env sidecar (the kept NCCL_ variable, not the one named KEY).
 * Usage: dlopen_check BUILD_DIR
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../artemis_ring.h"
#include "../nccl_profiler_abi.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL: " __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

typedef int (*standin_init_fn)(void *init, int version, void **ctx, uint64_t hash, int *mask,
                               const char *name, int nnodes, int nranks, int rank, void *logfn);

/* The Group event's handle from a context that init(version) made from inside
 * the runtime: the static dummy (not NULL) or NULL (README "Which NCCL/RCCL
 * version emits which events"). */
static void check_group(void *lib, standin_init_fn via, const char *runtime, int version,
                        int want_dummy, const char *dir) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclProfiler_v%d", version);
    ncclProfiler_v6_t *p = dlsym(lib, sym); /* init's slot differs for v4; the rest match */
    CHECK(p, "%s", sym);
    if (!p) return;
    void *ctx = NULL, *init;
    int mask = 0;
    *(void **)&init = *(void **)&p->init;
    via(init, version, &ctx, 0x78 + (uint64_t)version, &mask, "dlg", 1, 1, 0, NULL);
    CHECK(ctx, "init v%d through %s", version, runtime);
    if (!ctx) return;
    void *h = (void *)0x1;
    if (version == 4) {
        ncclProfilerEventDescr_v4_t d;
        memset(&d, 0, sizeof d);
        d.type = ncclProfileGroup;
        ((ncclProfiler_v4_t *)(void *)p)->startEvent(ctx, &h, &d);
    } else {
        ncclProfilerEventDescr_v6_t d;
        memset(&d, 0, sizeof d);
        d.type = ncclProfileGroup;
        p->startEvent(ctx, &h, &d);
    }
    CHECK(want_dummy ? h != NULL : h == NULL, "%s v%d: Group handle %p, want %s", runtime, version,
          h, want_dummy ? "the dummy" : "NULL");
    if (h) p->stopEvent(h);
    p->finalize(ctx);
    char rp[1024];
    snprintf(rp, sizeof rp, "%s/dl.%016llx.r0.ring", dir, 0x78ULL + (unsigned long long)version);
    unlink(rp);
    strncat(rp, ".env", sizeof rp - strlen(rp) - 1);
    unlink(rp);
}

static void check_lib(const char *build, const char *runtime, const char *dir, uint32_t want_clock,
                      uint64_t want_hz, uint32_t want_src, uint32_t want_flags, uint32_t want_ver,
                      int rccl) {
    char path[1024];
    snprintf(path, sizeof path, "%s/libnccl-profiler-artemis.so", build);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(h, "dlopen %s: %s", path, dlerror());
    if (!h) return;
    const char *syms[] = {"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6", "ncclProfiler_v7"};
    for (int i = 0; i < 4; i++) CHECK(dlsym(h, syms[i]), "%s missing", syms[i]);
    CHECK(!dlsym(h, "art_func_code") && !dlsym(h, "art_now_mono"), "internal symbol visible");
    ncclProfiler_v6_t *p = dlsym(h, "ncclProfiler_v6");
    if (!p) return;
    CHECK(p->name && !strcmp(p->name, "Artemis"), "name");
    snprintf(path, sizeof path, "%s/standin/%s", build, runtime);
    void *rt = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(rt, "dlopen %s: %s", path, dlerror());
    if (!rt) return;
    standin_init_fn via;
    *(void **)&via = dlsym(rt, "artemis_standin_init");
    CHECK(via, "artemis_standin_init in %s", runtime);
    if (!via) return;
    setenv("ARTEMIS_SHM_DIR", dir, 1);
    setenv("ARTEMIS_JOB", "dl", 1);
    void *ctx = NULL, *init;
    int mask = 0;
    *(void **)&init = *(void **)&p->init;
    via(init, 6, &ctx, 0x77, &mask, "dl", 1, 1, 0, NULL);
    CHECK(ctx && mask == 70, "init through %s", runtime);
    char rp[1024];
    snprintf(rp, sizeof rp, "%s/dl.%016llx.r0.ring", dir, 0x77ULL);
    int fd = open(rp, O_RDONLY);
    CHECK(fd >= 0, "ring %s", rp);
    if (fd >= 0) {
        ArtemisRingHeader hdr;
        CHECK(read(fd, &hdr, sizeof hdr) == (ssize_t)sizeof hdr, "read header");
        CHECK(hdr.clock_kind == want_clock && hdr.tick_hz == want_hz && hdr.tick_source == want_src &&
                  hdr.writer_flags == want_flags && hdr.nccl_version == want_ver,
              "%s: clock_kind %u tick_hz %llu tick_source %u writer_flags %u nccl_version %u", runtime,
              hdr.clock_kind, (unsigned long long)hdr.tick_hz, hdr.tick_source, hdr.writer_flags,
              hdr.nccl_version);
        close(fd);
        unlink(rp);
    }
    char ep[1100], env[4096] = {0};
    snprintf(ep, sizeof ep, "%s.env", rp);
    fd = open(ep, O_RDONLY);
    CHECK(fd >= 0, "env sidecar %s", ep);
    if (fd >= 0) {
        ssize_t n = read(fd, env, sizeof env - 1);
        CHECK(n > 0, "read %s", ep);
        size_t len = n > 0 ? (size_t)n : 0;
        int kept = 0, secret = 0, magic = len > 0 && !strcmp(env, "artemis-env=1");
        for (size_t off = 0; off < len; off += strlen(env + off) + 1) {
            kept += !strcmp(env + off, "env.NCCL_DLOPEN_CHECK=on");
            secret += strstr(env + off, "NCCL_DLOPEN_API_KEY") != NULL;
        }
        CHECK(magic && kept == 1 && secret == 0, "%s: magic %d kept %d secret %d", ep, magic, kept,
              secret);
        close(fd);
        unlink(ep);
    }
    p->finalize(ctx);
    /* Group: the dummy under v4 (NCCL 2.27 starts Coll/P2p only under a
     * Group handle) and under v7 on NCCL (2.31 not read); NULL under v5, v6
     * and, on RCCL, v7 (no gating in their ncclProfilerStartTaskEvents) */
    check_group(h, via, runtime, 4, 1, dir);
    check_group(h, via, runtime, 5, 0, dir);
    check_group(h, via, runtime, 6, 0, dir);
    check_group(h, via, runtime, 7, !rccl, dir);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char dir[] = "/tmp/artemis-dlopen-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    setenv("NCCL_DLOPEN_CHECK", "on", 1);
    setenv("NCCL_DLOPEN_API_KEY", "s3cret", 1);
    check_lib(argv[1], "libnccl.so.2", dir, ARTEMIS_CLOCK_DEVICE_NS, 0, ARTEMIS_TICK_SRC_NONE,
              ARTEMIS_WRITER_ENV, 23003, 0);
    setenv("ARTEMIS_STANDIN_HIP_WALLCLOCK_KHZ_0", "25000", 1);
    check_lib(argv[1], "librccl.so", dir, ARTEMIS_CLOCK_DEVICE_TICKS, 25000000ull, ARTEMIS_TICK_SRC_HIP,
              ARTEMIS_WRITER_RCCL | ARTEMIS_WRITER_ENV, 22803, 1);
    rmdir(dir);
    printf(fails ? "dlopen check FAILED\n"
                 : "dlopen check PASSED (under NCCL: ns; under RCCL: ticks at HIP's rate)\n");
    return fails ? 1 : 0;
}
