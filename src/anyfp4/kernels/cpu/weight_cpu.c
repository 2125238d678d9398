/* Weight-only NVFP4 / FP8 linears on the CPU, reading the GPU prepack as it is (no untiling per call).

   Built at first use by the system C compiler (kernels/cpu/linear.py), which passes the layout as defines
   (kernels/cpu/weight_cpu_defines.py) taken from packing/layout.py and the prepack modules, the owners of the
   layout:
     TILE_ROWS, TILE_WORDS     a storage tile: TILE_ROWS rows x TILE_WORDS int32 words, row-major inside
     TILE_BLOCKS               NVFP4 block scales per tile row, WORDS_PER_BLOCK words each
     NVFP4_CODE_i(w)           for i = 0..7: code i of word w (magnitude bits 0..2, sign at bit 3)
     NVFP4_INDEX_i(w)          the same in bits 0..3 with anything above (a permute's index reads only those)
     FP8_MAGNITUDE_i(w)        for i = 0..3: the 7 magnitude bits of E4M3 value i of word w
     FP8_SIGN_i(w)             its sign, at bit 0
     FP8_HALF_i(w)             the magnitude at bits 7..13 and the sign at bit 15, every other bit of 0..15 zero
     NVFP4_PAIR_CODES          {a0, b0, .., a3, b3}: the codes a word's four pairs take (the bf16 path below)
     NVFP4_PAIR_INDEX_p(w)     pair p's code a at bits 0..3 and code b at bits 16..19, anything elsewhere
     FP8_PAIR_BYTES            {a0, b0, a1, b1}: the values an FP8 word's two pairs take
     FP8_PAIR_BITS_p(w)        pair p's values a and b as a bf16 pair (magnitude at 4..10 / 20..26, sign at 15 /
                               31), every other bit zero
   each an expression of SRL (shift right), SHL, ROTL (rotate left), AND, OR and SEL (bit select), written from
   the prepack's bit tables. The tiles' strides come in as arguments, and so do, per row of a tile, the aligned
   16 bytes that hold its block scales and each lane's byte in them (computed by the prepack's own offset
   functions).

   Activations come as the caller's rows (float32, bfloat16 or float16, unit stride along k) and are permuted
   here, once per call, into float32 x_perm: for tile t, field i (code or byte i of a word) and lane j (word j
   of the tile row), x[m, k] for k = (t * TILE_WORDS + j) * FIELDS + i, zero past K, at
   x_perm[m0 * tiles * FIELDS * TILE_WORDS + ((t * mb + m - m0) * FIELDS + i) * TILE_WORDS + j], where the pass
   of x's rows that m belongs to starts at m0 and has mb rows (pass_of): a pass's rows of one tile lie side by
   side, so the kernels reach every row of a pass from one pointer and constant offsets. So every lane of a vector
   works on its own word and one field at a time. Only the tiles that hold some k < K are read: the prepack's
   padding past them adds nothing.

   Every output row is one fixed sequence of float32 operations: for each tile in k order, lane j sums its
   word's products of code values and x (fields in order, from zero) and adds that sum times the word's block
   scale to its accumulator (FP8: the products straight into it); then the TILE_WORDS lanes are added by halving.
   A tile's sum starting from zero keeps the dependency chain across tiles one multiply-add long (2x at M = 1 on
   a 4096x4096 layer). On CPUs with bf16 dot products (AVX512_BF16), bf16 rows take them instead: a word's
   values two at a time (NVFP4_BF16_ROWS, FP8_BF16_ROWS), and on CPUs with AMX tiles the tiles (AMX_PATH below: a row
   block decoded once to exact bf16 weights for up to 64 rows of x). Nothing depends on how many rows of x share the
   call or how the output rows are split between threads, so a row's bits do not depend on M. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* rows of x a pass over a weight row block decodes for: up to 8 (a call takes 8 at a time, then the rest at once).
   With a pass's rows side by side in the permuted x (pass_of) the bf16 dot products' eight rows of sums and partial
   sums stay in registers too (with each row's k contiguous they spilled, 2.4x the time of 4 rows) */
#define EVERY_MB(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)  /* 1 .. PASS_ROWS */
#define PASS_ROWS 8

#if !defined(TILE_ROWS) || !defined(TILE_WORDS) || !defined(TILE_BLOCKS) || !defined(WORDS_PER_BLOCK)
#error "the layout defines (TILE_ROWS, TILE_WORDS, TILE_BLOCKS, WORDS_PER_BLOCK, NVFP4_CODE_i, ...) come from linear.py"
#endif

static inline float as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t as_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* E2M1 magnitudes. A prepacked scale byte shifted into a float's exponent field is bs * 2^-117
   (packing/nvfp4.py; a float subnormal for small scales), so times 2^117 it is the block scale bs exactly. */
#define P117 1.6615349947311448e+35f
static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static inline float halving_sum(const float *v) {
    float a[TILE_WORDS];
    for (int j = 0; j < TILE_WORDS; j++) a[j] = v[j];
    for (int h = TILE_WORDS / 2; h > 0; h /= 2)
        for (int j = 0; j < h; j++) a[j] += a[j + h];
    return a[0];
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && TILE_WORDS == 16 && \
    !defined(WEIGHT_CPU_PORTABLE)
#include <immintrin.h>
#define SRL(w, s) _mm512_srli_epi32(w, s)
#define SHL(w, s) _mm512_slli_epi32(w, s)
#define AND(w, m) _mm512_and_si512(w, _mm512_set1_epi32((int)(m)))
#define OR(a, b) _mm512_or_si512(a, b)
#define SEL(a, b, m) _mm512_ternarylogic_epi32(a, b, _mm512_set1_epi32((int)(m)), 0xD8) /* m's bits from b, else a */

/* A weight row's words are one 64-byte line per tile, a tile's size apart, which the hardware prefetchers do not
   follow; but a row block's tiles are consecutive, and so are their scale bytes. So while row r of a block computes,
   the r-th of TILE_ROWS slices of the next block's tiles (words, then scales) is asked for, in address order, into
   L2: a stream the prefetchers join. From DRAM that reads twice as fast as asking for row n + 8's lines while row n
   computes (into L1, a block of 32 tiles pushed out the one in use). */
#define PREFETCH_SLICE(base, bytes, r)                                                                          \
            for (int64_t i = (r) * ((bytes) / 64) / TILE_ROWS; i < ((r) + 1) * ((bytes) / 64) / TILE_ROWS; i++) \
                _mm_prefetch((const char *)(base) + i * 64, _MM_HINT_T1);
#define NEXT_BLOCK(n) (((n) / TILE_ROWS + 1) * TILE_ROWS < n_end)
#define PREFETCH_WORDS(n)                                                                                       \
            if (NEXT_BLOCK(n))                                                                              \
                PREFETCH_SLICE(codes + ((n) / TILE_ROWS + 1) * word_rowblock, tiles * word_tile * 4, (n) % TILE_ROWS)
#define PREFETCH_SCALES(n)                                                                                      \
            if (NEXT_BLOCK(n))                                                                              \
                PREFETCH_SLICE(scales + ((n) / TILE_ROWS + 1) * scale_rowblock, tiles * scale_tile, (n) % TILE_ROWS)

/* y[m * ldy] = scale * (the lanes of acc[m] added by halving, as halving_sum: lane j + lane j + 8, then + 4, + 2,
   + 1), for the mb rows of x of a call */
static inline void store_rows(const __m512 *acc, int mb, float scale, float *y, int64_t ldy) {
    for (int m = 0; m < mb; m++) {
        const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(acc[m]), _mm512_extractf32x8_ps(acc[m], 1));
        const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
        const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
        const __m128 h1 = _mm_add_ss(h2, _mm_movehdup_ps(h2));
        y[m * ldy] = scale * _mm_cvtss_f32(h1);
    }
}

