/*
 * ring.c: configuration from the environment, logging, and atomic creation
 * of one shared-memory ring file per (communicator, rank).
 * Runs only at init (allocation and system calls are fine here).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plugin_internal.h"

uint64_t art_now_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t art_now_real(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The kernel keeps CLOCK_MONOTONIC on the TSC itself only when it trusts it
 * (invariant and synchronised across CPUs): then a line through
 * (tsc, CLOCK_MONOTONIC) pairs follows the clock between NTP adjustments. */
int art_tsc_usable(void) {
#if defined(__x86_64__)
    char buf[64] = {0};
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (!f) return 0;
    int ok = fgets(buf, sizeof buf, f) != NULL && !strncmp(buf, "tsc", 3) &&
             (buf[3] == '\n' || buf[3] == 0);
    fclose(f);
    if (!ok) return 0;
    f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[4096];
    int constant = 0, nonstop = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5)) continue;
        constant = strstr(line, " constant_tsc") != NULL;
        nonstop = strstr(line, " nonstop_tsc") != NULL;
        break;
    }
    fclose(f);
    return constant && nonstop;
#else
    return 0;
#endif
}

void art_log(ncclDebugLogger_t logfn, ncclDebugLogLevel level, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (logfn) {
        logfn(level, NCCL_LOG_SUBSYS_INIT | NCCL_LOG_SUBSYS_PROFILE, __FILE__, __LINE__, "%s", msg);
    } else if (level <= NCCL_LOG_WARN) {
        fprintf(stderr, "%s\n", msg); /* no NCCL logger: warnings only, on stderr */
    }
}

/* Parses a decimal unsigned integer; the whole string must be digits. */
static int parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s) return -1;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* 1 / 0 for a boolean env value, -1 if not a boolean. */
static int parse_bool(const char *s) {
    if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
        return 1;
    if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off"))
        return 0;
    return -1;
}

static const char *env_nonempty(const char *name) {
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

/* Copies src into dst (size n) keeping only [A-Za-z0-9_.-]; others become '_'. */
static void sanitise(char *dst, size_t n, const char *src) {
    size_t i = 0;
    for (; src[i] && i + 1 < n; i++) {
        char c = src[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-';
        dst[i] = ok ? c : '_';
    }
    dst[i] = '\0';
}

/* The job-wide rank of this process, as launchers export it; -1 when unknown.
 * NCCL tells the plugin only the rank inside each communicator, and a job with
 * one communicator per vendor island needs the global one to name a rank. */
static int32_t art_global_rank(void) {
    static const char *const names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                        "SLURM_PROCID", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = env_nonempty(names[i]);
        uint64_t r;
        if (v && parse_u64(v, &r) == 0 && r < (1u << 30)) return (int32_t)r;
    }
    return -1;
}

/* ---- the runtime around the plugin ----------------------------------------
 *
 * RCCL loads profiler plugins under NCCL's prefix (libnccl-profiler-<name>.so,
 * rocm-systems projects/rccl/src/plugin/plugin_open.cc), so the plugin's file
 * name says nothing. What does: symbols only RCCL exports. They are looked up
 * first in the library that called init (found with dladdr on the return
 * address, so this works when RCCL itself was loaded RTLD_LOCAL, as Python
 * extension modules load their libraries), then in the global scope. A
 * dlsym on a library handle also searches its dependencies, which is where
 * HIP (libamdhip64) sits for RCCL. */

#define ART_HIP_ATTR_WALL_CLOCK_RATE 10017 /* hipDeviceAttributeWallClockRate (kHz) */

typedef int (*art_get_version_fn)(int *version);
typedef int (*art_hip_get_device_fn)(int *device);
typedef int (*art_hip_attr_fn)(int *value, int attr, int device);

static void *art_sym(void *lib, const char *name) {
    void *p = lib ? dlsym(lib, name) : NULL;
    return p ? p : dlsym(RTLD_DEFAULT, name);
}

/* dlsym returns void *; POSIX guarantees it converts to a function pointer. */
#define ART_FN(T, p) (*(T *)(void *)&(p))

void art_runtime_probe(const void *caller, ArtRuntime *rt) {
    memset(rt, 0, sizeof *rt);
    void *lib = NULL;
    Dl_info info;
    if (caller && dladdr(caller, &info) && info.dli_fname && info.dli_fname[0])
        lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD); /* already loaded: a reference */
    /* ncclAllReduceWithBias is RCCL's own API (RCCL_ALLREDUCE_WITH_BIAS in its
     * nccl.h); ncclAllToAllv is RCCL's too, but an NCCL fork may carry it, so it
     * counts only next to HIP. */
    void *get_dev = art_sym(lib, "hipGetDevice"), *get_attr = art_sym(lib, "hipDeviceGetAttribute");
    rt->hip = get_dev && get_attr;
    rt->rccl = art_sym(lib, "ncclAllReduceWithBias") != NULL ||
               (rt->hip && art_sym(lib, "ncclAllToAllv") != NULL);
    void *gv = art_sym(lib, "ncclGetVersion");
    int version = 0;
    if (gv && ART_FN(art_get_version_fn, gv)(&version) == 0 && version > 0)
        rt->nccl_version = (uint32_t)version;
    if (rt->hip) {
        int dev = 0, khz = 0;
        if (ART_FN(art_hip_get_device_fn, get_dev)(&dev) == 0 &&
            ART_FN(art_hip_attr_fn, get_attr)(&khz, ART_HIP_ATTR_WALL_CLOCK_RATE, dev) == 0 &&
            khz > 0) {
            rt->hip_device = dev;
            rt->hip_tick_hz = (uint64_t)khz * 1000u;
        }
    }
    if (lib) dlclose(lib);
}

