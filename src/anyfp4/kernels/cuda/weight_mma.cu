// Weight-only decode GEMM for M <= 64 on sm_80+ tensor cores (mma.sync m16n8k16, fp32 accumulate), for NVFP4
// weights (FP8 = 0) and FP8 E4M3 weights (FP8 = 1); activations fp16 or bf16. On sm_75 (MMA_K8 = 1, fp16 only)
// each m16n8k16 product is two m16n8k8 ones over the same fragments (k 0..7: a0, a1, b0; k 8..15: a2, a3, b1),
// and without cp.async (ASYNC_COPY = 0) the staging copies go through registers. On sm_70 (QUAD_PAIRS = 1, fp16
// only) the warp's four quad pairs each run m8n8k4 products: quad pair q's thread i makes the loads of lane
// (g = i, t = q) of the m16n8k16 layout (fragment_lane), so its registers are that lane's fragments, and each
// m16n8k16 product becomes two m8n8k4 ones over the k slots of t = q (rows g: a0, a2 with b0, b1; rows g + 8:
// a1, a3); the quad pairs' sums are added once, after the main loop, and moved into the m16n8k16 C layout
// (quad_pairs_to_c), which the rest of the kernel keeps.
//
// out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]), or silu(gate) * up for a gated prepack.
// NVFP4 prepack (packing/nvfp4.py): codes in tiles of 16 rows x 128 k (256 words, row-major inside), each
// word holding the pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7) of its 8 codes (CODE_BITS there); scales in
// the same tiles, 128 bytes ordered (row % 8, block / 2, row / 8, block % 2), each byte (e + 10) << 3 | m for
// bs = 2^e (1 + m / 8) (SCALE_BYTE there; a zero scale's block has zero codes); one float32 global scale. FP8
// prepack (packing/fp8.py): the E4M3 values of k = 4j .. 4j + 3 in word j (bits placed by BYTE_BITS there),
// words in the same 16 x 16 tiles (64 k); one float32 scale per row.
//
// The weight is the mma's A operand (16 rows x 16 k), the activations its B operand (16 k x 8 columns, one
// column per activation row), so M = 1..8 costs one n8 tile and decode work is shared by all M columns.
// The k order inside an mma is free as long as A and B agree, and each thread owns its own k slots. A thread
// (g = lane / 4, t = lane % 4) loads 16 bytes of codes per row for rows g and g + 8 per step (NVFP4: 32 k of a
// 128-wide step, 2 mmas per word; FP8: 16 k of a 64-wide step, 1 mma per word; a warp's loads are one
// contiguous 1 KiB tile) and feeds them to the mmas straight from registers:
//   - NVFP4: the codes' bits are placed for bf16: a shift or rotation and a mask make pairs 0-2 bf16
//     e2m1 * 2^-126 in each half (code 1 a subnormal), pair 3 takes a rotation and two masks (decode_pair); the
//     fp16 forms put the magnitude at bits 9-11 instead (e2m1 * 2^-14). Times the block scale: in fp16 bs
//     (exact) gives e2m1 * bs * 2^-14, exact (<= 8 significant bits, within [2^-24, 0.17]); in bf16 the scale
//     enters as bs * 2^118 and the product
//     e2m1 * bs * 2^-8 is a normal bf16, exact (<= 6 significant bits, within [2^-18, 10.5]), so its products
//     with the activations stay far from float32's subnormal range. A scale byte becomes that fp16 / bf16
//     value in both halves with one byte permute and one multiply-add (scale_pair).
//   - FP8: values k0, k2 and k1, k3 of a word sit 16 bits apart, placed for bf16 (decode_e4m3_pair): as bf16
//     bits their magnitudes are e4m3 * 2^-120, times 2^120; the fp16 forms put them at bits 7-13 (e4m3 * 2^-8,
//     exactly, subnormals included).
//   - the activations are staged once per block in shared memory, permuted so that one load gives the B halves
//     matching those pairs: per 8-group (x0, x4, x1, x5, x2, x6, x3, x7) for NVFP4, (x0, x2, x1, x3, x4, x6,
//     x5, x7) for FP8. Staging copies every 16-byte group with cp.async (all in flight at once, no registers
//     held) and then permutes in place: at M = 32 a block stages 32 x K activations, and one round trip per
//     staging round instead of one per 8-group and thread keeps that off the critical path.
// The epilogue multiplies by the global scale * 2^14 (NVFP4 fp16), * 2^8 (NVFP4 bf16), or by the row's scale
// (* 2^8 for FP8 fp16).
//
// Split-K (gridDim.y > 1): every block writes its fp32 sums to `partial`, then the last block of a row tile
// (a counter per row tile, reset by that block) adds the partials in a fixed order (sum_slices: an even
// number of slices is halved, each half summed the same way, then the two halves added) and runs the
// epilogue: one launch, no floating-point atomics, identical bits run after run.
// K warps (KW > 1, a power of two): KW warps of a block share a row tile and take KW equal, consecutive slices of
// the block's k, each summing its own; they meet in shared memory, where the first warp adds them in the same
// balanced tree (sum_warps). With a power-of-two split, slice z = blockIdx.y * KW + warp's k index of
// SPLIT * KW slices then gets the bits that split-K SPLIT * KW with one K warp gives it: only the number of
// slices sets a row's bits, not how they are spread over blocks and warps.
//
// Compile-time parameters (prepended as #defines by the launcher): FP8, NT (n8 tiles: M <= 8 * NT), MT (m16 tiles per
// warp), WARPS, KW (warps along K per row tile), DEPTH (steps of code words in flight per thread), BF16 (activation
// dtype), GATED, HAS_BIAS, MMA_K8 and ASYNC_COPY (the architecture's mma shape and staging copies, above), WGMMA
// (sm_90a: warpgroup mmas for the m16n8k16 ones, the activations staged in their layout; see its #define), VEC_X
// (activation rows 16-byte aligned and K % 8 == 0: staged by cp.async), SPLIT (split-K slices, = gridDim.y), OUT_F32
// (float32 output, unrounded and before the global / row scale: a row-parallel rank's share; plain prepacks without
// bias only), EARLY (a programmatic dependent launch on sm_90: the block fills its ring of code words — weights, which
// no kernel writes — while the previous kernel finishes, and waits for it (griddepcontrol.wait) before it reads the
// activations or writes anything; it lets the next such kernel start as soon as all its own blocks run
// (griddepcontrol.launch_dependents), since that kernel too waits before it reads or writes anything a kernel writes);
// EXPERTS (a mixture of experts' grouped launch: block z runs pair z = blockIdx.z of a decode step's (token, expert)
// pairs — expert ids[z]'s prepack, found expert_c4 / expert_s2 / expert_g (codes in uint4, scales in u16, global or row
// scales in floats) on from the first expert's, over activation row z / pairs_per_row, into output row z; M = 1 and no
// split-K, so a pair gets the bits this launch gives that row with that expert alone; in stream order by default:
// early-launched behind the routing kernel it faulted now and then in CUDA-graph replays on an H100 (an illegal
// address; the host build, every input between guard pages, reads nothing out of bounds) — most likely its ids were
// read before the routing kernel wrote them. With EARLY (ANYFP4_EXPERTS_EARLY=1) every block now waits first thing,
// before it reads its ids or any weight); and the constants of the tile
// layout, the staging and the decode (STEP, X_T, X_Q, XS_PAD, TILE_ROWS, TILE_WORDS, TILE_BLOCKS, SCALE_PERM_BASE,
// SCALE_PERM_STEP, SCALE_MUL, SCALE_ADD, FP8_BF16_RESCALE, UNIT), which kernels/cuda/weight_mma_defines.py works out
// from packing/layout.py and the formats. The k range staged per round (kc, a multiple of DEPTH steps) is a run-time
// argument; dynamic shared memory holds KW * M * (kc / 2 + XS_PAD) words (each K warp's rows). Code words are loaded
// DEPTH steps ahead into a ring of registers, across staging rounds; or, with SHARED_RING (sm_80+), into a ring in
// shared memory past the staged activations (RING_SLOT words per tile and step: a lane's 16 code bytes of row g, of
// row g + 8, and its 4 scale bytes, each lane reading back only what its own cp.async copies wrote), filled by
// cp.async one commit group per step: the bytes in flight then hold no registers, so more warps fit a
// multiprocessor (registers bound its warps; probes/stream_pattern.py). The staging then copies through registers,
// so that waiting for it never waits for the ring. The main loop runs whole passes over the ring
// (DEPTH steps, no per-step bounds or staging checks, the refills at fixed offsets), then a last partial pass.