/* The sums of a row block's rows, kept until the block is done: sums[m][r] is row n0 + r's accumulator for the
   pass's row m of x. flush_rows adds each one's lanes in halving_sum's order (lane j + lane j + 8, then + 4, + 2,
   + 1; each addition the one store_rows makes) for 16 rows at once in four rounds of shuffles and adds, then
   writes scale (times row_scale[n] where given) times each total. */
static inline __m512 halving_sums_16(const __m512 *v) {
    __m512 h1[8], h2[4], h3[2];
    for (int i = 0; i < 8; i++)   /* quarters: v[2i] lanes j + j + 8 for j 0..3, 4..7, then v[2i + 1]'s */
        h1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++)   /* quarter q: v[4i + q]'s four sums of j + j + 4 */
        h2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h1[2 * i], h1[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(h1[2 * i], h1[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++)   /* quarter q: v[8i + q]'s two sums of j + j + 2, then v[8i + 4 + q]'s */
        h3[i] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(h2[2 * i]), _mm512_castps_pd(h2[2 * i + 1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(h2[2 * i]), _mm512_castps_pd(h2[2 * i + 1]))));
    /* lane 4q + i: the total of v[4i + q] */
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(h3[0], h3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(h3[0], h3[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), t);
}

static inline void flush_rows(__m512 (*sums)[TILE_ROWS], int mb, int64_t count, const float *row_scale, float scale,
                              float *y, int64_t ldy) {
    const __mmask16 live = (__mmask16)((1u << count) - 1u);
    const __m512 s = row_scale ? _mm512_mul_ps(_mm512_maskz_loadu_ps(live, row_scale), _mm512_set1_ps(scale))
                               : _mm512_set1_ps(scale);
    for (int m = 0; m < mb; m++) {
        for (int64_t r = count; r < TILE_ROWS; r++) sums[m][r] = _mm512_setzero_ps();
        _mm512_mask_storeu_ps(y + m * ldy, live, _mm512_mul_ps(s, halving_sums_16(sums[m])));
    }
}

/* one field of every word of a tile row: decode, then a product per row of x */
#define NVFP4_STEP(i)                                                                                           \
            {                                                                                               \
                const __m512 v = _mm512_permutexvar_ps(NVFP4_INDEX_##i(w), table);                          \
                for (int m = 0; m < mb; m++)                                                                \
                    part[m] = _mm512_fmadd_ps(v, _mm512_loadu_ps(xp + (m * 8 + i) * TILE_WORDS), part[m]);      \
            }

/* The rows [n0, n1) of an NVFP4 weight for the MB rows of x from m0 (x_rows: XT values, PER_TILE of them per
   tile lane): per tile the block scales bs, a sum `part` from zero that STEPS fills from w and xp, then
   acc += part * bs. The FMA and the bf16 dot-product paths differ only in x's form and STEPS. */
#define NVFP4_ROW_LOOP(MB, XT, PER_TILE, STEPS)                                                                 \
    __m512 sums[MB][TILE_ROWS];                                                                             \
    for (int64_t n = n0; n < n1; n++) {                                                                     \
        __m512 acc[MB];                                                                                     \
        for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();                                          \
        const int64_t r = n % TILE_ROWS;                                                                    \
        const uint32_t *wrow = codes + (n / TILE_ROWS) * word_rowblock + r * word_row;                       \
        const uint8_t *srow = scales + (n / TILE_ROWS) * scale_rowblock;                                     \
        PREFETCH_WORDS(n) PREFETCH_SCALES(n)                                                                \
        /* lane j takes the scale of block j / 2: the row's 8 scale bytes, each twice, picked by a byte    \
           shuffle from the aligned 16 bytes of the tile that hold them all (linear.py checks that they do) */  \
        const int64_t span = spans[r];                                                                      \
        const __m128i byte_index = _mm_loadu_si128((const __m128i *)(lane_bytes + r * 16));                 \
        for (int64_t t = 0; t < tiles; t++) {                                                               \
            const __m512i w = _mm512_loadu_si512(wrow + t * word_tile);                                     \
            const __m512i sb = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(                                       \
                _mm_loadu_si128((const __m128i *)(srow + t * scale_tile + span)), byte_index));              \
            const __m512 bs = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(sb, 20)), _mm512_set1_ps(P117)); \
            const XT *xp = x_rows + (m0 * tiles + t * MB) * PER_TILE * TILE_WORDS;                              \
            __m512 part[MB];                                                                                \
            for (int m = 0; m < MB; m++) part[m] = _mm512_setzero_ps();                                     \
            STEPS                                                                                           \
            for (int m = 0; m < MB; m++) acc[m] = _mm512_fmadd_ps(part[m], bs, acc[m]);                     \
        }                                                                                                   \
        for (int m = 0; m < MB; m++) sums[m][n - n0] = acc[m];                                               \
    }                                                                                                       \
    flush_rows(sums, MB, n1 - n0, NULL, out_scale, y + m0 * ldy + n0, ldy);                                  \

#define NVFP4_ROWS(MB)                                                                                          \
static void nvfp4_rows_##MB(const uint32_t *codes, const uint8_t *scales, const float *x_rows,              \
                            const int64_t *spans, const uint8_t *lane_bytes, int64_t tiles,                  \
                            int64_t word_rowblock, int64_t word_row, int64_t word_tile, int64_t scale_rowblock, \
                            int64_t scale_tile,                                                              \
                            int64_t n0, int64_t n1, int64_t n_end, int64_t m0, float out_scale, float *y, int64_t ldy) { \
    const int mb = MB;                                                                                      \
    float values[16];                                                                                       \
    for (int c = 0; c < 16; c++) values[c] = (c & 8 ? -1.0f : 1.0f) * e2m1[c & 7];                           \
    const __m512 table = _mm512_loadu_ps(values);                                                           \
    NVFP4_ROW_LOOP(MB, float, 8, NVFP4_STEP(0) NVFP4_STEP(1) NVFP4_STEP(2) NVFP4_STEP(3) NVFP4_STEP(4)       \
                   NVFP4_STEP(5) NVFP4_STEP(6) NVFP4_STEP(7))                                                \
}
EVERY_MB(NVFP4_ROWS)

#if defined(__AVX512BF16__)
/* bf16 activations on CPUs with bf16 dot products: a word's codes two at a time (pairs NVFP4_PAIR_CODES), both
   bf16 values of a pair by one 16-bit permute of a 32-entry table (every code twice: the index's bit 4 is
   anything), then one dot product per row of x with x's pair (the two bf16 values of those k in one 32-bit
   lane, the first code's low; NVFP4_ROW_LOOP's x_rows). The products are exact; each dot product adds them into
   the tile's sum in its fixed order (with the instruction's flush of subnormal inputs and results to zero). */
#define NVFP4_BF16_PATH 1
#define ROTL(w, r) _mm512_rol_epi32(w, r)
#define NVFP4_PAIR_STEP(p)                                                                                      \
            {                                                                                               \
                const __m512bh v = (__m512bh)_mm512_permutexvar_epi16(NVFP4_PAIR_INDEX_##p(w), table);      \
                for (int m = 0; m < mb; m++)                                                                \
                    part[m] = _mm512_dpbf16_ps(part[m], v,                                                  \
                        (__m512bh)_mm512_loadu_si512(xp + (m * 4 + p) * TILE_WORDS));                           \
            }

#define NVFP4_BF16_ROWS(MB)                                                                                     \
static void nvfp4_bf16_rows_##MB(const uint32_t *codes, const uint8_t *scales, const uint32_t *x_rows,      \
                                 const int64_t *spans, const uint8_t *lane_bytes, int64_t tiles,             \
                                 int64_t word_rowblock,                                                      \
                                 int64_t word_row, int64_t word_tile, int64_t scale_rowblock,                \
                                 int64_t scale_tile, int64_t n0, int64_t n1, int64_t n_end, int64_t m0, float out_scale, \
                                 float *y, int64_t ldy) {                                                    \
    const int mb = MB;                                                                                      \
    uint16_t values[32];                                                                                    \
    for (int c = 0; c < 32; c++) values[c] = (uint16_t)(as_bits((c & 8 ? -1.0f : 1.0f) * e2m1[c & 7]) >> 16); \
    const __m512i table = _mm512_loadu_si512(values);                                                       \
    NVFP4_ROW_LOOP(MB, uint32_t, 4, NVFP4_PAIR_STEP(0) NVFP4_PAIR_STEP(1) NVFP4_PAIR_STEP(2) NVFP4_PAIR_STEP(3)) \
}
EVERY_MB(NVFP4_BF16_ROWS)
#endif

