/*
 * codes.h: the codes: NCCL/RCCL names (func, datatype, algorithm, protocol)
 * -> ring codes, the datatype sizes, and the hot path's lookups through the
 * context's cache. Part of core.c's translation unit: core.c includes it and
 * its siblings (slot.h, hostclock.h, oppool.h) only, so that GCC sees the
 * whole hot path at once, as when it was one file. Measured: with the tables
 * in a separate object the calls on a cache miss lose GCC's interprocedural
 * register allocation and the Coll/P2p start costs 1 instruction more per
 * collective in single mode, 6 in shared mode (callgrind).
 */
#ifndef ARTEMIS_CODES_H
#define ARTEMIS_CODES_H
#ifndef ART_CORE_TU
#error "included by core.c only: the hot path is one translation unit"
#endif

#include <string.h>

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

#endif /* ARTEMIS_CODES_H */
