/*
 * hostclock.h: CLOCK_MONOTONIC ns from the TSC for the starting threads
 * (README "Host clock"). Part of core.c's translation unit (see codes.h).
 */
#ifndef ARTEMIS_HOSTCLOCK_H
#define ARTEMIS_HOSTCLOCK_H
#ifndef ART_CORE_TU
#error "included by core.c only: the hot path is one translation unit"
#endif

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

#endif /* ARTEMIS_HOSTCLOCK_H */