/* FP8: a value's 7 magnitude bits at fp16 bits 7-13 and its sign at 15 are e4m3 * 2^-8 as an fp16 (subnormals
   included), widened exactly to float32; the row scale times 2^8 comes at the end. */
#define FP8_STEP(i)                                                                                             \
            {                                                                                               \
                const __m512i half = FP8_HALF_##i(w);                                                       \
                const __m512 v = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(half));                              \
                for (int m = 0; m < mb; m++)                                                                \
                    acc[m] = _mm512_fmadd_ps(v, _mm512_loadu_ps(xp + (m * 4 + i) * TILE_WORDS), acc[m]);        \
            }

#define FP8_ROWS(MB)                                                                                            \
static void fp8_rows_##MB(const uint32_t *codes, const float *row_scale, const float *x_perm, int64_t tiles, \
                          int64_t word_rowblock, int64_t word_row, int64_t word_tile, int64_t n0, int64_t n1, \
                          int64_t n_end, int64_t m0, float *y, int64_t ldy) {                                   \
    const int mb = MB;                                                                                      \
    __m512 sums[MB][TILE_ROWS];                                                                             \
    for (int64_t n = n0; n < n1; n++) {                                                                     \
        __m512 acc[MB];                                                                                     \
        for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();                                          \
        const uint32_t *wrow = codes + (n / TILE_ROWS) * word_rowblock + (n % TILE_ROWS) * word_row;         \
        PREFETCH_WORDS(n)                                                                                   \
        for (int64_t t = 0; t < tiles; t++) {                                                               \
            const __m512i w = _mm512_loadu_si512(wrow + t * word_tile);                                     \
            const float *xp = x_perm + (m0 * tiles + t * MB) * 4 * TILE_WORDS;                                  \
            FP8_STEP(0) FP8_STEP(1) FP8_STEP(2) FP8_STEP(3)                                                 \
        }                                                                                                   \
        for (int m = 0; m < MB; m++) sums[m][n - n0] = acc[m];                                               \
    }                                                                                                       \
    flush_rows(sums, MB, n1 - n0, row_scale ? row_scale + n0 : NULL, 256.0f, y + m0 * ldy + n0, ldy);         \
}
EVERY_MB(FP8_ROWS)

#ifdef NVFP4_BF16_PATH
/* FP8 with bf16 rows: two E4M3 values of a word as a bf16 pair (FP8_PAIR_BITS_p: magnitude bits at 4..10 and sign
   at 15 of a half, e4m3 * 2^-120), rebiased by 120 in the exponent (exact for every normal E4M3 value), the
   halves with a zero exponent field (E4M3 subnormals and zero) taken from a table instead; then one dot product
   per row of x with x's pair, into the accumulator (exact products, the instruction's fixed order). */
static inline __m512i fp8_bf16_pairs(__m512i bits, __m512i subnormals) {
    const __mmask32 sub = _mm512_testn_epi16_mask(bits, _mm512_set1_epi16(0x0780));
    __m512i v = _mm512_add_epi32(bits, _mm512_set1_epi32(0x3C003C00));
    v = _mm512_mask_permutexvar_epi16(v, sub, _mm512_srli_epi16(bits, 4), subnormals);
    return _mm512_ternarylogic_epi32(v, bits, _mm512_set1_epi32((int)0x80008000u), 0xF8);
}

#define FP8_BF16_STEP(p)                                                                                        \
            {                                                                                               \
                const __m512i v = fp8_bf16_pairs(FP8_PAIR_BITS_##p(w), subnormals);                         \
                for (int m = 0; m < mb; m++)                                                                \
                    acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)v,                                          \
                        (__m512bh)_mm512_loadu_si512(xq + (m * 2 + p) * TILE_WORDS));                           \
            }

#define FP8_BF16_ROWS(MB)                                                                                       \
static void fp8_bf16_rows_##MB(const uint32_t *codes, const float *row_scale, const uint32_t *x_pair,       \
                               int64_t tiles, int64_t word_rowblock, int64_t word_row, int64_t word_tile,    \
                               int64_t n0, int64_t n1, int64_t n_end, int64_t m0, float *y, int64_t ldy) {   \
    const int mb = MB;                                                                                      \
    __m512 sums[MB][TILE_ROWS];                                                                             \
    uint16_t values[32] = {0};                                                                              \
    for (int m = 0; m < 8; m++) values[m] = (uint16_t)(as_bits((float)m * 0.001953125f) >> 16); /* m * 2^-9 */ \
    const __m512i subnormals = _mm512_loadu_si512(values);                                                  \
    for (int64_t n = n0; n < n1; n++) {                                                                     \
        __m512 acc[MB];                                                                                     \
        for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();                                          \
        const uint32_t *wrow = codes + (n / TILE_ROWS) * word_rowblock + (n % TILE_ROWS) * word_row;         \
        PREFETCH_WORDS(n)                                                                                   \
        for (int64_t t = 0; t < tiles; t++) {                                                               \
            const __m512i w = _mm512_loadu_si512(wrow + t * word_tile);                                     \
            const uint32_t *xq = x_pair + (m0 * tiles + t * MB) * 2 * TILE_WORDS;                               \
            FP8_BF16_STEP(0) FP8_BF16_STEP(1)                                                               \
        }                                                                                                   \
        for (int m = 0; m < MB; m++) sums[m][n - n0] = acc[m];                                               \
    }                                                                                                       \
    flush_rows(sums, MB, n1 - n0, row_scale ? row_scale + n0 : NULL, 1.0f, y + m0 * ldy + n0, ldy);           \
}
EVERY_MB(FP8_BF16_ROWS)

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512FP16__) && !defined(WEIGHT_CPU_NO_AMX)
/* bf16 rows on CPUs with AMX tiles: a row block (TILE_ROWS = 16 weight rows) is decoded to exact bf16 weights in
   `chunks` of 32 k (NVFP4: the code times its block scale, exact in bf16; FP8: the E4M3 value), each chunk one
   16 x 32 A tile, and every output of the block sums, chunk by chunk in k order from zero, the tile dot products
   with x's matching 16 k pairs (one B tile per 16 rows of x: x's pairs down, x's rows across). Each output is
   its own column of the instruction, a fixed sequence whatever the other rows of x or the threads (inputs and
   results flushed to zero when subnormal, as the dot products above), so a row's bits do not depend on M; the
   weight scale (NVFP4's global, FP8's row scale) multiplies the sum at the end. A weight row block is decoded
   once for every row of x, up to AMX_GROUPS x 16 rows of x per pass over the decoded block. */
#define AMX_PATH 1
#include <sys/syscall.h>
#include <unistd.h>
extern long syscall(long number, ...);  /* unistd.h declares it only outside strict C11 */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_GROUPS 4   /* C tiles 4..7: 64 rows of x per pass */
/* a row block's tiles are consecutive 1 KiB (and the next block follows): the decode asks for the lines of the tile
   AMX_PREFETCH_TILES ahead (past a block's last tile: the next block's first, or nothing — a prefetch never
   faults) */
#define AMX_PREFETCH_TILES 2

