/*
 * plugin.c: the Artemis NCCL/RCCL profiler plugin (ABI v4..v7).
 *
 * Hot path (startEvent / stopEvent / recordEventState) rules:
 *   - no allocation, no locks, no system calls except one clock_gettime per
 *     Coll/P2p start (an rdtsc on the owner thread, and in shared mode on a
 *     thread with a lane, where the TSC is usable: README "Host clock"), plus
 *     one at completion when host timing is used, plus one membarrier per
 *     context, at its switch to shared mode, and one per reclaim of an op
 *     whose channel owner may clear it without an RMW (README "Single
 *     writer");
 *   - every shared word is a C11 atomic with an explicit memory order;
 *   - every failure (pool full, slot busy, slot overwritten) drops the record
 *     and counts it in header.dropped; nothing ever waits or spins.
 *
 * Operation handle life cycle (ArtOp.pend and ArtOp.cwait):
 *   claim:   pend 0 -> CLAIMED|channel bits, cwait 0 -> 1
 *            (plain stores by the owner in single mode, else a CAS on pend) [startEvent Coll/P2p]
 *   stop:    release store cwait = 0; a host-timed op (no channel bits) is
 *            completed here, by its only completer                  [stopEvent Coll/P2p]
 *   channel: fetch_and ~(1 << k) (acq_rel), or kowner's plain last clear
 *            (kch_stop: an asymmetric Dekker with the reclaim)       [stopEvent KernelCh k]
 *   whoever clears the last channel bit completes the slot, then
 *   release-stores pend = 0; the handle is free once pend and cwait are both 0.
 * A bit that is already clear means "already stopped": stop is idempotent.
 *
 * Lifetime: contexts, handle pools and ring mappings are never freed or
 * unmapped (see README "Lifetime"): late callbacks racing with or following
 * finalize always touch valid memory.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__linux__) && defined(__has_include)
#if __has_include(<linux/membarrier.h>)
#include <linux/membarrier.h>
#define ART_HAVE_MEMBARRIER 1
#endif
#endif

#include "plugin_internal.h"

#define RLX memory_order_relaxed
#define ACQ memory_order_acquire
#define REL memory_order_release
#define ACQREL memory_order_acq_rel

/* ------------------------------------------------------------------ */
/* string -> code                                                      */

static const char *const func_names[] = {
    [ARTEMIS_FUNC_ALLREDUCE] = "AllReduce",   [ARTEMIS_FUNC_ALLGATHER] = "AllGather",
    [ARTEMIS_FUNC_REDUCESCATTER] = "ReduceScatter", [ARTEMIS_FUNC_BROADCAST] = "Broadcast",
    [ARTEMIS_FUNC_REDUCE] = "Reduce",         [ARTEMIS_FUNC_ALLTOALL] = "AlltoAll",
    [ARTEMIS_FUNC_GATHER] = "Gather",         [ARTEMIS_FUNC_SCATTER] = "Scatter",
    [ARTEMIS_FUNC_SEND] = "Send",             [ARTEMIS_FUNC_RECV] = "Recv",
    [ARTEMIS_FUNC_SENDRECV] = "SendRecv",
};
static const char *const dtype_names[] = {
    [ARTEMIS_DT_INT8] = "ncclInt8",       [ARTEMIS_DT_UINT8] = "ncclUint8",
    [ARTEMIS_DT_INT32] = "ncclInt32",     [ARTEMIS_DT_UINT32] = "ncclUint32",
    [ARTEMIS_DT_INT64] = "ncclInt64",     [ARTEMIS_DT_UINT64] = "ncclUint64",
    [ARTEMIS_DT_FLOAT16] = "ncclFloat16", [ARTEMIS_DT_FLOAT32] = "ncclFloat32",
    [ARTEMIS_DT_FLOAT64] = "ncclFloat64", [ARTEMIS_DT_BFLOAT16] = "ncclBfloat16",
    [ARTEMIS_DT_FP8E4M3] = "ncclFloat8e4m3", [ARTEMIS_DT_FP8E5M2] = "ncclFloat8e5m2",
};
static const uint8_t dtype_sizes[] = {
    [ARTEMIS_DT_INT8] = 1,    [ARTEMIS_DT_UINT8] = 1,   [ARTEMIS_DT_INT32] = 4,
    [ARTEMIS_DT_UINT32] = 4,  [ARTEMIS_DT_INT64] = 8,   [ARTEMIS_DT_UINT64] = 8,
    [ARTEMIS_DT_FLOAT16] = 2, [ARTEMIS_DT_FLOAT32] = 4, [ARTEMIS_DT_FLOAT64] = 8,
    [ARTEMIS_DT_BFLOAT16] = 2, [ARTEMIS_DT_FP8E4M3] = 1, [ARTEMIS_DT_FP8E5M2] = 1,
};
static const char *const algo_names[] = {
    [ARTEMIS_ALGO_TREE] = "TREE", [ARTEMIS_ALGO_RING] = "RING",
    [ARTEMIS_ALGO_COLLNET_DIRECT] = "COLLNET_DIRECT", [ARTEMIS_ALGO_COLLNET_CHAIN] = "COLLNET_CHAIN",
    [ARTEMIS_ALGO_NVLS] = "NVLS", [ARTEMIS_ALGO_NVLS_TREE] = "NVLS_TREE", [ARTEMIS_ALGO_PAT] = "PAT",
};
static const char *const proto_names[] = {
    [ARTEMIS_PROTO_LL] = "LL", [ARTEMIS_PROTO_LL128] = "LL128", [ARTEMIS_PROTO_SIMPLE] = "SIMPLE",
};

/* The guess (from length and one or two characters) is confirmed by one strcmp. */
static inline uint8_t confirm(const char *s, const char *const *names, uint8_t code) {
    return (code && !strcmp(s, names[code])) ? code : 0;
}

uint8_t art_func_code(const char *s) {
    if (!s) return 0;
    uint8_t c = 0;
    switch (strlen(s)) {
    case 4: c = s[0] == 'S' ? ARTEMIS_FUNC_SEND : ARTEMIS_FUNC_RECV; break;
    case 6: c = s[0] == 'R' ? ARTEMIS_FUNC_REDUCE : ARTEMIS_FUNC_GATHER; break;
    case 7: c = ARTEMIS_FUNC_SCATTER; break;
    case 8: c = s[0] == 'A' ? ARTEMIS_FUNC_ALLTOALL : ARTEMIS_FUNC_SENDRECV; break;
    case 9:
        c = s[0] == 'B' ? ARTEMIS_FUNC_BROADCAST
            : s[3] == 'R' ? ARTEMIS_FUNC_ALLREDUCE : ARTEMIS_FUNC_ALLGATHER;
        break;
    case 13: c = ARTEMIS_FUNC_REDUCESCATTER; break;
    default: return 0;
    }
    return confirm(s, func_names, c);
}

uint8_t art_dtype_code(const char *s) {
    if (!s) return 0;
    uint8_t c = 0;
    switch (strlen(s)) {
    case 8: c = ARTEMIS_DT_INT8; break;
    case 9:
        c = s[4] == 'U' ? ARTEMIS_DT_UINT8 : s[7] == '3' ? ARTEMIS_DT_INT32 : ARTEMIS_DT_INT64;
        break;
    case 10: c = s[8] == '3' ? ARTEMIS_DT_UINT32 : ARTEMIS_DT_UINT64; break;
    case 11:
        c = s[9] == '1' ? ARTEMIS_DT_FLOAT16 : s[9] == '3' ? ARTEMIS_DT_FLOAT32 : ARTEMIS_DT_FLOAT64;
        break;
    case 12: c = ARTEMIS_DT_BFLOAT16; break;
    case 14: c = s[11] == '4' ? ARTEMIS_DT_FP8E4M3 : ARTEMIS_DT_FP8E5M2; break;
    default: return 0;
    }
    return confirm(s, dtype_names, c);
}

uint8_t art_algo_code(const char *s) {
    if (!s) return 0;
    uint8_t c = 0;
    switch (strlen(s)) {
    case 3: c = ARTEMIS_ALGO_PAT; break;
    case 4: c = s[0] == 'T' ? ARTEMIS_ALGO_TREE : s[0] == 'R' ? ARTEMIS_ALGO_RING : ARTEMIS_ALGO_NVLS; break;
    case 9: c = ARTEMIS_ALGO_NVLS_TREE; break;
    case 13: c = ARTEMIS_ALGO_COLLNET_CHAIN; break;
    case 14: c = ARTEMIS_ALGO_COLLNET_DIRECT; break;
    default: return 0;
    }
    return confirm(s, algo_names, c);
}

uint8_t art_proto_code(const char *s) {
    if (!s) return 0;
    uint8_t c = 0;
    switch (strlen(s)) {
    case 2: c = ARTEMIS_PROTO_LL; break;
    case 5: c = ARTEMIS_PROTO_LL128; break;
    case 6: c = ARTEMIS_PROTO_SIMPLE; break;
    default: return 0;
    }
    return confirm(s, proto_names, c);
}

uint32_t art_dtype_size(uint8_t code) {
    return code < sizeof dtype_sizes ? dtype_sizes[code] : 0;
}

/* The same lookups through the context's cache, keyed by the pointer.
 *
 * NCCL and RCCL pass string literals with static lifetime (the results of
 * ncclFuncToString, ncclDatatypeToString, ncclAlgoToString and
 * ncclProtoToString; the Python stand-in keeps its strings for the process
 * lifetime too), so one pointer always names the same text and its code can
 * be remembered. An entry is one word, (pointer << 8) | (table << 4) | code,
 * written with a relaxed store: a thread sees a whole entry or none, and an
 * entry that names another pointer or table is a miss. A miss does the normal
 * lookup and overwrites the entry (direct-mapped, so two hot strings that hash
 * alike only cost slow lookups). Pointers above 2^56 bypass the cache. */
