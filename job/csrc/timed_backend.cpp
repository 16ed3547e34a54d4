// The `artemis` torch.distributed backend's hot path in C++ (docs/DESIGN.md,
// "The artemis backend: two paths"): a c10d::Backend that forwards every call to
// the inner backend (gloo for CPU tensors, nccl for CUDA ones) and writes one ring
// record per collective, IN_FLIGHT at the call and DONE when the inner Work's
// future completes (or when a Work without a future is waited on: gloo send/recv).
//
// The ring is created by the Python RingWriter (header, env sidecar, rename into
// place); this file maps it by path and is then its only writer. The slot layout
// and the seqlock are profiler_plugin/artemis_ring.h's: lock odd, body, lock even
// with release order, write_index published after the slot is whole. One mutex per
// ring orders the writers (the calling thread records, the inner backend's threads
// complete); the reader in the agent is another process and needs only the seqlock.
//
// CUDA tensors are forwarded unrecorded: the C++ path is taken only when the Artemis
// NCCL profiler plugin records NCCL's collectives (one source per collective);
// CUDA events without the plugin, and islands, stay on the Python path.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include "artemis_ring.h"

namespace {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using BackendPtr = c10::intrusive_ptr<c10d::Backend>;

inline uint64_t clock_ns(clockid_t id) {
    timespec ts;
    clock_gettime(id, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
// CLOCK_MONOTONIC: the ring's host clock. CLOCK_PROCESS_CPUTIME_ID: the ring
// contract's cpu_start_ns/cpu_end_ns (every thread of the process).
inline uint64_t mono_ns() { return clock_ns(CLOCK_MONOTONIC); }
inline uint64_t cpu_ns() { return clock_ns(CLOCK_PROCESS_CPUTIME_ID); }

template <class T>
inline void store_rel(T* p, std::type_identity_t<T> v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
template <class T>
inline void store_rlx(T* p, std::type_identity_t<T> v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

uint8_t dtype_code(const at::Tensor& t) {
    switch (t.scalar_type()) {
        case at::kChar: return ARTEMIS_DT_INT8;
        case at::kByte: return ARTEMIS_DT_UINT8;
        case at::kInt: return ARTEMIS_DT_INT32;
        case at::kLong: return ARTEMIS_DT_INT64;
        case at::kHalf: return ARTEMIS_DT_FLOAT16;
        case at::kFloat: return ARTEMIS_DT_FLOAT32;
        case at::kDouble: return ARTEMIS_DT_FLOAT64;
        case at::kBFloat16: return ARTEMIS_DT_BFLOAT16;
        default: return ARTEMIS_DT_UNKNOWN;
    }
}

// One mapped ring with its sequence counters (the Python path's _Comm).
class Ring : public c10::intrusive_ptr_target {
   public:
    explicit Ring(const std::string& path) : path_(path) {
        int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
        TORCH_CHECK(fd >= 0, "artemis: cannot open ring ", path, ": ", std::strerror(errno));
        struct stat st;
        if (fstat(fd, &st) != 0) {
            ::close(fd);
            TORCH_CHECK(false, "artemis: cannot stat ring ", path);
        }
        size_ = static_cast<size_t>(st.st_size);
        void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        TORCH_CHECK(p != MAP_FAILED, "artemis: cannot map ring ", path, ": ", std::strerror(errno));
        base_ = static_cast<uint8_t*>(p);
        hdr_ = reinterpret_cast<ArtemisRingHeader*>(base_);
        const bool ok = size_ >= sizeof(ArtemisRingHeader) && hdr_->magic == ARTEMIS_RING_MAGIC &&
                        hdr_->header_size == ARTEMIS_RING_HEADER_SIZE &&
                        hdr_->slot_size == ARTEMIS_RING_SLOT_CPU_SIZE &&
                        hdr_->slot_minor == ARTEMIS_SLOT_MINOR_CPU && hdr_->capacity != 0 &&
                        (hdr_->capacity & (hdr_->capacity - 1)) == 0 &&
                        size_ >= ARTEMIS_RING_HEADER_SIZE +
                                     static_cast<size_t>(hdr_->capacity) * ARTEMIS_RING_SLOT_CPU_SIZE;
        if (!ok) {
            munmap(base_, size_);
            base_ = nullptr;
            TORCH_CHECK(false, "artemis: ", path, " is not a ring with 128-byte CPU slots");
        }
        capacity_ = hdr_->capacity;
        next_ = hdr_->write_index;
    }
    // The last reference: the group and every owed completion's callback are gone (a
    // callback that was never run, such as a future dropped unfinished, owes nothing).
    ~Ring() override {
        std::lock_guard<std::mutex> g(mu_);
        unmap(finish_wanted_);
    }

    // An IN_FLIGHT record; returns its ticket (UINT64_MAX once closed or closing).
    // `owed`: a future's callback will complete it (complete_owed), and a close waits
    // for that callback before it marks the ring finished.
    uint64_t record(uint8_t kind, uint8_t func, uint8_t dtype, int32_t peer, uint64_t nbytes,
                    uint64_t enq, uint64_t start, uint64_t cpu0, bool owed = false) {
        std::lock_guard<std::mutex> g(mu_);
        if (base_ == nullptr || closing_) return UINT64_MAX;
        if (owed) ++owed_;
        const bool p2p = kind == ARTEMIS_KIND_P2P;
        const uint64_t seq = p2p ? p2p_seq_++ : coll_seq_++;
        const uint64_t t = next_;
        ArtemisSlotCpu* s = slot(t);
        const uint32_t lock = __atomic_load_n(&s->base.lock, __ATOMIC_RELAXED);
        // Seqlock: odd while the body is written; every body store is a release
        // store, which orders the odd value before it (artemis_ring.h, plugin.c).
        store_rlx(&s->base.lock, lock + 1u);
        ArtemisSlot& b = s->base;
        uint32_t w4;
        const uint8_t k4[4] = {kind, func, dtype, ARTEMIS_STATE_IN_FLIGHT};
        std::memcpy(&w4, k4, 4);
        store_rel(reinterpret_cast<uint32_t*>(&b.kind), w4);
        uint8_t k8[8] = {ARTEMIS_REC_HOST, 0, 0, 1, 0, 0, 0, 0};  // clock algo proto nchannels
        std::memcpy(k8 + 4, &peer, 4);
        uint64_t w8;
        std::memcpy(&w8, k8, 8);
        store_rel(reinterpret_cast<uint64_t*>(&b.clock), w8);
        store_rel(&b.seq, t);
        store_rel(&b.coll_seq, seq);
        store_rel(&b.bytes, nbytes);
        store_rel(&b.enqueue_ns, enq);
        store_rel(&b.start, start);
        store_rel(&b.end, uint64_t{0});
        store_rel(&s->cpu_start_ns, cpu0);
        store_rel(&s->cpu_end_ns, uint64_t{0});
        store_rel(&s->base.lock, lock + 2u);
        next_ = t + 1;
        // Publish the ticket after the slot is whole.
        store_rel(&hdr_->write_index, next_);
        return t;
    }

    // Marks an IN_FLIGHT record DONE; false when closed or the ring wrapped past it.
    bool complete(uint64_t ticket, uint64_t end, uint64_t cpu1) {
        std::lock_guard<std::mutex> g(mu_);
        return mark_done(ticket, end, cpu1);
    }

    // complete() for a record made with `owed`: the last one owed to a closing ring
    // closes it (marks it finished, when that was asked, and unmaps it).
    bool complete_owed(uint64_t ticket, uint64_t end, uint64_t cpu1) {
        std::lock_guard<std::mutex> g(mu_);
        const bool ok = mark_done(ticket, end, cpu1);
        if (owed_ > 0 && --owed_ == 0 && closing_) {
            unmap(finish_wanted_);
            settled_.notify_all();
        }
        return ok;
    }

    // No more records; with `finish`, marks the ring FINISHED (the agent then cuts its
    // last window) and unmaps it. A future's callback can still be owed: the inner
    // backend wakes the future's waiters before it runs the callbacks, so the training
    // thread can reach destroy_process_group while the last collective's completion is
    // still to run (it did under load). Marking the ring finished then would leave that
    // record IN_FLIGHT for good in a finished ring, which the agent never drains (the
    // rank's last window would never be sent): the close is left to that callback.
    // Waits up to `wait_s` for the owed callbacks; true when the ring is closed on return.
    bool close(bool finish, double wait_s = 0.0) {
        std::unique_lock<std::mutex> g(mu_);
        if (base_ == nullptr) return true;
        closing_ = true;
        finish_wanted_ = finish_wanted_ || finish;
        if (owed_ == 0) {
            unmap(finish_wanted_);
            return true;
        }
        if (wait_s <= 0.0) return false;
        return settled_.wait_for(g, std::chrono::duration<double>(wait_s), [this] { return owed_ == 0; });
    }

    uint64_t coll_seq() {
        std::lock_guard<std::mutex> g(mu_);
        return coll_seq_;
    }
    uint64_t write_index() {
        std::lock_guard<std::mutex> g(mu_);
        return next_;
    }
    const std::string& path() const { return path_; }

   private:
    // Under mu_.
    bool mark_done(uint64_t ticket, uint64_t end, uint64_t cpu1) {
        if (base_ == nullptr || ticket >= next_ || next_ - ticket > capacity_) return false;
        ArtemisSlotCpu* s = slot(ticket);
        const uint32_t lock = __atomic_load_n(&s->base.lock, __ATOMIC_RELAXED);
        store_rlx(&s->base.lock, lock + 1u);
        store_rel(&s->base.state, static_cast<uint8_t>(ARTEMIS_STATE_DONE));
        store_rel(&s->base.end, end);
        store_rel(&s->cpu_end_ns, cpu1);
        store_rel(&s->base.lock, lock + 2u);
        return true;
    }

    // Under mu_: unmaps; with `finish`, marks the ring FINISHED first (no more records).
    void unmap(bool finish) {
        if (base_ == nullptr) return;
        if (finish) {
            store_rel(&hdr_->finished_ns, clock_ns(CLOCK_REALTIME));
            __atomic_fetch_or(&hdr_->flags, static_cast<uint32_t>(ARTEMIS_RING_FINISHED), __ATOMIC_RELEASE);
        }
        munmap(base_, size_);
        base_ = nullptr;
    }

    ArtemisSlotCpu* slot(uint64_t t) {
        return reinterpret_cast<ArtemisSlotCpu*>(base_ + ARTEMIS_RING_HEADER_SIZE +
                                                 (t & (capacity_ - 1)) * ARTEMIS_RING_SLOT_CPU_SIZE);
    }

    std::mutex mu_;
    std::condition_variable settled_;  // the last owed completion of a closing ring ran
    std::string path_;
    uint8_t* base_ = nullptr;
    ArtemisRingHeader* hdr_ = nullptr;
    size_t size_ = 0;
    uint64_t capacity_ = 0;
    uint64_t next_ = 0;
    uint64_t coll_seq_ = 0;
    uint64_t p2p_seq_ = 0;
    uint64_t owed_ = 0;  // records whose completion a future's callback owes
    bool closing_ = false;
    bool finish_wanted_ = false;
};
using RingPtr = c10::intrusive_ptr<Ring>;

// A Work without a future (gloo send/recv): its record completes when it is
// waited on, or seen completed, whichever comes first.
class TimedWork : public Work {
   public:
    TimedWork(WorkPtr inner, RingPtr ring, uint64_t ticket)
        : Work(-1, inner->retrieveOpType()), inner_(std::move(inner)), ring_(std::move(ring)), ticket_(ticket) {}

    bool wait(std::chrono::milliseconds timeout) override {
        const bool ok = inner_->wait(timeout);
        finish();
        return ok;
    }
    bool isCompleted() override {
        const bool c = inner_->isCompleted();
        if (c) finish();
        return c;
    }
    bool isSuccess() const override { return inner_->isSuccess(); }
    std::exception_ptr exception() const override { return inner_->exception(); }
    int sourceRank() const override { return inner_->sourceRank(); }
    std::vector<at::Tensor> result() override { return inner_->result(); }
    void abort() override { inner_->abort(); }
    void synchronize() override { inner_->synchronize(); }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }

   private:
    void finish() {
        bool expected = false;
        if (done_.compare_exchange_strong(expected, true)) {
            const uint64_t end = mono_ns(), cpu1 = cpu_ns();
            ring_->complete(ticket_, end, cpu1);
        }
    }
    WorkPtr inner_;
    RingPtr ring_;
    uint64_t ticket_;
    std::atomic<bool> done_{false};
};

uint64_t nbytes_of(const std::vector<at::Tensor>& ts) {
    uint64_t n = 0;
    for (const auto& t : ts) n += t.nbytes();
    return n;
}
uint64_t nbytes_of(const std::vector<std::vector<at::Tensor>>& ts) {
    uint64_t n = 0;
    for (const auto& v : ts) n += nbytes_of(v);
    return n;
}
const at::Tensor* first_of(const std::vector<at::Tensor>& ts) { return ts.empty() ? nullptr : &ts[0]; }
const at::Tensor* first_of(const std::vector<std::vector<at::Tensor>>& ts) {
    for (const auto& v : ts)
        if (!v.empty()) return &v[0];
    return nullptr;
}

class TimedBackend : public c10d::Backend {
   public:
    // `close_wait_s`: how long shutdown waits for owed completions (backend.py's CLOSE_WAIT_S).
    TimedBackend(BackendPtr cpu, BackendPtr cuda, const std::string& ring_path, int rank, int size,
                 double close_wait_s)
        : Backend(rank, size), cpu_(std::move(cpu)), cuda_(std::move(cuda)), close_wait_s_(close_wait_s) {
        TORCH_CHECK(cpu_ || cuda_, "artemis: an inner backend is needed");
        if (!ring_path.empty()) ring_ = c10::make_intrusive<Ring>(ring_path);
    }

    const std::string getBackendName() const override { return "artemis"; }
    bool supportsCoalescing() const override { return primary()->supportsCoalescing(); }
    void startCoalescing() override { primary()->startCoalescing(); }
    WorkPtr endCoalescing() override { return primary()->endCoalescing(); }
    void setTimeout(std::chrono::milliseconds t) override {
        for (auto* b : {&cpu_, &cuda_})
            if (*b) (*b)->setTimeout(t);
    }
    void setGroupUid(const std::string& uid) override {
        Backend::setGroupUid(uid);
        for (auto* b : {&cpu_, &cuda_})
            if (*b) (*b)->setGroupUid(uid);
    }
    void setSequenceNumberForGroup() override { primary()->setSequenceNumberForGroup(); }
    uint64_t getSequenceNumberForGroup() override { return primary()->getSequenceNumberForGroup(); }
    void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all) override {
        primary()->monitoredBarrier(o, wait_all);
    }
    // destroy_process_group: waits (bounded) for the completions the ring is still owed,
    // with the GIL let go where this thread holds it (a callback before ours may be
    // Python's). An abort does not wait.
    void shutdown() override {
        for (auto* b : {&cpu_, &cuda_})
            if (*b && (b == &cpu_ || cuda_ != cpu_)) (*b)->shutdown();
        if (!ring_) return;
        std::optional<py::gil_scoped_release> nogil;
        if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
        ring_->close(true, close_wait_s_);
    }
    void abort() override {
        for (auto* b : {&cpu_, &cuda_})
            if (*b && (b == &cpu_ || cuda_ != cpu_)) (*b)->abort();
        if (ring_) ring_->close(true);
    }

// Each collective: pick the inner backend by the tensors' device; CPU ones are
// recorded (func code, the tensors whose bytes the record carries).
#define ARTEMIS_FWD(FUNC, TENSORS, CALL)                                        \
    {                                                                          \
        const at::Tensor* t0 = first_of(TENSORS);                              \
        const bool cuda = t0 != nullptr && t0->is_cuda();                       \
        c10d::Backend* b = pick(cuda);                                          \
        if (cuda || !ring_) return b->CALL;                                     \
        return timed(FUNC, ARTEMIS_KIND_COLL, -1, t0, nbytes_of(TENSORS),       \
                     [&]() { return b->CALL; });                                \
    }

    WorkPtr broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_BROADCAST, ts, broadcast(ts, o))
    WorkPtr allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLREDUCE, ts, allreduce(ts, o))
    WorkPtr allreduce_sparse(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLREDUCE, ts, allreduce_sparse(ts, o))
    WorkPtr allreduce_coalesced(std::vector<at::Tensor>& ts,
                                const c10d::AllreduceCoalescedOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLREDUCE, ts, allreduce_coalesced(ts, o))
    WorkPtr reduce(std::vector<at::Tensor>& ts, const c10d::ReduceOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_REDUCE, ts, reduce(ts, o))
    WorkPtr allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                      const c10d::AllgatherOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLGATHER, in, allgather(out, in, o))
    WorkPtr _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
        std::vector<at::Tensor> one{in};
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLGATHER, one, _allgather_base(out, in, o))
    }
    WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                const c10d::AllgatherOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLGATHER, in, allgather_coalesced(out, in, o))
    WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                            const c10d::AllgatherOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLGATHER, in, allgather_into_tensor_coalesced(out, in, o))
    WorkPtr gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                   const c10d::GatherOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_GATHER, in, gather(out, in, o))
    WorkPtr scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                    const c10d::ScatterOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_SCATTER, out, scatter(out, in, o))
    WorkPtr reduce_scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                           const c10d::ReduceScatterOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_REDUCESCATTER, in, reduce_scatter(out, in, o))
    WorkPtr _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                 const c10d::ReduceScatterOptions& o) override {
        std::vector<at::Tensor> one{in};
        ARTEMIS_FWD(ARTEMIS_FUNC_REDUCESCATTER, one, _reduce_scatter_base(out, in, o))
    }
    WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                            const c10d::ReduceScatterOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_REDUCESCATTER, in, reduce_scatter_tensor_coalesced(out, in, o))
    WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& osz,
                          std::vector<int64_t>& isz, const c10d::AllToAllOptions& o) override {
        std::vector<at::Tensor> one{in};
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLTOALL, one, alltoall_base(out, in, osz, isz, o))
    }
    WorkPtr alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                     const c10d::AllToAllOptions& o) override
        ARTEMIS_FWD(ARTEMIS_FUNC_ALLTOALL, in, alltoall(out, in, o))