/* the process's permission to use the tile registers (Linux asks each process to request it): 1 if granted */
static int amx_ready(void) {
    static volatile int state = 0;  /* 0 unknown, 1 granted, -1 refused; asking twice is harmless */
    if (state == 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state > 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tile 0: the weights' chunk (16 rows x 32 bf16), 1: x's chunk (16 pairs x cols rows of x), 4..7: the sums of
   16 weight rows x cols rows of x, one per group of x's rows */
static void amx_configure(int cols) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = 16, c.colsb[0] = 64;
    c.rows[1] = 16, c.colsb[1] = (uint16_t)(cols * 4);
    for (int i = 4; i < 4 + AMX_GROUPS; i++) c.rows[i] = TILE_ROWS, c.colsb[i] = (uint16_t)(cols * 4);
    _tile_loadconfig(&c);
}

/* bf16 h times 2^shift (an exponent shift: exact), zero for zero and subnormals (which the tile dot products take
   as zero), infinity past the largest bf16, infinities and NaNs as they are */
static inline uint32_t scaled_bf16(uint16_t h, int shift) {
    const uint32_t e = (h >> 7) & 0xFF;
    if (shift == 0 || e == 0xFF) return h;
    if (e == 0) return 0;
    if (e + (uint32_t)shift >= 0xFF) return (h & 0x8000u) | 0x7F80u;
    return h + ((uint32_t)shift << 7);
}

/* x (rows, k) bf16 times 2^shift -> x's B tiles: for group g (rows 16g..16g+15 of x) and chunk c, 16 pair rows of
   `cols` dwords at xb + (g * chunks + c) * 16 * cols; pair row d's dword i holds row 16g + i's bf16 values at
   k = kpair[(c % per_tile) * 32 + 2d] (low half) and kpair[.. + 2d + 1] (high half) of tile c / per_tile; zero
   past K and past the rows */
static uint32_t *amx_pairs(const uint16_t *x, int64_t ldx, int64_t rows, int64_t k, int64_t chunks, int per_tile,
                           int64_t tile_k, const int *kpair, int cols, int shift) {
    const int64_t groups = (rows + 15) / 16, size = groups * chunks * 16 * cols;
    uint32_t *xb = aligned_alloc(64, (size_t)(size + 16) * sizeof(uint32_t));
    if (!xb) return NULL;
    if (rows % cols) memset(xb, 0, (size_t)size * sizeof(uint32_t));
    for (int64_t m = 0; m < rows; m++)
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t k0 = (c / per_tile) * tile_k;
            const int *kp = kpair + (c % per_tile) * 32;
            uint32_t *dst = xb + ((m / 16) * chunks + c) * 16 * cols + m % 16;
            for (int d = 0; d < 16; d++) {
                const int64_t ka = k0 + kp[2 * d], kb = k0 + kp[2 * d + 1];
                const uint32_t a = ka < k ? scaled_bf16(x[m * ldx + ka], shift) : 0;
                const uint32_t b = kb < k ? scaled_bf16(x[m * ldx + kb], shift) : 0;
                dst[d * cols] = a | b << 16;
            }
        }
    return xb;
}

typedef struct {
    const uint32_t *xb;  /* amx_pairs */
    int64_t chunks, rows;
    int cols;
    float sum_scale;  /* a power of two the sums come scaled by the inverse of */
} amx_x;

/* group i of a pass sums in tile T = 4 + i (the tile intrinsics take the tile's number as a literal) */
#define AMX_ZERO(i, T) if (gn > (i)) _tile_zero(T);
#define AMX_DOT(i, T)                                                                                           \
            if (gn > (i)) {                                                                                 \
                _tile_loadd(1, xs->xb + ((g0 + (i)) * xs->chunks + c) * 16 * xs->cols, xs->cols * 4);          \
                _tile_dpbf16ps(T, 0, 1);                                                                    \
            }
#define AMX_STORE(i, T) if (gn > (i)) _tile_stored(T, sums + (i) * 256, 64);

static inline void amx_zero(int gn) { AMX_ZERO(0, 4) AMX_ZERO(1, 5) AMX_ZERO(2, 6) AMX_ZERO(3, 7) }

/* the decoded chunks [c0, c1) (at a, 16 rows x 16 dwords each) into the sums of groups g0..g0 + gn - 1 */
static inline void amx_dots(const uint32_t *a, int64_t c0, int64_t c1, const amx_x *xs, int64_t g0, int gn) {
    for (int64_t c = c0; c < c1; c++) {
        _tile_loadd(0, a + (c - c0) * 256, 64);
        AMX_DOT(0, 4) AMX_DOT(1, 5) AMX_DOT(2, 6) AMX_DOT(3, 7)
    }
}

/* the sums of groups g0.. for rows [r0, r1) of the block at output row nb: y[m * ldy + n] = scale(n) * sum */
static void amx_store(const amx_x *xs, int64_t g0, int gn, int64_t nb, int r0, int r1, float out_scale,
                      const float *row_scale, float *y, int64_t ldy) {
    float sums[AMX_GROUPS * 256] __attribute__((aligned(64)));
    AMX_STORE(0, 4) AMX_STORE(1, 5) AMX_STORE(2, 6) AMX_STORE(3, 7)
    for (int gi = 0; gi < gn; gi++)
        for (int r = r0; r < r1; r++) {
            const int64_t n = nb + r;
            const float scale = row_scale ? row_scale[n] : out_scale;
            for (int i = 0; i < xs->cols; i++) {
                const int64_t m = (g0 + gi) * 16 + i;
                if (m < xs->rows) y[m * ldy + n] = scale * (sums[gi * 256 + r * 16 + i] * xs->sum_scale);
            }
        }
}

/* A row block, `per_tile` chunks per tile decoded by DECODE (into dst, chunk p's row r at (p * 16 + r) * 16)
   tile by tile: with at most AMX_GROUPS groups of x's rows, each tile's chunks go into the sums while in L1;
   with more, the whole block is decoded once (into `all`) and every pass of AMX_GROUPS groups reads it. */
#define AMX_ROW_BLOCK(per_tile, DECODE)                                                                         \
        {                                                                                                   \
            const int64_t nb = b0 / TILE_ROWS * TILE_ROWS, b1 = nb + TILE_ROWS < n1 ? nb + TILE_ROWS : n1;   \
            const int r0 = (int)(b0 - nb), r1 = (int)(b1 - nb);                                             \
            if (groups <= AMX_GROUPS) amx_zero((int)groups);                                                \
            for (int64_t t = 0; t < tiles; t++) {                                                           \
                uint32_t *dst = groups <= AMX_GROUPS ? tile_buf + (t & 1) * (per_tile) * 256                \
                                                     : all + t * (per_tile) * 256;                           \
                for (int r = 0; r < TILE_ROWS; r++) { DECODE }                                              \
                if (groups <= AMX_GROUPS && t > 0)  /* the tile before, while this one's stores land */    \
                    amx_dots(tile_buf + ((t - 1) & 1) * (per_tile) * 256, (t - 1) * (per_tile), t * (per_tile), \
                             &xs, 0, (int)groups);                                                          \
            }                                                                                               \
            if (groups <= AMX_GROUPS)                                                                       \
                amx_dots(tile_buf + ((tiles - 1) & 1) * (per_tile) * 256, (tiles - 1) * (per_tile),           \
                         tiles * (per_tile), &xs, 0, (int)groups);                                          \
            for (int64_t g0 = 0; g0 < groups; g0 += AMX_GROUPS) {                                           \
                const int gn = groups - g0 < AMX_GROUPS ? (int)(groups - g0) : AMX_GROUPS;                   \
                if (groups > AMX_GROUPS) {                                                                  \
                    amx_zero(gn);                                                                           \
                    amx_dots(all, 0, xs.chunks, &xs, g0, gn);                                               \
                }                                                                                           \
                amx_store(&xs, g0, gn, nb, r0, r1, out_scale, row_scale, y, ldy);                           \
            }                                                                                               \
        }

