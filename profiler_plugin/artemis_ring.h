/*
 * artemis_ring.h: the one source of truth for the shared-memory ring format.
 *
 * One ring per (communicator, rank): a file in ARTEMIS_SHM_DIR (default
 * /dev/shm/artemis) named
 *     <job>.<commhash as 16 hex digits>.r<rank>.ring
 * holding an ArtemisRingHeader followed by `capacity` ArtemisSlot entries.
 *
 * Writers (the plugin, several threads) claim a slot by fetch_add on
 * write_index; slot = ticket & (capacity - 1). Each slot is a seqlock: `lock`
 * is odd while a writer is inside, even when the slot is whole. A writer
 * makes it odd, writes the body, then stores lock + 1 with release order;
 * it never spins (a record it cannot write is dropped and counted in
 * `dropped`). The plugin never overwrites a record in flight: a new record
 * enters only a DONE or empty slot (CAS even -> odd; a plain store when the
 * starting thread is the only one, plugin README "Single writer"), and the
 * in-flight record's one completer enters with a plain store (plugin README
 * "Slot writers"). The reader (agent, Python + numpy) copies the slot,
 * and accepts it only when lock was even and unchanged across the copy, and
 * the slot's `seq` is the ticket it expected.
 *
 * The Python reader mirrors these layouts with a numpy structured dtype; a test
 * compiles this header and compares sizes and offsets (tests/test_ring_layout.py).
 */
#ifndef ARTEMIS_RING_H
#define ARTEMIS_RING_H

#include <stdint.h>

#define ARTEMIS_RING_MAGIC 0x31474e4952534d41ULL /* "AMSRING1" little-endian */
#define ARTEMIS_RING_VERSION 1u /* major: a reader refuses another major */
/* Minor versions add fields only in space that older writers left zeroed, so
 * a reader of minor N reads every minor <= N (a rolling upgrade never blinds
 * jobs that still hold an older plugin). Minor 0 is the original layout. */
#define ARTEMIS_RING_MINOR 2u
#define ARTEMIS_SLOT_MINOR_BASE 0u /* 64-byte ArtemisSlot */
#define ARTEMIS_SLOT_MINOR_CPU 1u  /* 128-byte ArtemisSlotCpu: + process CPU time */
#define ARTEMIS_RING_SLOT_CPU_SIZE 128u
#define ARTEMIS_RING_HEADER_SIZE 512u
#define ARTEMIS_RING_SLOT_SIZE 64u
#define ARTEMIS_RING_DEFAULT_SLOTS 8192u
#define ARTEMIS_RING_MIN_SLOTS 4u
#define ARTEMIS_RING_MAX_SLOTS (1u << 22)
#define ARTEMIS_NAME_LEN 64

/* header.clock_kind: what the device timestamps in this ring count. */
enum {
    ARTEMIS_CLOCK_HOST = 0,         /* host CLOCK_MONOTONIC ns only (device timing off) */
    ARTEMIS_CLOCK_DEVICE_NS = 1,    /* NVIDIA %globaltimer ns */
    ARTEMIS_CLOCK_DEVICE_TICKS = 2, /* RCCL wall_clock64 ticks; ns = ticks * 1e9 / tick_hz */
};

/* header.tick_source: where tick_hz came from (minor >= 1). */
enum {
    ARTEMIS_TICK_SRC_NONE = 0,    /* clock_kind is not TICKS */
    ARTEMIS_TICK_SRC_DEFAULT = 1, /* the configured default (ARTEMIS_RCCL_TICK_HZ or 100 MHz) */
    ARTEMIS_TICK_SRC_HIP = 2,     /* hipDeviceAttributeWallClockRate of the device */
};

/* header.writer_flags bits (minor >= 1), set once at creation. */
enum {
    ARTEMIS_WRITER_RCCL = 1u << 0,    /* the process runs RCCL (detected from the process) */
    ARTEMIS_WRITER_TSC = 1u << 1,     /* host times are TSC ticks: see tsc_hz and tsc_anchor */
    ARTEMIS_WRITER_BACKEND = 1u << 2, /* written by the artemis torch.distributed backend */
    ARTEMIS_WRITER_ENV = 1u << 3,     /* an env sidecar was written beside the ring (below) */
};

