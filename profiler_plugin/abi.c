/*
 * abi.c: the ABI glue: the four exported ncclProfiler_v4..v7 tables, init
 * (one per ABI version, around art_init) and finalize. The event callbacks
 * they point at are core.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "plugin_internal.h"

static ncclResult_t art_finalize(void *context) {
    ArtCtx *ctx = (ArtCtx *)context;
    if (!ctx || ctx->tag != ART_TAG_CTX) return ncclSuccess;
    /* the owner's next start takes the slow path, which reads finished */
    atomic_store_explicit(&ctx->fast, ART_FAST_OFF, RLX);
    if (atomic_exchange_explicit(&ctx->finished, 1u, ACQREL) == 0) {
        atomic_store_explicit(A64(&ctx->hdr->finished_ns), art_now_real(), RLX);
        atomic_fetch_or_explicit(A32(&ctx->hdr->flags), (uint32_t)ARTEMIS_RING_FINISHED, REL);
        /* a ring no reader will read goes now: under plain torchrun nothing else would */
        art_ring_retire(ctx);
    }
    /* Nothing is freed or unmapped (README "Lifetime"): a removed ring's mapping
     * stays valid, so a late event still lands in memory, not in the file. */
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