#undef ARTEMIS_FWD

    WorkPtr barrier(const c10d::BarrierOptions& o) override {
        // The Python path's barrier record: func Unknown, no bytes, float32 (its probe).
        c10d::Backend* b = cpu_ ? cpu_.get() : cuda_.get();
        if (!cpu_ || !ring_) return b->barrier(o);
        return timed(ARTEMIS_FUNC_UNKNOWN, ARTEMIS_KIND_COLL, -1, nullptr, 0, [&]() { return b->barrier(o); },
                     ARTEMIS_DT_FLOAT32);
    }
    WorkPtr send(std::vector<at::Tensor>& ts, int dst, int tag) override {
        return p2p(ARTEMIS_FUNC_SEND, ts, dst, [&](c10d::Backend* b) { return b->send(ts, dst, tag); });
    }
    WorkPtr recv(std::vector<at::Tensor>& ts, int src, int tag) override {
        return p2p(ARTEMIS_FUNC_RECV, ts, src, [&](c10d::Backend* b) { return b->recv(ts, src, tag); });
    }
    WorkPtr recvAnysource(std::vector<at::Tensor>& ts, int tag) override {
        return p2p(ARTEMIS_FUNC_RECV, ts, -1, [&](c10d::Backend* b) { return b->recvAnysource(ts, tag); });
    }

    // For bench/torch_backend.py only (off the hot path): ns of thread CPU per
    // record + completion pair into this ring, over n pairs (it numbers them as
    // collectives, so call it on a ring no one reads).
    double bench_record_ns(int n) {
        TORCH_CHECK(ring_, "artemis: no ring");
        const uint64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < n; ++i) {
            const uint64_t t = ring_->record(ARTEMIS_KIND_COLL, ARTEMIS_FUNC_ALLREDUCE, ARTEMIS_DT_FLOAT32, -1,
                                             16, 1, 2, 3);
            ring_->complete(t, 4, 5);
        }
        return static_cast<double>(clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / n;
    }

    uint64_t next_coll_seq() const { return ring_ ? ring_->coll_seq() : 0; }
    uint64_t write_index() const { return ring_ ? ring_->write_index() : 0; }
    bool close_ring(double wait_s) { return ring_ ? ring_->close(true, wait_s) : true; }
    double close_wait_s() const { return close_wait_s_; }

   private:
    c10d::Backend* primary() const { return cpu_ ? cpu_.get() : cuda_.get(); }
    c10d::Backend* pick(bool cuda) const {
        c10d::Backend* b = cuda ? cuda_.get() : cpu_.get();
        TORCH_CHECK(b != nullptr, "the artemis backend has no inner backend for ", cuda ? "cuda" : "cpu",
                    " tensors");
        return b;
    }

    template <class F>
    WorkPtr p2p(uint8_t func, std::vector<at::Tensor>& ts, int peer, F call) {
        const at::Tensor* t0 = first_of(ts);
        const bool cuda = t0 != nullptr && t0->is_cuda();
        c10d::Backend* b = pick(cuda);
        if (cuda || !ring_) return call(b);
        return timed(func, ARTEMIS_KIND_P2P, peer, t0, nbytes_of(ts), [&]() { return call(b); });
    }

    // The hot path: enqueue and CPU time, the inner call, start, the IN_FLIGHT
    // record; DONE from the inner Work's future (its thread, or here when done).
    template <class F>
    WorkPtr timed(uint8_t func, uint8_t kind, int peer, const at::Tensor* t0, uint64_t nbytes, F call,
                  uint8_t dtype = ARTEMIS_DT_UNKNOWN) {
        if (t0 != nullptr) dtype = dtype_code(*t0);
        const uint64_t enq = mono_ns();
        const uint64_t cpu0 = cpu_ns();
        WorkPtr work = call();
        const uint64_t start = mono_ns();
        Ring* ring = ring_.get();
        // The future first (gloo's send/recv Works have none: their wait is timed), so
        // a record is owed to a callback only when there is one to run.
        c10::intrusive_ptr<c10::ivalue::Future> fut;
        if (kind != ARTEMIS_KIND_P2P) {
            try {
                fut = work->getFuture();
            } catch (const std::exception&) {
            }
        }
        const uint64_t ticket = ring->record(kind, func, dtype, peer, nbytes, enq, start, cpu0, bool(fut));
        if (ticket == UINT64_MAX) return work;
        if (!fut) return c10::make_intrusive<TimedWork>(std::move(work), ring_, ticket);
        fut->addCallback(
            [r = ring_, ticket](c10::ivalue::Future&) {
                const uint64_t end = mono_ns(), cpu1 = cpu_ns();
                r->complete_owed(ticket, end, cpu1);
            },
            /*uses_future=*/false);
        return work;
    }

    BackendPtr cpu_, cuda_;
    RingPtr ring_;
    double close_wait_s_;
};

