/*
 * plugin_internal.h: private types and declarations shared by the plugin's
 * files: abi.c (exported tables, init), core.c (event callbacks, handles;
 * with codes.h, slot.h, hostclock.h, oppool.h) and ring.c (config, ring
 * creation).
 * Nothing here is part of the ring contract (that is artemis_ring.h).
 */
#ifndef ARTEMIS_PLUGIN_INTERNAL_H
#define ARTEMIS_PLUGIN_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "artemis_ring.h"
#include "nccl_profiler_abi.h"

#define ART_HIDDEN __attribute__((visibility("hidden")))
#define ART_EXPORT __attribute__((visibility("default")))

/* every atomic access names its memory order; these are the short names */
#define RLX memory_order_relaxed
#define ACQ memory_order_acquire
#define REL memory_order_release
#define ACQREL memory_order_acq_rel

/* The slot and header body fields are plain in artemis_ring.h; we access
 * them as same-size atomics (lock-free, naturally aligned). */
#define A32(p) ((_Atomic uint32_t *)(void *)(p))
#define A64(p) ((_Atomic uint64_t *)(void *)(p))

/* 64-bit type tags: the first word of every handle we give NCCL. */
#define ART_TAG_CTX 0x415254435458ULL            /* "ARTCTX" */
#define ART_TAG_OP 0x41525430500000ULL           /* Coll / P2p operation */
#define ART_TAG_KCH 0x4152544b4348ULL            /* KernelCh */
#define ART_TAG_GROUP 0x41525447525000ULL       /* the Group event's static dummy */

/* Channels tracked per operation (one bit each in ArtOp.pend). */
#define ART_MAX_CH 62
#define ART_PEND_CLAIMED (1ULL << 63) /* handle in use */
/* Until round 5 bit 62 was COLL (the Coll/P2p stop not seen yet); the stop
 * now clears ArtOp.cwait instead, with a store. */
#define ART_PEND_WORK ((1ULL << ART_MAX_CH) - 1) /* channel bits */

/* Operations in flight per context (pool size, a power of two). */
#define ART_OP_POOL 512u

/* Reclaim of ops whose KernelCh events never come (see README "Ops that never
 * get device events"): an op is reclaimed once an op ART_RECLAIM_LAG tickets
 * later has completed with device times (one communicator's kernels run in
 * launch order, so its kernel is long done) and it is older than the reclaim
 * age, or, when the pool is exhausted, once it is older than the reclaim age.
 * The scan runs at every ART_RECLAIM_EVERY-th ticket, ART_RECLAIM_STEPS
 * tickets at most (more than it: it keeps up with the starts). */
#define ART_RECLAIM_LAG 64u
#define ART_RECLAIM_AGE_MS 2000u /* default of ARTEMIS_RECLAIM_AGE_MS */
#define ART_RECLAIM_EVERY 8u
#define ART_RECLAIM_STEPS 16u

#define ART_CACHELINE 64

/* Starting threads with a lane of their own in shared mode (ArtCtx.lanes);
 * more use the shared fallbacks (clock_gettime, kch_guess). */
#define ART_LANES 4u
/* Entries of ArtCtx.kch_guess (a power of two). */
#define ART_KCH_GUESS 4u

/* ArtOp.rclm */
#define ART_RCLM_LEAN 0u
#define ART_RCLM_CLAIM 1u
#define ART_RCLM_RMW 2u

/* ArtCtx.fast once the owner's fast path is closed: never a thread key */
#define ART_FAST_OFF ((uintptr_t)1)

/* Entries of the per-context string -> code cache (a power of two). */
#define ART_STRCACHE_BITS 5
#define ART_STRCACHE (1u << ART_STRCACHE_BITS)

struct ArtOp;

typedef struct ArtCh {
    uint64_t tag; /* ART_TAG_KCH */
    struct ArtOp *op;
    uint64_t bit;           /* 1 << (this channel's index), fixed at init */
    _Atomic uint64_t start; /* device start pTimer (0 = none): channels claimed by another
                             * thread than kowner only; kowner's go to ArtOp.kmin */
    _Atomic uint64_t stop;  /* device stop pTimer (0 = none), set by KernelChStop */
} ArtCh;