/* header.life_flags bits (minor >= 2), set once at creation. */
enum {
    ARTEMIS_LIFE_FLOCK = 1u << 0, /* the writer holds a shared flock on the ring (below) */
};

/* Lifetime (docs/DESIGN.md "Ring", "Who removes a ring"). No field: the marks
 * are kernel locks and one file, so a reader needs no write access to a ring.
 * - The writer holds flock(LOCK_SH) on the ring file from before its rename for
 *   as long as its open file lives (the plugin's mapping keeps it to the
 *   process's end), and sets ARTEMIS_LIFE_FLOCK. The kernel
 *   drops the lock when the process dies, so a reader that can take LOCK_EX
 *   (LOCK_NB) on a ring with the bit knows its writer is gone (pids are reused
 *   and differ across pid namespaces; a lock is neither).
 * - An agent serving a folder holds flock(LOCK_EX) on "<folder>/agent.lock".
 * - A reader that will read a ring to its end (the agent) marks it with an empty
 *   sidecar "<name>.ring.reader".
 * At a clean finish (finalize) a writer removes its ring, its .env and .reader
 * sidecars when no agent serves the folder (it can take LOCK_SH|LOCK_NB on
 * agent.lock, or there is none), no reader marked the ring, and ARTEMIS_KEEP_RINGS
 * is not set to 1. Otherwise the ring stays for its reader, which removes it once
 * read to the end; a ring whose writer is gone is reclaimed by the agent after a
 * bound. */

/* Env sidecar (the software fingerprint's environment, docs/DESIGN.md "Ring"):
 * beside <name>.ring its writer leaves <name>.ring.env, written once at creation
 * before the ring is renamed into place, and sets ARTEMIS_WRITER_ENV only then.
 * NUL-ended "key=value" records: first "artemis-env=1", then "pid=<writer pid>",
 * optionally "torch=<version>", then "env.NAME=VALUE" for each variable the
 * privacy rule keeps (a name starting NCCL_, RCCL_, TORCH_NCCL_, CUDA_ or HSA_,
 * shorter than ARTEMIS_ENV_NAME_MAX, and holding none of KEY, TOKEN, SECRET,
 * PASSWORD in any case), in name order, values cut at ARTEMIS_ENV_VALUE_MAX bytes,
 * at most ARTEMIS_ENV_MAX_VARS of them, and the file at most ARTEMIS_ENV_MAX_BYTES
 * (a record that does not fit is left out). A writer that cannot write it (a
 * full /dev/shm) leaves the bit clear and carries on. */
#define ARTEMIS_ENV_MAX_BYTES 65536u
#define ARTEMIS_ENV_MAX_VARS 256u
#define ARTEMIS_ENV_VALUE_MAX 1024u
#define ARTEMIS_ENV_NAME_MAX 128u

/* header.flags bits (atomic). */
enum {
    ARTEMIS_RING_FINISHED = 1u << 0, /* finalize ran: no more writes will come */
};

/* slot.kind */
enum {
    ARTEMIS_KIND_COLL = 1,
    ARTEMIS_KIND_P2P = 2,
    ARTEMIS_KIND_BRIDGE = 3, /* cross-island bridge record, written by artemis.job */
};

/* slot.state */
enum {
    ARTEMIS_STATE_IN_FLIGHT = 1,
    ARTEMIS_STATE_DONE = 2,
};

/* slot.clock: which clock start/end of this record are in. */
enum {
    ARTEMIS_REC_HOST = 0,   /* host CLOCK_MONOTONIC ns */
    ARTEMIS_REC_DEVICE = 1, /* device timer, units per header.clock_kind */
};

