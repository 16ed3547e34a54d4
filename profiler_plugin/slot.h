/*
 * slot.h: the hot path's access to a ring slot (core.c): the seqlock writer
 * and the packing of the kind and clock words. Part of core.c's translation
 * unit (see codes.h).
 */
#ifndef ARTEMIS_SLOT_H
#define ARTEMIS_SLOT_H
#ifndef ART_CORE_TU
#error "included by core.c only: the hot path is one translation unit"
#endif

#include <string.h>

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

/* byte `i` of a word, as the word lies in the slot, set to `v` */
static inline void set_byte(void *word, size_t i, uint8_t v) { memcpy((uint8_t *)word + i, &v, 1); }
/* offsets of state (in w4) and clock (in w8) as bytes */
static inline uint32_t with_state(uint32_t w4, uint8_t state) {
    set_byte(&w4, 3, state);
    return w4;
}
static inline uint64_t with_clock(uint64_t w8, uint8_t clock) {
    set_byte(&w8, 0, clock);
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

#endif /* ARTEMIS_SLOT_H */