typedef struct ArtOp {
    uint64_t tag; /* ART_TAG_OP */
    struct ArtCtx *ctx;
    _Atomic uint64_t pend;      /* CLAIMED | channel bits still pending */
    /* 1 while the op waits for its Coll/P2p stop, which then is a release
     * store of 0, not an RMW on pend: the handle is free only when pend and
     * cwait are both 0 (op_claim; README "Recording an operation"). */
    _Atomic uint32_t cwait;
    /* KernelCh channel claims (kch_start in core.c): kowner, fixed at start,
     * is the thread expected to deliver the op's KernelCh events; it takes
     * channels 0, 1, ... with a plain load and store of own_next, any other
     * thread takes nch-1, nch-2, ... with a fetch_add on foreign_next. */
    _Atomic uintptr_t kowner;
    _Atomic uint32_t own_next;
    _Atomic uint32_t foreign_next;
    _Atomic uint64_t own_stopped; /* channel bits the owner has stopped */
    _Atomic uint64_t own_cleared; /* ... and already cleared in pend */
    _Atomic uint64_t own_all;     /* all nch bits once the owner has claimed all nch, else 0 */
    /* kowner's running min of its channels' starts and max of their stops
     * (kowner only; read by the completer after the pend RMWs) */
    _Atomic uint64_t kmin, kmax;
    _Atomic uint32_t nch;       /* channel bits armed at start (0 = host timing) */
    /* The channel owner's last clear without a locked RMW (kch_stop; README
     * "Single writer"), an asymmetric Dekker against the reclaim: kfin, set
     * by kowner before it reads rclm; rclm, ART_RCLM_LEAN at start for an op
     * that may take that path (membarrier available, nch >= 2), ART_RCLM_RMW for one that may not, and ART_RCLM_CLAIM once
     * a reclaimer, which then runs a membarrier and reads kfin, wants it. */
    _Atomic uint32_t kfin;
    _Atomic uint32_t rclm;
    _Atomic uint32_t xstop;     /* 1: a channel was stopped by another thread than kowner */
    ArtemisSlot *slot;
    /* the guess its kowner came from, which a KernelCh start of another thread
     * corrects: ArtCtx.kch_thread (single mode: set at init), its starter's
     * ArtLane.kch, or an ArtCtx.kch_guess entry (a starter without a lane) */
    _Atomic uintptr_t *kguess;
    /* ticket and host_start are read by the reclaim scan of another thread */
    _Atomic uint64_t ticket;
    _Atomic uint64_t host_start; /* CLOCK_MONOTONIC at start */
    uint32_t w4;                /* slot bytes 4..7 (kind func dtype state) */
    uint32_t pad;
    uint64_t w8;                /* slot bytes 8..15 (clock algo proto nchannels peer) */
    ArtCh ch[ART_MAX_CH];
} ArtOp;

/* What the process around the plugin is, found at init (ring.c art_runtime_probe). */
typedef struct ArtRuntime {
    int rccl;              /* RCCL, detected from the process */
    uint32_t nccl_version; /* ncclGetVersion(), 0 = unknown */
    int hip;               /* hipGetDevice + hipDeviceGetAttribute were found */
    int hip_device;        /* current device at init (hip only) */
    uint64_t hip_tick_hz;  /* hipDeviceAttributeWallClockRate x 1000, 0 = not read */
} ArtRuntime;

typedef struct ArtConfig {
    int disabled;          /* ARTEMIS_DISABLE=1 */
    int host_tsc;          /* start times from the TSC (art_tsc_usable, ARTEMIS_HOST_TSC) */
    int plain_start;       /* the owner's slot entry a plain store (ARTEMIS_PLAIN_START, default 1) */
    int device_timing;     /* 1: KernelCh timing, 0: host only */
    uint32_t clock_kind;   /* ARTEMIS_CLOCK_* */
    uint64_t tick_hz;
    uint32_t tick_source;  /* ARTEMIS_TICK_SRC_* */
    uint32_t writer_flags; /* ARTEMIS_WRITER_* */
    uint32_t nccl_version;
    uint64_t reclaim_age_ns; /* ARTEMIS_RECLAIM_AGE_MS */
    uint32_t slots;        /* power of two, clamped */
    int keep_rings;        /* ARTEMIS_KEEP_RINGS=1: finalize never removes the ring */
    char dir[256];
    char job[ARTEMIS_NAME_LEN];
} ArtConfig;

/* CLOCK_MONOTONIC ns from the TSC, for the owner thread's starts (tsc_now in
 * hostclock.h; README "Host clock"): ns = ns0 + (tsc - tsc0) * mult / 2^32, the
 * line re-anchored on a clock_gettime pair every span ticks, its slope
 * measured over a baseline (btsc, bns) up to 2^30 ticks long. Plain fields:
 * only the owner, while single, uses them. */