enum { ART_STR_FUNC = 0, ART_STR_DTYPE = 1, ART_STR_ALGO = 2, ART_STR_PROTO = 3 };

static inline uint8_t str_code_slow(const char *s, uint32_t table) {
    switch (table) {
    case ART_STR_FUNC: return art_func_code(s);
    case ART_STR_DTYPE: return art_dtype_code(s);
    case ART_STR_ALGO: return art_algo_code(s);
    default: return art_proto_code(s);
    }
}

static inline uint8_t str_code(ArtCtx *ctx, const char *s, uint32_t table) {
    uint64_t p = (uint64_t)(uintptr_t)s;
    if (!p) return 0;
    if (p >> 56) return str_code_slow(s, table);
    uint64_t key = (p << 8) | ((uint64_t)table << 4);
    /* two-way: the pair of entries at an even index (the four hot strings of a
     * collective shared one direct-mapped set often enough to miss every op) */
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - ART_STRCACHE_BITS)) & ~1u;
    _Atomic uint64_t *e = &ctx->strcache[h];
    uint64_t v = atomic_load_explicit(&e[0], RLX);
    if ((v & ~(uint64_t)0xf) == key) return (uint8_t)(v & 0xf);
    v = atomic_load_explicit(&e[1], RLX);
    if ((v & ~(uint64_t)0xf) == key) return (uint8_t)(v & 0xf);
    uint8_t c = str_code_slow(s, table); /* every code is below 16 */
    /* the newest entry goes first; the older one moves to the second way */
    atomic_store_explicit(&e[1], atomic_load_explicit(&e[0], RLX), RLX);
    atomic_store_explicit(&e[0], key | c, RLX);
    return c;
}

/* ------------------------------------------------------------------ */
/* slot access: the body fields are plain in artemis_ring.h; we access  */
/* them as same-size atomics (lock-free, naturally aligned).            */

#define A32(p) ((_Atomic uint32_t *)(void *)(p))
#define A64(p) ((_Atomic uint64_t *)(void *)(p))

/* Seqlock, with one rule that makes most of it plain stores: a start never
 * overwrites an in-flight record (README "Slot writers"). So while a record is
 * in flight its completer (one per op: whoever clears its last pend bit) is the
 * slot's only writer and enters with a plain store of the odd value; a start
 * enters only a slot whose record is whole and DONE (or empty), whose writers
 * have all left, and takes it with a CAS from the even value it checked, which
 * excludes only other starts (several starting threads, or the ring lapping
 * during the single -> shared switch). A start that finds the record in flight
 * drops its own record (counted), without writing.
 *
 * No fence follows an odd store: every body store is a release store (BODY
 * below), which orders the odd lock value before it; a reader that
 * acquire-loads any body value therefore sees the odd value or a later one
 * when it loads the lock again. These are plain release/acquire pairs on the
 * same words, which ThreadSanitizer models (it does not model
 * atomic_thread_fence). On x86-64 a release store is a plain mov; on aarch64
 * it is an stlr per body word. */
#define BODY memory_order_release

/* state byte of the kind word (slot bytes 4..7) */
static inline uint8_t w4_state(uint32_t w4) {
    uint8_t b[4];
    memcpy(b, &w4, 4);
    return b[3];
}

/* Start: enters slot s for ticket if its record is whole, not in flight and
 * not newer than ticket: returns 1. Never spins: 0 if busy or newer, 2 if the
 * record of ticket *held is in flight. */
static inline int seq_enter_start(ArtemisSlot *s, uint64_t ticket, uint32_t *odd, uint64_t *held,
                                  int alone) {
    uint32_t v = atomic_load_explicit(A32(&s->lock), ACQ);
    if (v & 1u) return 0;
    /* acquire: a body value read here was written after that writer's odd store */
    uint32_t w4 = atomic_load_explicit(A32(&s->kind), ACQ);
    uint64_t seq = atomic_load_explicit(A64(&s->seq), ACQ);
    if (atomic_load_explicit(A32(&s->lock), RLX) != v) return 0; /* torn: a writer came */
    if (seq > ticket) return 0;
    if (w4_state(w4) == ARTEMIS_STATE_IN_FLIGHT) {
        *held = seq;
        return 2;
    }
    /* alone: no other start can run on this context now (README "Single
     * writer"), and no completer enters a DONE record: a plain store, as a
     * completion's. Otherwise the CAS excludes the other starts. */
    if (alone) atomic_store_explicit(A32(&s->lock), v + 1u, RLX);
    else if (!atomic_compare_exchange_strong_explicit(A32(&s->lock), &v, v + 1u, ACQ, RLX)) return 0;
    *odd = v + 1u;
    return 1;
}

/* Completion: the in-flight record's only writer (see above). */
static inline int seq_enter_own(ArtemisSlot *s, uint32_t *odd) {
    uint32_t v = atomic_load_explicit(A32(&s->lock), RLX);
    if (v & 1u) return 0; /* cannot happen under the rule; never write into a writer */
    atomic_store_explicit(A32(&s->lock), v + 1u, RLX);
    *odd = v + 1u;
    return 1;
}

/* Seqlock exit: release store of the next even value. */
static inline void seq_leave(ArtemisSlot *s, uint32_t odd) {
    atomic_store_explicit(A32(&s->lock), odd + 1u, REL);
}

static inline void count_drop(ArtCtx *ctx) {
    atomic_fetch_add_explicit(A64(&ctx->hdr->dropped), 1, RLX);
}

static inline uint32_t pack4(uint8_t kind, uint8_t func, uint8_t dtype, uint8_t state) {
    uint8_t b[4] = {kind, func, dtype, state};
    uint32_t v;
    memcpy(&v, b, sizeof v);
    return v;
}

static inline uint64_t pack8(uint8_t clock, uint8_t algo, uint8_t proto, uint8_t nch, int32_t peer) {
    struct { uint8_t b[4]; int32_t peer; } x = {{clock, algo, proto, nch}, peer};
    uint64_t v;
    memcpy(&v, &x, sizeof v);
    return v;
}

/* offsets of state (in w4) and clock (in w8) as bytes */
static inline uint32_t with_state(uint32_t w4, uint8_t state) {
    uint8_t b[4];
    memcpy(b, &w4, 4);
    b[3] = state;
    memcpy(&w4, b, 4);
    return w4;
}
static inline uint64_t with_clock(uint64_t w8, uint8_t clock) {
    uint8_t b[8];
    memcpy(b, &w8, 8);
    b[0] = clock;
    memcpy(&w8, b, 8);
    return w8;
}
/* w8 (nchannels and peer zero) with its nchannels and peer bytes */
static inline uint64_t w8_with(uint64_t w8, uint8_t nch, int32_t peer) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return w8 | ((uint64_t)nch << 24) | ((uint64_t)(uint32_t)peer << 32);
#else
    uint8_t b[8];
    memcpy(b, &w8, 8);
    return pack8(b[0], b[1], b[2], nch, peer);
#endif
}

/* ------------------------------------------------------------------ */
/* host clock: CLOCK_MONOTONIC ns from the TSC (README "Host clock")     */

#define ART_TSC_PAIR_MAX (1ull << 11) /* widest (rdtsc, clock_gettime, rdtsc) pair kept */
#define ART_TSC_SPAN (1ull << 25)     /* ticks between anchors (~10 ms at 3 GHz) */
#define ART_TSC_BASE0 (1ull << 22)    /* first slope after ~1.4 ms (at 3 GHz) */
#define ART_TSC_BASE1 (1ull << 28)    /* later slopes over >= ~90 ms ... */
#define ART_TSC_BASEMAX (1ull << 30)  /* ... and the baseline restarts after ~0.35 s */

static inline uint64_t rdtsc(void) {
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#else
    return 0; /* never called: art_tsc_usable is 0 off x86-64 */
#endif
}

/* A new anchor from one clock_gettime between two TSC reads (their midpoint),
 * kept only if the pair is tight (no preemption inside it); the slope is
 * measured against the baseline once that is long enough. Returns the clock
 * read, never less than the last value returned. Rare: once per span. */
static __attribute__((noinline)) uint64_t tsc_anchor(ArtTsc *c) {
    uint64_t a = rdtsc();
    uint64_t ns = art_now_mono();
    uint64_t b = rdtsc();
    if (b >= a && b - a <= ART_TSC_PAIR_MAX) {
        uint64_t mid = a + ((b - a) >> 1);
        if (c->btsc == 0 || mid <= c->btsc || ns <= c->bns) {
            c->btsc = mid, c->bns = ns; /* first pair, or the TSC went back: start over */
            c->min_base = ART_TSC_BASE0;
            if (mid <= c->tsc0) c->mult = 0;
        } else {
            uint64_t dt = mid - c->btsc, dn = ns - c->bns;
            if (dt >= c->min_base && dn < (1ull << 31)) {
                uint64_t m = (dn << 32) / dt;
                if (m > 0 && m < (1ull << 34)) c->mult = m; /* a TSC of 0.25 GHz or faster */
            }
            if (dt >= ART_TSC_BASEMAX || dn >= (1ull << 31)) {
                c->btsc = mid, c->bns = ns; /* the slope stands; measure a fresh one */
                c->min_base = ART_TSC_BASE1;
            }
        }
        c->tsc0 = mid, c->ns0 = ns;
        c->span = c->mult ? ART_TSC_SPAN : 0;
    }
    if (ns < c->last) ns = c->last;
    c->last = ns;
    return ns;
}

