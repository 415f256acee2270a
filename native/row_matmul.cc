// specexport.RowInvariantMatMulNBits: MatMulNBits's job (int4 or int8 block-quantized weights, activations
// quantized to int8 per block as accuracy level 4 does) with every output row computed alone.
//
// Lossless speculative decoding needs a token's row of a many-row verification call to carry the same bits as
// the one-row AR call of that token. ONNX Runtime's CPU MatMulNBits picks kernels by the number of rows, and
// on some CPUs (AVX2 without VNNI) a one-row call rounds otherwise than a row of many. Here a row's arithmetic
// is fixed: its activations are quantized per block (scale = max|a| / 127, codes rounded to nearest even and
// clipped to +-127); per (column, block) an exact int32 dot product of the codes with the weight codes, minus
// zero point * sum of the activation codes (integer, so in any order); per column a float sum over blocks in
// block order, acc = fma(float(dot), activation scale * weight scale, acc), from 0. Rows and columns are tiled
// for speed only: no tiling changes a (row, column)'s operations, and the portable and AVX2 paths do the same
// float operations, so the path taken is only a matter of speed. The AVX-512 path (AVX512-VNNI) takes the same
// layout and the same epilogue as the AVX2 one; only its integer dot products are summed otherwise (exactly).
//
// Inputs: A float [..., K]; B uint8, the weights in this operator's own layout (below); scales float
// [tiles, blocks, 8]; zero_points uint8 [tiles, blocks, 8] (one code per byte). Output float [..., N].
// Attributes: K, N, bits (4 or 8), block_size (a multiple of 32, at most 256), gated ("none", the default, or
// "silu": the output is then [..., N / 2] = silu(gate) * up, gate the first N / 2 columns and up the rest, the
// gated MLP's Split, SiLU and Mul in this operator's epilogue; silu(g) = g / (1 + e^-g) with the exp below, the
// same float operations on every path, so the fused output keeps the row and path invariance).
//
// Layout (exporter/row_matmul.py writes it): columns in tiles of 8 (N padded to a multiple of 8 with zero
// codes), K in blocks (padded with zero codes), a block in chunks of 32 values. B holds, tile by tile and
// block by block, each chunk's 8 columns:
//   bits 8: column c's 32 codes at chunk offset 32 c;
//   bits 4: 4 runs of 32 bytes, run p holding, for each column c, 4 bytes at 4 c: byte m carries value 8 p + m in its
//           low nibble and value 8 p + 4 + m in its high one, so that a 32-bit lane is one column's 4 values.
// The int4 attribute packing = 2 names this layout (bundles of an older one are refused: rebuild them).
// So one AVX2 register holds 8 columns' accumulators in column order, with no horizontal adds; one AVX-512 register
// holds two runs, summed at a block's end.
//
// Built without linking libonnxruntime, as native/row_attention.cc (which registers this operator too).

#define ORT_API_MANUAL_INIT
#include "onnxruntime_c_api.h"

#include <immintrin.h>

// tools/check_avx512.py builds the library a second time with SPECEXPORT_SIMDE: the AVX-512 intrinsics then come
// from SIMDe (emulated on AVX2 + FMA), the AVX-512 functions are compiled for AVX2 only, and the AVX-512 path is
// taken wherever AVX2 is, so a machine without AVX-512 runs that path's code.
#ifdef SPECEXPORT_SIMDE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define AVX512_TARGET "avx2,fma"
#else
#define AVX512_TARGET "avx512f,avx512bw,avx512vnni,avx2,fma"
#endif

#include "custom_op.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const OrtApi* g_api = nullptr;
constexpr int64_t kTile = 8;     // columns per tile
constexpr int64_t kChunk = 32;   // values per chunk
constexpr int64_t kMaxBlock = 256;
constexpr int64_t kInt4Packing = 2;  // the int4 layout below (exporter/row_matmul.py's PACKING)
constexpr int64_t kRowGroup = 8;     // rows whose accumulators a tile keeps at once
constexpr int64_t kTilesPerItem = 4; // columns a parallel work item takes: 32