// The holder of both classes bound below. The last reference to a TimedBackend (or
// to the group that holds one) destroys the inner gloo backend, whose destructor
// joins gloo's worker threads; a worker finishing a future with a Python callback
// (Future.then, the Python path's completions) takes the GIL to let go of it. Python
// drops an object with the GIL held, so a plain intrusive_ptr holder deadlocked
// there (tests/test_job_ring_close.py hung 2 runs in 30). This one lets go of the GIL
// while the object goes, as torch's own bindings of its backends do.
template <class T>
class NoGilRef {
   public:
    NoGilRef() = default;
    // pybind makes the holder of a new object from its pointer (refcount still 0).
    explicit NoGilRef(T* p) : p_(c10::intrusive_ptr<T>::unsafe_steal_from_new(p)) {}
    NoGilRef(const NoGilRef&) = default;
    NoGilRef(NoGilRef&&) noexcept = default;
    NoGilRef& operator=(const NoGilRef&) = default;
    NoGilRef& operator=(NoGilRef&&) noexcept = default;
    ~NoGilRef() {
        if (p_ && PyGILState_Check()) {
            py::gil_scoped_release nogil;
            p_.reset();
        }
    }
    T* get() const { return p_.get(); }

   private:
    c10::intrusive_ptr<T> p_;
};

