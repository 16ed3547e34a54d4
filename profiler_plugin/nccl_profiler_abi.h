/*
 * nccl_profiler_abi.h: our own declarations of the NCCL/RCCL profiler-plugin
 * ABI (versions 4 to 7), written from the layouts of NCCL's published profiler
 * headers (profiler_plugin/README.md describes how they are used).
 * LP64 Linux only (x86-64, aarch64).
 *
 * Only what the Artemis plugin and its tests need is declared; every layout
 * that matters is pinned by _Static_assert at the bottom of this file.
 */
#ifndef ARTEMIS_NCCL_PROFILER_ABI_H
#define ARTEMIS_NCCL_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
} ncclResult_t;

typedef enum {
    NCCL_LOG_NONE = 0,
    NCCL_LOG_VERSION = 1,
    NCCL_LOG_WARN = 2,
    NCCL_LOG_INFO = 3,
    NCCL_LOG_ABORT = 4,
    NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

#define NCCL_LOG_SUBSYS_INIT 1ul
#define NCCL_LOG_SUBSYS_PROFILE 16384ul

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char *file, int line, const char *fmt, ...);

/* Event-type bits (descriptor type and activation mask). */
enum {
    ncclProfileGroup = 1 << 0,
    ncclProfileColl = 1 << 1,
    ncclProfileP2p = 1 << 2,
    ncclProfileProxyOp = 1 << 3,
    ncclProfileProxyStep = 1 << 4,
    ncclProfileProxyCtrl = 1 << 5,
    ncclProfileKernelCh = 1 << 6,
    ncclProfileNetPlugin = 1 << 7,
    ncclProfileGroupApi = 1 << 8,
    ncclProfileCollApi = 1 << 9,
    ncclProfileP2pApi = 1 << 10,
    ncclProfileKernelLaunch = 1 << 11,
    ncclProfileCeColl = 1 << 12,
    ncclProfileCeSync = 1 << 13,
    ncclProfileCeBatch = 1 << 14,
    ncclProfileKernelPhase = 1 << 15,
};

/* Event states (one shared enum for every version). Only the values we use. */
typedef enum {
    ncclProfilerProxyOpInProgress_v4 = 19,
    ncclProfilerNetPluginUpdate = 21,
    ncclProfilerKernelChStop = 22,
    ncclProfilerGroupStartApiStop = 23,
    ncclProfilerGroupEndApiStart = 24,
    ncclProfilerKernelPhaseStop = 31,
} ncclProfilerEventState_t;

/* State arguments: one 8-byte union for v4..v7. */
typedef union {
    struct { size_t transSize; } proxyStep;
    struct { int appendedProxyOps; } proxyCtrl;
    struct { void *data; } netPlugin;
    struct { uint64_t pTimer; } kernelCh;
} ncclProfilerEventStateArgs_t;

/* Union arms shared (as a prefix) by several descriptor versions. */
struct artemisAbiCollV4 {
    uint64_t seqNumber;
    const char *func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char *algo;
    const char *proto;
};
struct artemisAbiP2pV4 {
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
    uint8_t nChannels;
};
struct artemisAbiProxyOp {
    pid_t pid;
    uint8_t channelId;
    int peer;
    int nSteps;
    int chunkSize;
    int isSend;
};
struct artemisAbiKernelCh {
    uint8_t channelId;
    uint64_t pTimer;
};
struct artemisAbiNetPlugin {
    int64_t id;
    void *data;
};

/* ---- v4 descriptor: uint8_t type, sizeof 104 ---- */
typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct artemisAbiCollV4 coll;
        struct artemisAbiP2pV4 p2p;
        struct artemisAbiProxyOp proxyOp;
        struct { int step; } proxyStep;
        struct artemisAbiKernelCh kernelCh;
        struct artemisAbiNetPlugin netPlugin;
    };
} ncclProfilerEventDescr_v4_t;