/* NVFP4's tile decode gives bf16 bits of the weight * 2^-AMX_DECODE_SHIFT (NVFP4_AMX_PAIR below); x comes times
   2^AMX_X_SHIFT, so the sums come times 2^(AMX_X_SHIFT - AMX_DECODE_SHIFT). FP8's decode is exact (x_shift 0). */
#define AMX_DECODE_SHIFT 112
#define AMX_X_SHIFT 48

/* x's tiles and, with more than AMX_GROUPS groups of rows, the whole-block buffer; 0 or -1 (out of memory) */
#define AMX_SETUP(per_tile, tile_k)                                                                             \
    const int cols = rows < 16 ? (int)rows : 16;                                                            \
    const int64_t groups = (rows + 15) / 16;                                                                \
    const int sum_exponent = x_shift ? AMX_DECODE_SHIFT - x_shift : 0;                                     \
    amx_x xs = {amx_pairs(x, ldx, rows, k, tiles * (per_tile), (per_tile), (tile_k), kpair, cols, x_shift),  \
                tiles * (per_tile), rows, cols, as_float((uint32_t)(127 + sum_exponent) << 23)};               \
    uint32_t *all = groups > AMX_GROUPS ? aligned_alloc(64, (size_t)(tiles * (per_tile) * 256) * 4) : NULL;  \
    uint32_t tile_buf[2 * (per_tile) * 256] __attribute__((aligned(64)));                                      \
    if (!xs.xb || (groups > AMX_GROUPS && !all)) {                                                          \
        free((void *)xs.xb), free(all);                                                                     \
        return -1;                                                                                          \
    }                                                                                                       \
    amx_configure(cols);

#define AMX_DONE                                                                                                \
    _tile_release();                                                                                        \
    free((void *)xs.xb), free(all);                                                                         \
    return 0;

/* NVFP4 pair p of every word of a tile row as one A row: both codes of the pair (NVFP4_PAIR_CODES) as fp16 code *
   2^5 by one 16-bit permute, times the lane's block scale * 2^-5 as fp16 (the prepacked scale byte at fp16 bits
   7..14, packing/nvfp4.py): the exact product as a normal fp16 (2^-10 .. 2688, at most 6 significant bits); its
   sign and its magnitude shifted right by 3 (an arithmetic shift, the copies of the sign cleared) are bf16 bits
   of the product * 2^-112, exactly (zero stays zero).
   Word j's codes a and b in dword j. x comes times 2^AMX_X_SHIFT, the sums times 2^(AMX_DECODE_SHIFT -
   AMX_X_SHIFT): products under 2^(-14 - AMX_X_SHIFT) flush to zero, x from 2^(128 - AMX_X_SHIFT) on is infinite. */