enum class Isa { portable, avx2, avx512vnni };

struct Attrs {
  int64_t K = 0, N = 0, bits = 0, block = 0;
  bool silu = false;  // gated = "silu"
};

struct Call {  // one Compute's shapes and pointers, shared by the parallel loop
  Attrs a;
  int64_t M, blocks, chunks, tiles, padded_k, tile_block_bytes;
  const uint8_t* w;
  const float* wscale;
  const uint8_t* zp;
  std::vector<int8_t> q;       // [M, padded_k] activation codes
  std::vector<float> ascale;   // [M, blocks]
  std::vector<int32_t> asum;   // [M, blocks] sum of a block's codes
  float* out;                  // [M, N]: the operator's output, or the gated epilogue's scratch
  float* gated = nullptr;      // [M, N / 2]: the gated output
  int64_t half_tiles = 0;      // gated with N / 2 a multiple of 8: gate tile t pairs with up tile t + half_tiles
  Isa isa = Isa::portable;
  void (*tile)(const Call&, int64_t t, int64_t r0, int64_t rows);
  void (*silu_mul)(const float* g, const float* u, float* out, int64_t n);
};

// A row's activations to int8 codes per block: the same scalar code for every path.
void quantize_row(const float* a, int64_t K, int64_t block, int64_t blocks, int8_t* q, float* scale, int32_t* sum) {
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t lo = b * block, hi = std::min(K, lo + block);
    float amax = 0.0f;
    for (int64_t k = lo; k < hi; ++k) amax = std::max(amax, std::fabs(a[k]));
    float s = amax / 127.0f;
    float inv = s != 0.0f ? 1.0f / s : 0.0f;
    int32_t total = 0;
    for (int64_t k = lo; k < lo + block; ++k) {
      int32_t v = 0;
      if (k < hi) {
        float r = std::nearbyint(a[k] * inv);  // the default rounding mode: to nearest even
        v = static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, r)));
      }
      q[k] = static_cast<int8_t>(v);
      total += v;
    }
    scale[b] = s;
    sum[b] = total;
  }
}

// quantize_row on 8 lanes for blocks whose K values are all present: the same float product, the same rounding
// to nearest even (roundps in the default mode, as nearbyint), the same clamp (a NaN becomes -127 on both paths, as
// std::max(-127, NaN) and maxps(NaN, -127) give -127); the maximum and the integer sum are exact in any order.
// A block cut short by K takes the scalar code.
__attribute__((target("avx2,fma"))) void quantize_row_avx2(const float* a, int64_t K, int64_t block, int64_t blocks,
                                                          int8_t* q, float* scale, int32_t* sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 hi_code = _mm256_set1_ps(127.0f), lo_code = _mm256_set1_ps(-127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t lo = b * block;
    if (lo + block > K) {
      quantize_row(a + lo, K - lo, block, 1, q + lo, scale + b, sum + b);
      continue;
    }
    __m256 m = _mm256_setzero_ps();
    for (int64_t k = lo; k < lo + block; k += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(a + k), magnitude), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float s = _mm_cvtss_f32(m4) / 127.0f;
    __m256 inv = _mm256_set1_ps(s != 0.0f ? 1.0f / s : 0.0f);
    __m256i total = _mm256_setzero_si256();
    for (int64_t k = lo; k < lo + block; k += 32) {
      __m256i c[4];
      for (int i = 0; i < 4; ++i) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(a + k + 8 * i), inv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        c[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo_code), hi_code));
        total = _mm256_add_epi32(total, c[i]);
      }
      __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm256_permutevar8x32_epi32(bytes, order));
    }
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
    scale[b] = s;
    sum[b] = _mm_cvtsi128_si32(t4);
  }
}

void store(const Call& c, int64_t t, int64_t r, const float* acc) {
  int64_t n = std::min(kTile, c.a.N - t * kTile);
  std::memcpy(c.out + r * c.a.N + t * kTile, acc, sizeof(float) * n);
}