/* (tsc - tsc0) < span <= 2^25 and mult < 2^34: the product fits in 64 bits. */
static inline uint64_t tsc_now(ArtTsc *c) {
    uint64_t d = rdtsc() - c->tsc0;
    if (d >= c->span) return tsc_anchor(c); /* span 0 until the slope is known */
    uint64_t ns = c->ns0 + ((d * c->mult) >> 32);
    if (ns < c->last) ns = c->last;
    c->last = ns;
    return ns;
}

/* ------------------------------------------------------------------ */
/* The Group event's handle under ABI v4, and v7 on NCCL: a static dummy,
 * never recycled, whose stop does nothing. NCCL 2.27 (ABI v4) starts a plan's
 * Coll/P2p events only when the Group handle is not NULL
 * (ncclProfilerStartTaskEvents), so it must be one there. NCCL 2.28-2.30
 * (ABI v5, v6) no longer gate them on it (only pass it as parentGroup), so
 * v5 and v6 get NULL, and NCCL makes no Group stop call. RCCL's
 * ncclProfilerStartTaskEvents (v6 and v7 loaders, README "Which NCCL/RCCL
 * version emits which events") does not gate on it either: RCCL gets NULL
 * on v5..v7. v7 on NCCL (2.31, whose own source was not read) keeps it.
 * GroupApi, CollApi, P2pApi and KernelLaunch get NULL: NCCL gates nothing on
 * them and never calls stop or record on a NULL handle, so those calls are
 * not made at all (README "API-level events"). */

typedef struct { uint64_t tag; } ArtDummy;
static ArtDummy dummy_group = {ART_TAG_GROUP};

/* ------------------------------------------------------------------ */
/* operations                                                           */

static inline uintptr_t thread_key(void);

/* A handle is free when pend and cwait are both 0: its channels (or the
 * reclaim) and its Coll/P2p stop are all done (ArtOp.cwait). */
static inline int op_free(ArtOp *op) {
    return atomic_load_explicit(&op->pend, ACQ) == 0 && atomic_load_explicit(&op->cwait, ACQ) == 0;
}

/* A starting thread's entry in ArtCtx.kch_guess. */
static inline uint32_t kch_guess_slot(uintptr_t key) {
    return (uint32_t)(((uint64_t)(key >> 12) * 0x9E3779B97F4A7C15ULL) >> 62) & (ART_KCH_GUESS - 1u);
}

/* plain: the caller is the only thread that can claim now (the owner, alone
 * in single mode: op_start_body), and only starters claim, so a free handle
 * (pend 0, released with a release store) can be taken with a plain store,
 * starting at the shared hint. Otherwise by CAS, starting at a place of the
 * caller's own (its lane's last handle, or by its key: threads' keys are far
 * apart), so that two starting threads do not fight over the same handles.
 * Either way the op then waits for its Coll/P2p stop on cwait. */
static __attribute__((noinline)) ArtOp *op_claim_scan(ArtCtx *ctx, uint64_t pend, int plain,
                                                     ArtLane *lane) {
    uint32_t n = ctx->nops;
    uint32_t h = plain ? atomic_load_explicit(&ctx->hint, RLX)
                 : lane ? lane->claim_at
                        : (uint32_t)((thread_key() >> 12) * 0x9E3779B1u) & ~15u;
    for (uint32_t i = 0; i < n; i++) { /* a full scan happens only when nearly exhausted */
        uint32_t idx = (h + i) & (n - 1u);
        ArtOp *op = &ctx->ops[idx];
        if (!op_free(op)) continue;
        if (plain) {
            atomic_store_explicit(&op->pend, pend, RLX);
            atomic_store_explicit(&op->cwait, 1u, RLX);
            atomic_store_explicit(&ctx->hint, idx + 1u, RLX);
            return op;
        }
        uint64_t e = 0;
        if (!atomic_compare_exchange_strong_explicit(&op->pend, &e, pend, ACQ, RLX)) continue;
        /* pend went 0 -> ours, but between the check and the CAS the handle may
         * have served another op whose channels are done and whose stop has
         * not come (its claimer's cwait store is visible: it came before that
         * op's completion released pend, which the CAS read): not free, give
         * it back untouched */
        if (atomic_load_explicit(&op->cwait, ACQ)) {
            atomic_store_explicit(&op->pend, 0, REL);
            continue;
        }
        atomic_store_explicit(&op->cwait, 1u, RLX);
        /* a lane tries this handle first next time: freed by then, it is
         * still in this core's cache */
        if (lane) lane->claim_at = idx;
        return op;
    }
    return NULL;
}

static inline __attribute__((always_inline)) ArtOp *op_claim(ArtCtx *ctx, uint64_t pend,
                                                             int plain, ArtLane *lane) {
    if (plain) {
        /* the hint: usually the handle the last completion released */
        uint32_t idx = atomic_load_explicit(&ctx->hint, RLX) & (ART_OP_POOL - 1u);
        ArtOp *op = &ctx->ops[idx];
        if (__builtin_expect(op_free(op), 1)) {
            atomic_store_explicit(&op->pend, pend, RLX);
            atomic_store_explicit(&op->cwait, 1u, RLX);
            atomic_store_explicit(&ctx->hint, idx + 1u, RLX);
            return op;
        }
    }
    return op_claim_scan(ctx, pend, plain, lane);
}

/* Returns the handle to the pool and points the hint at it, so the next claim
 * reuses a handle that is still in this core's cache. */
static inline void op_release(ArtOp *op) {
    ArtCtx *ctx = op->ctx;
    atomic_store_explicit(&op->pend, 0, REL);
    if (!atomic_load_explicit(&ctx->shared, RLX))
        atomic_store_explicit(&ctx->hint, (uint32_t)(op - ctx->ops), RLX);
}

static inline void count_host_fallback(ArtCtx *ctx) {
    atomic_fetch_add_explicit(A64(&ctx->hdr->host_fallback), 1, RLX);
}

/* reclaimed: the op's KernelCh events never came; it completes as a host record
 * with start = end = its enqueue time (no duration is known), counted. */
static inline __attribute__((always_inline)) void op_complete_body(ArtOp *op, int reclaimed) {
    ArtCtx *ctx = op->ctx;
    uint32_t nch = atomic_load_explicit(&op->nch, RLX);
    uint64_t start = UINT64_MAX, end = 0;
    uint8_t clock = ARTEMIS_REC_DEVICE;
    uint64_t ticket = atomic_load_explicit(&op->ticket, RLX);
    if (reclaimed) {
        start = end = atomic_load_explicit(&op->host_start, RLX);
        clock = ARTEMIS_REC_HOST;
        count_host_fallback(ctx);
    } else if (nch) {
        /* the claimed channels: [0, own) by kowner, whose starts and stops it
         * folded into kmin / kmax, and [nch - foreign, nch) by other threads,
         * with their times per channel (they meet exactly when nch KernelCh
         * came; overlap only with extra ones) */
        start = atomic_load_explicit(&op->kmin, RLX);
        end = atomic_load_explicit(&op->kmax, RLX);
        uint32_t foreign = atomic_load_explicit(&op->foreign_next, RLX);
        if (foreign > nch) foreign = nch;
        uint32_t k = nch - foreign;
        if (atomic_load_explicit(&op->xstop, RLX)) {
            /* some of kowner's channels were stopped by another thread: their
             * stops are only in the channel */
            uint32_t own = atomic_load_explicit(&op->own_next, RLX);
            for (uint32_t j = 0; j < own && j < nch; j++) {
                uint64_t e = atomic_load_explicit(&op->ch[j].stop, RLX);
                if (e > end) end = e;
            }
        }
        for (; k < nch; k++) {
            uint64_t s = atomic_load_explicit(&op->ch[k].start, RLX);
            uint64_t e = atomic_load_explicit(&op->ch[k].stop, RLX);
            if (s && s < start) start = s;
            if (e > end) end = e;
        }
    }
    if (reclaimed) {
    } else if (!nch || start == UINT64_MAX || end == 0) {
        /* host timing: configured, no channels, or KernelCh without timers */
        if (nch && !atomic_load_explicit(&ctx->timer_seen, RLX)) {
            atomic_store_explicit(&ctx->no_timer, 1u, RLX);
            atomic_store_explicit(&ctx->nch_cap, 0u, RLX); /* later ops: host timing */
        }
        start = atomic_load_explicit(&op->host_start, RLX);
        end = art_now_mono();
        if (end < start) end = start; /* a TSC start can run a little ahead */
        clock = ARTEMIS_REC_HOST;
    } else {
        if (!atomic_load_explicit(&ctx->timer_seen, RLX))
            atomic_store_explicit(&ctx->timer_seen, 1u, RLX);
        /* The device has run this op: older ops still waiting for KernelCh may be
         * reclaimed. A hint, moved in steps of at least 16 tickets (an understated
         * mark only delays a reclaim) so that most completions only read its line. */
        if (atomic_load_explicit(&ctx->dev_mark, RLX) + 16u <= ticket + 1u)
            atomic_store_explicit(&ctx->dev_mark, ticket + 1u, RLX);
    }

    ArtemisSlot *s = op->slot;
    uint32_t odd;
    /* the record stays ours until we complete it (no start overwrites an
     * in-flight record): the check only guards against a broken invariant */
    if (atomic_load_explicit(A64(&s->seq), RLX) != ticket || !seq_enter_own(s, &odd)) {
        count_drop(ctx);
    } else {
        atomic_store_explicit(A32(&s->kind), with_state(op->w4, ARTEMIS_STATE_DONE), BODY);
        atomic_store_explicit(A64(&s->clock), with_clock(op->w8, clock), BODY);
        atomic_store_explicit(A64(&s->start), start, BODY);
        atomic_store_explicit(A64(&s->end), end, BODY);
        seq_leave(s, odd);
    }
    op_release(op);
}

