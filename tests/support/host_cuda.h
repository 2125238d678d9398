// Runs a CUDA kernel source (weight_mma.cu) on the CPU, for tests: the source is compiled as C++ after the
// launch's #defines and this header. Each CUDA thread of a block is a fiber (ucontext) on one OS thread; blocks
// run one after another. __syncthreads waits for every live thread of the block, an mma waits for its 32 lanes
// and computes its m16n8k16 tile from their fragments (PTX ISA fragment layouts, float64 sums rounded to
// float32). A barrier that cannot complete (a divergent __syncthreads or mma) is reported, not hung on.
// Shared memory starts as NaN bits in every 16-bit half, so reading a slot no thread staged shows up.
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

using std::max;
using std::min;

#define WEIGHT_MMA_HOST 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct uint4 {
    unsigned x, y, z, w;
} __attribute__((aligned(16)));
struct uint2 {
    unsigned x, y;
} __attribute__((aligned(8)));
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
struct host_dim3 {
    unsigned x, y, z;
};

static host_dim3 threadIdx, blockIdx, gridDim, blockDim;

namespace host {
enum State { RUNNING, AT_SYNCTHREADS, AT_WARP, AT_GROUP, DONE };
struct Fiber {
    ucontext_t ctx;
    State state;
    std::vector<char> stack;
};
constexpr size_t SHARED_WORDS = 232448 / 4;  // the largest opt-in shared memory of an sm_80+ GPU
constexpr int MAX_THREADS = 1024;
static ucontext_t scheduler;
static std::vector<Fiber> fibers;
static int current = 0;
static char error[512];
static char fault[512];  // the first fault of a launch (it runs on, like a GPU until the error is read)
struct WarpFragments {
    unsigned a[32][4], b[32][2];
    float s[32];  // a shuffle's values
};
static WarpFragments warps[MAX_THREADS / 32];
struct GroupFragments {  // a warpgroup's wgmma operands: every lane's A fragments and descriptor
    unsigned a[128][4];
    unsigned long long desc[128];
};
static GroupFragments groups[MAX_THREADS / 128];

inline void wait(State s) {
    fibers[current].state = s;
    swapcontext(&fibers[current].ctx, &scheduler);
}

inline float bits_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned float_bits(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float half_to_float(unsigned short h) {
    const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return bits_float(sign | 0x7F800000u | (m << 13));
    if (e == 0) return (sign ? -1.0f : 1.0f) * std::ldexp((float)m, -24);
    return bits_float(sign | ((e + 112) << 23) | (m << 13));
}
inline unsigned short float_to_half(float f) {  // round to nearest even, subnormals, overflow to infinity
    const unsigned u = float_bits(f), sign = (u >> 16) & 0x8000u;
    const float a = std::fabs(f);
    if (std::isnan(f)) return (unsigned short)(sign | 0x7E00u);
    if (a >= 65520.0f) return (unsigned short)(sign | 0x7C00u);
    if (a < 6.103515625e-05f) return (unsigned short)(sign | (unsigned)std::nearbyint(std::ldexp(a, 24)));
    int e;
    const float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
    const unsigned m = (unsigned)std::nearbyint(std::ldexp(frac, 11));  // 1024..2048
    return (unsigned short)(sign | (((unsigned)(e + 14) << 10) + (m - 1024)));
}
inline float bf16_to_float(unsigned short h) { return bits_float((unsigned)h << 16); }
inline unsigned short float_to_bf16(float f) {  // round to nearest even
    const unsigned u = float_bits(f);
    if (std::isnan(f)) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float lo(unsigned r, bool bf16) { return bf16 ? bf16_to_float(r & 0xFFFF) : half_to_float(r & 0xFFFF); }
inline float hi(unsigned r, bool bf16) { return bf16 ? bf16_to_float(r >> 16) : half_to_float(r >> 16); }
}  // namespace host

inline void __syncthreads() { host::wait(host::AT_SYNCTHREADS); }
inline void __threadfence() {}
inline float __ldcg(const float* p) { return *p; }
inline int __ldcg(const int* p) { return *p; }
inline uint4 load_ring_words(const uint4* p) { return *p; }
inline unsigned load_ring_scales(const unsigned* p) { return *p; }
inline void ring_used(unsigned* slot, unsigned seen) { *slot = seen; }
inline int atomicAdd(int* p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
inline float __expf(float x) { return std::exp(x); }
inline float __uint_as_float(unsigned u) { return host::bits_float(u); }
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
    const unsigned long long both = ((unsigned long long)hi << 32) | lo;
    return (unsigned)((both << (shift & 31)) >> 32);
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long pool = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((pool >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}

// The PTX primitives of weight_mma.cu.
inline unsigned mul2(unsigned a, unsigned b) {  // mul.rn.f16x2 / fma.rn.bf16x2 with -0: one rounding per half
    unsigned out = 0;
    for (int h = 0; h < 2; ++h) {
        const unsigned short x = (a >> (16 * h)) & 0xFFFF, y = (b >> (16 * h)) & 0xFFFF;
        const unsigned short r = BF16 ? host::float_to_bf16(host::bf16_to_float(x) * host::bf16_to_float(y))
                                      : host::float_to_half(host::half_to_float(x) * host::half_to_float(y));
        out |= (unsigned)r << (16 * h);
    }
    return out;
}

// One warp's mma of K = 8 or 16: every lane publishes its A (na registers) and B (nb registers) fragments, then
// computes its C from the PTX layouts. A (16 x K, row-major): lane (g, t) holds a0 = (row g, k 2t, 2t + 1),
// a1 = (g + 8, same k), for K = 16 also a2 = (g, k 2t + 8, 2t + 9), a3 = (g + 8, those k). B (K x 8): b0 = (k 2t,
// 2t + 1; column g), for K = 16 also b1 = (k 2t + 8, 2t + 9; column g). C: c0, c1 = (row g; columns 2t, 2t + 1),
// c2, c3 = (row g + 8; same). The sums are exact (double) and rounded to float32 once per mma.
inline void warp_mma(float* c, const unsigned* a, int na, const unsigned* b, int nb, int K) {
    const int tid = (int)threadIdx.x, lane = tid & 31;
    host::WarpFragments& w = host::warps[tid >> 5];
    for (int i = 0; i < na; ++i) w.a[lane][i] = a[i];
    for (int i = 0; i < nb; ++i) w.b[lane][i] = b[i];
    host::wait(host::AT_WARP);
    auto a_at = [&](int row, int k) {
        const unsigned r = w.a[(row & 7) * 4 + (k & 7) / 2][(row >> 3) + 2 * (k >> 3)];
        return (k & 1) ? host::hi(r, BF16) : host::lo(r, BF16);
    };
    auto b_at = [&](int k, int col) {
        const unsigned r = w.b[col * 4 + (k & 7) / 2][k >> 3];
        return (k & 1) ? host::hi(r, BF16) : host::lo(r, BF16);
    };
    const int g = lane >> 2, t = lane & 3;
    float d[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        double sum = c[i];
        for (int k = 0; k < K; ++k) sum += (double)a_at(row, k) * (double)b_at(k, col);
        d[i] = (float)sum;
    }
    host::wait(host::AT_WARP);  // every lane has read the fragments before any lane's next mma writes them
    for (int i = 0; i < 4; ++i) c[i] = d[i];
}

inline void mma16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    const unsigned a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    warp_mma(c, a, 4, b, 2, 16);
}

inline void mma1688(float* c, unsigned a0, unsigned a1, unsigned b0) {  // sm_75's m16n8k8 (fp16)
    const unsigned a[2] = {a0, a1};
    warp_mma(c, a, 2, &b0, 1, 8);
}

// sm_70's m8n8k4 (fp16), from the PTX layouts: one 8 x 8 x 4 product per quad pair q (lanes 4q .. 4q + 3 and
// 4q + 16 .. 4q + 19; its thread i = lane % 4 + 4 (lane / 16)). A row i = thread i's (a_lo: k 0, 1; a_hi: k 2, 3),
// B column i = thread i's (b_lo, b_hi, the same k); D element v of thread i (bits i0 i1 i2, v0 v1 v2): row
// i0 + 2 v1 + 4 i2, column v0 + 2 i1 + 4 v2. Exact sums rounded to float32 once per mma.
inline void mma884(float* c, unsigned a_lo, unsigned a_hi, unsigned b_lo, unsigned b_hi) {
    const int tid = (int)threadIdx.x, lane = tid & 31;
    host::WarpFragments& w = host::warps[tid >> 5];
    w.a[lane][0] = a_lo, w.a[lane][1] = a_hi, w.b[lane][0] = b_lo, w.b[lane][1] = b_hi;
    host::wait(host::AT_WARP);
    const int q = (lane >> 2) & 3, i = (lane & 3) | ((lane >> 4) << 2);
    auto lane_of = [&](int j) { return (j & 3) + 4 * q + 16 * (j >> 2); };
    auto half_at = [&](const unsigned* regs, int k) {
        return (k & 1) ? host::hi(regs[k >> 1], false) : host::lo(regs[k >> 1], false);
    };
    float d[8];
    for (int v = 0; v < 8; ++v) {
        const int row = (i & 1) + 2 * ((v >> 1) & 1) + 4 * (i >> 2), col = (v & 1) + 2 * ((i >> 1) & 1) + 4 * (v >> 2);
        double sum = c[v];
        for (int k = 0; k < 4; ++k)
            sum += (double)half_at(w.a[lane_of(row)], k) * (double)half_at(w.b[lane_of(col)], k);
        d[v] = (float)sum;
    }
    host::wait(host::AT_WARP);
    for (int v = 0; v < 8; ++v) c[v] = d[v];
}

// A warp shuffle: every lane publishes v, then reads lane src's.
inline float warp_exchange(float v, int src) {
    const int tid = (int)threadIdx.x, lane = tid & 31;
    host::WarpFragments& w = host::warps[tid >> 5];
    w.s[lane] = v;
    host::wait(host::AT_WARP);
    const float got = w.s[src & 31];
    host::wait(host::AT_WARP);
    return got;
}
inline float __shfl_sync(unsigned, float v, int src) { return warp_exchange(v, src); }
inline float __shfl_xor_sync(unsigned, float v, int mask) { return warp_exchange(v, ((int)threadIdx.x & 31) ^ mask); }

inline void copy_async(unsigned* dst, const unsigned short* src, bool valid, unsigned bytes) {  // done at once
    if (((valid && reinterpret_cast<uintptr_t>(src) % bytes) || reinterpret_cast<uintptr_t>(dst) % bytes)
        && !host::fault[0])
        std::snprintf(host::fault, sizeof host::fault, "block (%u, %u) thread %u: cp.async of %u bytes from %p to "
                      "%p, not %u-byte aligned (a GPU faults)", blockIdx.x, blockIdx.y, threadIdx.x, bytes,
                      (const void*)src, (void*)dst, bytes);
    if (valid)
        std::memcpy(dst, src, bytes);
    else
        std::memset(dst, 0, bytes);
}
inline void copy_16_bytes_async(unsigned* dst, const unsigned short* src, bool valid) {
    copy_async(dst, src, valid, 16);
}
inline void copy_8_bytes_async(unsigned* dst, const unsigned short* src, bool valid) { copy_async(dst, src, valid, 8); }
inline void wait_async_copies() {}
inline void ring_copy_16(unsigned* dst, const uint4* src) {
    copy_async(dst, reinterpret_cast<const unsigned short*>(src), true, 16);
}
inline void ring_copy_4(unsigned* dst, const unsigned* src) {
    copy_async(dst, reinterpret_cast<const unsigned short*>(src), true, 4);
}
inline void ring_commit() {}
inline void ring_wait_oldest() {}

inline float act_to_float(unsigned short bits) {
    return BF16 ? host::bf16_to_float(bits) : host::half_to_float(bits);
}
inline unsigned short float_to_out(float f) { return BF16 ? host::float_to_bf16(f) : host::float_to_half(f); }

__attribute__((aligned(16))) unsigned xs[host::SHARED_WORDS];

// sm_90's wgmma (WGMMA in weight_mma.cu): the warpgroup's 128 lanes publish their A fragments (each warp its 16 rows
// of the 64, in the m16n8k16 A layout) and the B descriptor, then each lane computes its D elements (per n8 tile the
// m16n8 C layout) from them and from the staged shared memory the descriptor names, read as the PTX ISA lays out a
// K-major operand without swizzle: element (k, n) at start + (k / 8) LBO + (n / 8) SBO + (n % 8) 16 + (k % 8) 2
// bytes. Exact sums rounded to float32 once per wgmma; the descriptor's address is a byte offset into xs.
inline unsigned long long wgmma_desc(const unsigned* p) {
    const unsigned long long addr = (unsigned long long)(p - xs) * 4;
    return ((addr & 0x3FFFFull) >> 4) | ((unsigned long long)((16 * NT * 8) >> 4) << 16) | ((128ull >> 4) << 32);
}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
inline void wgmma_wait() {}
inline void wgmma_wait_previous() {}
inline void fence_proxy_async() {}
inline void wgmma_k16(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long desc) {
    const int tid = (int)threadIdx.x, member = tid & 127;
    host::GroupFragments& gr = host::groups[tid >> 7];
    gr.a[member][0] = a0, gr.a[member][1] = a1, gr.a[member][2] = a2, gr.a[member][3] = a3;
    gr.desc[member] = desc;
    host::wait(host::AT_GROUP);
    if (gr.desc[member] != gr.desc[0] && !host::fault[0])
        std::snprintf(host::fault, sizeof host::fault, "block (%u, %u) thread %d: a wgmma descriptor other than its "
                      "warpgroup's", blockIdx.x, blockIdx.y, tid);
    const size_t start = (desc & 0x3FFF) << 4, lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
    auto a_at = [&](int row, int k) {
        const int r = row & 15;
        const unsigned v = gr.a[(row >> 4) * 32 + (r & 7) * 4 + (k & 7) / 2][(r >> 3) + 2 * (k >> 3)];
        return (k & 1) ? host::hi(v, BF16) : host::lo(v, BF16);
    };
    auto b_at = [&](int k, int n) {
        const size_t off = start + (k >> 3) * lbo + (n >> 3) * sbo + (n & 7) * 16 + (k & 7) * 2;
        if (off + 2 > sizeof xs) {
            if (!host::fault[0])
                std::snprintf(host::fault, sizeof host::fault, "block (%u, %u): a wgmma reads shared byte %zu, past "
                              "the %zu", blockIdx.x, blockIdx.y, off, sizeof xs);
            return 0.0f;
        }
        unsigned short h;
        std::memcpy(&h, reinterpret_cast<const char*>(xs) + off, 2);
        return act_to_float(h);
    };
    const int w = member >> 5, g = (member & 31) >> 2, t = member & 3;
    float out[4 * NT];
    for (int c = 0; c < NT; ++c)
        for (int i = 0; i < 4; ++i) {
            const int row = 16 * w + g + 8 * (i >> 1), col = 8 * c + 2 * t + (i & 1);
            double sum = d[4 * c + i];
            for (int k = 0; k < 16; ++k) sum += (double)a_at(row, k) * (double)b_at(k, col);
            out[4 * c + i] = (float)sum;
        }
    host::wait(host::AT_GROUP);  // every lane has read the fragments before any lane's next wgmma writes them
    for (int i = 0; i < 4 * NT; ++i) d[i] = out[i];
}

namespace host {
static void (*kernel_body)();
static void fiber_main() {
    kernel_body();
    fibers[current].state = DONE;  // returns to the scheduler (uc_link)
}

// One block: every fiber runs until it waits or returns; then a warp whose 32 lanes all wait at an mma goes on,
// else the block's __syncthreads completes once every thread waits there. Returns 0, or 1 with `error` set.
inline int run_block(int threads) {
    for (size_t i = 0; i < SHARED_WORDS; ++i) xs[i] = 0x7FFF7FFFu;  // NaN in fp16 and in bf16
    for (int i = 0; i < threads; ++i) {
        Fiber& f = fibers[i];
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = &scheduler;
        makecontext(&f.ctx, fiber_main, 0);
        f.state = RUNNING;
    }
    for (;;) {
        for (int i = 0; i < threads; ++i) {
            if (fibers[i].state != RUNNING) continue;
            current = i;
            threadIdx = {(unsigned)i, 0, 0};
            swapcontext(&scheduler, &fibers[i].ctx);
        }
        int done = 0, at_sync = 0;
        bool moved = false;
        for (int w = 0; w < threads / 32; ++w) {
            int at_warp = 0;
            for (int l = 0; l < 32; ++l) at_warp += fibers[w * 32 + l].state == AT_WARP;
            if (at_warp == 32) {
                for (int l = 0; l < 32; ++l) fibers[w * 32 + l].state = RUNNING;
                moved = true;
            } else if (at_warp > 0) {
                std::snprintf(error, sizeof error, "block (%u, %u) warp %d: %d of 32 lanes at an mma, the rest "
                              "elsewhere (a divergent mma.sync)", blockIdx.x, blockIdx.y, w, at_warp);
                return 1;
            }
        }
        for (int gi = 0; gi < threads / 128; ++gi) {  // a warpgroup whose 128 lanes all wait at a wgmma goes on
            int at_group = 0;
            for (int l = 0; l < 128; ++l) at_group += fibers[gi * 128 + l].state == AT_GROUP;
            if (at_group == 128) {
                for (int l = 0; l < 128; ++l) fibers[gi * 128 + l].state = RUNNING;
                moved = true;
            }
        }
        if (moved) continue;
        for (int i = 0; i < threads; ++i) {
            done += fibers[i].state == DONE;
            at_sync += fibers[i].state == AT_SYNCTHREADS;
        }
        if (done == threads) return 0;
        if (at_sync == threads) {
            for (int i = 0; i < threads; ++i) fibers[i].state = RUNNING;
            continue;
        }
        std::snprintf(error, sizeof error, "block (%u, %u): %d threads at __syncthreads, %d returned (a divergent "
                      "__syncthreads)", blockIdx.x, blockIdx.y, at_sync, done);
        return 1;
    }
}

// Every block of the grid, x fastest, then y, then z; returns 0, or 1 with the first error in `err`.
inline int run_grid(int gx, int gy, int gz, int threads, void (*body)(), char* err, int errlen) {
    if (threads % 32 != 0 || threads > MAX_THREADS) {
        std::snprintf(err, errlen, "block of %d threads: need a multiple of 32 up to %d", threads, MAX_THREADS);
        return 1;
    }
    kernel_body = body;
    fault[0] = 0;
    // the fibers' stacks (128 KiB a thread) go back when the grid is done: every variant's library stays
    // loaded for the rest of the test session, and kept stacks made it grow by ~0.4 GB per variant
    struct Release { ~Release() { std::vector<Fiber>().swap(fibers); } } release;
    fibers.assign(threads, Fiber{});
    for (auto& f : fibers) f.stack.resize(128 * 1024);
    gridDim = {(unsigned)gx, (unsigned)gy, (unsigned)gz};
    blockDim = {(unsigned)threads, 1, 1};
    for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
            for (int x = 0; x < gx; ++x) {
                blockIdx = {(unsigned)x, (unsigned)y, (unsigned)z};
                if (run_block(threads)) {
                    std::snprintf(err, errlen, "%s", error);
                    return 1;
                }
            }
    if (fault[0]) {
        std::snprintf(err, errlen, "%s", fault);
        return 1;
    }
    return 0;
}
}  // namespace host