typedef struct ArtTsc {
    uint64_t tsc0, ns0;   /* anchor (0 = none yet) */
    uint64_t btsc, bns;   /* baseline anchor for the slope */
    uint64_t mult;        /* ns per tick x 2^32, 0 = not measured yet */
    uint64_t span;        /* ticks between anchors */
    uint64_t min_base;    /* baseline ticks needed to (re)measure the slope */
    uint64_t last;        /* last value returned (never go back) */
} ArtTsc;

/* The owner thread's last strings of one kind (Coll, P2p) and what op_start
 * makes of them: the record's kind word, its clock word without nChannels
 * and peer, and the datatype's size (1 if unknown: bytes = count). */
typedef struct ArtMemo {
    const char *func, *dtype, *algo, *proto;
    uint32_t w4;
    uint32_t size;
    uint64_t w8;
} ArtMemo;

/* One starting thread's own state in shared mode (README "Shared mode"): its
 * TSC line, its last strings, the KernelCh thread its ops expect and where
 * its handle claims start. Plain fields (only that thread uses them), except
 * kch, which a KernelCh start of another thread may correct. Lines of their
 * own, so that two starting threads write none in common here. */
typedef struct ArtLane {
    _Alignas(ART_CACHELINE) ArtTsc tsc;
    ArtMemo memo[2];
    _Atomic uintptr_t kch;
    uint32_t claim_at; /* the handle it claimed last (tried first next time) */
} ArtLane;

typedef struct ArtCtx {
    uint64_t tag; /* ART_TAG_CTX */
    ArtemisRingHeader *hdr;
    ArtemisSlot *slots;
    uint64_t slot_mask;
    ArtOp *ops;
    uint32_t nops;
    int device_timing;
    int rank;
    uint64_t reclaim_age_ns;
    uint32_t plugin_version;
    _Atomic uint32_t finished;  /* finalize ran */
    _Atomic uint32_t no_timer;  /* KernelCh never carried timers: use host timing */
    _Atomic uint32_t nch_cap;   /* channels an op may arm: ART_MAX_CH, 0 = host timing
                                 * (device timing off, or no_timer) */
    _Atomic uint32_t timer_seen; /* some KernelCh carried a timer */
    char path[512];
    char env_err[256]; /* why the env sidecar was not written ("" = it was): init logs it */
    int lock_fd;       /* the ring's open file, holding the writer's flock; -1 = none */
    int keep_rings;    /* ArtConfig.keep_rings */
    /* string -> code cache, keyed by pointer (see str_code in codes.h); each
     * entry is one word: (pointer << 8) | (table << 4) | code, 0 = empty.
     * Written only on a miss, so after warm-up its lines are only read. */
    _Alignas(ART_CACHELINE) _Atomic uint64_t strcache[ART_STRCACHE];
    /* reclaim: 1 + highest ticket completed with device times (completers),
     * the next ticket to check (starters) */
    _Alignas(ART_CACHELINE) _Atomic uint64_t dev_mark;
    _Alignas(ART_CACHELINE) _Atomic uint64_t reclaim_cursor;
    /* slot -> op index of the last start that entered it (capacity entries;
     * allocated at init with the pool): finds the op of a lapped in-flight
     * record, and the op of a recent ticket for the reclaim scan (an op still
     * in flight keeps its entry: no later start enters its slot) */
    _Atomic uint16_t *slot_op;
    /* Read at every start, written once or rarely (the switch, finalize):
     * their own line, so that in shared mode, where coll_count moves between
     * the starting threads' caches, reading them misses nothing (round 5). */
    _Alignas(ART_CACHELINE) _Atomic uintptr_t owner; /* thread key of the first Coll/P2p start, 0 = none yet */
    /* owner's key while its starts may take the fast path (op_start: single
     * mode, plain_start, not finished); ART_FAST_OFF once that ends, for good;
     * 0 before the owner's first start */
    _Atomic uintptr_t fast;
    _Atomic uint32_t shared;   /* 1 once another thread started an op: fetch_add from then on */
    /* The switch's asymmetric Dekker (op_start in core.c): the owner sets
     * in_start around each start it makes while shared is 0; the switching
     * thread sets shared, runs a membarrier, sets mb_done; the first start of
     * another thread that then sees in_start 0 sets switched. Until then other
     * threads' starts are dropped. The owner's first start in shared mode
     * sets switched too (the only way if the membarrier failed: mb_failed
     * counts those switches, and the reclaims it stopped). plain_start: the
     * membarrier is available (else the owner's slot entry stays a CAS and
     * these are unused). */
    _Atomic uint32_t mb_done;
    _Atomic uint32_t mb_failed;
    _Atomic uint32_t switched;
    int plain_start;
    int group_dummy;           /* Group gets dummy_group (v4; v7 on NCCL), else NULL (core.c) */
    int host_tsc;              /* tsc below is used */
    /* written on the hot path: own cache lines. coll_count and the header's
     * write_index have one writer while `shared` is 0: the owner thread,
     * which alone writes the rest of this line then. */
    _Alignas(ART_CACHELINE) _Atomic uint64_t coll_count;
    _Atomic uint32_t in_start;
    ArtMemo memo[2];           /* [kind - 1]: Coll, P2p; owner only, while shared is 0 */
    ArtTsc tsc;                /* owner only, while shared is 0 */
    /* thread key of the last KernelCh start that was not its op's expected
     * one: the guess for the next ops (read at every start, rarely written) */
    _Alignas(ART_CACHELINE) _Atomic uintptr_t kch_thread;
    /* in shared mode, the guess of a starting thread without a lane (more
     * than ART_LANES of them), by a hash of its key (kch_guess_slot) */
    _Atomic uintptr_t kch_guess[ART_KCH_GUESS];
    _Alignas(ART_CACHELINE) _Atomic uint32_t hint;
    /* shared mode: the starting threads' lanes, taken once each by a CAS of
     * the thread's key into lane_key (0 = free; never given back), so that
     * the keys' line is only read after that */
    _Alignas(ART_CACHELINE) _Atomic uintptr_t lane_key[ART_LANES];
    ArtLane lanes[ART_LANES];
} ArtCtx;

