/*
 * core.c: the plugin's core: the event callbacks (startEvent, stopEvent,
 * recordEventState of ABI v4..v7), the handles, the single -> shared switch.
 * The exported tables and init are in abi.c, the ring's creation in ring.c.
 *
 * One translation unit: codes.h, slot.h, hostclock.h and oppool.h are
 * included here only, so that GCC sees the whole hot path at once (as when
 * it was one file: same inlining and register allocation, same callgrind
 * counts).
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
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__linux__) && defined(__has_include)
#if __has_include(<linux/membarrier.h>)
#include <linux/membarrier.h>
#define ART_HAVE_MEMBARRIER 1
#endif
#endif

#include "plugin_internal.h"

#define ART_CORE_TU 1
#include "codes.h"
#include "slot.h"
#include "hostclock.h"

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

#include "oppool.h"

/* ------------------------------------------------------------------ */
/* the single -> shared switch (README "Single writer")                 */

/* 1 if this process can issue expedited private membarriers (registered once). */
int art_membarrier_register(void) {
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
/* the harness only (tests/harness_shared.c test_switch_mb_fail): both membarriers fail */
_Atomic int art_test_membarrier_fail;
/* the harness only (tests/harness_shared.c test_switch_in_start): called by the
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
/* the event callbacks (abi.c's tables point at them)                   */

/* One startEvent per descriptor version; the union arms we read have the
 * same offsets in v4..v7 (v5+ only append members). Here, not in abi.c:
 * each inlines the hot path (op_start, kch_start). */
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
    ncclResult_t art_start_v##N(void *context, void **eHandle,                                 \
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

ncclResult_t art_stop(void *eHandle) {
    if (!eHandle) return ncclSuccess;
    uint64_t tag = *(const uint64_t *)eHandle;
    if (tag == ART_TAG_KCH) return kch_stop((ArtCh *)eHandle); /* nChannels per op */
    if (tag == ART_TAG_OP) return op_stop((ArtOp *)eHandle);
    return ncclSuccess;
}

ncclResult_t art_record(void *eHandle, ncclProfilerEventState_t eState,
                        ncclProfilerEventStateArgs_t *args) {
    /* separate tests: GCC turns one && chain into setcc arithmetic */
    if (__builtin_expect(eState != ncclProfilerKernelChStop, 0)) return ncclSuccess;
    if (__builtin_expect(!eHandle, 0)) return ncclSuccess;
    if (__builtin_expect(*(const uint64_t *)eHandle != ART_TAG_KCH, 0)) return ncclSuccess;
    if (__builtin_expect(!args, 0)) return ncclSuccess;
    atomic_store_explicit(&((ArtCh *)eHandle)->stop, args->kernelCh.pTimer, RLX);
    return ncclSuccess;
}
