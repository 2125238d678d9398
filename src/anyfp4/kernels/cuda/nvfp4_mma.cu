// NVFP4 x fp16/bf16 decode GEMM for M <= 32 on sm_80+ tensor cores (mma.sync m16n8k16, fp32 accumulate).
//
// out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]), or silu(gate) * up for a gated prepack.
// W comes in the NVFP4 prepack (nvfp4_prepack.py): codes int32 [N_pad, K_pad/8], code k = 8j+i in bits
// 4i..4i+3 of word j; scales uint8 [N_pad, K_pad/16]; one float32 global scale.
//
// The weight is the mma's A operand (16 rows x 16 k), the activations its B operand (16 k x 8 columns, one
// column per activation row), so M = 1..8 costs one n8 tile and decode work is shared by all M columns.
// The k order inside an mma is free as long as A and B agree, and each thread owns its own k slots. A thread
// (g = lane / 4, t = lane % 4) loads 16 bytes of codes per row for rows g and g + 8 (k = 32t .. 32t + 31 of a
// 128-wide step) and feeds them to 8 mmas straight from registers:
//   - codes h and h + 4 of a word sit 16 bits apart, so one shift and mask decodes them into a half2:
//     ((v & 0x00070007) << 9) | ((v & 0x00080008) << 12) is e2m1 * 2^-14 in each fp16 half, exactly;
//   - times the block scale (fp16, exact): e2m1 * bs * 2^-14 is exact in fp16 (<= 8 significant bits,
//     within [2^-24, 0.17]);
//   - the activations are staged once per block in shared memory, permuted per 8-group to
//     (x0, x4, x1, x5, x2, x6, x3, x7) so that one 16-byte load gives the B halves matching the pairs.
// bf16 activations are split exactly into two fp16 terms, x = hi * 2^16 + lo * 2^-8 (exact for
// 2^-22 <= |x| < 2^32, absolute error below 2^-33 under that), and run as two mmas.
// The epilogue multiplies by global_scale * 2^14.
//
// Split-K (gridDim.y > 1): every block writes its fp32 sums to `partial`, then the last block of a row tile
// (a counter per row tile, reset by that block) adds the partials in the fixed order z = 0, 1, ... and runs the
// epilogue: one launch, no floating-point atomics, identical bits run after run.
//
// Compile-time parameters (prepended as #defines by the launcher): NT (n8 tiles: M <= 8 * NT), MT (m16 tiles
// per warp), WARPS, TERMS (1: fp16 activations, 2: bf16 split), GATED, HAS_BIAS. The k range staged per round
// (kc, a multiple of 128) is a run-time argument; dynamic shared memory holds TERMS * M * (kc / 2 + 4) words.

typedef unsigned int u32;
typedef unsigned short u16;

#define ROWS_PER_WARP (MT * 16)
#define ROWS_PER_BLOCK (WARPS * ROWS_PER_WARP)
#define TILES (GATED ? 2 * MT : MT)

__device__ __forceinline__ u32 decode_pair(u32 v) {
    return ((v & 0x00070007u) << 9) | ((v & 0x00080008u) << 12);
}

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// fp16 bits of the E4M3 block scale byte b (>= 0), in both halves: (b << 7) is bs * 2^-8, times 256 exactly.
__device__ __forceinline__ u32 scale_pair(u32 b) {
    return hmul2((b << 7) | (b << 23), 0x5C005C00u);
}

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float act_to_float(u16 bits) {
#if TERMS == 2
    return __uint_as_float(((u32)bits) << 16);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
#endif
}