// ---------------------------------------------------------------------------------------------------------
// The canonical arithmetic (the portable path); the AVX2 path mirrors its float operations.

inline int32_t code_at(const uint8_t* wb, int64_t bits, int64_t col, int64_t i) {  // wb: a tile's block
  int64_t j = i / kChunk, v = i % kChunk;
  if (bits == 8) return wb[(j * kTile + col) * kChunk + v];
  uint8_t byte = wb[j * 4 * kChunk + (v / 8) * kChunk + col * 4 + v % 4];
  return v % 8 < 4 ? byte & 15 : byte >> 4;
}

void tile_portable(const Call& c, int64_t t, int64_t r0, int64_t rows) {
  for (int64_t r = r0; r < r0 + rows; ++r) {
    float acc[kTile] = {0};
    for (int64_t b = 0; b < c.blocks; ++b) {
      const uint8_t* wb = c.w + (t * c.blocks + b) * c.tile_block_bytes;
      const int8_t* q = c.q.data() + r * c.padded_k + b * c.a.block;
      float as = c.ascale[r * c.blocks + b];
      int32_t sum = c.asum[r * c.blocks + b];
      for (int64_t col = 0; col < kTile; ++col) {
        int32_t dot = 0;
        for (int64_t i = 0; i < c.a.block; ++i) dot += q[i] * code_at(wb, c.a.bits, col, i);
        int64_t at = (t * c.blocks + b) * kTile + col;
        dot -= static_cast<int32_t>(c.zp[at]) * sum;
        float s = as * c.wscale[at];
        acc[col] = std::fma(static_cast<float>(dot), s, acc[col]);
      }
    }
    store(c, t, r, acc);
  }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 + FMA, written for a block of CH chunks and R rows at a time so that the loops unroll and the
// accumulators stay in registers: a tile's block of weights is loaded and unpacked once for the R rows.

struct Ptrs {  // the call's arrays, copied out of Call so that the compiler need not reload them
  const uint8_t* w;
  const float* wscale;
  const uint8_t* zp;
  const int8_t* q;
  const float* ascale;
  const int32_t* asum;
  int64_t blocks, padded_k, block, tile_block_bytes;
};

// acc += float(dot - zero point * sum of the row's codes) * (row scale * column scale), for 8 columns
__attribute__((target("avx2,fma"))) inline __m256 accumulate_avx2(__m256 acc, __m256i dot, __m256i zp, __m256 ws,
                                                                   float as, int32_t sum) {
  // zp < 256 and |sum| <= 127 * 256 < 2^15: madd_epi16's low halves give zp * sum exactly
  dot = _mm256_sub_epi32(dot, _mm256_madd_epi16(zp, _mm256_set1_epi32(sum)));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(_mm256_set1_ps(as), ws), acc);
}