/* ---- v5 / v6 descriptor: uint64_t type, sizeof 112 ---- */
struct artemisAbiGroupApi { bool graphCaptured; int groupDepth; };
struct artemisAbiCollApiV6 {
    const char *func; size_t count; const char *datatype; int root; void *stream;
    bool graphCaptured;
};
struct artemisAbiP2pApiV6 {
    const char *func; size_t count; const char *datatype; void *stream; bool graphCaptured;
};
struct artemisAbiCollV6 {
    uint64_t seqNumber;
    const char *func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char *algo;
    const char *proto;
    void *parentGroup;
};
struct artemisAbiP2pV6 {
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
    uint8_t nChannels;
    void *parentGroup;
};
struct artemisAbiCeCollV6 {
    uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff; size_t count;
    int root; const char *datatype; const char *syncStrategy; bool intraBatchSync;
    uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum; void *stream;
};
struct artemisAbiCeSync { bool isComplete; int nRanks; };
struct artemisAbiCeBatch { int numOps; size_t totalBytes; bool useIntraSync; };

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct artemisAbiGroupApi groupApi;
        struct artemisAbiCollApiV6 collApi;
        struct artemisAbiP2pApiV6 p2pApi;
        struct { void *stream; } kernelLaunch;
        struct artemisAbiCollV6 coll;
        struct artemisAbiP2pV6 p2p;
        struct artemisAbiProxyOp proxyOp;
        struct { int step; } proxyStep;
        struct artemisAbiKernelCh kernelCh;
        struct artemisAbiNetPlugin netPlugin;
    };
} ncclProfilerEventDescr_v5_t;

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct artemisAbiGroupApi groupApi;
        struct artemisAbiCollApiV6 collApi;
        struct artemisAbiP2pApiV6 p2pApi;
        struct { void *stream; } kernelLaunch;
        struct artemisAbiCollV6 coll;
        struct artemisAbiP2pV6 p2p;
        struct artemisAbiProxyOp proxyOp;
        struct { int step; } proxyStep;
        struct artemisAbiKernelCh kernelCh;
        struct artemisAbiNetPlugin netPlugin;
        struct artemisAbiCeCollV6 ceColl;
        struct artemisAbiCeSync ceCollSync;
        struct artemisAbiCeBatch ceCollBatch;
    };
} ncclProfilerEventDescr_v6_t;

/* ---- v7 descriptor (NCCL 2.31): userTag and more, sizeof 136 ---- */
typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct artemisAbiGroupApi groupApi;
        struct {
            const char *func; size_t count; const char *datatype; int root; void *stream;
            bool graphCaptured; uint64_t userTag;
        } collApi;
        struct {
            const char *func; size_t count; const char *datatype; void *stream;
            bool graphCaptured; uint64_t userTag;
        } p2pApi;
        struct { void *stream; } kernelLaunch;
        struct {
            uint64_t seqNumber;
            const char *func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
            void *parentGroup;
            const char *kernelVariant;
            bool isSymColl;
            uint64_t userTag;
        } coll;
        struct {
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
            uint8_t nChannels;
            void *parentGroup;
            uint64_t userTag;
        } p2p;
        struct artemisAbiProxyOp proxyOp;
        struct { int step; } proxyStep;
        struct artemisAbiKernelCh kernelCh;
        struct artemisAbiNetPlugin netPlugin;
        struct {
            uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;
            size_t count; int root; const char *datatype; const char *syncStrategy;
            bool intraBatchSync; uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum;
            void *stream; uint64_t userTag;
        } ceColl;
        struct artemisAbiCeSync ceCollSync;
        struct artemisAbiCeBatch ceCollBatch;
        struct { uint8_t channelId; uint8_t phaseId; const char *phaseName; uint64_t pTimer; } kernelPhase;
    };
} ncclProfilerEventDescr_v7_t;

typedef ncclProfilerEventStateArgs_t ncclProfilerEventStateArgs_v4_t;
typedef ncclProfilerEventStateArgs_t ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_t ncclProfilerEventStateArgs_v6_t;
typedef ncclProfilerEventStateArgs_t ncclProfilerEventStateArgs_v7_t;

