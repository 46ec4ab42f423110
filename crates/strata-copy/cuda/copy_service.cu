// Strata's kernel-free small-copy service: one block that polls a doorbell ring in
// write-combined pinned host memory and moves payloads between host memory and device memory.
// Layout and protocol: crates/strata-copy/src/ring.rs (the host side; keep the two in step).
//
// Every 8-byte ring word carries 4 data bytes and the request's 32-bit tag, so one parallel
// read of a slot by warp 0 (32 lanes x 16 bytes = the whole 512-byte slot) both detects a new
// request and fetches its inline payload: one PCIe round trip instead of two.

#define SLOT_WORDS 64
#define HEADER_WORDS 4
#define INLINE_MAX 240

#define OP_H2D_INLINE 1
#define OP_H2D_STAGED 2
#define OP_D2H 3
#define OP_STOP 4

#define STATUS_DONE 0
#define STATUS_EXITED 8
#define STATUS_FAULT 16

__device__ __forceinline__ unsigned long long strata_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// A 16-byte load that always goes to memory (the host rewrites the ring behind the GPU's back).
__device__ __forceinline__ void strata_load2(const unsigned long long* p, unsigned long long& a,
                                             unsigned long long& b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

__device__ __forceinline__ void strata_store_sys(unsigned long long* p, unsigned long long v) {
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ bool strata_tagged(unsigned long long w, unsigned tag) {
    return (unsigned)(w >> 32) == tag;
}

// Host (staging, 16-byte aligned) to device (any alignment).
__device__ void strata_h2d(unsigned char* dev, const unsigned char* src, unsigned len) {
    const unsigned t = threadIdx.x, n = blockDim.x;
    if ((((unsigned long long)dev) & 15) == 0) {
        const unsigned vecs = len / 16;
        for (unsigned i = t; i < vecs; i += n) {
            uint4 v = __ldcv(reinterpret_cast<const uint4*>(src) + i);
            reinterpret_cast<uint4*>(dev)[i] = v;
        }
        for (unsigned i = vecs * 16 + t; i < len; i += n) dev[i] = __ldcv(src + i);
    } else {
        const unsigned words = len / 4;
        for (unsigned i = t; i < words; i += n) {
            unsigned v = __ldcv(reinterpret_cast<const unsigned*>(src) + i);
            dev[4 * i] = (unsigned char)v;
            dev[4 * i + 1] = (unsigned char)(v >> 8);
            dev[4 * i + 2] = (unsigned char)(v >> 16);
            dev[4 * i + 3] = (unsigned char)(v >> 24);
        }
        for (unsigned i = words * 4 + t; i < len; i += n) dev[i] = __ldcv(src + i);
    }
}

// Device (any alignment) to host (staging, 16-byte aligned).
__device__ void strata_d2h(unsigned char* dst, const unsigned char* dev, unsigned len) {
    const unsigned t = threadIdx.x, n = blockDim.x;
    if ((((unsigned long long)dev) & 15) == 0) {
        const unsigned vecs = len / 16;
        for (unsigned i = t; i < vecs; i += n) {
            reinterpret_cast<uint4*>(dst)[i] = __ldcv(reinterpret_cast<const uint4*>(dev) + i);
        }
        for (unsigned i = vecs * 16 + t; i < len; i += n) dst[i] = __ldcv(dev + i);
    } else {
        const unsigned words = len / 4;
        for (unsigned i = t; i < words; i += n) {
            const unsigned char* s = dev + 4 * i;
            unsigned v = (unsigned)__ldcv(s) | ((unsigned)__ldcv(s + 1) << 8) |
                         ((unsigned)__ldcv(s + 2) << 16) | ((unsigned)__ldcv(s + 3) << 24);
            reinterpret_cast<unsigned*>(dst)[i] = v;
        }
        for (unsigned i = words * 4 + t; i < len; i += n) dst[i] = __ldcv(dev + i);
    }
}

// ring: nslots * SLOT_WORDS words (WC host memory); h2d/d2h: nslots * stage_slot bytes;
// status: STATUS words (cached host memory). Serves requests start_seq, start_seq + 1, ... in
// order until a STOP request. hot_ns: after a request, poll the whole slot with no sleep for
// this long; afterwards poll only the header, sleeping up to max_backoff_ns between polls.
extern "C" __global__ void __launch_bounds__(256)
strata_copy_service(const unsigned long long* ring, unsigned nslots, const unsigned char* h2d,
                    unsigned char* d2h, unsigned long long stage_slot,
                    unsigned long long* status, unsigned long long start_seq,
                    unsigned long long epoch, unsigned long long hot_ns,
                    unsigned max_backoff_ns, unsigned pollers, unsigned stagger_ns,
                    unsigned sys_fence_all) {
    __shared__ unsigned long long s_words[SLOT_WORDS];
    __shared__ int s_found;
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned full = 0xffffffffu;
    unsigned long long seq = start_seq;
    unsigned long long last_active = strata_now_ns();
    for (;;) {
        const unsigned slot_index = (unsigned)((seq - 1) % nslots);
        const unsigned long long* slot = ring + (unsigned long long)slot_index * SLOT_WORDS;
        const unsigned tag = (unsigned)seq;
        if (tid == 0) s_found = 0;
        __syncthreads();
        // Warps below `pollers` poll; while hot, warp k starts k * stagger_ns late, so their
        // round trips overlap and a new request is seen sooner. Cold, only warp 0 polls.
        if (warp < pollers) {
            unsigned backoff = 0;
            unsigned long long a = 0, b = 0;
            if (warp > 0) __nanosleep(warp * stagger_ns);
            for (;;) {
                if (*(volatile int*)&s_found) break;
                const bool hot = strata_now_ns() - last_active < hot_ns;
                if (!hot && warp > 0) {
                    __nanosleep(max_backoff_ns);
                    continue;
                }
                if (hot || lane < 2) strata_load2(slot + 2 * lane, a, b);
                const bool head_ok =
                    __all_sync(full, lane >= 2 || (strata_tagged(a, tag) && strata_tagged(b, tag)));
                if (head_ok) {
                    const unsigned long long w0 = __shfl_sync(full, a, 0);
                    const unsigned op = (unsigned)(w0 >> 24) & 0xff;
                    const unsigned len = (unsigned)w0 & 0xffffff;
                    if (op == OP_H2D_INLINE && len <= INLINE_MAX) {
                        const unsigned need = HEADER_WORDS + (len + 3) / 4;
                        if (!hot && lane >= 2) strata_load2(slot + 2 * lane, a, b);
                        // Words still in flight from the host's WC buffers: read them again.
                        for (;;) {
                            const bool ok = (2 * lane >= need || strata_tagged(a, tag)) &&
                                            (2 * lane + 1 >= need || strata_tagged(b, tag));
                            if (__all_sync(full, ok)) break;
                            if (!ok) strata_load2(slot + 2 * lane, a, b);
                        }
                    }
                    int claimed = 0;
                    if (lane == 0) claimed = atomicCAS(&s_found, 0, 1) == 0;
                    claimed = __shfl_sync(full, claimed, 0);
                    if (claimed) {
                        s_words[2 * lane] = a;
                        s_words[2 * lane + 1] = b;
                    }
                    break;
                }
                if (!hot) {
                    backoff = backoff == 0 ? 64 : min(backoff * 2, max_backoff_ns);
                    __nanosleep(backoff);
                }
            }
        }
        __syncthreads();
        const unsigned long long w0 = s_words[0];
        const unsigned op = (unsigned)(w0 >> 24) & 0xff;
        const unsigned len = (unsigned)w0 & 0xffffff;
        unsigned char* dev = reinterpret_cast<unsigned char*>(
            (s_words[1] & 0xffffffffull) | ((s_words[2] & 0xffffffffull) << 32));
        bool fault = false;
        if (op == OP_H2D_INLINE) {
            if (len > INLINE_MAX) {
                fault = true;
            } else {
                for (unsigned i = tid; i < len; i += blockDim.x) {
                    dev[i] = (unsigned char)(s_words[HEADER_WORDS + i / 4] >> (8 * (i % 4)));
                }
            }
        } else if (op == OP_H2D_STAGED) {
            if (len > stage_slot) fault = true;
            else strata_h2d(dev, h2d + slot_index * stage_slot, len);
        } else if (op == OP_D2H) {
            if (len > stage_slot) fault = true;
            else strata_d2h(d2h + slot_index * stage_slot, dev, len);
        } else if (op != OP_STOP) {
            fault = true;
        }
        // Every thread's writes, then one system-scope fence, then the completion word.
        __syncthreads();
        if (tid == 0) {
            // Device-memory writes (H2D) need only reach the GPU's L2 before `done`: anything
            // the host starts after seeing `done` reads them there. Host-memory writes (D2H)
            // must reach the host first: a system-scope fence.
            if (op == OP_D2H || sys_fence_all) __threadfence_system();
            else __threadfence();
            if (fault) {
                strata_store_sys(status + STATUS_FAULT, seq);
            } else {
                strata_store_sys(status + STATUS_DONE, seq);
            }
            if (fault || op == OP_STOP) {
                __threadfence_system();
                strata_store_sys(status + STATUS_EXITED, epoch);
            }
        }
        if (fault || op == OP_STOP) return;
        last_active = strata_now_ns();
        ++seq;
    }
}