__device__ __forceinline__ u16 float_to_half(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float half_to_float(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 float_to_out(float f) {
#if TERMS == 2
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return float_to_half(f);
#endif
}

// The fp16 term(s) of one activation value (bits of the input dtype).
__device__ __forceinline__ void split_act(u16 bits, u16* hi, u16* lo) {
#if TERMS == 2
    float f = act_to_float(bits);
    u16 h = float_to_half(f * 1.52587890625e-05f);  // 2^-16
    float r = f - half_to_float(h) * 65536.0f;
    *hi = h;
    *lo = float_to_half(r * 256.0f);
#else
    *hi = bits;
    *lo = 0;
#endif
}

__device__ __forceinline__ float epilogue_value(const float* c, int i) {
#if TERMS == 2
    return c[i] * 65536.0f + c[4 + i] * 0.00390625f;
#else
    return c[i];
#endif
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) anyfp4_nvfp4_mma(
    const u16* __restrict__ x, const uint4* __restrict__ codes, const u16* __restrict__ scales,
    const float* __restrict__ gscale, const u16* __restrict__ bias, u16* __restrict__ out,
    float* __restrict__ partial, int* __restrict__ counters,
    int M, int K, int N_OUT, int up_offset, int rows_total, int stride_c4, int stride_s2, int stride_xm,
    int stride_om, int nsteps, int kc) {
    extern __shared__ __align__(16) u32 xs[];  // [TERMS][M][xs_stride], 8-groups permuted
    const int xs_stride = kc / 2 + 4;  // u32 per staged column (+16 bytes against bank conflicts)
    __shared__ int is_last;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int split = gridDim.y, kz = blockIdx.y;
    const int row0 = blockIdx.x * ROWS_PER_BLOCK + warp * ROWS_PER_WARP;
    const int s_beg = (int)((long long)kz * nsteps / split);
    const int s_end = (int)((long long)(kz + 1) * nsteps / split);

    // acc[tile][nt][term * 4 + i]; tiles MT.. are the up rows of a gated prepack
    float acc[TILES][NT][4 * TERMS];
#pragma unroll
    for (int a = 0; a < TILES; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int c = 0; c < 4 * TERMS; ++c) acc[a][b][c] = 0.0f;

    int rows[TILES];
#pragma unroll
    for (int a = 0; a < TILES; ++a) rows[a] = (a < MT ? row0 + a * 16 : up_offset + row0 + (a - MT) * 16) + g;

    for (int c0 = s_beg; c0 < s_end; c0 += kc / 128) {
        const int c1 = min(c0 + kc / 128, s_end);
        const int groups = (c1 - c0) * 16;  // 8-wide k groups this round
        __syncthreads();
        for (int idx = threadIdx.x; idx < M * groups; idx += WARPS * 32) {
            const int m = idx / groups, grp = idx - m * groups;
            const int k = c0 * 128 + grp * 8;
            u16 hi[8], lo[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const u16 v = (k + i < K) ? x[(long long)m * stride_xm + k + i] : (u16)0;
                split_act(v, &hi[i], &lo[i]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                xs[m * xs_stride + grp * 4 + j] = (u32)hi[j] | ((u32)hi[j + 4] << 16);
#if TERMS == 2
                xs[(M + m) * xs_stride + grp * 4 + j] = (u32)lo[j] | ((u32)lo[j + 4] << 16);
#endif
            }
        }
        __syncthreads();

        for (int s = c0; s < c1; ++s) {
            uint4 wa[TILES], wb[TILES];
            u32 sa[TILES], sb[TILES];
#pragma unroll
            for (int a = 0; a < TILES; ++a) {
                wa[a] = codes[(long long)rows[a] * stride_c4 + s * 4 + t];
                wb[a] = codes[(long long)(rows[a] + 8) * stride_c4 + s * 4 + t];
                sa[a] = scales[(long long)rows[a] * stride_s2 + s * 4 + t];
                sb[a] = scales[(long long)(rows[a] + 8) * stride_s2 + s * 4 + t];
            }
            const int xoff = (s - c0) * 64 + t * 16;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                uint4 bx[NT][TERMS];
#pragma unroll
                for (int b = 0; b < NT; ++b)
#pragma unroll
                    for (int tm = 0; tm < TERMS; ++tm) {
                        if (b * 8 + g < M) {
                            bx[b][tm] = *reinterpret_cast<const uint4*>(&xs[(tm * M + b * 8 + g) * xs_stride + xoff + q * 4]);
                        } else {
                            bx[b][tm] = make_uint4(0u, 0u, 0u, 0u);
                        }
                    }
#pragma unroll
                for (int a = 0; a < TILES; ++a) {
                    const u32 va = q == 0 ? wa[a].x : q == 1 ? wa[a].y : q == 2 ? wa[a].z : wa[a].w;
                    const u32 vb = q == 0 ? wb[a].x : q == 1 ? wb[a].y : q == 2 ? wb[a].z : wb[a].w;
                    const u32 bsa = scale_pair((sa[a] >> (8 * (q >> 1))) & 0xFFu);
                    const u32 bsb = scale_pair((sb[a] >> (8 * (q >> 1))) & 0xFFu);
                    u32 ha[4], hb[4];
#pragma unroll
                    for (int h = 0; h < 4; ++h) {
                        ha[h] = hmul2(decode_pair(va >> (4 * h)), bsa);
                        hb[h] = hmul2(decode_pair(vb >> (4 * h)), bsb);
                    }
#pragma unroll
                    for (int b = 0; b < NT; ++b)
#pragma unroll
                        for (int tm = 0; tm < TERMS; ++tm) {
                            mma16816(&acc[a][b][4 * tm], ha[0], hb[0], ha[1], hb[1], bx[b][tm].x, bx[b][tm].y);
                            mma16816(&acc[a][b][4 * tm], ha[2], hb[2], ha[3], hb[3], bx[b][tm].z, bx[b][tm].w);
                        }
                }
            }
        }
    }

    // Values of this block: out rows (n) = rows[a] and rows[a] + 8, columns (m) = b * 8 + 2t + {0, 1}.
    float val[TILES][NT][4];
#pragma unroll
    for (int a = 0; a < TILES; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) val[a][b][i] = epilogue_value(acc[a][b], i);

    if (split > 1) {
        float* mine = partial + (long long)kz * M * rows_total;
#pragma unroll
        for (int a = 0; a < TILES; ++a)
#pragma unroll
            for (int b = 0; b < NT; ++b)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = b * 8 + 2 * t + (i & 1), n = rows[a] + (i >> 1) * 8;
                    if (m < M) mine[(long long)m * rows_total + n] = val[a][b][i];
                }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) is_last = atomicAdd(&counters[blockIdx.x], 1) == split - 1;
        __syncthreads();
        if (!is_last) return;
        __threadfence();
#pragma unroll
        for (int a = 0; a < TILES; ++a)
#pragma unroll
            for (int b = 0; b < NT; ++b)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = b * 8 + 2 * t + (i & 1), n = rows[a] + (i >> 1) * 8;
                    float sum = 0.0f;
                    if (m < M)
                        for (int z = 0; z < split; ++z) sum += __ldcg(partial + ((long long)z * M + m) * rows_total + n);
                    val[a][b][i] = sum;
                }
        if (threadIdx.x == 0) counters[blockIdx.x] = 0;
    }

    const float gs = gscale[0] * 16384.0f;
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int m = b * 8 + 2 * t + (i & 1), n = rows[a] + (i >> 1) * 8;
                if (m >= M || n >= N_OUT) continue;
                float y = val[a][b][i] * gs;
#if GATED
                const float u = val[a + MT][b][i] * gs;
                y = y / (1.0f + __expf(-y)) * u;
#elif HAS_BIAS
                y += act_to_float(bias[n]);
#endif
                out[(long long)m * stride_om + n] = float_to_out(y);
            }
}