typedef unsigned int u32;
typedef unsigned short u16;

#define ROWS_PER_WARP (MT * 16)
#if !defined(KW) || KW < 1 || (KW & (KW - 1)) || WARPS % KW
#error "KW (warps along K per row tile) must be a power of two dividing WARPS"
#endif
#define ROWS_PER_BLOCK (WARPS / KW * ROWS_PER_WARP)
#define TILES (GATED ? 2 * MT : MT)
// Staged activations (u32 words: two halves each): a thread's B fragments for word q of a step lie at
// t * X_T + q * X_Q from its row's step start; rows are kc / 2 + XS_PAD words apart (no bank conflicts: see
// weight_mma_defines.STAGING). STEP: the k of one step, one tile row of code words.
#if !defined(STEP) || !defined(X_T) || !defined(X_Q) || !defined(XS_PAD) || !defined(TILE_ROWS) || \
    !defined(TILE_WORDS) || !defined(TILE_BLOCKS) || !defined(UNIT)
#error "the layout and decode constants come from kernels/cuda/weight_mma_defines.py (weight_mma.plan_launch)"
#endif
// A warp reads one code tile per step as 32 lanes x 16 bytes: lane (g, t) the words 4t .. 4t + 3 of rows g and
// g + 8, and the four scale bytes of those rows' blocks 2t, 2t + 1 in one 32-bit load.
static_assert(TILE_ROWS == 16 && TILE_WORDS == 16 && TILE_BLOCKS == 8, "the lane mapping reads 16 x 16-word tiles");

// The PTX primitives: an f16x2 / bf16x2 multiply, the m16n8k16 mma (sm_75: m16n8k8), conversions, asynchronous
// copies. A host build of this file
// (tests/support/host_cuda.h, which runs the kernel on a CPU) defines WEIGHT_MMA_HOST and brings its own.
#ifndef QUAD_PAIRS
#define QUAD_PAIRS 0
#endif
#ifndef SHARED_RING
#define SHARED_RING 0
#endif
#if SHARED_RING && !ASYNC_COPY
#error "a shared-memory ring (SHARED_RING) is filled by cp.async: sm_80+"
#endif
// WGMMA (sm_90a): each warpgroup's four warps give their decoded 16-row A fragments to one wgmma.mma_async
// m64nNk16 (N = 8 * NT) per k16, whose B operand (the activations) the tensor cores read from shared memory
// themselves: no B fragment loads, one instruction for what took NT mma.sync per warp. The staged activations then
// lie in wgmma's canonical K-major layout (wgmma_word). WGMMA 1: a step waits for its wgmmas before the next
// decodes; 2: they stay in flight while the next step decodes (two steps' fragments live: more registers).
#ifndef WGMMA
#define WGMMA 0
#endif
#if WGMMA && (KW != 1 || WARPS % 4 || EXPERTS || SHARED_RING || !ASYNC_COPY)
#error "WGMMA: one K warp, whole warpgroups, no expert pairs, a register ring, sm_90a"
#endif
#define NP (NT * 8)  // WGMMA: the activation rows a wgmma's B operand holds (rows >= M staged as zeros)
#define K16S (STEP / 16)  // WGMMA: the k16 products of a step (NVFP4 8, FP8 4), 8 NP staged words each
// A shared-memory ring's words per tile and step: 32 lanes' 16 code bytes of row g and of row g + 8, then (NVFP4)
// their 4 scale bytes.
#define RING_SLOT (32 * 4 * 2 + (FP8 ? 0 : 32))
#if (MMA_K8 || QUAD_PAIRS) && BF16
#error "sm_70 / sm_75 tensor cores have no bf16 mma: fp16 activations only"
#endif
#if MMA_K8 && QUAD_PAIRS
#error "MMA_K8 (sm_75) and QUAD_PAIRS (sm_70) are two architectures"
#endif
#ifndef WEIGHT_MMA_HOST
__device__ __forceinline__ u32 mul2(u32 a, u32 b) {
    u32 d;
#if BF16
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#else
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#endif
    return d;
}