/* ring.c */
ART_HIDDEN uint64_t art_now_mono(void);
ART_HIDDEN uint64_t art_now_real(void);
/* 1 if the TSC can stand in for CLOCK_MONOTONIC here: x86-64, invariant TSC
 * (constant_tsc and nonstop_tsc) and the kernel's clocksource is tsc. */
ART_HIDDEN int art_tsc_usable(void);
ART_HIDDEN void art_log(ncclDebugLogger_t logfn, ncclDebugLogLevel level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Looks at the library that called init (caller: a code address in it) and at
 * the process: RCCL or NCCL, its version, HIP's wall-clock rate. */
ART_HIDDEN void art_runtime_probe(const void *caller, ArtRuntime *rt);
/* 0 on success; on failure writes one message into err and returns -1. */
ART_HIDDEN int art_config_load(ArtConfig *cfg, const ArtRuntime *rt, char *err, size_t errlen);
ART_HIDDEN int art_ring_create(ArtCtx *ctx, const ArtConfig *cfg, uint64_t comm_hash,
                               const char *comm_name, int nnodes, int nranks, int rank,
                               uint32_t plugin_version, char *err, size_t errlen);
/* At finalize (once): removes the ring and its sidecars when no one will read it
 * (artemis_ring.h "Lifetime"), then drops the writer's lock. 1 when removed. */
ART_HIDDEN int art_ring_retire(ArtCtx *ctx);

/* core.c: the event callbacks of the exported tables (abi.c) */
ART_HIDDEN ncclResult_t art_start_v4(void *context, void **eHandle, ncclProfilerEventDescr_v4_t *d);
ART_HIDDEN ncclResult_t art_start_v5(void *context, void **eHandle, ncclProfilerEventDescr_v5_t *d);
ART_HIDDEN ncclResult_t art_start_v6(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *d);
ART_HIDDEN ncclResult_t art_start_v7(void *context, void **eHandle, ncclProfilerEventDescr_v7_t *d);
ART_HIDDEN ncclResult_t art_stop(void *eHandle);
ART_HIDDEN ncclResult_t art_record(void *eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_t *args);
/* 1 if this process can issue expedited private membarriers (registered once). */
ART_HIDDEN int art_membarrier_register(void);

/* codes.h: string -> code tables (also used by tests through the ring values) */
ART_HIDDEN uint8_t art_func_code(const char *s);
ART_HIDDEN uint8_t art_dtype_code(const char *s);
ART_HIDDEN uint8_t art_algo_code(const char *s);
ART_HIDDEN uint8_t art_proto_code(const char *s);
ART_HIDDEN uint32_t art_dtype_size(uint8_t code);

#endif /* ARTEMIS_PLUGIN_INTERNAL_H */