int art_config_load(ArtConfig *cfg, const ArtRuntime *rt, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    const char *v;
    int b;

    if ((v = env_nonempty("ARTEMIS_DISABLE"))) {
        if ((b = parse_bool(v)) < 0) {
            snprintf(err, errlen, "bad ARTEMIS_DISABLE='%s' (want 0 or 1)", v);
            return -1;
        }
        cfg->disabled = b;
    }

    cfg->device_timing = 1;
    if ((v = env_nonempty("ARTEMIS_DEVICE_TIMING"))) {
        if ((b = parse_bool(v)) < 0) {
            snprintf(err, errlen, "bad ARTEMIS_DEVICE_TIMING='%s' (want 0 or 1)", v);
            return -1;
        }
        cfg->device_timing = b;
    }

    cfg->clock_kind = rt->rccl ? ARTEMIS_CLOCK_DEVICE_TICKS : ARTEMIS_CLOCK_DEVICE_NS;
    cfg->writer_flags = rt->rccl ? ARTEMIS_WRITER_RCCL : 0u;
    cfg->nccl_version = rt->nccl_version;
    if ((v = env_nonempty("ARTEMIS_CLOCK"))) {
        if (!strcasecmp(v, "ns")) cfg->clock_kind = ARTEMIS_CLOCK_DEVICE_NS;
        else if (!strcasecmp(v, "ticks")) cfg->clock_kind = ARTEMIS_CLOCK_DEVICE_TICKS;
        else if (!strcasecmp(v, "host")) cfg->clock_kind = ARTEMIS_CLOCK_HOST;
        else {
            snprintf(err, errlen, "bad ARTEMIS_CLOCK='%s' (want ns, ticks or host)", v);
            return -1;
        }
    }
    if (!cfg->device_timing) cfg->clock_kind = ARTEMIS_CLOCK_HOST;
    if (cfg->clock_kind == ARTEMIS_CLOCK_HOST) cfg->device_timing = 0;

    uint64_t hz = 100000000ull;
    if ((v = env_nonempty("ARTEMIS_TICK_HZ"))) {
        if (parse_u64(v, &hz) || hz == 0) {
            snprintf(err, errlen, "bad ARTEMIS_TICK_HZ='%s' (want a positive integer)", v);
            return -1;
        }
    }
    /* The GPU's own wall-clock rate when HIP gives it, else the configured default. */
    cfg->tick_hz = 0;
    cfg->tick_source = ARTEMIS_TICK_SRC_NONE;
    if (cfg->clock_kind == ARTEMIS_CLOCK_DEVICE_TICKS) {
        cfg->tick_hz = rt->hip_tick_hz ? rt->hip_tick_hz : hz;
        cfg->tick_source = rt->hip_tick_hz ? ARTEMIS_TICK_SRC_HIP : ARTEMIS_TICK_SRC_DEFAULT;
    }

    cfg->host_tsc = art_tsc_usable();
    if ((v = env_nonempty("ARTEMIS_HOST_TSC"))) {
        if ((b = parse_bool(v)) < 0) {
            snprintf(err, errlen, "bad ARTEMIS_HOST_TSC='%s' (want 0 or 1)", v);
            return -1;
        }
        if (!b) cfg->host_tsc = 0; /* 1 cannot force it where the TSC is not usable */
    }

    /* the owner's slot entry without a locked instruction (plugin README
     * "Single writer"); 0 keeps the CAS (and the old switch) */
    cfg->plain_start = 1;
    if ((v = env_nonempty("ARTEMIS_PLAIN_START"))) {
        if ((b = parse_bool(v)) < 0) {
            snprintf(err, errlen, "bad ARTEMIS_PLAIN_START='%s' (want 0 or 1)", v);
            return -1;
        }
        cfg->plain_start = b;
    }

    uint64_t age_ms = ART_RECLAIM_AGE_MS;
    if ((v = env_nonempty("ARTEMIS_RECLAIM_AGE_MS"))) {
        if (parse_u64(v, &age_ms) || age_ms > 3600000u) {
            snprintf(err, errlen, "bad ARTEMIS_RECLAIM_AGE_MS='%s' (want 0..3600000)", v);
            return -1;
        }
    }
    cfg->reclaim_age_ns = age_ms * 1000000ull;

    if ((v = env_nonempty("ARTEMIS_KEEP_RINGS"))) {
        if ((b = parse_bool(v)) < 0) {
            snprintf(err, errlen, "bad ARTEMIS_KEEP_RINGS='%s' (want 0 or 1)", v);
            return -1;
        }
        cfg->keep_rings = b;
    }

    uint64_t slots = ARTEMIS_RING_DEFAULT_SLOTS;
    if ((v = env_nonempty("ARTEMIS_RING_SLOTS"))) {
        if (parse_u64(v, &slots) || slots == 0) {
            snprintf(err, errlen, "bad ARTEMIS_RING_SLOTS='%s' (want a positive integer)", v);
            return -1;
        }
    }
    if (slots < ARTEMIS_RING_MIN_SLOTS) slots = ARTEMIS_RING_MIN_SLOTS;
    if (slots > ARTEMIS_RING_MAX_SLOTS) slots = ARTEMIS_RING_MAX_SLOTS;
    uint32_t p2 = ARTEMIS_RING_MIN_SLOTS;
    while (p2 < slots) p2 <<= 1;
    cfg->slots = p2;

    v = env_nonempty("ARTEMIS_SHM_DIR");
    if (!v) v = "/dev/shm/artemis";
    if (strlen(v) >= sizeof cfg->dir) {
        snprintf(err, errlen, "ARTEMIS_SHM_DIR is longer than %zu bytes", sizeof cfg->dir - 1);
        return -1;
    }
    strcpy(cfg->dir, v);

    v = env_nonempty("ARTEMIS_JOB");
    if (!v) v = env_nonempty("SLURM_JOB_ID");
    if (!v) v = env_nonempty("TORCHELASTIC_RUN_ID");
    if (v) sanitise(cfg->job, sizeof cfg->job, v); /* empty job: the caller uses the comm hash */
    return 0;
}

