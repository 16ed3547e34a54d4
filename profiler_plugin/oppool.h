/*
 * oppool.h: the operation handles (core.c): claim, release, completion into
 * the slot, and the reclaim of ops whose KernelCh events never come. Part of
 * core.c's translation unit (see codes.h).
 */
#ifndef ARTEMIS_OPPOOL_H
#define ARTEMIS_OPPOOL_H
#ifndef ART_CORE_TU
#error "included by core.c only: the hot path is one translation unit"
#endif

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

#endif /* ARTEMIS_OPPOOL_H */