/* Out of line: inlined into kch_stop, it made every channel stop save and
 * restore more registers (measured: 5 more instructions per channel). */
static __attribute__((noinline)) ncclResult_t op_complete(ArtOp *op, int reclaimed) {
    op_complete_body(op, reclaimed);
    return ncclSuccess;
}

/* A claimed op whose Coll/P2p stop came (cwait 0) but whose channel bits are
 * still armed. */
static inline int pend_waits(ArtOp *op, uint64_t e) {
    return (e & ART_PEND_CLAIMED) && (e & ART_PEND_WORK) && !atomic_load_explicit(&op->cwait, ACQ);
}

/* 1 if op (still ticket t) had its Coll/P2p stop but waits for KernelCh events. */
static inline int waits_for_channels(ArtOp *op, uint64_t t) {
    return pend_waits(op, atomic_load_explicit(&op->pend, RLX)) &&
           atomic_load_explicit(&op->ticket, RLX) == t;
}

/* Takes over the completion of such an op: clears all its bits in one CAS (a
 * KernelCh stop racing with it either wins, and completes the op itself, or
 * finds its bit clear). by_ticket: only if the op still holds want_ticket. */
static int art_membarrier(void);

static int op_reclaim(ArtOp *op, uint64_t want_ticket, int by_ticket) {
    uint64_t e = atomic_load_explicit(&op->pend, ACQ);
    if (!pend_waits(op, e)) return 0;
    if (by_ticket && atomic_load_explicit(&op->ticket, RLX) != want_ticket) return 0;
    if (atomic_load_explicit(&op->rclm, RLX) != ART_RCLM_RMW) {
        /* The channel owner may clear its bits with a plain store (kch_stop):
         * the slow side of that Dekker. After the membarrier, an owner that
         * had not yet read rclm sees CLAIM (and takes the RMW, which the CAS
         * below excludes), and one that had is visible in kfin: leave the op
         * to it. Without the barrier the owner cannot be excluded: no reclaim. */
        atomic_store_explicit(&op->rclm, ART_RCLM_CLAIM, RLX);
        if (!art_membarrier()) {
            atomic_fetch_add_explicit(&op->ctx->mb_failed, 1u, RLX);
            return 0;
        }
        if (atomic_load_explicit(&op->kfin, ACQ)) return 0;
    }
    if (!atomic_compare_exchange_strong_explicit(&op->pend, &e, ART_PEND_CLAIMED, ACQREL, RLX))
        return 0;
    op_complete(op, 1);
    return 1;
}

/* Called at each Coll/P2p start with the new ticket and its clock read: walks
 * the cursor over tickets at least ART_RECLAIM_LAG older than the newest op
 * completed with device times, a few per call. An op still waiting for
 * KernelCh there is reclaimed once it is older than the reclaim age; until then
 * the cursor waits on it. No timer thread: the next op of the communicator
 * does it. */
static __attribute__((noinline)) void reclaim_walk(ArtCtx *ctx, uint64_t ticket, uint64_t now,
                                                   uint64_t mark, uint64_t c0) {
    uint64_t c = c0;
    /* the slot -> op map holds the last capacity tickets (and every op still
     * in flight); older ones: the lap and pool-age reclaims */
    uint64_t window = ctx->slot_mask + 1u;
    if (c + window <= ticket) c = ticket - window + 1u;
    for (uint32_t i = 0; i < ART_RECLAIM_STEPS && c + ART_RECLAIM_LAG < mark; i++, c++) {
        /* most tickets are done: their slot says so (an in-flight record
         * keeps its ticket and state until its completer writes it, so a
         * waiting op is never skipped here) */
        const ArtemisSlot *s = &ctx->slots[c & ctx->slot_mask];
        if (atomic_load_explicit(A64(&s->seq), RLX) != c ||
            w4_state(atomic_load_explicit(A32(&s->kind), RLX)) != ARTEMIS_STATE_IN_FLIGHT)
            continue;
        ArtOp *op = &ctx->ops[atomic_load_explicit(&ctx->slot_op[c & ctx->slot_mask], RLX)];
        if (!waits_for_channels(op, c)) continue; /* its Coll/P2p stop has not come */
        if (atomic_load_explicit(&op->host_start, RLX) + ctx->reclaim_age_ns > now)
            break; /* too young: look again at the next scan */
        op_reclaim(op, c, 1);
    }
    if (c != c0) atomic_store_explicit(&ctx->reclaim_cursor, c, RLX);
}

static inline void reclaim_scan(ArtCtx *ctx, uint64_t ticket, uint64_t now) {
    uint64_t mark = atomic_load_explicit(&ctx->dev_mark, RLX);
    uint64_t c0 = atomic_load_explicit(&ctx->reclaim_cursor, RLX);
    if (c0 + ART_RECLAIM_LAG < mark) reclaim_walk(ctx, ticket, now, mark, c0);
}

/* The pool is exhausted: reclaim every op that still waits for KernelCh events
 * after the reclaim age. Runs only when a start would otherwise be dropped. */
static void reclaim_aged(ArtCtx *ctx) {
    uint64_t now = art_now_mono();
    for (uint32_t i = 0; i < ctx->nops; i++) {
        ArtOp *op = &ctx->ops[i];
        if (atomic_load_explicit(&op->host_start, RLX) + ctx->reclaim_age_ns <= now)
            op_reclaim(op, 0, 0);
    }
}

/* An address unique to the calling thread: its thread pointer (one register
 * read on x86-64 and aarch64), else a thread-local's address. */
static inline uintptr_t thread_key(void) {
#if defined(__x86_64__) || defined(__aarch64__)
    return (uintptr_t)__builtin_thread_pointer();
#else
    static _Thread_local char anchor;
    return (uintptr_t)&anchor;
#endif
}

/* ------------------------------------------------------------------ */
/* the single -> shared switch (README "Single writer")                 */

/* 1 if this process can issue expedited private membarriers (registered once). */
static int art_membarrier_register(void) {
#ifdef ART_HAVE_MEMBARRIER
    static _Atomic int state; /* 0 unknown, 1 yes, 2 no */
    int st = atomic_load_explicit(&state, ACQ);
    if (st == 0) {
        st = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 1 : 2;
        atomic_store_explicit(&state, st, REL);
    }
    return st == 1;
#else
    return 0;
#endif
}

#ifdef ART_TEST_HOOKS
/* the harness only (tests/harness.c test_switch_mb_fail): both membarriers fail */
_Atomic int art_test_membarrier_fail;
#endif

/* A full memory barrier on every running thread of the process: the slow
 * side of an asymmetric Dekker whose fast side (the owner's start) has only a
 * compiler barrier. Once per context, at its switch to shared mode. Returns 1
 * if one of the two membarriers succeeded; 0 leaves the switch to the owner's
 * acknowledgement (op_start). */
static __attribute__((noinline)) int art_membarrier(void) {
#ifdef ART_TEST_HOOKS
    if (atomic_load(&art_test_membarrier_fail)) return 0;
#endif
#ifdef ART_HAVE_MEMBARRIER
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return 1;
    return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0;
#else
    return 0;
#endif
}

static inline void op_start_body(ArtCtx *ctx, void **eHandle, uint8_t kind, const char *func,
                                 const char *dtype, size_t count, uint8_t nChannels,
                                 const char *algo, const char *proto, int peer, int single,
                                 int alone, int fastp, ArtLane *lane);

#ifdef ART_TEST_HOOKS
/* the harness only (tests/harness.c test_switch_in_start): called by the
 * owner's plain start between the load and the store of its ticket */
void (*_Atomic art_test_ticket_hook)(void);
/* the harness reads these of a context's private fields */
uint32_t art_test_mb_failed(void *context);
int art_test_plain_start(void *context);
uint32_t art_test_mb_failed(void *context) {
    return atomic_load(&((ArtCtx *)context)->mb_failed);
}
int art_test_plain_start(void *context) { return ((ArtCtx *)context)->plain_start; }
/* lanes taken so far (README "Shared mode") */
uint32_t art_test_lanes(void *context);
uint32_t art_test_lanes(void *context) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < ART_LANES; i++) n += atomic_load(&((ArtCtx *)context)->lane_key[i]) != 0;
    return n;
}
#define ART_TICKET_HOOK()                                                      \
    do {                                                                       \
        void (*hook_)(void) = atomic_load(&art_test_ticket_hook);              \
        if (alone && hook_) hook_();                                           \
    } while (0)
/* called by the channel owner's plain last clear (kch_stop) at three places:
 * 0 before kfin, 1 between kfin and rclm, 2 after rclm (its plain path) */
void (*_Atomic art_test_kfin_hook)(int where);
#define ART_KFIN_HOOK(w)                                                       \
    do {                                                                       \
        void (*khook_)(int) = atomic_load(&art_test_kfin_hook);                \
        if (khook_) khook_(w);                                                 \
    } while (0)
#else
#define ART_TICKET_HOOK() ((void)0)
#define ART_KFIN_HOOK(w) ((void)0)
#endif

/* A start of another thread than the owner before the switch is safe: its
 * record is dropped (counted), its collective still counted in coll_seq. */