#define NVFP4_AMX_PAIR(p)                                                                                       \
            {                                                                                               \
                const __m512h v = _mm512_castsi512_ph(_mm512_permutexvar_epi16(NVFP4_PAIR_INDEX_##p(w), table)); \
                const __m512i h = _mm512_castph_si512(_mm512_mul_ph(v, bs));                                \
                _mm512_store_si512(dst + ((p) * 16 + r) * 16,                                              \
                    _mm512_and_si512(_mm512_srai_epi16(h, 3), _mm512_set1_epi16((short)0x8FFF)));           \
            }

/* bs: the lane's scale byte at fp16 bits 7..13 in both halves of its dword (scale_pairs: each lane's byte twice) */
#define NVFP4_AMX_DECODE                                                                                        \
                const __m512i w = _mm512_loadu_si512(block + r * word_row + t * word_tile);                 \
                _mm_prefetch((const char *)(block + r * word_row + (t + AMX_PREFETCH_TILES) * word_tile),  \
                             _MM_HINT_T0);                                                                  \
                if (r < 2) _mm_prefetch((const char *)(sblock + (t + AMX_PREFETCH_TILES) * scale_tile + r * 64),  \
                                        _MM_HINT_T0);                                                       \
                const __m256i sbytes = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(                      \
                    _mm_loadu_si128((const __m128i *)(sblock + t * scale_tile + spans[r]))),                 \
                    _mm256_loadu_si256((const __m256i *)(scale_pairs + r * 32)));                             \
                const __m512h bs = _mm512_castsi512_ph(_mm512_slli_epi16(_mm512_cvtepu8_epi16(sbytes), 7));  \
                NVFP4_AMX_PAIR(0) NVFP4_AMX_PAIR(1) NVFP4_AMX_PAIR(2) NVFP4_AMX_PAIR(3)

static int nvfp4_amx_linear_rows(const uint32_t *codes, const uint8_t *scales, const uint16_t *x, int64_t ldx,
                                 int64_t k, int64_t rows, const int64_t *spans, const uint8_t *lane_bytes,
                                 int64_t tiles, int64_t word_rowblock, int64_t word_row, int64_t word_tile,
                                 int64_t scale_rowblock, int64_t scale_tile, int64_t n0, int64_t n1,
                                 float out_scale, float *y, int64_t ldy) {
    static const int pair_codes[8] = NVFP4_PAIR_CODES;
    const float *row_scale = NULL;
    const int x_shift = AMX_X_SHIFT;
    int kpair[4 * 32];  /* chunk p's dword d: word d's codes a and b */
    for (int p = 0; p < 4; p++)
        for (int d = 0; d < 16; d++)
            for (int e = 0; e < 2; e++) kpair[p * 32 + 2 * d + e] = d * 8 + pair_codes[2 * p + e];
    uint8_t scale_pairs[TILE_ROWS * 32];  /* per tile row: each lane's byte index twice */
    for (int r = 0; r < TILE_ROWS; r++)
        for (int j = 0; j < 32; j++) scale_pairs[r * 32 + j] = lane_bytes[r * 16 + j / 2];
    _Float16 values[32];  /* code * 2^5, every code twice: a permute index's bit 4 is anything */
    for (int c = 0; c < 32; c++) values[c] = (_Float16)((c & 8 ? -32.0f : 32.0f) * e2m1[c & 7]);
    const __m512i table = _mm512_loadu_si512(values);
    if (rows == 0) return 0;
    AMX_SETUP(4, (int64_t)TILE_WORDS * 8)
    for (int64_t b0 = n0; b0 < n1; b0 = (b0 / TILE_ROWS + 1) * TILE_ROWS) {
        const uint32_t *block = codes + (b0 / TILE_ROWS) * word_rowblock;
        const uint8_t *sblock = scales + (b0 / TILE_ROWS) * scale_rowblock;
        AMX_ROW_BLOCK(4, NVFP4_AMX_DECODE)
    }
    AMX_DONE
}

/* FP8: pair p of every word of a tile row as one A row, as FP8_BF16_STEP decodes it (word j's values a and b of
   FP8_PAIR_BYTES in dword j) */
#define FP8_AMX_PAIR(p)                                                                                         \
            _mm512_store_si512(dst + ((p) * 16 + r) * 16, fp8_bf16_pairs(FP8_PAIR_BITS_##p(w), subnormals));

#define FP8_AMX_DECODE                                                                                          \
                const __m512i w = _mm512_loadu_si512(block + r * word_row + t * word_tile);                 \
                _mm_prefetch((const char *)(block + r * word_row + (t + AMX_PREFETCH_TILES) * word_tile),  \
                             _MM_HINT_T0);                                                                  \
                FP8_AMX_PAIR(0) FP8_AMX_PAIR(1)

static int fp8_amx_linear_rows(const uint32_t *codes, const float *row_scale, const uint16_t *x, int64_t ldx,
                               int64_t k, int64_t rows, int64_t tiles, int64_t word_rowblock, int64_t word_row,
                               int64_t word_tile, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    static const int pair_bytes[4] = FP8_PAIR_BYTES;
    const float out_scale = 1.0f;
    const int x_shift = 0;
    int kpair[2 * 32];  /* chunk p's dword d: word d's values a and b */
    for (int p = 0; p < 2; p++)
        for (int d = 0; d < 16; d++)
            for (int e = 0; e < 2; e++) kpair[p * 32 + 2 * d + e] = d * 4 + pair_bytes[2 * p + e];
    uint16_t values[32] = {0};
    for (int m = 0; m < 8; m++) values[m] = (uint16_t)(as_bits((float)m * 0.001953125f) >> 16); /* m * 2^-9 */
    const __m512i subnormals = _mm512_loadu_si512(values);
    if (rows == 0) return 0;
    AMX_SETUP(2, (int64_t)TILE_WORDS * 4)
    for (int64_t b0 = n0; b0 < n1; b0 = (b0 / TILE_ROWS + 1) * TILE_ROWS) {
        const uint32_t *block = codes + (b0 / TILE_ROWS) * word_rowblock;
        AMX_ROW_BLOCK(2, FP8_AMX_DECODE)
    }
    AMX_DONE
}
#endif
#endif

#else  /* portable C: the same operations in the same order, one lane at a time */
#define SRL(w, s) ((w) >> (s))
#define SHL(w, s) ((w) << (s))
#define AND(w, m) ((w) & (uint32_t)(m))
#define OR(a, b) ((a) | (b))
static inline uint32_t nvfp4_code(uint32_t w, int i) {
    switch (i) {
    case 0: return NVFP4_CODE_0(w); case 1: return NVFP4_CODE_1(w); case 2: return NVFP4_CODE_2(w);
    case 3: return NVFP4_CODE_3(w); case 4: return NVFP4_CODE_4(w); case 5: return NVFP4_CODE_5(w);
    case 6: return NVFP4_CODE_6(w); default: return NVFP4_CODE_7(w);
    }
}
static inline uint32_t fp8_magnitude(uint32_t w, int i) {
    switch (i) {
    case 0: return FP8_MAGNITUDE_0(w); case 1: return FP8_MAGNITUDE_1(w); case 2: return FP8_MAGNITUDE_2(w);
    default: return FP8_MAGNITUDE_3(w);
    }
}
static inline uint32_t fp8_sign(uint32_t w, int i) {
    switch (i) {
    case 0: return FP8_SIGN_0(w); case 1: return FP8_SIGN_1(w); case 2: return FP8_SIGN_2(w);
    default: return FP8_SIGN_3(w);
    }
}
/* NVFP4: y[m, n] = out_scale * sum_k x[m, k] * e2m1 * bs for rows n in [n0, n1) of the prepack, x rows
   [0, rows) with rows <= MB (the decoded tile is shared by the MB rows of x). */
#define NVFP4_ROWS(MB)                                                                                          \
static void nvfp4_rows_##MB(const uint32_t *codes, const uint8_t *scales, const float *x_rows,              \
                            const int64_t *spans, const uint8_t *lane_bytes, int64_t tiles,                  \
                            int64_t word_rowblock, int64_t word_row, int64_t word_tile, int64_t scale_rowblock, \
                            int64_t scale_tile,                                                              \
                            int64_t n0, int64_t n1, int64_t n_end, int64_t m0, float out_scale, float *y, int64_t ldy) { \
    for (int64_t n = n0; n < n1; n++) {                                                                     \
        float acc[MB][TILE_WORDS];                                                                          \
        memset(acc, 0, sizeof acc);                                                                         \
        const int64_t r = n % TILE_ROWS;                                                                    \
        const uint32_t *wrow = codes + (n / TILE_ROWS) * word_rowblock + r * word_row;                       \
        const uint8_t *srow = scales + (n / TILE_ROWS) * scale_rowblock;                                     \
        for (int64_t t = 0; t < tiles; t++) {                                                               \
            const uint32_t *w = wrow + t * word_tile;                                                       \
            const uint8_t *s = srow + t * scale_tile;                                                       \
            float bs[TILE_WORDS], part[MB][TILE_WORDS];                                                     \
            for (int j = 0; j < TILE_WORDS; j++)                                                            \
                bs[j] = as_float((uint32_t)s[spans[r] + lane_bytes[r * TILE_WORDS + j]] << 20) * P117;         \
            memset(part, 0, sizeof part);                                                                   \
            for (int i = 0; i < 8; i++) {                                                                   \
                float v[TILE_WORDS];                                                                        \
                for (int j = 0; j < TILE_WORDS; j++) {                                                      \
                    uint32_t c = nvfp4_code(w[j], i);                                                       \
                    v[j] = as_float(as_bits(e2m1[c & 7]) | (c >> 3) << 31);                                 \
                }                                                                                           \
                for (int m = 0; m < MB; m++) {                                                              \
                    const float *xp = x_rows + (m0 * tiles + t * MB + m) * 8 * TILE_WORDS + i * TILE_WORDS;     \
                    for (int j = 0; j < TILE_WORDS; j++) part[m][j] += v[j] * xp[j];                        \
                }                                                                                           \
            }                                                                                               \
            for (int m = 0; m < MB; m++)                                                                    \
                for (int j = 0; j < TILE_WORDS; j++) acc[m][j] += part[m][j] * bs[j];                       \
        }                                                                                                   \
        for (int m = 0; m < MB; m++) y[(m0 + m) * ldy + n] = out_scale * halving_sum(acc[m]);               \
    }                                                                                                       \
}
EVERY_MB(NVFP4_ROWS)

/* E4M3 byte (sign removed) -> float: the 7 bits in a float's exponent/mantissa, rebiased by 120 (2^-7 * (1 +
   m / 8) for a zero exponent field, corrected to the subnormal m * 2^-9: exact, and no float subnormals). */
static inline float e4m3_magnitude(uint32_t mag7) {
    float f = as_float((mag7 << 20) + (120u << 23));
    return (mag7 >> 3) ? f : (f - 0.0078125f) * 2.0f;
}

/* FP8: y[m, n] = row_scale[n] * sum_k x[m, k] * e4m3 (row_scale, not out_scale: per output row). */
#define FP8_ROWS(MB)                                                                                            \
static void fp8_rows_##MB(const uint32_t *codes, const float *row_scale, const float *x_perm, int64_t tiles, \
                          int64_t word_rowblock, int64_t word_row, int64_t word_tile, int64_t n0, int64_t n1, \
                          int64_t n_end, int64_t m0, float *y, int64_t ldy) {                                   \
    for (int64_t n = n0; n < n1; n++) {                                                                     \
        float acc[MB][TILE_WORDS];                                                                          \
        memset(acc, 0, sizeof acc);                                                                         \
        const uint32_t *wrow = codes + (n / TILE_ROWS) * word_rowblock + (n % TILE_ROWS) * word_row;         \
        for (int64_t t = 0; t < tiles; t++) {                                                               \
            const uint32_t *w = wrow + t * word_tile;                                                       \
            for (int i = 0; i < 4; i++) {                                                                   \
                float v[TILE_WORDS];                                                                        \
                for (int j = 0; j < TILE_WORDS; j++) {                                                      \
                    v[j] = as_float(as_bits(e4m3_magnitude(fp8_magnitude(w[j], i))) | fp8_sign(w[j], i) << 31); \
                }                                                                                           \
                for (int m = 0; m < MB; m++) {                                                              \
                    const float *xp = x_perm + (m0 * tiles + t * MB + m) * 4 * TILE_WORDS + i * TILE_WORDS;     \
                    for (int j = 0; j < TILE_WORDS; j++) acc[m][j] += v[j] * xp[j];                         \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        const float scale = row_scale ? row_scale[n] : 1.0f;                                                \
        for (int m = 0; m < MB; m++) y[(m0 + m) * ldy + n] = scale * halving_sum(acc[m]);                   \
    }                                                                                                       \
}
EVERY_MB(FP8_ROWS)

#endif

/* x's dtypes (linear.py's X_DTYPES) and their exact widening to float32 */
enum { X_FLOAT32 = 0, X_BFLOAT16 = 1, X_FLOAT16 = 2 };

static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return as_float(sign | 0x7f800000u | man << 13);              /* inf, nan */
    if (exp != 0) return as_float(sign | (exp + 112) << 23 | man << 13);             /* normal */
    const float subnormal = (float)man * 5.9604644775390625e-08f;                      /* man * 2^-24, exact */
    return sign ? -subnormal : subnormal;
}

static inline float x_value(const void *x, int dtype, int64_t i) {
    if (dtype == X_BFLOAT16) return as_float((uint32_t)((const uint16_t *)x)[i] << 16);
    if (dtype == X_FLOAT16) return half_to_float(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

/* A new buffer of `values` 4-byte values for a copy of x, 64-byte aligned: the kernels' vector loads of it are
   then one cache line each (loads split over two lines took a 6-row call 10-15% longer); NULL if out of memory */
static void *x_buffer(int64_t values) { return aligned_alloc(64, (size_t)(values / 16 + 1) * 64); }

/* Row m's place in the passes of PASS_ROWS rows that the entry points run (the rest of the rows the last pass):
   the offset of its tile 0 in a permuted x of `per_tile` values a tile, and the stride between its tiles. */
static inline int64_t pass_of(int64_t m, int64_t rows, int64_t tiles, int64_t per_tile, int64_t *stride) {
    const int64_t m0 = m / PASS_ROWS * PASS_ROWS, mb = rows - m0 < PASS_ROWS ? rows - m0 : PASS_ROWS;
    *stride = mb * per_tile;
    return (m0 * tiles + m - m0) * per_tile;
}

/* x (rows, k) at row stride ldx -> a new float32 x_perm of `tiles` tiles (see above); NULL if out of memory */
static float *permuted(const void *x, int dtype, int64_t ldx, int64_t rows, int64_t k, int64_t tiles, int fields) {
    const int64_t per_tile = (int64_t)TILE_WORDS * fields;
    float *xp = x_buffer(rows * tiles * per_tile);
    if (!xp) return NULL;
    for (int64_t m = 0; m < rows; m++) {
        int64_t stride;
        float *row = xp + pass_of(m, rows, tiles, per_tile, &stride);
        for (int64_t t = 0; t < tiles; t++)
            for (int i = 0; i < fields; i++)
                for (int j = 0; j < TILE_WORDS; j++) {
                    const int64_t kk = (t * TILE_WORDS + j) * fields + i;
                    row[t * stride + i * TILE_WORDS + j] = kk < k ? x_value(x, dtype, m * ldx + kk) : 0.0f;
                }
    }
    return xp;
}

/* Entry points: output rows [n0, n1) (the caller's threads take disjoint ranges) and all `rows` rows of x
   (x_dtype, k values a row at row stride ldx; `tiles`: the tiles that hold k < K). A row block of the weight
   (TILE_ROWS rows) is decoded for 8 rows of x at a time, then the rest at once, while it
   is in cache. y is (rows, ldy) float32; column n of it gets weight row n. Returns 0, or -1 if the permuted x
   could not be allocated. */
#ifdef NVFP4_BF16_PATH
/* bf16 x (rows, k) -> a new x_pair of `tiles` tiles: for tile t, pair p and lane j, the bf16 bits of x at the k
   of the pair's first code (low half) and second code (high half) of word j; zero past K */
static uint32_t *paired(const uint16_t *x, int64_t ldx, int64_t rows, int64_t k, int64_t tiles, int fields,
                        const int *pair_fields) {
    const int pairs = fields / 2;
    uint32_t *xq = x_buffer(rows * tiles * pairs * TILE_WORDS);
    if (!xq) return NULL;
    for (int64_t m = 0; m < rows; m++) {
        int64_t stride;
        uint32_t *row = xq + pass_of(m, rows, tiles, (int64_t)pairs * TILE_WORDS, &stride);
        for (int64_t t = 0; t < tiles; t++)
            for (int p = 0; p < pairs; p++)
                for (int j = 0; j < TILE_WORDS; j++) {
                    const int64_t k0 = (t * TILE_WORDS + j) * fields;
                    const int64_t ka = k0 + pair_fields[2 * p], kb = k0 + pair_fields[2 * p + 1];
                    const uint32_t a = ka < k ? x[m * ldx + ka] : 0, b = kb < k ? x[m * ldx + kb] : 0;
                    row[t * stride + p * TILE_WORDS + j] = a | b << 16;
                }
    }
    return xq;
}

static const int nvfp4_pair_codes[8] = NVFP4_PAIR_CODES, fp8_pair_bytes[4] = FP8_PAIR_BYTES;

static int fp8_bf16_linear_rows(const uint32_t *codes, const float *row_scale, const uint16_t *x, int64_t ldx,
                                int64_t k, int64_t rows, int64_t tiles, int64_t word_rowblock, int64_t word_row,
                                int64_t word_tile, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    uint32_t *x_pair = paired(x, ldx, rows, k, tiles, 4, fp8_pair_bytes);
    if (!x_pair) return -1;
    for (int64_t b0 = n0; b0 < n1; b0 = (b0 / TILE_ROWS + 1) * TILE_ROWS) {
        const int64_t b1 = (b0 / TILE_ROWS + 1) * TILE_ROWS < n1 ? (b0 / TILE_ROWS + 1) * TILE_ROWS : n1;
#define FP8_BF16_CASE(MB)                                                                                       \
            case MB: fp8_bf16_rows_##MB(codes, row_scale, x_pair, tiles, word_rowblock, word_row, word_tile,    \
                                        b0, b1, n1, m, y, ldy); break;
        for (int64_t m = 0, mb; m < rows; m += mb)
            switch (mb = rows - m < PASS_ROWS ? rows - m : PASS_ROWS) { EVERY_MB(FP8_BF16_CASE) }
    }
    free(x_pair);
    return 0;
}

static int nvfp4_bf16_linear_rows(const uint32_t *codes, const uint8_t *scales, const uint16_t *x, int64_t ldx,
                                  int64_t k, int64_t rows, const int64_t *spans, const uint8_t *lane_bytes,
                                  int64_t tiles,
                                  int64_t word_rowblock, int64_t word_row, int64_t word_tile,
                                  int64_t scale_rowblock, int64_t scale_tile, int64_t n0, int64_t n1,
                                  float out_scale, float *y, int64_t ldy) {
    uint32_t *x_pair = paired(x, ldx, rows, k, tiles, 8, nvfp4_pair_codes);
    if (!x_pair) return -1;
    for (int64_t b0 = n0; b0 < n1; b0 = (b0 / TILE_ROWS + 1) * TILE_ROWS) {
        const int64_t b1 = (b0 / TILE_ROWS + 1) * TILE_ROWS < n1 ? (b0 / TILE_ROWS + 1) * TILE_ROWS : n1;
#define NVFP4_BF16_CASE(MB)                                                                                     \
            case MB: nvfp4_bf16_rows_##MB(codes, scales, x_pair, spans, lane_bytes, tiles, word_rowblock,       \
                                          word_row, word_tile, scale_rowblock, scale_tile, b0, b1, n1, m,       \
                                          out_scale, y, ldy); break;
        for (int64_t m = 0, mb; m < rows; m += mb)
            switch (mb = rows - m < PASS_ROWS ? rows - m : PASS_ROWS) { EVERY_MB(NVFP4_BF16_CASE) }
    }
    free(x_pair);
    return 0;
}
#endif

/* What this build computes with: bit 0 the AVX-512 kernels, bit 1 the bf16 dot products for bf16 x, bit 2 AMX
   tiles for bf16 x (built for, and granted to this process) */
int64_t weight_cpu_features(void) {
#if defined(AMX_PATH)
    return amx_ready() ? 7 : 3;
#elif defined(NVFP4_BF16_PATH)
    return 3;
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && TILE_WORDS == 16 && \
    !defined(WEIGHT_CPU_PORTABLE)
    return 1;
#else
    return 0;
#endif
}

int nvfp4_linear_rows(const uint32_t *codes, const uint8_t *scales, const void *x, int64_t x_dtype, int64_t ldx,
                      int64_t k, int64_t rows, const int64_t *spans, const uint8_t *lane_bytes, int64_t tiles,
                      int64_t word_rowblock, int64_t word_row, int64_t word_tile, int64_t scale_rowblock,
                      int64_t scale_tile, int64_t n0, int64_t n1, float out_scale, float *y, int64_t ldy) {
#ifdef NVFP4_BF16_PATH
#ifdef AMX_PATH
    if (x_dtype == X_BFLOAT16 && amx_ready())
        return nvfp4_amx_linear_rows(codes, scales, (const uint16_t *)x, ldx, k, rows, spans, lane_bytes, tiles,
                                     word_rowblock, word_row, word_tile, scale_rowblock, scale_tile, n0, n1,
                                     out_scale, y, ldy);
#endif
    if (x_dtype == X_BFLOAT16)
        return nvfp4_bf16_linear_rows(codes, scales, (const uint16_t *)x, ldx, k, rows, spans, lane_bytes, tiles,
                                      word_rowblock, word_row, word_tile, scale_rowblock, scale_tile, n0, n1,
                                      out_scale, y, ldy);
#endif
    float *x_perm = permuted(x, (int)x_dtype, ldx, rows, k, tiles, 8);
    if (!x_perm) return -1;
    for (int64_t b0 = n0; b0 < n1; b0 = (b0 / TILE_ROWS + 1) * TILE_ROWS) {
        const int64_t b1 = (b0 / TILE_ROWS + 1) * TILE_ROWS < n1 ? (b0 / TILE_ROWS + 1) * TILE_ROWS : n1;
#define NVFP4_CASE(MB)                                                                                          \
            case MB: nvfp4_rows_##MB(codes, scales, x_perm, spans, lane_bytes, tiles, word_rowblock, word_row,  \
                                     word_tile, scale_rowblock, scale_tile, b0, b1, n1, m, out_scale, y, ldy); break;
        for (int64_t m = 0, mb; m < rows; m += mb)
            switch (mb = rows - m < PASS_ROWS ? rows - m : PASS_ROWS) { EVERY_MB(NVFP4_CASE) }
    }
    free(x_perm);
    return 0;
}

int fp8_linear_rows(const uint32_t *codes, const float *row_scale, const void *x, int64_t x_dtype, int64_t ldx,
                    int64_t k, int64_t rows, int64_t tiles, int64_t word_rowblock, int64_t word_row,
                    int64_t word_tile, int64_t n0, int64_t n1, float *y, int64_t ldy) {
#ifdef NVFP4_BF16_PATH
#ifdef AMX_PATH
    if (x_dtype == X_BFLOAT16 && amx_ready())
        return fp8_amx_linear_rows(codes, row_scale, (const uint16_t *)x, ldx, k, rows, tiles, word_rowblock,
                                   word_row, word_tile, n0, n1, y, ldy);
#endif
    if (x_dtype == X_BFLOAT16)
        return fp8_bf16_linear_rows(codes, row_scale, (const uint16_t *)x, ldx, k, rows, tiles, word_rowblock,
                                    word_row, word_tile, n0, n1, y, ldy);
#endif
    float *x_perm = permuted(x, (int)x_dtype, ldx, rows, k, tiles, 4);
    if (!x_perm) return -1;
    for (int64_t b0 = n0; b0 < n1; b0 = (b0 / TILE_ROWS + 1) * TILE_ROWS) {
        const int64_t b1 = (b0 / TILE_ROWS + 1) * TILE_ROWS < n1 ? (b0 / TILE_ROWS + 1) * TILE_ROWS : n1;
#define FP8_CASE(MB)                                                                                            \
            case MB: fp8_rows_##MB(codes, row_scale, x_perm, tiles, word_rowblock, word_row, word_tile, b0, b1, \
                                   n1, m, y, ldy); break;
        for (int64_t m = 0, mb; m < rows; m += mb)
            switch (mb = rows - m < PASS_ROWS ? rows - m : PASS_ROWS) { EVERY_MB(FP8_CASE) }
    }
    free(x_perm);
    return 0;
}

/* Dense weights (float32 or bfloat16, row-major at row stride ldw) for the layers a checkpoint leaves unquantized
   (an lm_head): y[m, n] = sum_k x[m, k] w[n, k] for output rows [n0, n1) and every row of x. Each output is one
   fixed sequence: TILE_WORDS lanes, lane j adding x * w at k = j, j + TILE_WORDS, .. in k order from zero (zero
   past K), then the lanes added by halving. So a row's bits do not depend on M, where a BLAS GEMM picks its
   kernel, and with it the order of a row's sums, by M. A weight row is read once for up to 8 rows of x. */
enum { W_FLOAT32 = 0, W_BFLOAT16 = 1 };

/* x (rows, k) at row stride ldx -> a new float32 (rows, kp) copy, zero past k; NULL if out of memory */
static float *widened(const void *x, int dtype, int64_t ldx, int64_t rows, int64_t k, int64_t kp) {
    float *xf = x_buffer(rows * kp);
    if (!xf) return NULL;
    for (int64_t m = 0; m < rows; m++)
        for (int64_t i = 0; i < kp; i++) xf[m * kp + i] = i < k ? x_value(x, dtype, m * ldx + i) : 0.0f;
    return xf;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && TILE_WORDS == 16 && \
    !defined(WEIGHT_CPU_PORTABLE)
static inline __m512 dense_weights(const void *w, int64_t w_dtype, int64_t at, int64_t left) {
    const __mmask16 live = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    if (w_dtype == W_BFLOAT16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, (const uint16_t *)w + at)), 16));
    return _mm512_maskz_loadu_ps(live, (const float *)w + at);
}