/* ---- the env sidecar (artemis_ring.h "Env sidecar") ----------------------
 * The job's communication settings for its software fingerprint, read from
 * this process's environ once per ring, at init. The rule is the one of
 * artemis.ring.format.keep_env_name; a test holds the two together. */

extern char **environ;

static int art_env_keep(const char *entry, size_t name_len) {
    static const char *const prefixes[] = {"NCCL_", "RCCL_", "TORCH_NCCL_", "CUDA_", "HSA_"};
    static const char *const secrets[] = {"KEY", "TOKEN", "SECRET", "PASSWORD"};
    if (name_len >= ARTEMIS_ENV_NAME_MAX) return 0;
    int prefixed = 0;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t n = strlen(prefixes[i]);
        if (name_len >= n && !strncmp(entry, prefixes[i], n)) prefixed = 1;
    }
    if (!prefixed) return 0;
    char upper[ARTEMIS_ENV_NAME_MAX];
    for (size_t i = 0; i < name_len; i++) {
        char c = entry[i];
        upper[i] = (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : c;
    }
    upper[name_len] = '\0';
    for (size_t i = 0; i < sizeof secrets / sizeof secrets[0]; i++)
        if (strstr(upper, secrets[i])) return 0;
    return 1;
}

/* Orders environ entries by name (the bytes before '='). */
static int art_env_cmp(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    for (;; x++, y++) {
        char cx = *x == '=' ? '\0' : *x, cy = *y == '=' ? '\0' : *y;
        if (cx != cy) return (unsigned char)cx < (unsigned char)cy ? -1 : 1;
        if (!cx) return 0;
    }
}