static __attribute__((noinline)) void op_start_drop(ArtCtx *ctx, uint8_t kind) {
    if (kind == ARTEMIS_KIND_COLL) atomic_fetch_add_explicit(&ctx->coll_count, 1, RLX);
    count_drop(ctx);
}

/* The owner's acknowledgement of the switch: it has seen shared, so its
 * plain starts have all ended (they came before this one on this thread) and
 * none comes again; the release store publishes their writes. The switch's
 * only proof where the membarrier failed, and a shortcut otherwise. Shared
 * mode only (out of line: the single mode pays one predicted branch). */
static __attribute__((noinline)) void owner_ack(ArtCtx *ctx) {
    if (ctx->plain_start && !atomic_load_explicit(&ctx->switched, RLX))
        atomic_store_explicit(&ctx->switched, 1u, REL);
}

/* The calling thread's lane in shared mode (README "Shared mode"): found by
 * its key, or taken with one CAS at its first start there; NULL once all
 * ART_LANES are taken by other threads. */
static ArtLane *lane_of(ArtCtx *ctx, uintptr_t me) {
    for (uint32_t i = 0; i < ART_LANES; i++) {
        uintptr_t k = atomic_load_explicit(&ctx->lane_key[i], RLX);
        if (k == me) return &ctx->lanes[i];
        if (k == 0 &&
            atomic_compare_exchange_strong_explicit(&ctx->lane_key[i], &k, me, RLX, RLX)) {
            /* its claims start in a part of the pool of its own */
            ctx->lanes[i].claim_at = i * (ctx->nops / ART_LANES);
            return &ctx->lanes[i];
        }
    }
    return NULL;
}

/* Every start but the owner's in single mode (README "Single writer"): the
 * context's first start, other threads' starts and the switch to shared
 * mode, the owner's starts in shared mode, without membarrier
 * (plain_start 0), and after finalize. Out of line: op_start's fast path
 * stays small. */
static __attribute__((noinline)) void op_start_slow(ArtCtx *ctx, void **eHandle, uint8_t kind,
                                                    const char *func, const char *dtype,
                                                    size_t count, uint8_t nChannels,
                                                    const char *algo, const char *proto,
                                                    int peer) {
    /* NCCL starts one communicator's Coll/P2p events from one thread at a time
     * (the one launching its plans), so the counter, the ticket, the handle
     * claim and the slot entry have one writer: plain loads and stores, no
     * locked instruction. The first start from another thread switches the
     * context for good to fetch_add and CAS (see README "Single writer"). */
    uintptr_t me = thread_key();
    uintptr_t own = atomic_load_explicit(&ctx->owner, RLX);
    if (own == 0) {
        uintptr_t zero = 0;
        own = atomic_compare_exchange_strong_explicit(&ctx->owner, &zero, me, RLX, RLX) ? me : zero;
    }
    int plain = ctx->plain_start, marked = 0, single = 0;
    if (own == me) {
        if (plain && !atomic_load_explicit(&ctx->shared, RLX)) {
            /* The fast side: in_start, then shared, with only a compiler
             * barrier between them; the switching thread's membarrier makes it
             * a full one. */
            atomic_store_explicit(&ctx->in_start, 1u, RLX);
            atomic_signal_fence(memory_order_seq_cst);
            marked = 1;
        }
        single = !atomic_load_explicit(&ctx->shared, RLX);
        if (__builtin_expect(!single, 0)) {
            owner_ack(ctx);
        } else if (marked && !atomic_load_explicit(&ctx->finished, RLX) &&
                   atomic_load_explicit(&ctx->fast, RLX) == 0) {
            /* open the fast path for the owner's next starts; the CAS fails
             * if the switch (or finalize) has closed it meanwhile */
            uintptr_t zero = 0;
            atomic_compare_exchange_strong_explicit(&ctx->fast, &zero, me, RLX, RLX);
        }
    } else {
        if (!atomic_load_explicit(&ctx->shared, RLX) &&
            atomic_exchange_explicit(&ctx->shared, 1u, ACQREL) == 0) {
            /* close the owner's fast path before the membarrier: its starts
             * read fast where the slow path reads shared (op_start) */
            atomic_store_explicit(&ctx->fast, ART_FAST_OFF, RLX);
            if (plain) {
                /* the slow side: after it, every owner start that had not yet
                 * read shared (or fast) sees it set, and one that had is
                 * visible in in_start. Should both membarriers fail, in_start
                 * proves nothing: mb_done stays 0, and this context's other
                 * threads' starts are dropped (counted) until the owner's next
                 * start acknowledges (above), for good if it never starts
                 * again. */
                if (art_membarrier()) atomic_store_explicit(&ctx->mb_done, 1u, REL);
                else atomic_fetch_add_explicit(&ctx->mb_failed, 1u, RLX);
            }
        }
        if (plain && !atomic_load_explicit(&ctx->switched, ACQ)) {
            /* a start of the owner that saw shared == 0 may still be writing
             * (plain ticket, claim and slot entry): this start writes nothing */
            if (!atomic_load_explicit(&ctx->mb_done, ACQ) ||
                atomic_load_explicit(&ctx->in_start, ACQ)) {
                op_start_drop(ctx, kind);
                return;
            }
            atomic_store_explicit(&ctx->switched, 1u, REL);
        }
    }
    op_start_body(ctx, eHandle, kind, func, dtype, count, nChannels, algo, proto, peer, single,
                  marked && single, 0, single ? NULL : lane_of(ctx, me));
    if (marked) atomic_store_explicit(&ctx->in_start, 0u, REL);
}

/* The owner's start in single mode, the common case: one load of fast
 * stands for the slow path's owner, shared, plain_start and finished checks.
 * The Dekker read of the switch is the second load of fast (the switching
 * thread closes it before its membarrier, op_start_slow), with in_start set
 * before it as in the slow path. */
static inline __attribute__((always_inline)) void op_start(ArtCtx *ctx, void **eHandle,
                                                           uint8_t kind, const char *func,
                                                           const char *dtype, size_t count,
                                                           uint8_t nChannels, const char *algo,
                                                           const char *proto, int peer) {
    if (!ctx || ctx->tag != ART_TAG_CTX) return;
    uintptr_t me = thread_key();
    if (__builtin_expect(atomic_load_explicit(&ctx->fast, RLX) == me, 1)) {
        atomic_store_explicit(&ctx->in_start, 1u, RLX);
        atomic_signal_fence(memory_order_seq_cst);
        int go = atomic_load_explicit(&ctx->fast, RLX) == me;
        if (__builtin_expect(go, 1))
            op_start_body(ctx, eHandle, kind, func, dtype, count, nChannels, algo, proto, peer, 1,
                          1, 1, NULL);
        atomic_store_explicit(&ctx->in_start, 0u, REL);
        if (__builtin_expect(go, 1)) return;
    }
    op_start_slow(ctx, eHandle, kind, func, dtype, count, nChannels, algo, proto, peer);
}

/* The pool is exhausted: reclaim aged ops and try again (rare). */
static __attribute__((noinline)) ArtOp *op_claim_after_reclaim(ArtCtx *ctx, uint64_t pend,
                                                               int plain, ArtLane *lane) {
    reclaim_aged(ctx);
    ArtOp *op = op_claim(ctx, pend, plain, lane);
    if (!op) count_drop(ctx);
    return op;
}

/* The start found its slot busy (1 if it entered after all): the ring has
 * lapped an op still in flight. If it only waits for its KernelCh (its
 * Coll/P2p stop came) and is older than the reclaim age, reclaim it now, as
 * the scan would (README "Slot writers"): it completes as a host record, and
 * this start takes the slot. Younger, its KernelCh may still come (and would
 * land on a recycled handle). Otherwise (busy, in flight, or a later ticket's:
 * a tiny ring) the start keeps the slot's record, gives its handle back and
 * counts the drop. Rare, out of line. */
static __attribute__((noinline)) int op_start_lap(ArtCtx *ctx, ArtOp *op, ArtemisSlot *s,
                                                  uint64_t ticket, uint64_t now, uint32_t *odd,
                                                  int in, uint64_t held, int alone) {
    if (in == 2) {
        ArtOp *old = &ctx->ops[atomic_load_explicit(&ctx->slot_op[ticket & ctx->slot_mask], RLX)];
        if (old != op && atomic_load_explicit(&old->host_start, RLX) + ctx->reclaim_age_ns <= now &&
            op_reclaim(old, held, 1))
            in = seq_enter_start(s, ticket, odd, &held, alone);
    }
    if (in == 1) return 1;
    /* the handle goes back unused: no Coll/P2p stop will come for it */
    op_release(op);
    atomic_store_explicit(&op->cwait, 0u, REL);
    count_drop(ctx);
    return 0;
}

/* single: the owner, in single mode (plain ticket, claim, counter); alone:
 * single and no other start can run now (the slot entry is a plain store);
 * fastp: op_start's fast path (finalize closes it, so finished is not read);
 * lane: the caller's lane in shared mode (NULL in single mode, or without) */