static void dense_rows(const void *w, int64_t w_dtype, int64_t ldw, const float *xf, int64_t k, int64_t kp,
                       int64_t rows, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    for (int64_t n = n0; n < n1; n++)
        for (int64_t m0 = 0; m0 < rows; m0 += 8) {
            const int mb = rows - m0 < 8 ? (int)(rows - m0) : 8;
            __m512 acc[8];
            for (int m = 0; m < mb; m++) acc[m] = _mm512_setzero_ps();
            for (int64_t i = 0; i < kp; i += 16) {
                const __m512 wv = dense_weights(w, w_dtype, n * ldw + i, k - i);
                for (int m = 0; m < mb; m++)
                    acc[m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xf + (m0 + m) * kp + i), acc[m]);
            }
            store_rows(acc, mb, 1.0f, y + m0 * ldy + n, ldy);
        }
}
#else
static void dense_rows(const void *w, int64_t w_dtype, int64_t ldw, const float *xf, int64_t k, int64_t kp,
                       int64_t rows, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    for (int64_t n = n0; n < n1; n++)
        for (int64_t m = 0; m < rows; m++) {
            float acc[TILE_WORDS];
            memset(acc, 0, sizeof acc);
            for (int64_t i = 0; i < kp; i += TILE_WORDS)
                for (int j = 0; j < TILE_WORDS; j++) {
                    const int64_t kk = i + j;
                    const float wv = kk >= k ? 0.0f : w_dtype == W_BFLOAT16
                        ? as_float((uint32_t)((const uint16_t *)w)[n * ldw + kk] << 16) : ((const float *)w)[n * ldw + kk];
                    acc[j] += wv * xf[m * kp + kk];
                }
            y[m * ldy + n] = halving_sum(acc);
        }
}
#endif

int dense_linear_rows(const void *w, int64_t w_dtype, int64_t ldw, const void *x, int64_t x_dtype, int64_t ldx,
                      int64_t k, int64_t rows, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    const int64_t kp = (k + TILE_WORDS - 1) / TILE_WORDS * TILE_WORDS;
    float *xf = widened(x, (int)x_dtype, ldx, rows, k, kp);
    if (!xf) return -1;
    dense_rows(w, w_dtype, ldw, xf, k, kp, rows, n0, n1, y, ldy);
    free(xf);
    return 0;
}