/* slot.func codes (the NCCL function names). */
enum {
    ARTEMIS_FUNC_UNKNOWN = 0,
    ARTEMIS_FUNC_ALLREDUCE = 1,
    ARTEMIS_FUNC_ALLGATHER = 2,
    ARTEMIS_FUNC_REDUCESCATTER = 3,
    ARTEMIS_FUNC_BROADCAST = 4,
    ARTEMIS_FUNC_REDUCE = 5,
    ARTEMIS_FUNC_ALLTOALL = 6,
    ARTEMIS_FUNC_GATHER = 7,
    ARTEMIS_FUNC_SCATTER = 8,
    ARTEMIS_FUNC_SEND = 9,
    ARTEMIS_FUNC_RECV = 10,
    ARTEMIS_FUNC_SENDRECV = 11,
    ARTEMIS_FUNC_BRIDGE = 12,
};

/* slot.dtype codes (NCCL datatype names; 0 = unknown). */
enum {
    ARTEMIS_DT_UNKNOWN = 0,
    ARTEMIS_DT_INT8 = 1,
    ARTEMIS_DT_UINT8 = 2,
    ARTEMIS_DT_INT32 = 3,
    ARTEMIS_DT_UINT32 = 4,
    ARTEMIS_DT_INT64 = 5,
    ARTEMIS_DT_UINT64 = 6,
    ARTEMIS_DT_FLOAT16 = 7,
    ARTEMIS_DT_FLOAT32 = 8,
    ARTEMIS_DT_FLOAT64 = 9,
    ARTEMIS_DT_BFLOAT16 = 10,
    ARTEMIS_DT_FP8E4M3 = 11,
    ARTEMIS_DT_FP8E5M2 = 12,
};

/* slot.algo / slot.proto codes (0 = unknown). */
enum {
    ARTEMIS_ALGO_UNKNOWN = 0, ARTEMIS_ALGO_TREE = 1, ARTEMIS_ALGO_RING = 2,
    ARTEMIS_ALGO_COLLNET_DIRECT = 3, ARTEMIS_ALGO_COLLNET_CHAIN = 4,
    ARTEMIS_ALGO_NVLS = 5, ARTEMIS_ALGO_NVLS_TREE = 6, ARTEMIS_ALGO_PAT = 7,
};
enum {
    ARTEMIS_PROTO_UNKNOWN = 0, ARTEMIS_PROTO_LL = 1, ARTEMIS_PROTO_LL128 = 2,
    ARTEMIS_PROTO_SIMPLE = 3,
};

/* 64 bytes, one cache line. */
typedef struct ArtemisSlot {
    uint32_t lock;      /* 0: seqlock word (accessed atomically) */
    uint8_t kind;       /* 4: ARTEMIS_KIND_* */
    uint8_t func;       /* 5: ARTEMIS_FUNC_* */
    uint8_t dtype;      /* 6: ARTEMIS_DT_* */
    uint8_t state;      /* 7: ARTEMIS_STATE_* */
    uint8_t clock;      /* 8: ARTEMIS_REC_* */
    uint8_t algo;       /* 9 */
    uint8_t proto;      /* 10 */
    uint8_t nchannels;  /* 11: channels the op runs on (KernelCh events expected) */
    int32_t peer;       /* 12: p2p peer rank, bridge peer island index, else -1 */
    uint64_t seq;       /* 16: ticket: record number in this ring (slot = seq & (cap-1)) */
    uint64_t coll_seq;  /* 24: per-communicator collective index (same on every rank);
                                for p2p/bridge: collectives issued before it */
    uint64_t bytes;     /* 32: payload bytes (count x type size) */
    uint64_t enqueue_ns;/* 40: host CLOCK_MONOTONIC when NCCL enqueued the op */
    uint64_t start;     /* 48: min KernelCh start pTimer (device) or host ns; 0 = not yet */
    uint64_t end;       /* 56: max KernelChStop pTimer (device) or host ns; 0 = not yet */
} ArtemisSlot;

/* 128 bytes (slot_minor ARTEMIS_SLOT_MINOR_CPU): the base slot, then the
 * writing process's CPU time (CLOCK_PROCESS_CPUTIME_ID ns) at the record's
 * start and end, so a reader tells an idle compute gap from a busy one. */