/* ---- function tables ---- */
typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, int *eActivationMask, const char *commName,
                         uint64_t commHash, int nNodes, int nranks, int rank,
                         ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v4_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_t eState,
                                     ncclProfilerEventStateArgs_v4_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v4_t;

#define ARTEMIS_DECLARE_PROFILER_V5PLUS(N)                                                    \
    typedef struct {                                                                          \
        const char *name;                                                                     \
        ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask,           \
                             const char *commName, int nNodes, int nranks, int rank,          \
                             ncclDebugLogger_t logfn);                                        \
        ncclResult_t (*startEvent)(void *context, void **eHandle,                             \
                                   ncclProfilerEventDescr_v##N##_t *eDescr);                  \
        ncclResult_t (*stopEvent)(void *eHandle);                                             \
        ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_t eState,      \
                                         ncclProfilerEventStateArgs_v##N##_t *eStateArgs);    \
        ncclResult_t (*finalize)(void *context);                                              \
    } ncclProfiler_v##N##_t;

ARTEMIS_DECLARE_PROFILER_V5PLUS(5)
ARTEMIS_DECLARE_PROFILER_V5PLUS(6)
ARTEMIS_DECLARE_PROFILER_V5PLUS(7)

/* ---- layout pins (LP64), from the reference's sanity offsets ---- */
#define ARTEMIS_ABI_OFF(T, m) offsetof(T, m)
_Static_assert(sizeof(void *) == 8, "LP64 only");
_Static_assert(sizeof(ncclProfilerEventStateArgs_t) == 8, "state args union is 8 bytes");
_Static_assert(ARTEMIS_ABI_OFF(ncclProfilerEventStateArgs_t, kernelCh.pTimer) == 0, "args pTimer");
/* One pin of version V's descriptor: member m at offset off. */
#define ARTEMIS_ABI_PIN(V, m, off)                                                    \
    _Static_assert(ARTEMIS_ABI_OFF(ncclProfilerEventDescr_v##V##_t, m) == (off),      \
                   "v" #V " " #m " at " #off)
/* What every version pins: the size, the union at 24, kernelCh.pTimer at 32. */
#define ARTEMIS_ABI_PIN_DESCR(V, size)                                                \
    _Static_assert(sizeof(ncclProfilerEventDescr_v##V##_t) == (size),                 \
                   "v" #V " descriptor size");                                        \
    ARTEMIS_ABI_PIN(V, coll, 24);                                                     \
    ARTEMIS_ABI_PIN(V, kernelCh.pTimer, 32)
ARTEMIS_ABI_PIN_DESCR(4, 104);
ARTEMIS_ABI_PIN(4, coll.proto, 96);
ARTEMIS_ABI_PIN(4, p2p.nChannels, 60);
ARTEMIS_ABI_PIN_DESCR(5, 112);
ARTEMIS_ABI_PIN(5, coll.parentGroup, 104);
ARTEMIS_ABI_PIN_DESCR(6, 112);
ARTEMIS_ABI_PIN(6, coll.parentGroup, 104);
ARTEMIS_ABI_PIN(6, coll.nChannels, 80);
ARTEMIS_ABI_PIN(6, proxyOp.isSend, 44);
ARTEMIS_ABI_PIN(6, collApi.graphCaptured, 64);
ARTEMIS_ABI_PIN(6, ceColl.stream, 104);
ARTEMIS_ABI_PIN(6, p2p.peer, 56);
ARTEMIS_ABI_PIN_DESCR(7, 136);
ARTEMIS_ABI_PIN(7, coll.kernelVariant, 112);
ARTEMIS_ABI_PIN(7, coll.userTag, 128);
ARTEMIS_ABI_PIN(7, collApi.userTag, 72);
ARTEMIS_ABI_PIN(7, kernelPhase.pTimer, 40);
ARTEMIS_ABI_PIN(7, coll.nChannels, 80);
ARTEMIS_ABI_PIN(7, p2p.nChannels, 60);

#endif /* ARTEMIS_NCCL_PROFILER_ABI_H */