#if QUAD_PAIRS
// sm_70's mma: one 8 x 8 x 4 product per quad pair q (lanes 4q .. 4q + 3 and 4q + 16 .. 4q + 19; its thread
// i = lane % 4 + 4 (lane / 16)): A row i (a_lo: k 0, 1; a_hi: k 2, 3), B column i (the same k); D element v of
// thread i, with i0 i1 i2 the bits of i and v0 v1 v2 those of v: row i0 + 2 v1 + 4 i2, column v0 + 2 i1 + 4 v2.
__device__ __forceinline__ void mma884(float* c, u32 a_lo, u32 a_hi, u32 b_lo, u32 b_hi) {
    asm volatile(
        "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, {%10,%11}, "
        "{%0,%1,%2,%3,%4,%5,%6,%7};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]), "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])
        : "r"(a_lo), "r"(a_hi), "r"(b_lo), "r"(b_hi));
}
#elif MMA_K8
// sm_75's mma: A 16 x 8 (a0: row g, k 2t, 2t + 1; a1: row g + 8), B 8 x 8 (b0: k 2t, 2t + 1 of column g).
__device__ __forceinline__ void mma1688(float* c, u32 a0, u32 a1, u32 b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
#else
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if BF16
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
#endif  // QUAD_PAIRS / MMA_K8

__device__ __forceinline__ float act_to_float(u16 bits) {
#if BF16
    return __uint_as_float(((u32)bits) << 16);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
#endif
}

#if ASYNC_COPY
// 16 / 8 bytes global -> shared without registers (sm_80+ cp.async; zero-filled where !valid), and the wait.
__device__ __forceinline__ void copy_16_bytes_async(u32* dst, const u16* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void copy_8_bytes_async(u32* dst, const u16* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;"
                 :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 8 : 0) : "memory");
}