static inline __attribute__((always_inline)) void op_start_body(
    ArtCtx *ctx, void **eHandle, uint8_t kind, const char *func, const char *dtype, size_t count,
    uint8_t nChannels, const char *algo, const char *proto, int peer, int single, int alone,
    int fastp, ArtLane *lane) {
    uint64_t cseq;
    /* shared: one RMW, no load before it (that would fetch the line shared,
     * then again for the RMW) */
    if (kind == ARTEMIS_KIND_COLL && !single) {
        cseq = atomic_fetch_add_explicit(&ctx->coll_count, 1, RLX);
    } else {
        cseq = atomic_load_explicit(&ctx->coll_count, RLX);
        if (kind == ARTEMIS_KIND_COLL) atomic_store_explicit(&ctx->coll_count, cseq + 1u, RLX);
    }
    if (!fastp && atomic_load_explicit(&ctx->finished, RLX)) return;

    /* nch_cap: 0 with host timing (configured, or KernelCh without timers) */
    uint32_t cap = atomic_load_explicit(&ctx->nch_cap, RLX);
    uint32_t nch = nChannels < cap ? nChannels : cap;
    if (kind == ARTEMIS_KIND_P2P && nch && peer == ctx->rank) {
        /* NCCL gives a self Send/Recv nChannels >= 1 but no proxy op, so no
         * KernelCh ever follows (addP2pToPlan, 2.27-2.30): time it on the host. */
        count_host_fallback(ctx);
        nch = 0;
    }
    /* the Coll/P2p stop waits on cwait (op_claim), not in pend */
    uint64_t pend = ART_PEND_CLAIMED | ((1ULL << nch) - 1u);
    /* a plain claim only alone: without membarrier (plain_start 0) another
     * thread's CAS claim may run beside the owner's single-mode start */
    ArtOp *op = op_claim(ctx, pend, alone, lane);
    if (__builtin_expect(!op, 0)) {
        op = op_claim_after_reclaim(ctx, pend, alone, lane);
        if (!op) return;
    }
    /* the owner's starts, and in shared mode those of a thread with a lane,
     * read the TSC (README "Host clock") */
    uint64_t now = !ctx->host_tsc ? art_now_mono()
                   : single       ? tsc_now(&ctx->tsc)
                   : lane         ? tsc_now(&lane->tsc)
                                  : art_now_mono();
    /* shared mode: the ticket now, so that its slot's line, most likely last
     * written by another thread, is on its way while the handle is set up */
    uint64_t ticket = 0;
    if (!single) {
        ticket = atomic_fetch_add_explicit(A64(&ctx->hdr->write_index), 1, RLX);
        __builtin_prefetch(&ctx->slots[ticket & ctx->slot_mask], 1, 3);
    }
    /* The owner's last four strings of this kind and what they make: a
     * training loop repeats the same collective, so four pointer compares
     * replace four cache lookups and the packing of the record's words.
     * Plain fields: only the owner, while single, writes them. After the
     * switch (with membarrier) they are frozen, and every start may read
     * them: no start of another thread runs before the owner's last
     * single-mode start has ended (switched, acquire), so its writes are
     * visible; without membarrier no such edge exists, so only single. */
    uint32_t w4, size;
    uint64_t w8;
    ArtMemo *m = lane ? &lane->memo[kind - 1u] : &ctx->memo[kind - 1u];
    if ((single || lane || ctx->plain_start) && m->func == func && m->dtype == dtype &&
        m->algo == algo && m->proto == proto) {
        w4 = m->w4, size = m->size, w8 = m->w8;
    } else {
        uint8_t fc = str_code(ctx, func, ART_STR_FUNC);
        uint8_t dc = str_code(ctx, dtype, ART_STR_DTYPE);
        uint8_t ac = str_code(ctx, algo, ART_STR_ALGO);
        uint8_t pc = str_code(ctx, proto, ART_STR_PROTO);
        w4 = pack4(kind, fc, dc, ARTEMIS_STATE_IN_FLIGHT);
        size = dc ? art_dtype_size(dc) : 1u; /* unknown: bytes = count */
        w8 = pack8(ARTEMIS_REC_HOST, ac, pc, 0, 0);
        if (single || lane) *m = (ArtMemo){func, dtype, algo, proto, w4, size, w8};
    }
    uint64_t bytes = (uint64_t)count * size;
    w8 = w8_with(w8, nChannels, (int32_t)peer);
    /* the expected KernelCh thread: the context's guess; with several starting
     * threads, the guess kept for this one, in its lane (0 at first: the op's
     * first KernelCh start takes it with a CAS, and becomes the guess) */
    _Atomic uintptr_t *g = &ctx->kch_thread;
    if (!single) {
        /* stored only here: a handle starts with kch_thread (init), and once
         * the context is shared no start is single again */
        g = lane ? &lane->kch : &ctx->kch_guess[kch_guess_slot(thread_key())];
        op->kguess = g;
    }
    atomic_store_explicit(&op->kowner, atomic_load_explicit(g, RLX), RLX);
    atomic_store_explicit(&op->own_next, 0, RLX);
    atomic_store_explicit(&op->foreign_next, 0, RLX);
    atomic_store_explicit(&op->own_stopped, 0, RLX);
    atomic_store_explicit(&op->own_cleared, 0, RLX);
    atomic_store_explicit(&op->own_all, 0, RLX);
    atomic_store_explicit(&op->kmin, UINT64_MAX, RLX);
    atomic_store_explicit(&op->kmax, 0, RLX);
    atomic_store_explicit(&op->xstop, 0, RLX);
    atomic_store_explicit(&op->kfin, 0, RLX);
    /* the owner's plain last clear needs the reclaimer's membarrier (fastp
     * implies plain_start) and nch >= 2 (kch_stop) */
    atomic_store_explicit(&op->rclm, (fastp || ctx->plain_start) && nch >= 2 ? ART_RCLM_LEAN
                                                                             : ART_RCLM_RMW,
                          RLX);
    atomic_store_explicit(&op->nch, nch, RLX);
    atomic_store_explicit(&op->host_start, now, RLX);
    op->w4 = w4;
    op->w8 = w8;

    if (single) {
        ticket = atomic_load_explicit(A64(&ctx->hdr->write_index), RLX);
        ART_TICKET_HOOK();
        atomic_store_explicit(A64(&ctx->hdr->write_index), ticket + 1u, RLX);
    }
    atomic_store_explicit(&op->ticket, ticket, RLX);
    /* One scanner: the owner (in shared mode too), so the cursor has one
     * writer; alone, at every ART_RECLAIM_EVERY-th ticket (it scans more
     * tickets than that each time), in shared mode at each of its starts (its
     * tickets need not fall on those). */
    if (single ? (ticket & (ART_RECLAIM_EVERY - 1u)) == 0
               : atomic_load_explicit(&ctx->owner, RLX) == thread_key())
        reclaim_scan(ctx, ticket, now);
    ArtemisSlot *s = &ctx->slots[ticket & ctx->slot_mask];
    /* The next op will most likely take the next slot: start fetching its line
     * for writing now, so its seqlock entry does not wait for memory. */
    if (single) __builtin_prefetch(&ctx->slots[(ticket + 1u) & ctx->slot_mask], 1, 3);
    uint32_t odd;
    uint64_t held = 0;
    int in = seq_enter_start(s, ticket, &odd, &held, alone);
    if (__builtin_expect(in != 1, 0) &&
        !op_start_lap(ctx, op, s, ticket, now, &odd, in, held, alone))
        return;
    atomic_store_explicit(&ctx->slot_op[ticket & ctx->slot_mask], (uint16_t)(op - ctx->ops), RLX);
    atomic_store_explicit(A32(&s->kind), w4, BODY);
    atomic_store_explicit(A64(&s->clock), w8, BODY);
    atomic_store_explicit(A64(&s->seq), ticket, BODY);
    atomic_store_explicit(A64(&s->coll_seq), cseq, BODY);
    atomic_store_explicit(A64(&s->bytes), bytes, BODY);
    atomic_store_explicit(A64(&s->enqueue_ns), now, BODY);
    atomic_store_explicit(A64(&s->start), 0, BODY);
    atomic_store_explicit(A64(&s->end), 0, BODY);
    seq_leave(s, odd);
    op->slot = s;
    *eHandle = op;
}

/* once per op: out of line, so that art_stop stays small for KernelCh */
static __attribute__((noinline)) ncclResult_t op_stop(ArtOp *op) {
    /* The stop takes no part in the completion unless the op is host-timed
     * (no channel bits: the stop is its only completer); a device-timed op is
     * completed by its channels (or the reclaim), before or after this. The
     * stop only lets the handle go back to the pool (op_free), with a
     * release store: no locked RMW. cwait 0: already stopped, or a free
     * handle. */
    if (!atomic_load_explicit(&op->cwait, RLX)) return ncclSuccess;
    if (!atomic_load_explicit(&op->nch, RLX)) op_complete(op, 0);
    atomic_store_explicit(&op->cwait, 0u, REL);
    return ncclSuccess;
}

/* The claim of the owner of op's channels (kowner: plain load and store). */
static inline __attribute__((always_inline)) ArtCh *kch_claim_own(ArtOp *op, uint32_t nch,
                                                                  uint64_t pTimer) {
    /* kowner keeps the min of its channels' starts itself (its fields have
     * one writer): op_complete reads no per-channel start of them */
    uint32_t k = atomic_load_explicit(&op->own_next, RLX);
    if (k >= nch) return NULL; /* more channels than announced (or beyond ART_MAX_CH) */
    atomic_store_explicit(&op->own_next, k + 1u, RLX);
    if (k + 1u == nch) /* all claimed: its stops are deferred to the last one */
        atomic_store_explicit(&op->own_all, (2ULL << (nch - 1u)) - 1u, RLX);
    if (pTimer && pTimer < atomic_load_explicit(&op->kmin, RLX))
        atomic_store_explicit(&op->kmin, pTimer, RLX);
    ArtCh *ch = &op->ch[k];
    atomic_store_explicit(&ch->stop, 0, RLX);
    return ch;
}

/* A KernelCh start of another thread than the op's expected one, or of an op
 * with no expected thread yet: out of line (NCCL delivers one communicator's
 * KernelCh from one thread, so the guess is right after the first ops). */
