/*
 * harness.h: what the harness's files share (see harness.c): the check
 * macro, the workload's and the ring's types, the comm fixture and the event
 * driver (harness_fixture.c), and each file's tests, run by main in order.
 */
#ifndef ARTEMIS_HARNESS_H
#define ARTEMIS_HARNESS_H

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

extern _Atomic int failures;
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

extern char g_root[256];
extern _Atomic int g_log_lines;
void test_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                 const char *fmt, ...);
void keep(void *p);

/* ---- the self-describing workload (every field derived from rank, coll_seq) ---- */
typedef struct {
    uint8_t kind, func, dtype, algo, proto, nch;
    int32_t peer;
    uint64_t bytes;
    const char *func_s, *dtype_s, *algo_s, *proto_s;
    size_t count;
} Expect;

int is_p2p(uint64_t i);
void expect_coll(uint64_t c, int rank, Expect *e);
void expect_p2p(uint64_t c, int rank, int nranks, Expect *e);
uint64_t tstart(int kind, uint64_t c, int rank, unsigned k);
uint64_t tstop(int kind, uint64_t c, int rank, unsigned k);

/* ---- ring reading (the agent's protocol) ---- */

typedef struct {
    uint32_t lock;
    uint8_t kind, func, dtype, state, clock, algo, proto, nchannels;
    int32_t peer;
    uint64_t seq, coll_seq, bytes, enqueue_ns, start, end;
} Rec;

typedef struct {
    const ArtemisRingHeader *hdr;
    const ArtemisSlot *slots;
    size_t bytes;
    int device;   /* expected device timing for ops with channels */
} Ring;

int read_slot(const ArtemisSlot *s, Rec *r);
int map_ring(const char *path, Ring *r);
int check_rec(const Ring *ring, const Rec *r, uint64_t slot_idx, const char *where);

/* ---- communicators and their events ---- */
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

void *start_ev(Comm *cm, int type, void *parent, const Expect *e, uint64_t ptimer, int channel);
void stop_ev(void *h);
void record_ev(void *h, int state, ncclProfilerEventStateArgs_t *a);
void kch_end(void *kh, uint64_t ptimer);
void ring_path(char *out, size_t n, const char *dir, const char *job, uint64_t hash, int rank);
void *init_comm(int version, uint64_t hash, const char *name, int nnodes, int nranks, int rank,
                int *mask);
int finalize_ctx(int version, void *ctx);

/* ---- the single-threaded fixture ---- */
int count_files(const char *dir);
void set_dir(const char *label, char *dir, size_t n);
void clear_env(void);
Comm *fixture(const char *label, int version, uint64_t hash);
Rec slot_rec(Comm *cm, uint64_t ticket);
void coll_expect(uint64_t c, Expect *e, uint8_t nch);
int check_done(const Rec *r, uint64_t c, unsigned nch, const char *where);
void run_coll(Comm *cm, uint64_t c, unsigned nch);
uint64_t mono_ns(void);

/* ---- the tests, one file per group ---- */
/* harness_scenario.c */
void run_scenario(const char *label, int ncomm, const int *versions, uint64_t nops, int nproxy,
                  const char *slots, int device, int expect_drops);
/* harness_failures.c */
void test_retire(void);
void test_failures(void);
/* harness_reclaim.c */
void test_no_device_events(void);
void test_lap_in_flight(void);
void test_kfin_race(void);
/* harness_shared.c */
void test_two_starters(void);
void test_lanes(void);
void test_switch_rounds(void);
void test_switch_in_start(void);
void test_switch_mb_fail(void);
/* harness_host.c */
void test_host_clock(int tsc);
void test_concurrent_init(void);
void test_env_sidecar(void);

#endif