static int art_put(char *buf, size_t *len, const char *a, size_t alen, const char *b, size_t blen) {
    if (*len + alen + blen + 1 > ARTEMIS_ENV_MAX_BYTES) return -1;
    memcpy(buf + *len, a, alen);
    memcpy(buf + *len + alen, b, blen);
    *len += alen + blen;
    buf[(*len)++] = '\0';
    return 0;
}

/* The sidecar's bytes into buf (ARTEMIS_ENV_MAX_BYTES); returns their length. */
static size_t art_env_block(char *buf, const char **kept, size_t cap) {
    size_t len = 0, n = 0;
    char pid[32];
    int pn = snprintf(pid, sizeof pid, "%d", (int)getpid());
    art_put(buf, &len, "artemis-env=1", 13, "", 0);
    art_put(buf, &len, "pid=", 4, pid, (size_t)pn);
    for (char **e = environ; e && *e && n < cap; e++) {
        const char *eq = strchr(*e, '=');
        if (eq && art_env_keep(*e, (size_t)(eq - *e))) kept[n++] = *e;
    }
    qsort(kept, n, sizeof *kept, art_env_cmp);
    if (n > ARTEMIS_ENV_MAX_VARS) n = ARTEMIS_ENV_MAX_VARS;
    for (size_t i = 0; i < n; i++) {
        size_t vlen = strlen(kept[i]);
        if (vlen > (size_t)(strchr(kept[i], '=') - kept[i]) + 1u + ARTEMIS_ENV_VALUE_MAX)
            vlen = (size_t)(strchr(kept[i], '=') - kept[i]) + 1u + ARTEMIS_ENV_VALUE_MAX;
        (void)art_put(buf, &len, "env.", 4, kept[i], vlen); /* one that does not fit: left out */
    }
    return len;
}

/* Writes <ring>.env (temp file, then rename); 0 on success. On any failure
 * nothing is left at that path (an older sidecar included) and the ring goes
 * on without one: a full /dev/shm never costs the job its ring. */