static ArtCh *kch_claim_other(ArtOp *op, uint32_t nch, uintptr_t me, uintptr_t ko,
                              uint64_t pTimer) {
    if (!nch) return NULL; /* host-timed */
    if (ko == 0) {
        /* no guess (the context's first ops, or several starting threads):
         * the op's first KernelCh start takes it with one CAS */
        uintptr_t zero = 0;
        ko = atomic_compare_exchange_strong_explicit(&op->kowner, &zero, me, RLX, RLX) ? me : zero;
        if (ko == me) {
            /* the guess for the next ops of the same starting thread (in
             * single mode only if none was taken meanwhile) */
            _Atomic uintptr_t *g = op->kguess;
            uintptr_t cur = atomic_load_explicit(g, RLX);
            if (cur != me && (cur == 0 || g != &op->ctx->kch_thread))
                atomic_store_explicit(g, me, RLX);
            return kch_claim_own(op, nch, pTimer);
        }
    }
    /* any other thread: fetch_add from the top, and it becomes the guess for
     * later ops (of the op's starting thread, in shared mode) */
    _Atomic uintptr_t *guess = op->kguess;
    if (atomic_load_explicit(guess, RLX) != me) atomic_store_explicit(guess, me, RLX);
    uint32_t j = atomic_fetch_add_explicit(&op->foreign_next, 1, RLX);
    if (j >= nch) return NULL;
    ArtCh *ch = &op->ch[nch - 1u - j];
    atomic_store_explicit(&ch->start, pTimer, RLX);
    atomic_store_explicit(&ch->stop, 0, RLX);
    return ch;
}

/* tail-called from startEvent, which then needs no frame of its own */
static __attribute__((noinline)) ncclResult_t kch_start_other(void **eHandle, ArtOp *op,
                                                              uint32_t nch, uintptr_t me,
                                                              uintptr_t ko, uint64_t pTimer) {
    *eHandle = kch_claim_other(op, nch, me, ko, pTimer);
    return ncclSuccess;
}

/* inlined into each startEvent: nChannels calls per op */
static inline __attribute__((always_inline)) ncclResult_t kch_start(void **eHandle, void *parent,
                                                                   uint64_t pTimer) {
    if (!parent || *(const uint64_t *)parent != ART_TAG_OP) {
        *eHandle = NULL;
        return ncclSuccess;
    }
    ArtOp *op = (ArtOp *)parent;
    /* nch 0: a host-timed operation (the owner's k >= nch covers it) */
    uint32_t nch = atomic_load_explicit(&op->nch, RLX);
    /* NCCL delivers a communicator's KernelCh events from one thread (the
     * proxy thread; in 2.31 the profiler thread). op_start names the thread
     * that started the context's last KernelCh as the op's channel owner:
     * that thread claims with a plain load and store (kch_claim_own). */
    uintptr_t me = thread_key(), ko = atomic_load_explicit(&op->kowner, RLX);
    if (__builtin_expect(ko == me, 1)) {
        *eHandle = kch_claim_own(op, nch, pTimer);
        return ncclSuccess;
    }
    return kch_start_other(eHandle, op, nch, me, ko, pTimer);
}

/* The last channel bit of op cleared by this thread. If kowner claimed all
 * nch channels of an op that may take its plain last clear (rclm LEAN), and
 * this is another thread, its channel was an extra KernelCh sharing one of
 * kowner's (NCCL sends none): kowner completes the op at its last stop
 * (kch_stop), without reading pend, so this one must not. */
static __attribute__((noinline)) ncclResult_t op_complete_last(ArtOp *op) {
    if (atomic_load_explicit(&op->rclm, RLX) == ART_RCLM_LEAN &&
        atomic_load_explicit(&op->own_all, RLX) &&
        atomic_load_explicit(&op->kowner, RLX) != thread_key())
        return ncclSuccess;
    return op_complete(op, 0);
}

/* Clears the channel bits `bits` of op; whoever clears the last work bit
 * completes it. Bits already clear mean "already stopped". */
static inline ncclResult_t clear_channels(ArtOp *op, uint64_t bits) {
    uint64_t old = atomic_fetch_and_explicit(&op->pend, ~bits, ACQREL);
    if (!(old & bits)) return ncclSuccess; /* already stopped (or reclaimed) */
    /* a tail call: art_stop needs no frame of its own */
    if ((old & ART_PEND_WORK & ~bits) == 0) return op_complete_last(op);
    return ncclSuccess;
}

static inline ncclResult_t kch_stop(ArtCh *ch) {
    ArtOp *op = ch->op;
    uint64_t bit = ch->bit;
    if (atomic_load_explicit(&op->kowner, RLX) != thread_key()) {
        /* its stop time stays in the channel: op_complete reads it there */
        if (!atomic_load_explicit(&op->xstop, RLX)) atomic_store_explicit(&op->xstop, 1u, RLX);
        return clear_channels(op, bit);
    }
    /* The channel owner. Once it has claimed all nch channels, no other thread
     * holds one of this op's channels (another thread's claim beyond them is
     * an extra event, which shares a slot), so it defers its bits and clears
     * them all with one RMW at its last stop: NCCL's proxy loop starts every
     * channel of an op before it stops them (src/transport/profiler.cc), so
     * that is one RMW per op instead of one per channel. Before that (starts
     * and stops interleaved, or channels on several threads) each stop clears
     * at once. own_stopped and own_cleared have one writer: the owner. */
    uint64_t stopped = atomic_load_explicit(&op->own_stopped, RLX);
    if (stopped & bit) return ncclSuccess; /* already stopped */
    stopped |= bit;
    atomic_store_explicit(&op->own_stopped, stopped, RLX);
    uint64_t t = atomic_load_explicit(&ch->stop, RLX); /* its KernelChStop's pTimer */
    if (t > atomic_load_explicit(&op->kmax, RLX)) atomic_store_explicit(&op->kmax, t, RLX);
    uint64_t all = atomic_load_explicit(&op->own_all, RLX);
    /* deferred to the last stop; all is 0 until every channel is claimed, and
     * then nothing defers (stopped & 0 == 0) */
    if ((stopped & all) != all) return ncclSuccess;
    uint64_t cleared = atomic_load_explicit(&op->own_cleared, RLX);
    atomic_store_explicit(&op->own_cleared, stopped, RLX);
    uint64_t bits = stopped & ~cleared;
    if (all && !cleared && atomic_load_explicit(&op->rclm, RLX) == ART_RCLM_LEAN) {
        /* The last clear without a locked RMW (all != 0: kowner claimed all
         * nch channels and has now stopped them all; with all == 0 each stop
         * clears at once). pend's other writers: the Coll/P2p stop (none: it
         * stores cwait); other threads' channels (none under NCCL's one
         * KernelCh per channel; an extra one shares a channel of kowner's,
         * and op_complete_last leaves such an op to kowner); kowner's own
         * earlier clears (none: !cleared, all nch bits still set); and the
         * reclaim, excluded by this Dekker's fast side: kfin, a compiler
         * barrier, then rclm (the reclaimer stores CLAIM, runs a membarrier,
         * then reads kfin: op_reclaim). So pend needs no store here: the
         * completion's release of pend frees the handle. */
        ART_KFIN_HOOK(0);
        atomic_store_explicit(&op->kfin, 1u, RLX);
        atomic_signal_fence(memory_order_seq_cst);
        ART_KFIN_HOOK(1);
        if (__builtin_expect(atomic_load_explicit(&op->rclm, RLX) == ART_RCLM_LEAN, 1)) {
            ART_KFIN_HOOK(2);
            return op_complete(op, 0);
        }
    }
    return clear_channels(op, bits);
}

/* ------------------------------------------------------------------ */
/* entry points                                                         */

/* One startEvent per descriptor version; the union arms we read have the
 * same offsets in v4..v7 (v5+ only append members). */
#define ART_DEFINE_START(N)                                                                    \
    /* Coll / P2p: out of line, so that startEvent stays small for KernelCh */                 \
    static __attribute__((noinline)) ncclResult_t art_op_start_v##N(                         \
        void *context, void **eHandle, ncclProfilerEventDescr_v##N##_t *d) {                   \
        *eHandle = NULL; /* op_start sets it only when it records */                           \
        if (d->type == ncclProfileColl)                                                        \
            op_start((ArtCtx *)context, eHandle, ARTEMIS_KIND_COLL, d->coll.func,              \
                     d->coll.datatype, d->coll.count, d->coll.nChannels, d->coll.algo,         \
                     d->coll.proto, -1);                                                       \
        else                                                                                   \
            op_start((ArtCtx *)context, eHandle, ARTEMIS_KIND_P2P, d->p2p.func,                \
                     d->p2p.datatype, d->p2p.count, d->p2p.nChannels, NULL, NULL, d->p2p.peer); \
        return ncclSuccess;                                                                    \
    }                                                                                          \
    static ncclResult_t art_start_v##N(void *context, void **eHandle,                          \
                                       ncclProfilerEventDescr_v##N##_t *d) {                   \
        if (!eHandle) return ncclSuccess;                                                      \
        if (!d) {                                                                              \
            *eHandle = NULL;                                                                   \
            return ncclSuccess;                                                                \
        }                                                                                      \
        uint64_t type = (uint64_t)d->type;                                                     \
        /* tail calls: no frame here */                                                        \
        if (type == ncclProfileKernelCh) /* the most frequent: nChannels per op */             \
            return kch_start(eHandle, d->parentObj, d->kernelCh.pTimer);                       \
        if (type == ncclProfileColl || type == ncclProfileP2p)                                 \
            return art_op_start_v##N(context, eHandle, d);                                     \
        if (type == ncclProfileGroup &&                                                        \
            (N == 4 || (context && ((ArtCtx *)context)->group_dummy)))                         \
            *eHandle = &dummy_group;                                                           \
        else /* GroupApi, CollApi, P2pApi, KernelLaunch, others: NULL */                       \
            *eHandle = NULL;                                                                   \
        return ncclSuccess;                                                                    \
    }