template <int CH, int R>
__attribute__((target("avx2,fma"))) void int4_rows_avx2(const Ptrs& p, int64_t t, int64_t r0, float* const* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < p.blocks; ++b) {
    const uint8_t* wb = p.w + (t * p.blocks + b) * p.tile_block_bytes;
    __m256i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
    for (int j = 0; j < CH; ++j) {
      __m256i w[8];  // w[2 p]: values 8 p .. 8 p + 3 of each column (a lane); w[2 p + 1]: 8 p + 4 .. 8 p + 7
      for (int k = 0; k < 4; ++k) {
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + (j * 4 + k) * kChunk));
        w[2 * k] = _mm256_and_si256(v, mask);
        w[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* q = p.q + (r0 + r) * p.padded_k + b * p.block + j * kChunk;
        __m256i pairs[8];
        for (int i = 0; i < 8; ++i) {
          int32_t four;
          std::memcpy(&four, q + 4 * i, 4);
          pairs[i] = _mm256_maddubs_epi16(w[i], _mm256_set1_epi32(four));
        }
        // |pair| <= 2 * 15 * 127: eight of them sum within int16
        __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(pairs[0], pairs[1]),
                                                      _mm256_add_epi16(pairs[2], pairs[3])),
                                     _mm256_add_epi16(_mm256_add_epi16(pairs[4], pairs[5]),
                                                      _mm256_add_epi16(pairs[6], pairs[7])));
        dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(s, ones));
      }
    }
    int64_t at = (t * p.blocks + b) * kTile;
    __m256i zp = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.zp + at)));
    __m256 ws = _mm256_loadu_ps(p.wscale + at);
    for (int r = 0; r < R; ++r) {
      int64_t row = (r0 + r) * p.blocks + b;
      acc[r] = accumulate_avx2(acc[r], dot[r], zp, ws, p.ascale[row], p.asum[row]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

template <int CH, int R>
__attribute__((target("avx2,fma"))) void int8_rows_avx2(const Ptrs& p, int64_t t, int64_t r0, float* const* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < p.blocks; ++b) {
    const uint8_t* wb = p.w + (t * p.blocks + b) * p.tile_block_bytes;
    __m256i s[R][kTile];
    for (int r = 0; r < R; ++r)
      for (int col = 0; col < kTile; ++col) s[r][col] = _mm256_setzero_si256();
    for (int j = 0; j < CH; ++j)
      for (int col = 0; col < kTile; ++col) {
        const __m128i* src = reinterpret_cast<const __m128i*>(wb + (j * kTile + col) * kChunk);
        __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(src)), hi = _mm256_cvtepu8_epi16(_mm_loadu_si128(src + 1));
        for (int r = 0; r < R; ++r) {
          const int8_t* q = p.q + (r0 + r) * p.padded_k + b * p.block + j * kChunk;
          __m256i qlo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
          __m256i qhi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
          s[r][col] = _mm256_add_epi32(s[r][col], _mm256_add_epi32(_mm256_madd_epi16(lo, qlo),
                                                                   _mm256_madd_epi16(hi, qhi)));
        }
      }
    int64_t at = (t * p.blocks + b) * kTile;
    __m256i zp = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.zp + at)));
    __m256 ws = _mm256_loadu_ps(p.wscale + at);
    for (int r = 0; r < R; ++r) {
      __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(s[r][0], s[r][1]), _mm256_hadd_epi32(s[r][2], s[r][3]));
      __m256i y = _mm256_hadd_epi32(_mm256_hadd_epi32(s[r][4], s[r][5]), _mm256_hadd_epi32(s[r][6], s[r][7]));
      __m256i dot = _mm256_add_epi32(_mm256_permute2x128_si256(x, y, 0x20), _mm256_permute2x128_si256(x, y, 0x31));
      int64_t row = (r0 + r) * p.blocks + b;
      acc[r] = accumulate_avx2(acc[r], dot, zp, ws, p.ascale[row], p.asum[row]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

// ---------------------------------------------------------------------------------------------------------
// AVX-512 with VNNI: dpbusd multiplies unsigned bytes (the weight codes, 0..15 or 0..255) by signed ones (the
// activation codes) and adds each 4 products into an int32 lane without saturation, so the dot products are the
// exact ones of the other paths; the epilogue is the AVX2 path's, on the same 8 columns.

// GCC 12's AVX-512 intrinsics fill unused lanes from a self-initialized variable, which -Wmaybe-uninitialized
// reports once inlined (a false alarm: no lane of ours is read uninitialized)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

template <int CH, int R>
__attribute__((target(AVX512_TARGET))) void int4_rows_avx512(const Ptrs& p, int64_t t, int64_t r0,
                                                               float* const* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F);
  // A register holds runs 2 h (low half) and 2 h + 1 (high half) of a chunk. Its low nibbles meet activation
  // words (4 codes each) 4 h and 4 h + 2, its high nibbles words 4 h + 1 and 4 h + 3.
  const __m512i words_of[4] = {
      _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
      _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
      _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4),
      _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5, 5)};
  for (int64_t b = 0; b < p.blocks; ++b) {
    const uint8_t* wb = p.w + (t * p.blocks + b) * p.tile_block_bytes;
    __m512i dot[R][2];  // two chains a row, for the multiply-adds' latency
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm512_setzero_si512();
    for (int j = 0; j < CH; ++j) {
      __m512i w[4];
      for (int h = 0; h < 2; ++h) {
        __m512i v = _mm512_loadu_si512(wb + (j * 4 + 2 * h) * kChunk);
        w[2 * h] = _mm512_and_si512(v, mask);
        w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* q = p.q + (r0 + r) * p.padded_k + b * p.block + j * kChunk;
        __m512i words = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
        for (int i = 0; i < 4; ++i)
          dot[r][i & 1] = _mm512_dpbusd_epi32(dot[r][i & 1], w[i], _mm512_permutexvar_epi32(words_of[i], words));
      }
    }
    int64_t at = (t * p.blocks + b) * kTile;
    __m256i zp = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.zp + at)));
    __m256 ws = _mm256_loadu_ps(p.wscale + at);
    for (int r = 0; r < R; ++r) {
      __m512i d = _mm512_add_epi32(dot[r][0], dot[r][1]);
      __m256i sum = _mm256_add_epi32(_mm512_castsi512_si256(d), _mm512_extracti64x4_epi64(d, 1));
      int64_t row = (r0 + r) * p.blocks + b;
      acc[r] = accumulate_avx2(acc[r], sum, zp, ws, p.ascale[row], p.asum[row]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

template <int CH, int R>
__attribute__((target(AVX512_TARGET))) void int8_rows_avx512(const Ptrs& p, int64_t t, int64_t r0,
                                                               float* const* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < p.blocks; ++b) {
    const uint8_t* wb = p.w + (t * p.blocks + b) * p.tile_block_bytes;
    __m512i s[R][4];  // s[r][i]: columns 2 i (low half) and 2 i + 1 (high half), 8 partial sums each
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) s[r][i] = _mm512_setzero_si512();
    for (int j = 0; j < CH; ++j) {
      __m512i w[4];
      for (int i = 0; i < 4; ++i) w[i] = _mm512_loadu_si512(wb + (j * kTile + 2 * i) * kChunk);
      for (int r = 0; r < R; ++r) {
        const int8_t* q = p.q + (r0 + r) * p.padded_k + b * p.block + j * kChunk;
        __m512i codes = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
        for (int i = 0; i < 4; ++i) s[r][i] = _mm512_dpbusd_epi32(s[r][i], w[i], codes);
      }
    }
    int64_t at = (t * p.blocks + b) * kTile;
    __m256i zp = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.zp + at)));
    __m256 ws = _mm256_loadu_ps(p.wscale + at);
    for (int r = 0; r < R; ++r) {
      __m256i c[kTile];
      for (int i = 0; i < 4; ++i) {
        c[2 * i] = _mm512_castsi512_si256(s[r][i]);
        c[2 * i + 1] = _mm512_extracti64x4_epi64(s[r][i], 1);
      }
      __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(c[0], c[1]), _mm256_hadd_epi32(c[2], c[3]));
      __m256i y = _mm256_hadd_epi32(_mm256_hadd_epi32(c[4], c[5]), _mm256_hadd_epi32(c[6], c[7]));
      __m256i dot = _mm256_add_epi32(_mm256_permute2x128_si256(x, y, 0x20), _mm256_permute2x128_si256(x, y, 0x31));
      int64_t row = (r0 + r) * p.blocks + b;
      acc[r] = accumulate_avx2(acc[r], dot, zp, ws, p.ascale[row], p.asum[row]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

#pragma GCC diagnostic pop

using RowsKernel = void (*)(const Ptrs&, int64_t, int64_t, float* const*);

template <int CH, int R>
RowsKernel kernel_for(Isa isa, int64_t bits) {
  if (isa == Isa::avx512vnni) return bits == 4 ? int4_rows_avx512<CH, R> : int8_rows_avx512<CH, R>;
  return bits == 4 ? int4_rows_avx2<CH, R> : int8_rows_avx2<CH, R>;
}

template <int CH>
RowsKernel rows_kernel(Isa isa, int64_t bits, int64_t rows) {
  switch (rows) {
    case 1: return kernel_for<CH, 1>(isa, bits);
    case 2: return kernel_for<CH, 2>(isa, bits);
    case 3: return kernel_for<CH, 3>(isa, bits);
    default: return kernel_for<CH, 4>(isa, bits);
  }
}

RowsKernel pick(Isa isa, int64_t chunks, int64_t bits, int64_t rows) {
  switch (chunks) {
    case 1: return rows_kernel<1>(isa, bits, rows);
    case 2: return rows_kernel<2>(isa, bits, rows);
    case 4: return rows_kernel<4>(isa, bits, rows);
    case 8: return rows_kernel<8>(isa, bits, rows);
    default: return nullptr;  // blocks of 96, 160 ... (no recipe's): the portable path
  }
}

// a tile on the AVX2 or AVX-512 kernels (c.isa's), R rows at a time
void tile_vector(const Call& c, int64_t t, int64_t r0, int64_t rows) {
  Ptrs p{c.w, c.wscale, c.zp, c.q.data(), c.ascale.data(), c.asum.data(), c.blocks, c.padded_k, c.a.block,
         c.tile_block_bytes};
  bool whole = (t + 1) * kTile <= c.a.N;
  alignas(32) float part[kRowGroup][kTile];  // the last tile's padded columns are not written out
  for (int64_t r = r0; r < r0 + rows;) {
    int64_t n = std::min<int64_t>(4, r0 + rows - r);
    RowsKernel k = pick(c.isa, c.chunks, c.a.bits, n);
    if (!k) return tile_portable(c, t, r, r0 + rows - r);
    float* out[4];
    for (int64_t i = 0; i < n; ++i) out[i] = whole ? c.out + (r + i) * c.a.N + t * kTile : part[i];
    k(p, t, r, out);
    if (!whole)
      for (int64_t i = 0; i < n; ++i) store(c, t, r + i, part[i]);
    r += n;
  }
}

Isa detect_isa() {
  // SPECEXPORT_MATMUL_ISA=portable|avx2 forces a path (the tests compare them); the default is the widest
  std::string want = forced_isa("SPECEXPORT_MATMUL_ISA");
  bool avx2 = cpu_has_avx2_fma();
#ifdef SPECEXPORT_SIMDE
  bool vnni = avx2;
#else
  bool vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vnni");
#endif
  if (want == "portable") return Isa::portable;
  if (want == "avx2") return avx2 ? Isa::avx2 : Isa::portable;
  return vnni ? Isa::avx512vnni : avx2 ? Isa::avx2 : Isa::portable;
}

const char* isa_name(Isa isa) {
  return isa == Isa::avx512vnni ? "avx512vnni" : isa == Isa::avx2 ? "avx2" : "portable";
}

void run_item(void* data, size_t item) {  // item: kTilesPerItem tiles of columns, every row
  const Call& c = *static_cast<const Call*>(data);
  int64_t first = static_cast<int64_t>(item) * kTilesPerItem, last = std::min(c.tiles, first + kTilesPerItem);
  for (int64_t t = first; t < last; ++t)
    for (int64_t r0 = 0; r0 < c.M; r0 += kRowGroup) c.tile(c, t, r0, std::min(kRowGroup, c.M - r0));
}

void gated_rows(const Call& c, int64_t j0, int64_t j1) {  // the epilogue on columns [j0, j1) of every row
  int64_t half = c.a.N / 2;
  for (int64_t r = 0; r < c.M; ++r)
    c.silu_mul(c.out + r * c.a.N + j0, c.out + r * c.a.N + half + j0, c.gated + r * half + j0, j1 - j0);
}

// item: kTilesPerItem gate tiles, then their up tiles (each run of tiles one stretch of weights), every row, then
// their epilogue while the outputs are in cache
void run_gated_item(void* data, size_t item) {
  const Call& c = *static_cast<const Call*>(data);
  int64_t first = static_cast<int64_t>(item) * kTilesPerItem, last = std::min(c.half_tiles, first + kTilesPerItem);
  for (int64_t half : {int64_t{0}, c.half_tiles})
    for (int64_t t = first + half; t < last + half; ++t)
      for (int64_t r0 = 0; r0 < c.M; r0 += kRowGroup) c.tile(c, t, r0, std::min(kRowGroup, c.M - r0));
  gated_rows(c, first * kTile, last * kTile);
}

// ---------------------------------------------------------------------------------------------------------
// ONNX Runtime glue

struct Kernel {
  Attrs a;
  Isa isa;
};

OrtStatus* fail(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

struct Tensor {
  std::vector<int64_t> shape;
  int64_t size = 1;
  const void* data = nullptr;
};

OrtStatus* input(OrtKernelContext* ctx, size_t index, Tensor* t) {
  const OrtValue* value = nullptr;
  RETURN_IF(g_api->KernelContext_GetInput(ctx, index, &value));
  if (!value) return fail("RowInvariantMatMulNBits: input " + std::to_string(index) + " is missing");
  RETURN_IF(shape_of(g_api, value, &t->shape));
  for (int64_t d : t->shape) t->size *= d;
  return data_of(g_api, value, &t->data);
}

OrtStatus* compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel& kern = *static_cast<Kernel*>(op_kernel);
  Tensor a, w, scales, zp;
  RETURN_IF(input(ctx, 0, &a));
  RETURN_IF(input(ctx, 1, &w));
  RETURN_IF(input(ctx, 2, &scales));
  RETURN_IF(input(ctx, 3, &zp));
  Call c;
  c.a = kern.a;
  if (a.shape.empty() || a.shape.back() != c.a.K)
    return fail("RowInvariantMatMulNBits: A's last axis is not K = " + std::to_string(c.a.K));
  c.M = a.size / c.a.K;
  c.blocks = (c.a.K + c.a.block - 1) / c.a.block;
  c.chunks = c.a.block / kChunk;
  c.tiles = (c.a.N + kTile - 1) / kTile;
  c.padded_k = c.blocks * c.a.block;
  c.tile_block_bytes = kTile * c.a.block * c.a.bits / 8;
  if (w.size != c.tiles * c.blocks * c.tile_block_bytes || scales.size != c.tiles * c.blocks * kTile ||
      zp.size != c.tiles * c.blocks * kTile)
    return fail("RowInvariantMatMulNBits: B, scales or zero_points do not hold K, N, bits and block_size's tiles");
  c.w = static_cast<const uint8_t*>(w.data);
  c.wscale = static_cast<const float*>(scales.data);
  c.zp = static_cast<const uint8_t*>(zp.data);
  std::vector<int64_t> out_shape = a.shape;
  out_shape.back() = c.a.silu ? c.a.N / 2 : c.a.N;
  OrtValue* out = nullptr;
  RETURN_IF(g_api->KernelContext_GetOutput(ctx, 0, out_shape.data(), out_shape.size(), &out));
  float* result = nullptr;
  RETURN_IF(g_api->GetTensorMutableData(out, reinterpret_cast<void**>(&result)));
  if (c.M == 0) return nullptr;
  std::vector<float> scratch;  // gated: gate and up, [M, N], before the epilogue
  if (c.a.silu) {
    scratch.resize(c.M * c.a.N);
    c.out = scratch.data();
    c.gated = result;
  } else {
    c.out = result;
  }
  c.q.resize(c.M * c.padded_k);
  c.ascale.resize(c.M * c.blocks);
  c.asum.resize(c.M * c.blocks);
  const float* rows = static_cast<const float*>(a.data);
  auto quantize = kern.isa == Isa::portable ? quantize_row : quantize_row_avx2;
  for (int64_t r = 0; r < c.M; ++r)  // before the parallel loop, so vectorised: it is the call's serial part
    quantize(rows + r * c.a.K, c.a.K, c.a.block, c.blocks, c.q.data() + r * c.padded_k,
             c.ascale.data() + r * c.blocks, c.asum.data() + r * c.blocks);
  c.isa = kern.isa;
  c.tile = kern.isa == Isa::portable ? tile_portable : tile_vector;
  c.silu_mul = kern.isa == Isa::portable ? silu_mul_portable : silu_mul_avx2;
  if (c.a.silu && (c.a.N / 2) % kTile == 0) {
    c.half_tiles = c.a.N / 2 / kTile;
    size_t items = static_cast<size_t>((c.half_tiles + kTilesPerItem - 1) / kTilesPerItem);
    return g_api->KernelContext_ParallelFor(ctx, run_gated_item, items, 0, &c);
  }
  size_t items = static_cast<size_t>((c.tiles + kTilesPerItem - 1) / kTilesPerItem);
  RETURN_IF(g_api->KernelContext_ParallelFor(ctx, run_item, items, 0, &c));
  if (c.a.silu) gated_rows(c, 0, c.a.N / 2);  // halves that share a tile: the epilogue after every tile
  return nullptr;
}

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  Kernel* kern = new Kernel;
  const char* names[] = {"K", "N", "bits", "block_size"};
  int64_t* fields[] = {&kern->a.K, &kern->a.N, &kern->a.bits, &kern->a.block};
  for (int i = 0; i < 4; ++i) {
    OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, names[i], fields[i]);
    if (st) {
      g_api->ReleaseStatus(st);
      delete kern;
      return fail(std::string("RowInvariantMatMulNBits needs the attribute ") + names[i]);
    }
  }
  std::string gated = "none";
  size_t size = 0;
  OrtStatus* st = g_api->KernelInfoGetAttribute_string(info, "gated", nullptr, &size);
  if (st) {
    g_api->ReleaseStatus(st);  // absent: not gated
  } else {
    std::vector<char> text(size);
    st = g_api->KernelInfoGetAttribute_string(info, "gated", text.data(), &size);
    if (st) {
      delete kern;
      return st;
    }
    gated = std::string(text.data());
  }
  if (gated != "none" && gated != "silu") {
    delete kern;
    return fail("RowInvariantMatMulNBits: gated must be \"none\" or \"silu\", not \"" + gated + "\"");
  }
  kern->a.silu = gated == "silu";
  const Attrs& a = kern->a;
  if (a.silu && a.N % 2) {
    delete kern;
    return fail("RowInvariantMatMulNBits: gated = \"silu\" needs an even N (gate and up halves)");
  }
  if (a.K <= 0 || a.N <= 0 || (a.bits != 4 && a.bits != 8) || a.block < kChunk || a.block > kMaxBlock ||
      a.block % kChunk) {
    delete kern;
    return fail("RowInvariantMatMulNBits: K and N must be positive, bits 4 or 8, block_size a multiple of 32 up"
                " to 256");
  }
  int64_t packing = 0;
  st = g_api->KernelInfoGetAttribute_int64(info, "packing", &packing);
  if (st) g_api->ReleaseStatus(st);
  if (a.bits == 4 && packing != kInt4Packing) {
    delete kern;
    return fail("RowInvariantMatMulNBits: this model's int4 weights are packed in an older layout than this library"
                " reads; rebuild the bundle with this specexport");
  }
  kern->isa = detect_isa();
  *out = kern;
  return nullptr;
}

struct Op : OrtCustomOp {
  explicit Op(uint32_t api_version) {
    fill_common(this, api_version);
    GetName = [](const OrtCustomOp*) { return "RowInvariantMatMulNBits"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 4; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      return i == 0 || i == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    };
    GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    CreateKernelV2 = create_kernel;
    KernelComputeV2 = compute;
    KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  }
};

}  // namespace

// The operator for RegisterCustomOps (native/row_attention.cc), which holds the library's one domain.
OrtCustomOp* SpecexportMatMulOp(const OrtApi* api, uint32_t version) {
  g_api = api;
  static Op op(version);
  return &op;
}

extern "C" {

// The path the kernels take on this CPU, for `specexport doctor` and the tests.
__attribute__((visibility("default"))) const char* SpecexportMatMulIsa() { return isa_name(detect_isa()); }

}  // extern "C"