typedef struct ArtemisSlotCpu {
    ArtemisSlot base;          /* 0 */
    uint64_t cpu_start_ns;     /* 64: 0 = not taken */
    uint64_t cpu_end_ns;       /* 72: 0 = not yet */
    uint8_t reserved[48];      /* 80 */
} ArtemisSlotCpu;

/* 512 bytes; write_index sits alone on its own cache line. */
typedef struct ArtemisRingHeader {
    uint64_t magic;            /* 0: ARTEMIS_RING_MAGIC */
    uint32_t version;          /* 8: ARTEMIS_RING_VERSION */
    uint32_t header_size;      /* 12: ARTEMIS_RING_HEADER_SIZE */
    uint32_t slot_size;        /* 16: ARTEMIS_RING_SLOT_SIZE */
    uint32_t capacity;         /* 20: slots, a power of two */
    int32_t rank;              /* 24 */
    int32_t nranks;            /* 28 */
    int32_t nnodes;            /* 32 */
    int32_t pid;               /* 36: the training process */
    uint64_t comm_hash;        /* 40 */
    uint32_t clock_kind;       /* 48: ARTEMIS_CLOCK_* */
    uint32_t flags;            /* 52: ARTEMIS_RING_* bits (accessed atomically) */
    uint64_t tick_hz;          /* 56: device ticks per second when clock_kind is TICKS, else 0 */
    uint64_t created_ns;       /* 64: CLOCK_REALTIME ns at creation */
    uint64_t finished_ns;      /* 72: CLOCK_REALTIME ns at finalize, 0 while running */
    uint64_t dropped;          /* 80: records the writer had to drop (accessed atomically) */
    uint32_t plugin_version;   /* 88: ABI version NCCL loaded us as (4..7), 0 = other writer */
    int32_t global_rank;       /* 92: job-wide rank (env RANK, else OMPI/SLURM/PMI), -1 unknown */
    char job[ARTEMIS_NAME_LEN];       /* 96: job id, NUL-terminated */
    char comm_name[ARTEMIS_NAME_LEN]; /* 160: communicator name or "" */
    char host[ARTEMIS_NAME_LEN];      /* 224: hostname of the writer */
    /* minor >= 1 (zero in minor-0 rings): */
    uint16_t minor;            /* 288: ARTEMIS_RING_MINOR of the writer */
    uint16_t slot_minor;       /* 290: ARTEMIS_SLOT_MINOR_* of every slot */
    uint32_t tick_source;      /* 292: ARTEMIS_TICK_SRC_* */
    uint32_t writer_flags;     /* 296: ARTEMIS_WRITER_* bits */
    uint32_t nccl_version;     /* 300: ncclGetVersion() code of the process, 0 = unknown */
    uint64_t tsc_hz;           /* 304: TSC ticks per second when ARTEMIS_WRITER_TSC, else 0 */
    uint64_t host_fallback;    /* 312: records host-timed although device timing was on: self
                                *      Send/Recv (NCCL sends them no KernelCh) and ops whose
                                *      KernelCh never came, reclaimed (accessed atomically) */
    uint64_t write_index;      /* 320: next ticket (accessed atomically), own cache line */
    /* 328: (tsc, CLOCK_MONOTONIC ns) anchor pairs, [0] at creation and [1] refreshed
     * by the writer, so a reader converts TSC host times to ns (minor >= 1). */
    uint64_t tsc_anchor[2][2];
    /* minor >= 2 (zero in older rings): */
    uint32_t life_flags;       /* 360: ARTEMIS_LIFE_* bits ("Lifetime" above) */
    uint8_t reserved2[ARTEMIS_RING_HEADER_SIZE - 364];
} ArtemisRingHeader;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(ArtemisSlot) == ARTEMIS_RING_SLOT_SIZE, "slot size");
_Static_assert(sizeof(ArtemisSlotCpu) == ARTEMIS_RING_SLOT_CPU_SIZE, "cpu slot size");
_Static_assert(sizeof(ArtemisRingHeader) == ARTEMIS_RING_HEADER_SIZE, "header size");
#endif

#endif /* ARTEMIS_RING_H */