// The group the C++ path hands to torch: a plain c10d ProcessGroup (no pybind
// trampoline: torch's Python-subclassable ProcessGroup holds the GIL around every
// call made from C++, DDP's reducer included, which deadlocks against gloo's
// workers and would put the GIL on the hot path). Python subclasses of it add the
// attributes only (job/cpp_path.py, ArtemisCppGroup).
class ArtemisProcessGroupBase : public c10d::ProcessGroup {
   public:
    ArtemisProcessGroupBase(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
        : ProcessGroup(std::move(store), rank, size) {}
    const std::string getBackendName() const override { return "artemis"; }
};

// For bench/torch_backend.py: ns of thread CPU per read of a clock, in C (n reads).
double clock_read_ns(const std::string& which, int n) {
    const clockid_t id = which == "monotonic" ? CLOCK_MONOTONIC
                         : which == "process_cputime" ? CLOCK_PROCESS_CPUTIME_ID
                                                      : CLOCK_THREAD_CPUTIME_ID;
    uint64_t sink = 0;
    const uint64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < n; ++i) sink += clock_ns(id);
    const uint64_t c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    TORCH_CHECK(sink != 0, "clock");
    return static_cast<double>(c1 - c0) / n;
}

// For bench/torch_backend.py: ns of thread CPU per completion callback added to a
// completed future (what the hot path does with a Work whose future is done).
double bench_callback_ns(int n) {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
    fut->markCompleted();
    uint64_t hits = 0;
    const uint64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < n; ++i) fut->addCallback([&hits](c10::ivalue::Future&) { ++hits; }, false);
    const uint64_t c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    TORCH_CHECK(hits == static_cast<uint64_t>(n), "callbacks");
    return static_cast<double>(c1 - c0) / n;
}

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilRef<T>, true);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "The artemis torch.distributed backend's C++ hot path (job/csrc/timed_backend.cpp)";
    py::module_::import("torch.distributed");  // registers c10d's Backend type first
    py::class_<TimedBackend, c10d::Backend, NoGilRef<TimedBackend>>(m, "TimedBackend")
        .def(py::init<BackendPtr, BackendPtr, const std::string&, int, int, double>(), py::arg("cpu"),
             py::arg("cuda"), py::arg("ring_path"), py::arg("rank"), py::arg("size"),
             py::arg("close_wait_s"))
        .def_property_readonly("close_wait_s", &TimedBackend::close_wait_s)
        .def("next_coll_seq", &TimedBackend::next_coll_seq)
        .def("bench_record_ns", &TimedBackend::bench_record_ns)
        .def("write_index", &TimedBackend::write_index)
        .def("close_ring", &TimedBackend::close_ring, py::arg("wait_s") = 0.0,
             py::call_guard<py::gil_scoped_release>());
    m.def("clock_read_ns", &clock_read_ns, py::arg("clock"), py::arg("n"));
    m.def("bench_callback_ns", &bench_callback_ns, py::arg("n"));
    py::class_<ArtemisProcessGroupBase, c10d::ProcessGroup, NoGilRef<ArtemisProcessGroupBase>>(
        m, "ProcessGroupBase")
        .def(py::init<c10::intrusive_ptr<c10d::Store>, int, int>(), py::arg("store"), py::arg("rank"),
             py::arg("size"));
}