__device__ __forceinline__ void wait_async_copies() {
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}
#else
// Before sm_80: the same copies through registers (zeros where !valid); nothing to wait for.
__device__ __forceinline__ void copy_16_bytes_async(u32* dst, const u16* src, bool valid) {
    *reinterpret_cast<uint4*>(dst) = valid ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ void copy_8_bytes_async(u32* dst, const u16* src, bool valid) {
    *reinterpret_cast<uint2*>(dst) = valid ? *reinterpret_cast<const uint2*>(src) : make_uint2(0u, 0u);
}

__device__ __forceinline__ void wait_async_copies() {}
#endif

// The ring's first fill in an early launch of FP8 weights, issued before griddepcontrol.wait so that the weights —
// which no kernel writes — stream while the kernel before finishes. ptxas may move read-only loads below that acquire
// and moved the plain ones in every FP8 config of the sm_90 launch table (benchmarks/probes/ring_before_wait.py): as
// volatile asm, and every word used before the wait (ring_used), they stay before it. Timed on an H100 (2026-12-06,
// random Llama-3.1-8B, benchmarks/NOTES.md): FP8 decode +3%, NVFP4 -6% (its fill pinned too), so NVFP4 keeps plain
// loads scheduled as ptxas likes, as does every launch without a wait.
__device__ __forceinline__ uint4 load_ring_words(const uint4* p) {
#if EARLY && FP8
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return *p;
#endif
}

// A use of the first fill before the wait that ptxas cannot move: a volatile store of their xor to shared memory
// (the staging area, which the first staging round overwrites after a barrier; nothing reads this value).
__device__ __forceinline__ void ring_used(u32* slot, u32 seen) {
    asm volatile("st.volatile.shared.u32 [%0], %1;" :: "r"((u32)__cvta_generic_to_shared(slot)), "r"(seen) : "memory");
}

#if SHARED_RING
// A shared-memory ring's copies: 16 code bytes and 4 scale bytes (cp.async, no registers held), one commit group a
// step, and the wait for the oldest step's group (the DEPTH - 1 later steps' may still be in flight).
__device__ __forceinline__ void ring_copy_16(u32* dst, const uint4* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void ring_copy_4(u32* dst, const u32* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;"
                 :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void ring_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ void ring_wait_oldest() {
    asm volatile("cp.async.wait_group %0;" :: "n"(DEPTH - 1) : "memory");
}
#endif

#if WGMMA
// A shared-memory matrix descriptor of a K-major B operand without swizzle: 8 x 16-byte core matrices (8 activation
// rows of 8 k) of one n8 tile 128 bytes apart (SBO), the two k halves of a k16 16 * NP bytes apart (LBO).
__device__ __forceinline__ unsigned long long wgmma_desc(const u32* p) {
    const unsigned long long addr = (u32)__cvta_generic_to_shared(p);
    return ((addr & 0x3FFFFull) >> 4) | ((unsigned long long)((16 * NP) >> 4) << 16) | ((128ull >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// All but the latest group done: the step before's wgmmas (and so its fragment registers) are finished.
__device__ __forceinline__ void wgmma_wait_previous() {
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}
// Staged by ordinary stores (the generic proxy), read by wgmma (the async proxy): made visible to it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

#if BF16
#define WGMMA_TYPES ".f32.bf16.bf16"
#else
#define WGMMA_TYPES ".f32.f16.f16"
#endif
// d (4 * NT floats, the m16n8 C layout per n8 tile) += A (this warp's 16 rows: the m16n8k16 A fragments) x B (desc).
__device__ __forceinline__ void wgmma_k16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long desc) {
#if NT == 1
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %9, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n8k16" WGMMA_TYPES " {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, "
                 "0;\n\t}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#elif NT == 2
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %13, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n16k16" WGMMA_TYPES " {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, "
                 "%12, p, 1, 1, 0;\n\t}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#elif NT == 4
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %21, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n32k16" WGMMA_TYPES " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,"
                 "%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n\t}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#elif NT == 8
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %37, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16" WGMMA_TYPES " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,"
                 "%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, "
                 "%36, p, 1, 1, 0;\n\t}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#else
#error "WGMMA: NT is 1, 2, 4 or 8"
#endif
}
#endif  // WGMMA

__device__ __forceinline__ u16 float_to_out(float f) {
    u16 h;
#if BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
    return h;
}
#endif  // WEIGHT_MMA_HOST

// One m16n8k16 product (fragments as mma16816 takes them): on sm_75 two m16n8k8 ones, k 0..7 (a0, a1, b0) then
// k 8..15 (a2, a3, b1); on sm_70 into the quad pair's 16 sums (c[0..7] rows g, c[8..15] rows g + 8), its part of
// the product: the k slots of t = q.
__device__ __forceinline__ void mma_k16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if QUAD_PAIRS
    mma884(c, a0, a2, b0, b1);
    mma884(c + 8, a1, a3, b0, b1);
#elif MMA_K8
    mma1688(c, a0, a1, b0);
    mma1688(c, a2, a3, b1);
#else
    mma16816(c, a0, a1, a2, a3, b0, b1);
#endif
}

extern __shared__ __align__(16) u32 xs[];  // [M][xs_stride], 8-groups permuted (see above)
__shared__ int is_last;  // split-K: this block arrived last for its row tile

// NVFP4 pair p (0..3: codes p and p + 4) of a prepacked word w -> two fp16/bf16 values (packing/nvfp4.py's CODE_BITS:
// pair 0's magnitudes at 4-6 and 20-22, signs at 13 and 29; pair 1's at 0-2 / 16-18, 9 / 25; pair 2's at
// 26-28 / 10-12, 3 / 19; pair 3's magnitude bits 1-2 and signs already in place, bit 0 at 30 / 14).
__device__ __forceinline__ u32 decode_pair_bf16(u32 w, int p) {
    if (p == 0) return (w << 2) & 0x81C081C0u;
    if (p == 1) return (w << 6) & 0x81C081C0u;
    if (p == 2) return __funnelshift_l(w, w, 12) & 0x81C081C0u;
    return (w & 0x81808180u) | (__funnelshift_l(w, w, 8) & 0x00400040u);
}

__device__ __forceinline__ u32 decode_pair(u32 w, int p) {
    const u32 b = decode_pair_bf16(w, p);
#if BF16
    return b;
#else
    return ((b << 3) & 0x0E000E00u) | (b & 0x80008000u);  // the magnitude moved up three bits
#endif
}

// Scale byte j (0..3) of the word s, a prepacked scale (e + 10) << 3 | m, in both halves: fp16 bs, or bf16
// bs * 2^118, exactly. The byte permute gives (b | b << 16); shifted into the exponent field (SCALE_MUL: fp16
// << 7, bf16 << 4) its exponent reads e + 10, and adding 5 (fp16, bias 15) or 235 (bf16, bias 127) to the field
// (SCALE_ADD) gives those values; the field stays below 24 / 254. A zero byte gives 2^-10 / 2^108, but its
// block's codes are zero.
__device__ __forceinline__ u32 scale_pair(u32 s, int j) {
    const u32 b = __byte_perm(s, 0u, (u32)SCALE_PERM_BASE | ((u32)SCALE_PERM_STEP * j));
    return b * (u32)SCALE_MUL + (u32)SCALE_ADD;
}

// FP8 pair p of a prepacked word w (packing/fp8.py's BYTE_BITS: pair 0 = values k0, k2, pair 1 = k1, k3) -> e4m3 * 2^-8
// (fp16) or e4m3 (bf16), exactly. bf16: pair 0 is stored with magnitudes at 4-10 and signs at 15 of each half
// (e4m3 * 2^-120 as bf16 bits, subnormals included); pair 1 moves there with a shift and a rotation.
__device__ __forceinline__ u32 decode_e4m3_pair(u32 w, int p) {
#if BF16
    const u32 bits = p == 0 ? w & 0x87F087F0u
                            : ((w << 4) & 0x80F080F0u) | (__funnelshift_l(w, w, 12) & 0x07000700u);
    return mul2(bits, (u32)FP8_BF16_RESCALE);  // * 2^120
#else
    if (p == 0) return ((w << 3) & 0x3F803F80u) | (w & 0x80008000u);
    return ((w << 7) & 0x07800780u) | (__funnelshift_l(w, w, 15) & 0x38003800u) | ((w << 4) & 0x80008000u);
#endif
}

// mma accumulator element i of n8 tile b in thread (g, t): activation row (output column) m, and the row offset
// (0 or 8) from the thread's weight row g.
__device__ __forceinline__ int acc_col(int b, int t, int i) { return b * 8 + 2 * t + (i & 1); }
__device__ __forceinline__ int acc_row_offset(int i) { return (i >> 1) * 8; }

// The lane whose loads (code words, scale bytes, staged activations) this lane makes: itself, or on sm_70 lane
// (g = i, t = q) for thread i of quad pair q.
__device__ __forceinline__ int fragment_lane(int lane) {
#if QUAD_PAIRS
    return ((lane >> 2) & 3) | ((lane & 3) << 2) | (lane & 16);
#else
    return lane;
#endif
}

#if QUAD_PAIRS
#define FULL_WARP 0xFFFFFFFFu
// sm_70: a quad pair's 16 sums of one m16 x n8 tile (mma_k16) -> this lane's m16n8k16 C elements c[0..3]. The four
// quad pairs' sums are added by two exchanges (lanes 4 and 8 apart: the same thread of another quad pair), so every
// quad pair holds the totals, bit for bit (a + b = b + a). C element i of lane (g, t) is D element v of thread
// (g & 1) + 2 (t & 1) + 4 (g >> 2), rows g / g + 8 in the first / second 8 sums, v = (i & 1) + 2 ((g >> 1) & 1) +
// 4 (t >> 1); quad pair q sends D elements v0 + 2 (q & 1) + 4 (q >> 1), so each lane reads the quad pair that
// sends the v it needs: one exchange per C element.
__device__ __forceinline__ void quad_pairs_to_c(float* q, float* c, int lane) {
#pragma unroll
    for (int v = 0; v < 16; ++v) {
        q[v] += __shfl_xor_sync(FULL_WARP, q[v], 4);
        q[v] += __shfl_xor_sync(FULL_WARP, q[v], 8);
    }
    const int mine = (lane >> 2) & 3, g = lane >> 2, t = lane & 3;
    const int src = (g & 1) | ((t & 1) << 1) | (((g >> 1) & 1) << 2) | ((t >> 1) << 3) | ((g >> 2) << 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float* half = q + 8 * (i >> 1) + (i & 1);
        const float sent = mine == 0 ? half[0] : mine == 1 ? half[2] : mine == 2 ? half[4] : half[6];
        c[i] = __shfl_sync(FULL_WARP, sent, src);
    }
}
#endif

// The sum of the SPLIT slice partials p[0], p[stride], ...: an even count is halved and each half summed the
// same way, then (left half) + (right half); an odd count is added in order from 0. The slices of one half are
// what a tensor-parallel rank holding that half of K computes with SPLIT / 2 slices, so two ranks' sums added
// give these bits. Unrolled: all partials loaded at once, blocks of the odd part of SPLIT summed in order, then
// a balanced tree over the power-of-two number of blocks, left + right.
#ifndef SPLIT
#error "SPLIT (the split-K, gridDim.y) must be defined"
#endif
#ifndef VEC_X
#error "VEC_X (16-byte aligned activation rows, K % 8 == 0) must be defined"
#endif
#ifndef EXPERTS
#define EXPERTS 0
#endif
#if EXPERTS && SPLIT != 1
#error "a grouped expert launch (EXPERTS) has one activation row per pair and no split-K"
#endif
#define LEAVES (SPLIT & -SPLIT)
#define PER_LEAF (SPLIT / LEAVES)
__device__ __forceinline__ float sum_slices(const float* p, long long stride) {
    float v[SPLIT];
#pragma unroll
    for (int z = 0; z < SPLIT; ++z) v[z] = __ldcg(p + z * stride);
#pragma unroll
    for (int j = 0; j < LEAVES; ++j) {
        float leaf = 0.0f;
#pragma unroll
        for (int z = 0; z < PER_LEAF; ++z) leaf += v[j * PER_LEAF + z];
        v[j] = leaf;  // j <= j * PER_LEAF: no later leaf reads it
    }
#pragma unroll
    for (int width = 1; width < LEAVES; width *= 2)
#pragma unroll
        for (int j = 0; j < LEAVES; j += 2 * width) v[j] = v[j] + v[j + width];
    return v[0];
}

// A row tile's KW K-warp sums of accumulator element e in lane `lane`, from the shared-memory block `red` (the sums
// of K warps 1..KW-1; K warp 0's is `own`): leaves 0 + v as in sum_slices (a -0 leaf becomes +0), then the
// balanced tree, left + right: what sum_slices gives KW slices.
__device__ __forceinline__ float sum_warps(float own, const float* red, int e, int lane) {
    float v[KW];
    v[0] = 0.0f + own;
#pragma unroll
    for (int w = 1; w < KW; ++w) v[w] = 0.0f + red[((w - 1) * (TILES * NT * 4) + e) * 32 + lane];
#pragma unroll
    for (int width = 1; width < KW; width *= 2)
#pragma unroll
        for (int j = 0; j < KW; j += 2 * width) v[j] = v[j] + v[j + width];
    return v[0];
}

// An 8-group of activations (x0 | x1 << 16, x2 | x3 << 16, ...) in the order the pairs of a weight word meet
// them: (x0, x4), (x1, x5), (x2, x6), (x3, x7) for NVFP4; (x0, x2), (x1, x3), (x4, x6), (x5, x7) for FP8.
__device__ __forceinline__ uint4 permute_group(const uint4 w) {
#if FP8
    return make_uint4(__byte_perm(w.x, w.y, 0x5410u), __byte_perm(w.x, w.y, 0x7632u),
                      __byte_perm(w.z, w.w, 0x5410u), __byte_perm(w.z, w.w, 0x7632u));
#else
    return make_uint4(__byte_perm(w.x, w.z, 0x5410u), __byte_perm(w.x, w.z, 0x7632u),
                      __byte_perm(w.y, w.w, 0x5410u), __byte_perm(w.y, w.w, 0x7632u));
#endif
}

#if WGMMA
// WGMMA: where 8-group grp of step sr of a round, row m, begins in the staged round, in words: the steps one after
// another (K16S x 8 NP words each), each k16 kb at two core-matrix columns c (4 NP words each: NP rows of 4 words),
// row m at 4m, slot t (k 2t, 2t + 1 of the core matrix's 8). NVFP4: group grp = 4t + q is word q of lane t, its pairs
// p = 2h + c go to k16 kb = 2q + h; FP8: group grp = 2t + q / 2 holds words q and q + 1 of lane t, pairs (0, 1) of
// word q to k16 q and (2, 3) of word q + 1 to q + 1. Either way pair p lies p * 4 NP words past pair 0.
__device__ __forceinline__ int wgmma_word(const int m, const int sr, const int grp) {
#if FP8
    return sr * K16S * 8 * NP + (grp & 1) * 16 * NP + m * 4 + (grp >> 1);
#else
    return sr * K16S * 8 * NP + (grp & 3) * 16 * NP + m * 4 + (grp >> 2);
#endif
}
#endif

// Where 8-group grp of a staging round goes in its row (in words): FP8 in k order; NVFP4 with the group's two
// 2-bit fields (t, q) of its step swapped, so that word q of the four threads t lies side by side (X_T, X_Q).
__device__ __forceinline__ int staged_word(const int grp) {
#if FP8
    return grp * 4;
#else
    return (grp & ~15) * 4 + (grp & 3) * X_Q + ((grp >> 2) & 3) * X_T;
#endif
}

// A staged 8-group as one 16-byte access (NVFP4: 16-byte aligned) or two 8-byte ones (FP8 rows are 8-byte
// aligned); the copy from global memory likewise.
__device__ __forceinline__ uint4 load_group(const u32* p) {
#if FP8
    const uint2 a = *reinterpret_cast<const uint2*>(p), b = *reinterpret_cast<const uint2*>(p + 2);
    return make_uint4(a.x, a.y, b.x, b.y);
#else
    return *reinterpret_cast<const uint4*>(p);
#endif
}

__device__ __forceinline__ void store_group(u32* p, const uint4 v) {
#if FP8
    *reinterpret_cast<uint2*>(p) = make_uint2(v.x, v.y);
    *reinterpret_cast<uint2*>(p + 2) = make_uint2(v.z, v.w);
#else
    *reinterpret_cast<uint4*>(p) = v;
#endif
}

// The 8-group of row xr at k, element by element (rows not 16-byte aligned or K % 8 != 0), zeros past K.
__device__ __forceinline__ uint4 load_group_elementwise(const u16* xr, const int k, const int K) {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        w[i] = (k + 2 * i < K ? (u32)xr[k + 2 * i] : 0u) | ((k + 2 * i + 1 < K ? (u32)xr[k + 2 * i + 1] : 0u) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void copy_group_async(u32* dst, const u16* src, bool valid) {
#if FP8
    copy_8_bytes_async(dst, src, valid);
    copy_8_bytes_async(dst + 2, valid ? src + 4 : src, valid);
#else
    copy_16_bytes_async(dst, src, valid);
#endif
}

__device__ __forceinline__ u32 word_of(const uint4& w, int q) {
    return q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) anyfp4_weight_mma(
    const u16* __restrict__ x, const uint4* __restrict__ codes, const u16* __restrict__ scales,
    const float* __restrict__ gscale, const u16* __restrict__ bias, void* __restrict__ out,
    float* __restrict__ partial, int* __restrict__ counters,
    int M, int K, int N_OUT, int up_offset, int rows_total, int stride_c4, int stride_s2, int stride_xm,
    int stride_om, int nsteps, int kc, const int* __restrict__ ids, int pairs_per_row, int expert_c4, int expert_s2,
    int expert_g) {
    const int xs_stride = kc / 2 + XS_PAD;  // u32 per staged row
    const int round_steps = kc / STEP;

#if EARLY
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#if EXPERTS
    {
#if EARLY
        // the ids come from the kernel before and choose every weight this block reads: wait for it before anything
        asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
        const int pair = blockIdx.z;
        const long long expert = __ldcg(ids + pair);  // from the kernel before: through L2, never a cached copy
        codes += expert * expert_c4;
        scales += expert * expert_s2;
        gscale += expert * expert_g;
        x += (long long)(pair / pairs_per_row) * stride_xm;
        out = reinterpret_cast<char*>(out) + (long long)pair * stride_om * (OUT_F32 ? 4 : 2);
    }
#endif
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;  // the C elements' lane, as the epilogue reads them
    const int fl = fragment_lane(lane), fg = fl >> 2, ft = fl & 3;  // the lane whose fragments this lane loads
    const int kw = warp % KW;  // this warp's K slice of the block's; warps warp - kw .. warp - kw + KW - 1 share rows
    const int split = gridDim.y, kz = blockIdx.y;
    const int row0 = blockIdx.x * ROWS_PER_BLOCK + warp / KW * ROWS_PER_WARP;
    const long long slices = (long long)split * KW, z = (long long)kz * KW + kw;  // KW > 1: slices divide nsteps
    const int s_beg = (int)(z * nsteps / slices);
    const int s_end = (int)((z + 1) * nsteps / slices);

    float acc[TILES][NT][4];  // the m16n8k16 C elements (sm_70: written by quad_pairs_to_c after the main loop)
#if QUAD_PAIRS
    float qacc[TILES][NT][16];  // the quad pair's sums, which the mmas accumulate
#define MMA_ACC(a, b) qacc[a][b]
#define MMA_SUMS 16
#else
#define MMA_ACC(a, b) acc[a][b]
#define MMA_SUMS 4
#endif
#pragma unroll
    for (int a = 0; a < TILES; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int c = 0; c < MMA_SUMS; ++c) MMA_ACC(a, b)[c] = 0.0f;

    // Per step s: codes cptr[a][s * W_STEP] (row g) and [s * W_STEP + W_B] (row g + 8) from a tile of 16 rows x
    // 16 words (NVFP4 128 k, FP8 64 k); NVFP4 scales sptr[a][s * S_STEP] (the bytes of row g, then row g + 8).
    const uint4* cptr[TILES];
    const u32* sptr[TILES];
    int rows[TILES];
#pragma unroll
    for (int a = 0; a < TILES; ++a) {
        rows[a] = (a < MT ? row0 + a * 16 : up_offset + row0 + (a - MT) * 16) + g;
        cptr[a] = codes + (long long)(rows[a] - g) * stride_c4 + fl;  // the row block's first tile
#if FP8
        sptr[a] = nullptr;
#else
        sptr[a] = reinterpret_cast<const u32*>(scales + (long long)(rows[a] - g) * stride_s2) + fl;
#endif
    }
    // in uint4 (codes) and u32 (scales): one 1 KiB code tile per step, row g + 8 half a tile on, 128 NVFP4 scale
    // bytes per step
    const int W_STEP = TILE_ROWS * TILE_WORDS / 4, W_B = TILE_ROWS / 2 * TILE_WORDS / 4;
    const int S_STEP = TILE_ROWS * TILE_BLOCKS / 4;

    // Register ring of DEPTH steps: slot d holds step s0 + d; after its mmas it is refilled with step s0 + d + DEPTH.
    // With SHARED_RING the slots are in shared memory (this warp's, past the staged activations and the K warps'
    // sums) and wa / wb / sw hold only the step being computed, read from its slot at the step's start.
    uint4 wa[DEPTH][TILES], wb[DEPTH][TILES];
    u32 sw[DEPTH][TILES];
#if SHARED_RING
    const int staged_words = KW * M * xs_stride, red_words = (WARPS / KW) * (KW - 1) * TILES * NT * 4 * 32;
    u32* const ring = xs + ((max(staged_words, red_words) + 3) & ~3) + warp * (DEPTH * TILES * RING_SLOT);
    auto ring_fill = [&](const int d, const int a, const uint4* c, const u32* sc) {  // this lane's copies of a step
        u32* slot = ring + (d * TILES + a) * RING_SLOT;
        ring_copy_16(slot + fl * 4, c);
        ring_copy_16(slot + 128 + fl * 4, c + W_B);
#if !FP8
        ring_copy_4(slot + 256 + fl, sc);
#endif
    };
#endif
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
#pragma unroll
        for (int a = 0; a < TILES; ++a)
            if (s_beg + d < s_end) {  // before the wait (load_ring_words)
                const int s = s_beg + d;
#if SHARED_RING
                ring_fill(d, a, cptr[a] + s * W_STEP, FP8 ? nullptr : sptr[a] + s * S_STEP);
#else
                wa[d][a] = load_ring_words(cptr[a] + s * W_STEP);
                wb[d][a] = load_ring_words(cptr[a] + s * W_STEP + W_B);
#if !FP8
                sw[d][a] = sptr[a][s * S_STEP];
#endif
#endif
            }
#if SHARED_RING
        ring_commit();  // one group a step, empty or not: wait_group counts steps
#endif
    }

    // The refills of one pass over the ring (steps s0 + DEPTH .. s0 + 2 DEPTH - 1) read at fixed offsets from
    // these pointers, advanced once per pass.
#pragma unroll
    for (int a = 0; a < TILES; ++a) {
        cptr[a] += (long long)(s_beg + DEPTH) * W_STEP;
#if !FP8
        sptr[a] += (s_beg + DEPTH) * S_STEP;
#endif
    }

#if EARLY && FP8 && !SHARED_RING
    {
        u32 seen = 0;  // every word of the first fill (slots past the block's steps were never loaded: left out)
#pragma unroll
        for (int d = 0; d < DEPTH; ++d)
#pragma unroll
            for (int a = 0; a < TILES; ++a)
                if (s_beg + d < s_end) seen ^= wa[d][a].x ^ wb[d][a].x;
        ring_used(xs, seen);
    }
#endif
#if EARLY
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    // Staging rounds start at s_beg and are a multiple of DEPTH steps long (the launcher's kc), so a round only
    // ever starts at the first step of a pass over the ring. The K warps of a block have slices of one length and
    // stage together: a round holds, for each K warp j, the same offset into its slice (rows j * M .. j * M + M - 1).
    int round_beg = s_beg, round_end = s_beg;
#if WGMMA
    // The round's activations in wgmma's layout: 8-group grp of step sr (its pairs p permuted as for the register
    // fragments) of row m at wgmma_word(m, sr, grp) + p * 4 * NP; rows M .. NP - 1 zeros.
    auto stage = [&](const int s) {
        const int c1 = min(s + round_steps, s_end);
        const int groups = (c1 - s) * (STEP / 8), total = NP * groups;
        wgmma_wait();  // every wgmma that reads the round before has finished
        __syncthreads();
        for (int idx = threadIdx.x; idx < total; idx += WARPS * 32) {
            const int m = idx / groups, gr = idx - m * groups, k = s * STEP + gr * 8;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (m < M) {
                const u16* xr = x + (long long)m * stride_xm;
#if VEC_X
                if (k < K) v = *reinterpret_cast<const uint4*>(xr + k);
#else
                v = load_group_elementwise(xr, k, K);
#endif
            }
            const uint4 pv = permute_group(v);
            u32* dst = xs + wgmma_word(m, gr / (STEP / 8), gr % (STEP / 8));
            dst[0] = pv.x;
            dst[4 * NP] = pv.y;
            dst[8 * NP] = pv.z;
            dst[12 * NP] = pv.w;
        }
        fence_proxy_async();
        __syncthreads();
        round_beg = s;
        round_end = c1;
    };
#else
    // The activations of the kc-wide round from step s, as 8-groups permuted (permute_group) and placed
    // (staged_word). Rows 16-byte aligned with K % 8 == 0 (VEC_X; a group then lies wholly below K or wholly
    // past it): every group copied by cp.async at once (16 bytes, FP8 two 8-byte halves; no registers held; a
    // group past K is zero-filled), then each thread permutes its own groups in place. Else element by element.
    // Group idx of a round: K warp j, row m, 8-group grp; its k and its staged word.
    auto round_group = [&](const int s, const int idx, const int groups, int& k) -> u32* {
        const int per_warp = M * groups, j = KW == 1 ? 0 : idx / per_warp, r = idx - j * per_warp;
        const int m = r / groups, grp = r - m * groups;
        k = (s + (j - kw) * (s_end - s_beg)) * STEP + grp * 8;  // K warp j's step at this warp's step s
        return xs + (j * M + m) * xs_stride + staged_word(grp);
    };
    auto stage = [&](const int s) {
        const int c1 = min(s + round_steps, s_end);
        const int groups = (c1 - s) * (STEP / 8), total = KW * M * groups;
        __syncthreads();
#if VEC_X && SHARED_RING
        // through registers (a cp.async wait here would wait for the ring's copies too), STAGE_BATCH groups a thread
        // loaded before any is stored, so that their round trips overlap (2: no register more than one at a time;
        // 4 or 8 raised the kernel's count from 48 to 60 / 88)
        constexpr int STAGE_BATCH = 2;
        for (int first = threadIdx.x; first < total; first += STAGE_BATCH * WARPS * 32) {
            uint4 v[STAGE_BATCH];
            u32* dst[STAGE_BATCH];
#pragma unroll
            for (int j = 0; j < STAGE_BATCH; ++j) {
                const int idx = first + j * WARPS * 32;
                int k = K;
                dst[j] = idx < total ? round_group(s, idx, groups, k) : nullptr;
                const u16* xr = x + (long long)((idx / groups) % M) * stride_xm;
                v[j] = k < K ? load_group(reinterpret_cast<const u32*>(xr + k)) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int j = 0; j < STAGE_BATCH; ++j)
                if (dst[j]) store_group(dst[j], permute_group(v[j]));
        }
#elif VEC_X
        {
            for (int idx = threadIdx.x; idx < total; idx += WARPS * 32) {
                int k;
                u32* dst = round_group(s, idx, groups, k);
                const u16* xr = x + (long long)((idx / groups) % M) * stride_xm;
                copy_group_async(dst, k < K ? xr + k : xr, k < K);
            }
            wait_async_copies();
            for (int idx = threadIdx.x; idx < total; idx += WARPS * 32) {
                int k;
                u32* p = round_group(s, idx, groups, k);
                store_group(p, permute_group(load_group(p)));
            }
        }
#else
        {
            for (int idx = threadIdx.x; idx < total; idx += WARPS * 32) {
                int k;
                u32* dst = round_group(s, idx, groups, k);
                const u16* xr = x + (long long)((idx / groups) % M) * stride_xm;
                store_group(dst, permute_group(load_group_elementwise(xr, k, K)));
            }
        }
#endif
        __syncthreads();
        round_beg = s;
        round_end = c1;
    };
    // The staged activations a thread reads: per n8 tile b its column's row (columns m >= M read a copy of row
    // M - 1: their outputs are never stored), from its k slot.
    const u32* xrow[NT];
#pragma unroll
    for (int b = 0; b < NT; ++b) xrow[b] = xs + (kw * M + min(b * 8 + fg, M - 1)) * xs_stride + ft * X_T;
#endif  // WGMMA
#if WGMMA
    (void)fg, (void)ft, (void)xs_stride;
#endif

    // Step d of the pass starting at s0 (x0: its staged activations, relative to xrow); then refill ring slot d.
    auto step = [&](const int s0, const int d, const int x0) {
        const int xoff = x0 + d * (STEP / 2);
#if SHARED_RING
        ring_wait_oldest();  // this step's copies have landed
#pragma unroll
        for (int a = 0; a < TILES; ++a) {
            const u32* slot = ring + (d * TILES + a) * RING_SLOT;
            wa[d][a] = *reinterpret_cast<const uint4*>(slot + fl * 4);
            wb[d][a] = *reinterpret_cast<const uint4*>(slot + 128 + fl * 4);
#if !FP8
            sw[d][a] = slot[256 + fl];
#endif
        }
#endif
#if WGMMA
        // the step's A fragments first (k16 kb: NVFP4 pairs 2h, 2h + 1 of word q for kb = 2q + h; FP8 word kb), then its
        // K16S x TILES wgmmas
        u32 af[K16S][TILES][4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int a = 0; a < TILES; ++a) {
                const u32 va = word_of(wa[d][a], q), vb = word_of(wb[d][a], q);
#if FP8
                af[q][a][0] = decode_e4m3_pair(va, 0), af[q][a][1] = decode_e4m3_pair(vb, 0);
                af[q][a][2] = decode_e4m3_pair(va, 1), af[q][a][3] = decode_e4m3_pair(vb, 1);
#else
                const u32 bsa = scale_pair(sw[d][a], q >> 1), bsb = scale_pair(sw[d][a], 2 + (q >> 1));
#pragma unroll
                for (int p = 0; p < 4; ++p) {
                    af[2 * q + (p >> 1)][a][2 * (p & 1)] = mul2(decode_pair(va, p), bsa);
                    af[2 * q + (p >> 1)][a][2 * (p & 1) + 1] = mul2(decode_pair(vb, p), bsb);
                }
#endif
            }
        const u32* xstep = xs + (s0 + d - round_beg) * K16S * 8 * NP;
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < K16S; ++kb) {
            const unsigned long long desc = wgmma_desc(xstep + kb * 8 * NP);
#pragma unroll
            for (int a = 0; a < TILES; ++a)
                wgmma_k16(&acc[a][0][0], af[kb][a][0], af[kb][a][1], af[kb][a][2], af[kb][a][3], desc);
        }
        wgmma_commit();
#if WGMMA == 2
        wgmma_wait_previous();  // this step's stay in flight while the next step decodes (its fragments live on)
#else
        wgmma_wait();
#endif
        (void)xoff;
#elif FP8
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // word q: one mma per row pair
            uint2 bx[NT];
#pragma unroll
            for (int b = 0; b < NT; ++b) bx[b] = *reinterpret_cast<const uint2*>(xrow[b] + xoff + q * X_Q);
#pragma unroll
            for (int a = 0; a < TILES; ++a) {
                const u32 va = word_of(wa[d][a], q), vb = word_of(wb[d][a], q);
                const u32 a0 = decode_e4m3_pair(va, 0), a2 = decode_e4m3_pair(va, 1);
                const u32 a1 = decode_e4m3_pair(vb, 0), a3 = decode_e4m3_pair(vb, 1);
#pragma unroll
                for (int b = 0; b < NT; ++b) mma_k16(MMA_ACC(a, b), a0, a1, a2, a3, bx[b].x, bx[b].y);
            }
        }
#else
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint4 bx[NT];
#pragma unroll
            for (int b = 0; b < NT; ++b) bx[b] = *reinterpret_cast<const uint4*>(xrow[b] + xoff + q * X_Q);
#pragma unroll
            for (int a = 0; a < TILES; ++a) {
                const u32 va = word_of(wa[d][a], q), vb = word_of(wb[d][a], q);
                const u32 bsa = scale_pair(sw[d][a], q >> 1);  // word q: block 2t + q / 2
                const u32 bsb = scale_pair(sw[d][a], 2 + (q >> 1));
                u32 ha[4], hb[4];
#pragma unroll
                for (int p = 0; p < 4; ++p) {
                    ha[p] = mul2(decode_pair(va, p), bsa);
                    hb[p] = mul2(decode_pair(vb, p), bsb);
                }
#pragma unroll
                for (int b = 0; b < NT; ++b) {
                    mma_k16(MMA_ACC(a, b), ha[0], hb[0], ha[1], hb[1], bx[b].x, bx[b].y);
                    mma_k16(MMA_ACC(a, b), ha[2], hb[2], ha[3], hb[3], bx[b].z, bx[b].w);
                }
            }
        }
#endif
        if (s0 + d + DEPTH < s_end) {
#pragma unroll
            for (int a = 0; a < TILES; ++a) {
#if SHARED_RING
                ring_fill(d, a, cptr[a] + d * W_STEP, FP8 ? nullptr : sptr[a] + d * S_STEP);
#else
                wa[d][a] = cptr[a][d * W_STEP];
                wb[d][a] = cptr[a][d * W_STEP + W_B];
#if !FP8
                sw[d][a] = sptr[a][d * S_STEP];
#endif
#endif
            }
        }
#if SHARED_RING
        ring_commit();
#endif
    };
    auto advance = [&]() {
#pragma unroll
        for (int a = 0; a < TILES; ++a) {
            cptr[a] += DEPTH * W_STEP;
#if !FP8
            sptr[a] += DEPTH * S_STEP;
#endif
        }
    };

    int s0 = s_beg;
    for (; s0 + DEPTH <= s_end; s0 += DEPTH) {  // whole passes
        if (s0 == round_end) stage(s0);
        const int x0 = (s0 - round_beg) * (STEP / 2);
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) step(s0, d, x0);
        advance();
    }
    if (s0 < s_end) {  // the last, partial pass
        if (s0 == round_end) stage(s0);
        const int x0 = (s0 - round_beg) * (STEP / 2);
#pragma unroll
        for (int d = 0; d < DEPTH; ++d)
            if (s0 + d < s_end) step(s0, d, x0);
    }

#if QUAD_PAIRS
#pragma unroll
    for (int a = 0; a < TILES; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b) quad_pairs_to_c(qacc[a][b], acc[a][b], lane);
#endif
#if WGMMA
    wgmma_wait();  // the last step's wgmmas, before the sums are read
#endif
#if KW > 1
    // The K warps' sums meet in shared memory, in the staged activations' place (the launcher gives a block enough
    // for both): K warps 1..KW-1 of each row tile store theirs, K warp 0 adds them (sum_warps).
    __syncthreads();
    float* red = reinterpret_cast<float*>(xs) + (warp / KW) * ((KW - 1) * TILES * NT * 4 * 32);
    if (kw > 0) {
#pragma unroll
        for (int a = 0; a < TILES; ++a)
#pragma unroll
            for (int b = 0; b < NT; ++b)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    red[((kw - 1) * (TILES * NT * 4) + (a * NT + b) * 4 + i) * 32 + lane] = acc[a][b][i];
    }
    __syncthreads();
    if (kw == 0) {
#pragma unroll
        for (int a = 0; a < TILES; ++a)
#pragma unroll
            for (int b = 0; b < NT; ++b)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[a][b][i] = sum_warps(acc[a][b][i], red, (a * NT + b) * 4 + i, lane);
    }
#endif
    const bool owner = kw == 0;  // this warp holds its row tile's sums (with KW == 1 every warp does)

    // This block's sums: out rows (n) rows[a] and rows[a] + 8, columns (m) b * 8 + 2t + {0, 1}.
    if (split > 1) {
        float* mine = partial + (long long)kz * M * rows_total;
#pragma unroll
        for (int a = 0; a < TILES; ++a)
#pragma unroll
            for (int b = 0; b < NT; ++b)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = acc_col(b, t, i), n = rows[a] + acc_row_offset(i);
                    if (owner && m < M) mine[(long long)m * rows_total + n] = acc[a][b][i];
                }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) is_last = atomicAdd(&counters[blockIdx.x], 1) == split - 1;
        __syncthreads();
        if (!is_last || !owner) return;
        __threadfence();
#pragma unroll
        for (int a = 0; a < TILES; ++a)
#pragma unroll
            for (int b = 0; b < NT; ++b)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = acc_col(b, t, i), n = rows[a] + acc_row_offset(i);
                    acc[a][b][i] = m < M ? sum_slices(partial + (long long)m * rows_total + n,
                                                      (long long)M * rows_total) : 0.0f;
                }
        if (threadIdx.x == 0) counters[blockIdx.x] = 0;
    }

    if (!owner) return;
    // The weight value in the mma is w * 2^-e (see above); the epilogue restores 2^e (UNIT: NVFP4 fp16 2^14, bf16
    // 2^8; FP8 fp16 2^8, bf16 1) and the scale.
    const float unit = (float)UNIT;
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int m = acc_col(b, t, i), n = rows[a] + acc_row_offset(i);
                if (m >= M || n >= N_OUT) continue;
                // gscale: FP8 one scale per prepack row, NVFP4 the one global scale; a float32 output leaves
                // it to whoever adds the ranks' outputs (scaled once, after the sum)
#if OUT_F32
                float y = acc[a][b][i] * unit;
#else
                float y = acc[a][b][i] * unit * gscale[FP8 ? n : 0];
#endif
#if GATED
                const float u = acc[a + MT][b][i] * unit * gscale[FP8 ? rows[a + MT] + acc_row_offset(i) : 0];
                y = y / (1.0f + __expf(-y)) * u;
#elif HAS_BIAS
                y += act_to_float(bias[n]);
#endif
#if OUT_F32
                reinterpret_cast<float*>(out)[(long long)m * stride_om + n] = y;
#else
                reinterpret_cast<u16*>(out)[(long long)m * stride_om + n] = float_to_out(y);
#endif
            }
}