ART_DEFINE_START(4)
ART_DEFINE_START(5)
ART_DEFINE_START(6)
ART_DEFINE_START(7)

static ncclResult_t art_stop(void *eHandle) {
    if (!eHandle) return ncclSuccess;
    uint64_t tag = *(const uint64_t *)eHandle;
    if (tag == ART_TAG_KCH) return kch_stop((ArtCh *)eHandle); /* nChannels per op */
    if (tag == ART_TAG_OP) return op_stop((ArtOp *)eHandle);
    return ncclSuccess;
}

static ncclResult_t art_record(void *eHandle, ncclProfilerEventState_t eState,
                               ncclProfilerEventStateArgs_t *args) {
    /* separate tests: GCC turns one && chain into setcc arithmetic */
    if (__builtin_expect(eState != ncclProfilerKernelChStop, 0)) return ncclSuccess;
    if (__builtin_expect(!eHandle, 0)) return ncclSuccess;
    if (__builtin_expect(*(const uint64_t *)eHandle != ART_TAG_KCH, 0)) return ncclSuccess;
    if (__builtin_expect(!args, 0)) return ncclSuccess;
    atomic_store_explicit(&((ArtCh *)eHandle)->stop, args->kernelCh.pTimer, RLX);
    return ncclSuccess;
}

static ncclResult_t art_finalize(void *context) {
    ArtCtx *ctx = (ArtCtx *)context;
    if (!ctx || ctx->tag != ART_TAG_CTX) return ncclSuccess;
    /* the owner's next start takes the slow path, which reads finished */
    atomic_store_explicit(&ctx->fast, ART_FAST_OFF, RLX);
    if (atomic_exchange_explicit(&ctx->finished, 1u, ACQREL) == 0) {
        atomic_store_explicit(A64(&ctx->hdr->finished_ns), art_now_real(), RLX);
        atomic_fetch_or_explicit(A32(&ctx->hdr->flags), (uint32_t)ARTEMIS_RING_FINISHED, REL);
    }
    /* Nothing is freed or unmapped: see README "Lifetime". */
    return ncclSuccess;
}

/* ------------------------------------------------------------------ */
/* init                                                                 */

static void set_mask(int *mask, int value) {
    if (mask) atomic_store_explicit((_Atomic int *)(void *)mask, value, RLX);
}

/* caller: the return address of the init call, inside NCCL or RCCL. */
static ncclResult_t art_init(void **context, int *mask, const char *comm_name, uint64_t comm_hash,
                             int nnodes, int nranks, int rank, ncclDebugLogger_t logfn,
                             uint32_t version, const void *caller) {
    if (context) *context = NULL;
    char err[512];
    ArtConfig cfg;
    ArtRuntime rt;
    art_runtime_probe(caller, &rt);
    if (art_config_load(&cfg, &rt, err, sizeof err) != 0) {
        set_mask(mask, 0);
        art_log(logfn, NCCL_LOG_WARN, "Artemis profiler: %s; disabled for comm %016llx rank %d",
                err, (unsigned long long)comm_hash, rank);
        return ncclSuccess;
    }
    if (cfg.disabled) {
        set_mask(mask, 0);
        art_log(logfn, NCCL_LOG_INFO, "Artemis profiler: ARTEMIS_DISABLE set; off for comm %016llx rank %d",
                (unsigned long long)comm_hash, rank);
        return ncclSuccess;
    }
    set_mask(mask, ncclProfileColl | ncclProfileP2p | (cfg.device_timing ? ncclProfileKernelCh : 0));
    if (!context) {
        art_log(logfn, NCCL_LOG_WARN, "Artemis profiler: init without a context pointer; disabled");
        return ncclSuccess;
    }

    ArtCtx *ctx = NULL;
    ArtOp *ops = NULL;
    /* the slot -> op map: one entry per slot (lap and scan reclaims) */
    void *so = NULL;
    if (posix_memalign((void **)&ctx, ART_CACHELINE, sizeof *ctx) != 0 ||
        posix_memalign((void **)&ops, ART_CACHELINE, (size_t)ART_OP_POOL * sizeof *ops) != 0 ||
        posix_memalign(&so, ART_CACHELINE,
                       ((size_t)cfg.slots * sizeof(uint16_t) + 63u) & ~(size_t)63u) != 0) {
        free(ops);
        free(ctx);
        art_log(logfn, NCCL_LOG_WARN, "Artemis profiler: out of memory; disabled for comm %016llx rank %d",
                (unsigned long long)comm_hash, rank);
        return ncclSuccess;
    }
    memset(ctx, 0, sizeof *ctx);
    memset(ops, 0, (size_t)ART_OP_POOL * sizeof *ops);
    memset(so, 0, (size_t)cfg.slots * sizeof(uint16_t));
    ctx->tag = ART_TAG_CTX;
    ctx->slot_op = (_Atomic uint16_t *)so;
    ctx->ops = ops;
    ctx->nops = ART_OP_POOL;
    ctx->device_timing = cfg.device_timing;
    atomic_store_explicit(&ctx->nch_cap, cfg.device_timing ? ART_MAX_CH : 0u, RLX);
    ctx->reclaim_age_ns = cfg.reclaim_age_ns;
    ctx->host_tsc = cfg.host_tsc;
    ctx->rank = rank;
    ctx->plugin_version = version;
    ctx->group_dummy = version == 4 || (version >= 7 && !rt.rccl); /* see dummy_group */
    ctx->plain_start = cfg.plain_start && art_membarrier_register();
    for (uint32_t i = 0; i < ART_OP_POOL; i++) {
        ops[i].tag = ART_TAG_OP;
        ops[i].ctx = ctx;
        /* single mode's guess; shared-mode starts set their own (op_start_body) */
        ops[i].kguess = &ctx->kch_thread;
        for (uint32_t k = 0; k < ART_MAX_CH; k++) {
            ops[i].ch[k].tag = ART_TAG_KCH;
            ops[i].ch[k].op = &ops[i];
            ops[i].ch[k].bit = 1ULL << k;
        }
    }
    if (art_ring_create(ctx, &cfg, comm_hash, comm_name, nnodes, nranks, rank, version, err,
                        sizeof err) != 0) {
        free(so);
        free(ops);
        free(ctx);
        art_log(logfn, NCCL_LOG_WARN, "Artemis profiler: %s; disabled for comm %016llx rank %d",
                err, (unsigned long long)comm_hash, rank);
        return ncclSuccess;
    }
    if (ctx->env_err[0])
        art_log(logfn, NCCL_LOG_WARN,
                "Artemis profiler: env sidecar %s.env not written (%s); the fingerprint of comm "
                "%016llx rank %d has no env",
                ctx->path, ctx->env_err, (unsigned long long)comm_hash, rank);
    art_log(logfn, NCCL_LOG_INFO,
            "Artemis profiler v%u: ring %s (%u slots, clock %s, %s %u, tick rate %llu Hz %s, "
            "host clock %s)",
            version, ctx->path, cfg.slots,
            cfg.clock_kind == ARTEMIS_CLOCK_HOST ? "host"
            : cfg.clock_kind == ARTEMIS_CLOCK_DEVICE_TICKS ? "device ticks" : "device ns",
            rt.rccl ? "RCCL" : "NCCL", cfg.nccl_version, (unsigned long long)cfg.tick_hz,
            cfg.tick_source == ARTEMIS_TICK_SRC_HIP ? "from HIP"
            : cfg.tick_source == ARTEMIS_TICK_SRC_DEFAULT ? "default" : "unused",
            cfg.host_tsc ? "TSC" : "clock_gettime");
    *context = ctx;
    return ncclSuccess;
}

static ncclResult_t art_init_v4(void **context, int *mask, const char *comm_name,
                                uint64_t comm_hash, int nnodes, int nranks, int rank,
                                ncclDebugLogger_t logfn) {
    return art_init(context, mask, comm_name, comm_hash, nnodes, nranks, rank, logfn, 4,
                    __builtin_return_address(0));
}

#define ART_DEFINE_INIT(N)                                                                     \
    static ncclResult_t art_init_v##N(void **context, uint64_t comm_id, int *mask,             \
                                      const char *comm_name, int nnodes, int nranks, int rank, \
                                      ncclDebugLogger_t logfn) {                               \
        return art_init(context, mask, comm_name, comm_id, nnodes, nranks, rank, logfn, N,     \
                        __builtin_return_address(0));                                          \
    }
ART_DEFINE_INIT(5)
ART_DEFINE_INIT(6)
ART_DEFINE_INIT(7)

/* The four exported symbols: non-const globals with default visibility. */
ART_EXPORT ncclProfiler_v7_t ncclProfiler_v7 = {
    "Artemis", art_init_v7, art_start_v7, art_stop, art_record, art_finalize,
};
ART_EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {
    "Artemis", art_init_v6, art_start_v6, art_stop, art_record, art_finalize,
};
ART_EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {
    "Artemis", art_init_v5, art_start_v5, art_stop, art_record, art_finalize,
};
ART_EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {
    "Artemis", art_init_v4, art_start_v4, art_stop, art_record, art_finalize,
};
