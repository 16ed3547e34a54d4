/*
 * dlopen_check.c: loads the built libraries the way NCCL and RCCL do
 * (dlopen + dlsym of the function tables) and checks what only a real
 * shared object shows: the four tables resolve, the RCCL-named copy reports
 * device ticks, the NCCL-named one device ns. Usage: dlopen_check BUILD_DIR
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

static void check_lib(const char *build, const char *name, const char *dir, uint32_t want_clock) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", build, name);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(h, "dlopen %s: %s", path, dlerror());
    if (!h) return;
    const char *syms[] = {"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6", "ncclProfiler_v7"};
    for (int i = 0; i < 4; i++) CHECK(dlsym(h, syms[i]), "%s missing in %s", syms[i], name);
    CHECK(!dlsym(h, "art_func_code") && !dlsym(h, "art_now_mono"), "internal symbol visible in %s", name);
    ncclProfiler_v6_t *p = dlsym(h, "ncclProfiler_v6");
    if (!p) return;
    CHECK(p->name && !strcmp(p->name, "Artemis"), "name");
    setenv("ARTEMIS_SHM_DIR", dir, 1);
    setenv("ARTEMIS_JOB", "dl", 1);
    void *ctx = NULL;
    int mask = 0;
    p->init(&ctx, 0x77, &mask, "dl", 1, 1, 0, NULL);
    CHECK(ctx && mask == 70, "init through %s", name);
    char rp[1024];
    snprintf(rp, sizeof rp, "%s/dl.%016llx.r0.ring", dir, 0x77ULL);
    int fd = open(rp, O_RDONLY);
    CHECK(fd >= 0, "ring %s", rp);
    if (fd >= 0) {
        ArtemisRingHeader hdr;
        CHECK(read(fd, &hdr, sizeof hdr) == (ssize_t)sizeof hdr, "read header");
        CHECK(hdr.clock_kind == want_clock, "%s: clock_kind %u, want %u", name, hdr.clock_kind, want_clock);
        CHECK(want_clock != ARTEMIS_CLOCK_DEVICE_TICKS || hdr.tick_hz == 100000000ull, "tick_hz %llu",
              (unsigned long long)hdr.tick_hz);
        close(fd);
        unlink(rp);
    }
    p->finalize(ctx);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char dir[] = "/tmp/artemis-dlopen-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    check_lib(argv[1], "libnccl-profiler-artemis.so", dir, ARTEMIS_CLOCK_DEVICE_NS);
    check_lib(argv[1], "librccl-profiler-artemis.so", dir, ARTEMIS_CLOCK_DEVICE_TICKS);
    rmdir(dir);
    printf(fails ? "dlopen check FAILED\n" : "dlopen check PASSED (NCCL name: ns, RCCL name: ticks)\n");
    return fails ? 1 : 0;
}