static int art_env_write(const char *ring_path, char *err, size_t errlen) {
    char path[sizeof ((ArtCtx *)0)->path + 8], tmp[sizeof path + 16];
    snprintf(path, sizeof path, "%s.env", ring_path);
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    size_t cap = 0;
    for (char **e = environ; e && *e; e++) cap++;
    char *buf = malloc(ARTEMIS_ENV_MAX_BYTES);
    const char **kept = malloc((cap ? cap : 1) * sizeof *kept);
    int fd = -1, rc = -1;
    if (!buf || !kept) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    size_t len = art_env_block(buf, kept, cap);
    if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
        snprintf(err, errlen, "creating it: %s", strerror(errno));
        goto out;
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            snprintf(err, errlen, "writing it: %s", w < 0 ? strerror(errno) : "short write");
            goto out;
        }
        off += (size_t)w;
    }
    if (fchmod(fd, 0644) != 0 || close(fd) != 0) {
        fd = -1;
        snprintf(err, errlen, "closing it: %s", strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "renaming it into place: %s", strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0) close(fd);
    if (rc != 0) {
        unlink(tmp);
        unlink(path);
    }
    free(kept);
    free(buf);
    return rc;
}

/* mkdir -p with mode 0755; 0 on success. */
static int make_dirs(const char *path) {
    char buf[256];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int art_ring_create(ArtCtx *ctx, const ArtConfig *cfg, uint64_t comm_hash, const char *comm_name,
                    int nnodes, int nranks, int rank, uint32_t plugin_version, char *err,
                    size_t errlen) {
    ctx->lock_fd = -1;
    char job[ARTEMIS_NAME_LEN];
    if (cfg->job[0]) {
        memcpy(job, cfg->job, sizeof job);
    } else {
        snprintf(job, sizeof job, "%016llx", (unsigned long long)comm_hash);
    }
    if (make_dirs(cfg->dir) != 0) {
        snprintf(err, errlen, "cannot create ring folder %s: %s", cfg->dir, strerror(errno));
        return -1;
    }
    int n = snprintf(ctx->path, sizeof ctx->path, "%s/%s.%016llx.r%d.ring", cfg->dir, job,
                     (unsigned long long)comm_hash, rank);
    char tmp[sizeof ctx->path + 16];
    if (n < 0 || (size_t)n >= sizeof ctx->path) {
        snprintf(err, errlen, "ring path too long in %s", cfg->dir);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s/.%s.r%d.XXXXXX", cfg->dir, job, rank);

    size_t bytes = (size_t)ARTEMIS_RING_HEADER_SIZE + (size_t)cfg->slots * ARTEMIS_RING_SLOT_SIZE;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create a file in %s: %s", cfg->dir, strerror(errno));
        return -1;
    }
    void *mem = MAP_FAILED;
    const char *what = NULL;
    int rc = 0;
    /* posix_fallocate, not ftruncate alone: a sparse file on a full tmpfs maps
     * fine, and the first store to an unbacked page then raises SIGBUS inside
     * the training process. Reserving every block first turns a full /dev/shm
     * into an error here (the plugin then stays off for this communicator).
     * The reserved blocks read as zero, like ftruncate's. */
    if (fchmod(fd, 0644) != 0) what = "fchmod", rc = errno;
    else if ((rc = posix_fallocate(fd, 0, (off_t)bytes)) != 0) what = "reserving space for";
    else if ((mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        what = "mmap", rc = errno;
    if (what) {
        snprintf(err, errlen, "%s ring %s (%zu bytes) failed: %s", what, tmp, bytes, strerror(rc));
        close(fd);
        unlink(tmp);
        return -1;
    }
    /* The writer's lock, held by this open file for the process's life (or until
     * finalize removes the ring): the kernel drops it when the process dies, which
     * is how a reader tells a dead writer (artemis_ring.h "Lifetime"). Taken before
     * the rename, so no reader sees the ring without it. */
    uint32_t lock_flag = ARTEMIS_LIFE_FLOCK;
    if (flock(fd, LOCK_SH) != 0) {
        close(fd); /* a file system without flock: the ring goes on, never reclaimed */
        fd = -1;
        lock_flag = 0;
    }
    ctx->lock_fd = fd;
    ctx->keep_rings = cfg->keep_rings;

    /* posix_fallocate gave zeroed blocks: only the header needs filling. */
    ArtemisRingHeader *h = (ArtemisRingHeader *)mem;
    h->magic = ARTEMIS_RING_MAGIC;
    h->version = ARTEMIS_RING_VERSION;
    h->header_size = ARTEMIS_RING_HEADER_SIZE;
    h->slot_size = ARTEMIS_RING_SLOT_SIZE;
    h->capacity = cfg->slots;
    h->rank = rank;
    h->nranks = nranks;
    h->nnodes = nnodes;
    h->pid = (int32_t)getpid();
    h->comm_hash = comm_hash;
    h->clock_kind = cfg->clock_kind;
    h->tick_hz = cfg->tick_hz;
    h->tick_source = cfg->tick_source;
    h->writer_flags = cfg->writer_flags;
    h->life_flags = lock_flag;
    h->nccl_version = cfg->nccl_version;
    h->created_ns = art_now_real();
    h->plugin_version = plugin_version;
    h->minor = ARTEMIS_RING_MINOR;
    h->slot_minor = ARTEMIS_SLOT_MINOR_BASE;
    h->global_rank = art_global_rank();
    memcpy(h->job, job, sizeof h->job);
    snprintf(h->comm_name, sizeof h->comm_name, "%s", comm_name ? comm_name : "");
    if (gethostname(h->host, sizeof h->host - 1) != 0) h->host[0] = '\0';
    h->host[sizeof h->host - 1] = '\0';
    /* Before the ring's rename: a reader that sees the ring sees its sidecar whole. */
    ctx->env_err[0] = '\0';
    if (art_env_write(ctx->path, ctx->env_err, sizeof ctx->env_err) == 0)
        h->writer_flags |= ARTEMIS_WRITER_ENV; /* else init logs env_err; the ring goes on */

    if (rename(tmp, ctx->path) != 0) {
        snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, ctx->path, strerror(errno));
        munmap(mem, bytes);
        unlink(tmp);
        if (ctx->lock_fd >= 0) close(ctx->lock_fd);
        ctx->lock_fd = -1;
        char side[sizeof ctx->path + 8];
        snprintf(side, sizeof side, "%s.env", ctx->path);
        unlink(side);
        return -1;
    }
    ctx->hdr = h;
    ctx->slots = (ArtemisSlot *)((char *)mem + ARTEMIS_RING_HEADER_SIZE);
    ctx->slot_mask = cfg->slots - 1u;
    return 0;
}

/* An agent holds LOCK_EX on <folder>/agent.lock while it serves the folder. */
static int art_agent_serves(const char *ring_path) {
    char lock[sizeof ((ArtCtx *)0)->path + 16];
    const char *slash = strrchr(ring_path, '/');
    int dlen = slash ? (int)(slash - ring_path) : 0;
    snprintf(lock, sizeof lock, "%.*s/agent.lock", dlen, ring_path);
    int fd = open(lock, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0; /* no agent ever served this folder */
    int serves = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* drops our probe's lock with it */
    return serves;
}

int art_ring_retire(ArtCtx *ctx) {
    if (ctx->lock_fd < 0) return 0; /* no writer's lock: an agent cannot reclaim it either */
    char side[sizeof ctx->path + 16];
    snprintf(side, sizeof side, "%s.reader", ctx->path);
    int removed = 0;
    if (!ctx->keep_rings && !art_agent_serves(ctx->path) && access(side, F_OK) != 0) {
        removed = unlink(ctx->path) == 0;
        unlink(side);
        snprintf(side, sizeof side, "%s.env", ctx->path);
        unlink(side);
    }
    close(ctx->lock_fd);
    ctx->lock_fd = -1;
    return removed;
}
