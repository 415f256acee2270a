// specexport.RowInvariantAttention: GroupQueryAttention's job as the `ort` pieces use it, with every output row
// computed alone.
//
// Lossless speculative decoding needs a token's row of a many-row verification call to carry the same bits as
// the one-row AR call of that token. ONNX Runtime's GroupQueryAttention picks kernels by the call's shape, so
// it does not. Here a row's arithmetic depends only on its query, its bias row and the keys and values of the
// slots it sees, taken in slot order with masked slots skipped (a token tree's branch therefore rounds as the
// same tokens laid out as a chain). Sums run over 16 fixed lanes (element k goes to lane k % 16) with a fixed
// reduction tree, products accumulate with fused multiply-adds, and exp is a polynomial of our own, so the
// portable, AVX2 and AVX-512 paths give the same bits and the path taken is only a matter of speed.
//
// Inputs (GroupQueryAttention's order): query [B, S, H*hd] or packed q|k|v [B, S, (H+2Hkv)*hd]; key and value
// [B, S, Hkv*hd] (absent when packed); past_key, past_value [B, Hkv, C, hd] (the in-place cache: bound as the
// present outputs too, new keys land at slots seqlens_k + 1 - S ...); seqlens_k [B] (total length - 1 per
// batch row); total_sequence_length []; cos_cache, sin_cache [P, rotary_dim / 2] (rotate-half layout over the
// first rotary_dim features); position_ids [B, S]; attention_bias [B or 1, 1, S, total] (a value at or below
// -3e38 masks the slot). Causality is by slot: the query in slot p sees slots 0 .. p.
// Attributes: num_heads, kv_num_heads, scale (0: hd^-0.5), softcap (0: none), do_rotary.
//
// Built without linking libonnxruntime: the API comes from the OrtApiBase that RegisterCustomOps receives
// (the Python module carries its own copy of the runtime).

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
#define AVX512_TARGET "avx512f,avx2,fma"
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
constexpr int kLanes = 16;
constexpr float kMasked = -3.0e38f;  // finfo(float32).min and -inf both count as masked

enum class Isa { portable, avx2, avx512 };

// ---------------------------------------------------------------------------------------------------------
// The canonical arithmetic, written once for one lane (the portable path) and mirrored op for op below.

inline float reduce_lanes(const float* s) {  // the fixed tree: (l, l+8), then (l, l+4), (l, l+2), (0, 1)
  float t[8], u[4], v[2];
  for (int l = 0; l < 8; ++l) t[l] = s[l] + s[l + 8];
  for (int l = 0; l < 4; ++l) u[l] = t[l] + t[l + 4];
  for (int l = 0; l < 2; ++l) v[l] = u[l] + u[l + 2];
  return v[0] + v[1];
}

float dot_portable(const float* a, const float* b, int n) {
  float acc[kLanes] = {0};
  for (int d = 0; d < n; ++d) acc[d % kLanes] = std::fma(a[d], b[d], acc[d % kLanes]);
  return reduce_lanes(acc);
}

float exp_sum_portable(float* s, int n, float m) {  // s[k] <- e^(s[k] - m); returns their sum
  float acc[kLanes] = {0};
  for (int k = 0; k < n; ++k) {
    s[k] = exp_lane(s[k] - m);
    acc[k % kLanes] += s[k];
  }
  return reduce_lanes(acc);
}

// scores[t] = q . keys[slots[t]]; acc += sum_t w[t] keys... : the batched forms every path implements
void scores_portable(const float* q, const float* keys, const int64_t* slots, int n, int hd, float* out) {
  for (int t = 0; t < n; ++t) out[t] = dot_portable(q, keys + slots[t] * hd, hd);
}

void wsum_portable(const float* w, const float* vals, const int64_t* slots, int n, int hd, float* acc) {
  for (int t = 0; t < n; ++t) {  // acc[d] = fma(w[t], v_t[d], acc[d]) in slot order, for every d
    const float* v = vals + slots[t] * hd;
    for (int d = 0; d < hd; ++d) acc[d] = std::fma(w[t], v[d], acc[d]);
  }
}

// scores *= scale, then (softcap) cap tanh(score / cap), then + the slot's bias; returns their maximum, NaN
// scores left out (as `score > m` leaves them out)
float prepare_portable(float* sc, const float* adds, int n, float scale, float cap) {
  float m = -INFINITY;
  for (int t = 0; t < n; ++t) {
    float x = sc[t] * scale;
    if (cap > 0.0f) x = cap * std::tanh(x / cap);
    if (adds) x += adds[t];
    sc[t] = x;
    m = x > m ? x : m;
  }
  return m;
}

void scale_portable(float* out, const float* acc, float sum, int n) {
  for (int d = 0; d < n; ++d) out[d] = acc[d] / sum;
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 + FMA: two 8-lane registers hold lanes 0-7 and 8-15. Head sizes that are not a multiple of 16 take
// the portable dot product (the same bits, without masked tails).

__attribute__((target("avx2,fma"))) inline float reduce_avx2(__m256 lo, __m256 hi) {
  __m256 t = _mm256_add_ps(lo, hi);
  __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

__attribute__((target("avx2,fma"))) float exp_sum_avx2(float* s, int n, float m) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(), mm = _mm256_set1_ps(m);
  int k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    __m256 a = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + k), mm));
    __m256 b = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + k + 8), mm));
    _mm256_storeu_ps(s + k, a);
    _mm256_storeu_ps(s + k + 8, b);
    lo = _mm256_add_ps(lo, a);
    hi = _mm256_add_ps(hi, b);
  }
  alignas(32) float acc[kLanes];
  _mm256_store_ps(acc, lo);
  _mm256_store_ps(acc + 8, hi);
  for (int l = 0; k < n; ++k, ++l) {  // the tail: lane l gets element k, as in the portable loop
    s[k] = exp_lane(s[k] - m);
    acc[l] += s[k];
  }
  return reduce_lanes(acc);
}

// prepare_portable on 8 lanes. The maximum is exact in any order; maxps(x, m) keeps m where x is NaN, as the
// scalar comparison does. Where the two could differ (the sign of a zero maximum), e^(s - m) does not: s - (+0) and
// s - (-0) differ only in a zero's sign, and e^(+-0) is 1 either way.
__attribute__((target("avx2,fma"))) float prepare_avx2(float* sc, const float* adds, int n, float scale, float cap) {
  if (cap > 0.0f) return prepare_portable(sc, adds, n, scale, cap);  // soft-capping's tanh: scalar
  __m256 mv = _mm256_set1_ps(-INFINITY), sv = _mm256_set1_ps(scale);
  int t = 0;
  for (; t + 8 <= n; t += 8) {
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(sc + t), sv);
    if (adds) x = _mm256_add_ps(x, _mm256_loadu_ps(adds + t));
    _mm256_storeu_ps(sc + t, x);
    mv = _mm256_max_ps(x, mv);
  }
  float m = prepare_portable(sc + t, adds ? adds + t : nullptr, n - t, scale, cap);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  for (float x : lanes) m = x > m ? x : m;
  return m;
}

// Four keys' lane sums reduced together: each key's sums are added in reduce_avx2's pairs, so its score has
// the same bits, while the shuffles are shared and the four keys' multiply-add chains run side by side.
__attribute__((target("avx2,fma"))) inline __m128 reduce4_avx2(__m256 lo_a, __m256 hi_a, __m256 lo_b, __m256 hi_b,
                                                               __m256 lo_c, __m256 hi_c, __m256 lo_d, __m256 hi_d) {
  __m256 ta = _mm256_add_ps(lo_a, hi_a), tb = _mm256_add_ps(lo_b, hi_b);  // t[l] = s[l] + s[l + 8]
  __m256 tc = _mm256_add_ps(lo_c, hi_c), td = _mm256_add_ps(lo_d, hi_d);
  __m256 uab = _mm256_add_ps(_mm256_permute2f128_ps(ta, tb, 0x20), _mm256_permute2f128_ps(ta, tb, 0x31));  // + t[l + 4]
  __m256 ucd = _mm256_add_ps(_mm256_permute2f128_ps(tc, td, 0x20), _mm256_permute2f128_ps(tc, td, 0x31));
  // v0 = u0 + u2, v1 = u1 + u3: [a0 a1 c0 c1 | b0 b1 d0 d1]
  __m256 v = _mm256_add_ps(_mm256_shuffle_ps(uab, ucd, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(uab, ucd, _MM_SHUFFLE(3, 2, 3, 2)));
  __m256 w = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1)));  // v0 + v1 in lanes 0, 2, 4, 6
  return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 2, 6, 0, 0, 0, 0)));
}

__attribute__((target("avx2,fma"))) void scores_avx2(const float* q, const float* keys, const int64_t* slots, int n,
                                                     int hd, float* out) {
  if (hd % kLanes) return scores_portable(q, keys, slots, n, hd, out);
  int t = 0;
  for (; t + 4 <= n; t += 4) {
    const float *ka = keys + slots[t] * hd, *kb = keys + slots[t + 1] * hd;
    const float *kc = keys + slots[t + 2] * hd, *kd = keys + slots[t + 3] * hd;
    __m256 la = _mm256_setzero_ps(), ha = la, lb = la, hb = la, lc = la, hc = la, ld = la, hd_ = la;
    for (int d = 0; d < hd; d += kLanes) {
      __m256 q0 = _mm256_loadu_ps(q + d), q1 = _mm256_loadu_ps(q + d + 8);
      la = _mm256_fmadd_ps(q0, _mm256_loadu_ps(ka + d), la);
      ha = _mm256_fmadd_ps(q1, _mm256_loadu_ps(ka + d + 8), ha);
      lb = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kb + d), lb);
      hb = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kb + d + 8), hb);
      lc = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kc + d), lc);
      hc = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kc + d + 8), hc);
      ld = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kd + d), ld);
      hd_ = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kd + d + 8), hd_);
    }
    _mm_storeu_ps(out + t, reduce4_avx2(la, ha, lb, hb, lc, hc, ld, hd_));
  }
  for (; t < n; ++t) {
    const float* k = keys + slots[t] * hd;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += kLanes) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), hi);
    }
    out[t] = reduce_avx2(lo, hi);
  }
}

// the accumulators of 64 features stay in registers while every slot's values are added
__attribute__((target("avx2,fma"))) void wsum_avx2(const float* w, const float* vals, const int64_t* slots, int n,
                                                   int hd, float* acc) {
  int d0 = 0;
  for (; d0 + 64 <= hd; d0 += 64) {
    __m256 a0 = _mm256_loadu_ps(acc + d0), a1 = _mm256_loadu_ps(acc + d0 + 8), a2 = _mm256_loadu_ps(acc + d0 + 16),
           a3 = _mm256_loadu_ps(acc + d0 + 24), a4 = _mm256_loadu_ps(acc + d0 + 32),
           a5 = _mm256_loadu_ps(acc + d0 + 40), a6 = _mm256_loadu_ps(acc + d0 + 48),
           a7 = _mm256_loadu_ps(acc + d0 + 56);
    for (int t = 0; t < n; ++t) {
      const float* v = vals + slots[t] * hd + d0;
      __m256 ww = _mm256_set1_ps(w[t]);
      a0 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v), a0);
      a1 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + 8), a1);
      a2 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + 16), a2);
      a3 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + 24), a3);
      a4 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + 32), a4);
      a5 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + 40), a5);
      a6 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + 48), a6);
      a7 = _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + 56), a7);
    }
    _mm256_storeu_ps(acc + d0, a0);
    _mm256_storeu_ps(acc + d0 + 8, a1);
    _mm256_storeu_ps(acc + d0 + 16, a2);
    _mm256_storeu_ps(acc + d0 + 24, a3);
    _mm256_storeu_ps(acc + d0 + 32, a4);
    _mm256_storeu_ps(acc + d0 + 40, a5);
    _mm256_storeu_ps(acc + d0 + 48, a6);
    _mm256_storeu_ps(acc + d0 + 56, a7);
  }
  for (; d0 + 8 <= hd; d0 += 8) {
    __m256 a = _mm256_loadu_ps(acc + d0);
    for (int t = 0; t < n; ++t) a = _mm256_fmadd_ps(_mm256_set1_ps(w[t]), _mm256_loadu_ps(vals + slots[t] * hd + d0), a);
    _mm256_storeu_ps(acc + d0, a);
  }
  for (; d0 < hd; ++d0)
    for (int t = 0; t < n; ++t) acc[d0] = std::fma(w[t], vals[slots[t] * hd + d0], acc[d0]);
}

// ---------------------------------------------------------------------------------------------------------
// AVX-512F: one register holds the 16 lanes.

__attribute__((target(AVX512_TARGET))) void scores_avx512(const float* q, const float* keys, const int64_t* slots,
                                                          int n, int hd, float* out) {
  if (hd % kLanes) return scores_portable(q, keys, slots, n, hd, out);
  for (int t = 0; t < n; ++t) {
    const float* k = keys + slots[t] * hd;
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += kLanes) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
    alignas(64) float lanes[kLanes];  // lanes 0-7 and 8-15 as AVX2's two registers, then the same tree
    _mm512_store_ps(lanes, acc);
    out[t] = reduce_avx2(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
  }
}

struct Kernels {
  void (*scores)(const float*, const float*, const int64_t*, int, int, float*);
  float (*prepare)(float*, const float*, int, float, float);
  float (*exp_sum)(float*, int, float);
  void (*wsum)(const float*, const float*, const int64_t*, int, int, float*);
};

Isa detect_isa() {
  // SPECEXPORT_ATTENTION_ISA=portable|avx2 forces a path (the tests compare them); the default is the widest
  std::string want = forced_isa("SPECEXPORT_ATTENTION_ISA");
  bool avx2 = cpu_has_avx2_fma();
#ifdef SPECEXPORT_SIMDE
  bool avx512 = avx2;
#else
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
#endif
  if (want == "portable") return Isa::portable;
  if (want == "avx2") return avx2 ? Isa::avx2 : Isa::portable;
  return avx512 ? Isa::avx512 : avx2 ? Isa::avx2 : Isa::portable;
}

Kernels kernels_for(Isa isa) {
  switch (isa) {
    case Isa::avx512: return {scores_avx512, prepare_avx2, exp_sum_avx2, wsum_avx2};
    case Isa::avx2: return {scores_avx2, prepare_avx2, exp_sum_avx2, wsum_avx2};
    default: return {scores_portable, prepare_portable, exp_sum_portable, wsum_portable};
  }
}

const char* isa_name(Isa isa) {
  return isa == Isa::avx512 ? "avx512" : isa == Isa::avx2 ? "avx2" : "portable";
}

// ---------------------------------------------------------------------------------------------------------

struct Attrs {
  int64_t heads = 0, kv_heads = 0, do_rotary = 0;
  float scale = 0.0f, softcap = 0.0f;
};

struct Call {  // one Compute's shapes and pointers, shared by the parallel loops
  Attrs a;
  Kernels k;
  int64_t B, S, hd, C, half, bias_batch, bias_width, cos_rows;
  bool packed;
  const float *q, *knew, *vnew, *cos, *sin, *bias;
  int64_t q_stride, kv_stride, k_off, v_off;  // per token: floats in the query (and key/value) rows
  const int64_t* pos;
  std::vector<int64_t> past;  // per batch row: the slot of the call's first token
  float *kc, *vc, *out;
  // per query row (b, i): the slots it sees in order and their bias, found once for all its heads (find_seen)
  struct Seen {
    const int64_t* slots;
    const float* adds;
    int n;
  };
  std::vector<Seen> seen;
  int64_t group;  // query heads an attend item computes: all that share a kv head, or one (too few items else)
};

inline int64_t position(const Call& c, int64_t b, int64_t i) {
  return c.pos ? c.pos[b * c.S + i] : c.past[b] + i;
}

void rotate(const Call& c, const float* x, float* y, int64_t p) {
  std::memcpy(y, x, sizeof(float) * c.hd);
  if (!c.a.do_rotary) return;
  const float* cs = c.cos + p * c.half;
  const float* sn = c.sin + p * c.half;
  for (int64_t d = 0; d < c.half; ++d) {
    float x1 = x[d], x2 = x[d + c.half];
    y[d] = x1 * cs[d] - x2 * sn[d];
    y[d + c.half] = x2 * cs[d] + x1 * sn[d];
  }
}

void write_kv(void* data, size_t item) {  // item: (b, kv head, i) -> the new key (rotated) and value in the cache
  const Call& c = *static_cast<const Call*>(data);
  int64_t i = item % c.S, kh = (item / c.S) % c.a.kv_heads, b = item / (c.S * c.a.kv_heads);
  int64_t slot = c.past[b] + i;
  const float* krow = c.knew + (b * c.S + i) * c.kv_stride + c.k_off + kh * c.hd;
  const float* vrow = c.vnew + (b * c.S + i) * c.kv_stride + c.v_off + kh * c.hd;
  size_t at = ((b * c.a.kv_heads + kh) * c.C + slot) * c.hd;
  rotate(c, krow, c.kc + at, position(c, b, i));
  std::memcpy(c.vc + at, vrow, sizeof(float) * c.hd);
}

// Keys and values are read in tiles that stay in the L1 cache while every head of a kv head's group uses them: the
// group then reads its cache rows from L2 once, not once per head. Each head's scores, softmax and weighted sum are
// the same operations in the same order as for that head alone (a tile boundary only stores and reloads a sum).
int64_t tile_slots(int64_t hd) { return std::max<int64_t>(16, (16384 / (hd * 4)) / 4 * 4); }

// item: (b, head group, i) -> the output rows of the group's query heads, `group` heads that share a kv head
void attend(void* data, size_t item) {
  const Call& c = *static_cast<const Call*>(data);
  int64_t group = c.group, hd = c.hd, groups = c.a.heads / group;
  int64_t i = item % c.S, hg = (item / c.S) % groups, b = item / (c.S * groups);
  int64_t kh = hg * group / (c.a.heads / c.a.kv_heads);
  const Call::Seen& seen = c.seen[b * c.S + i];
  float* out = c.out + (b * c.S + i) * c.a.heads * hd + hg * group * hd;
  if (seen.n == 0) {
    std::memset(out, 0, sizeof(float) * group * hd);
    return;
  }
  int n = seen.n;
  thread_local std::vector<float> scores, qrot, acc, sums;
  scores.resize(group * n);
  qrot.resize(group * hd);
  acc.assign(group * hd, 0.0f);
  sums.resize(group);
  for (int64_t g = 0; g < group; ++g)
    rotate(c, c.q + (b * c.S + i) * c.q_stride + (hg * group + g) * hd, qrot.data() + g * hd, position(c, b, i));
  const float* keys = c.kc + (b * c.a.kv_heads + kh) * c.C * hd;
  const float* vals = c.vc + (b * c.a.kv_heads + kh) * c.C * hd;
  int width = static_cast<int>(hd), tile = static_cast<int>(tile_slots(hd));
  for (int t0 = 0; t0 < n; t0 += tile)
    for (int64_t g = 0; g < group; ++g)
      c.k.scores(qrot.data() + g * hd, keys, seen.slots + t0, std::min(tile, n - t0), width,
                 scores.data() + g * n + t0);
  for (int64_t g = 0; g < group; ++g) {
    float* sc = scores.data() + g * n;
    sums[g] = c.k.exp_sum(sc, n, c.k.prepare(sc, seen.adds, n, c.a.scale, c.a.softcap));
  }
  for (int t0 = 0; t0 < n; t0 += tile)
    for (int64_t g = 0; g < group; ++g)
      c.k.wsum(scores.data() + g * n + t0, vals, seen.slots + t0, std::min(tile, n - t0), width,
               acc.data() + g * hd);
  for (int64_t g = 0; g < group; ++g) scale_portable(out + g * hd, acc.data() + g * hd, sums[g], width);
}

// Call::seen for every query row: the slots 0 .. its own that its bias row does not mask. A row that masks nothing
// reads 0, 1, 2 ... (`iota`) and its bias row as they are; the others' lists are packed in `slots` and `adds`. The
// lists live in the calling thread's storage, which outlasts the parallel loop that reads them.
void find_seen(Call& c) {
  thread_local std::vector<int64_t> iota, slots;
  thread_local std::vector<float> adds;
  int64_t rows = c.B * c.S, widest = 0;
  for (int64_t b = 0; b < c.B; ++b) widest = std::max(widest, c.past[b] + c.S);
  if (static_cast<int64_t>(iota.size()) < widest) {
    iota.resize(widest);
    for (int64_t j = 0; j < widest; ++j) iota[j] = j;
  }
  c.seen.resize(rows);
  std::vector<int64_t> packed_at(rows, -1);
  int64_t packed = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t b = r / c.S, i = r % c.S, last = c.past[b] + i;
    const float* bias = c.bias ? c.bias + ((c.bias_batch == 1 ? 0 : b) * c.S + i) * c.bias_width : nullptr;
    bool masks = false;
    for (int64_t j = 0; bias && j <= last && !masks; ++j) masks = !(bias[j] > kMasked);
    c.seen[r] = {iota.data(), bias, static_cast<int>(last + 1)};
    if (masks) {
      packed_at[r] = packed;
      packed += last + 1;
    }
  }
  if (!packed) return;
  slots.resize(packed);
  adds.resize(packed);
  for (int64_t r = 0; r < rows; ++r) {
    if (packed_at[r] < 0) continue;
    int64_t* row_slots = slots.data() + packed_at[r];
    float* row_adds = adds.data() + packed_at[r];
    const float* bias = c.seen[r].adds;
    int n = 0;
    for (int64_t j = 0; j < c.seen[r].n; ++j) {  // branch-free: a masked slot is written and then overwritten
      row_slots[n] = j;
      row_adds[n] = bias[j];
      n += bias[j] > kMasked;
    }
    c.seen[r] = {row_slots, row_adds, n};
  }
}

// ---------------------------------------------------------------------------------------------------------
// ONNX Runtime glue

struct Kernel {
  Attrs a;
  Kernels k;
};

OrtStatus* fail(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

struct Tensor {
  const OrtValue* value = nullptr;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

OrtStatus* input(OrtKernelContext* ctx, size_t index, Tensor* t) {
  RETURN_IF(g_api->KernelContext_GetInput(ctx, index, &t->value));
  if (!t->value) return nullptr;
  RETURN_IF(shape_of(g_api, t->value, &t->shape));
  return data_of(g_api, t->value, &t->data);
}

template <typename T>
const T* as(const Tensor& t) { return static_cast<const T*>(t.data); }

OrtStatus* output(OrtKernelContext* ctx, size_t index, const std::vector<int64_t>& shape, float** data) {
  OrtValue* v = nullptr;
  RETURN_IF(g_api->KernelContext_GetOutput(ctx, index, shape.data(), shape.size(), &v));
  return g_api->GetTensorMutableData(v, reinterpret_cast<void**>(data));
}

// Present = past with the new rows written. Where the caller bound one buffer as both (the runtime does), the
// past is already there; otherwise it is copied first.
void carry_past(const float* past, float* present, int64_t rows, int64_t c_past, int64_t c_present, int64_t hd) {
  if (past == present) return;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(present + r * c_present * hd, past + r * c_past * hd, sizeof(float) * c_past * hd);
}

OrtStatus* compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel& kern = *static_cast<Kernel*>(op_kernel);
  Tensor q, k, v, pk, pv, seqlens, total, cs, sn, pos, bias;
  Tensor* all[] = {&q, &k, &v, &pk, &pv, &seqlens, &total, &cs, &sn, &pos, &bias};
  size_t count = 0;
  RETURN_IF(g_api->KernelContext_GetInputCount(ctx, &count));
  for (size_t idx = 0; idx < 11 && idx < count; ++idx) RETURN_IF(input(ctx, idx, all[idx]));
  Call c;
  c.a = kern.a;
  c.k = kern.k;
  if (!q.value || !pk.value || !pv.value || !seqlens.value) return fail("RowInvariantAttention needs query, past_key, past_value and seqlens_k");
  if (q.shape.size() != 3 || pk.shape.size() != 4 || pk.shape != pv.shape)
    return fail("RowInvariantAttention: query must be [batch, seq, features] and the caches [batch, kv_heads, slots, head_dim]");
  c.B = q.shape[0];
  c.S = q.shape[1];
  c.hd = pk.shape[3];
  c.C = pk.shape[2];
  int64_t H = c.a.heads, Hk = c.a.kv_heads;
  if (pk.shape[0] != c.B || pk.shape[1] != Hk) return fail("RowInvariantAttention: the caches' batch or kv heads do not match the query's");
  c.packed = !k.value;
  if (c.packed) {
    if (q.shape[2] != (H + 2 * Hk) * c.hd) return fail("RowInvariantAttention: packed query's features are not (heads + 2 kv_heads) * head_dim");
    c.q_stride = c.kv_stride = q.shape[2];
    c.knew = c.vnew = as<float>(q);
    c.k_off = H * c.hd;
    c.v_off = (H + Hk) * c.hd;
  } else {
    if (!v.value || q.shape[2] != H * c.hd || k.shape != v.shape || k.shape.size() != 3 || k.shape[2] != Hk * c.hd ||
        k.shape[0] != c.B || k.shape[1] != c.S)
      return fail("RowInvariantAttention: query, key and value do not match num_heads, kv_num_heads and head_dim");
    c.q_stride = H * c.hd;
    c.kv_stride = Hk * c.hd;
    c.knew = as<float>(k);
    c.vnew = as<float>(v);
    c.k_off = c.v_off = 0;
  }
  c.q = as<float>(q);
  if (seqlens.shape.size() != 1 || seqlens.shape[0] != c.B) return fail("RowInvariantAttention: seqlens_k must be [batch]");
  c.past.resize(c.B);
  for (int64_t b = 0; b < c.B; ++b) {
    c.past[b] = static_cast<int64_t>(as<int32_t>(seqlens)[b]) + 1 - c.S;
    if (c.past[b] < 0 || c.past[b] + c.S > c.C)
      return fail("RowInvariantAttention: seqlens_k puts the call's tokens outside the cache (" + std::to_string(c.C) + " slots)");
  }
  c.cos = c.sin = nullptr;
  c.half = 0;
  c.cos_rows = 0;
  if (c.a.do_rotary) {
    if (!cs.value || !sn.value || cs.shape.size() != 2 || cs.shape != sn.shape || 2 * cs.shape[1] > c.hd)
      return fail("RowInvariantAttention: do_rotary needs cos_cache and sin_cache [positions, rotary_dim / 2]");
    c.cos = as<float>(cs);
    c.sin = as<float>(sn);
    c.half = cs.shape[1];
    c.cos_rows = cs.shape[0];
  }
  c.pos = pos.value ? as<int64_t>(pos) : nullptr;
  if (c.pos && (pos.shape.size() != 2 || pos.shape[0] != c.B || pos.shape[1] != c.S))
    return fail("RowInvariantAttention: position_ids must be [batch, seq]");
  for (int64_t b = 0; b < c.B && c.a.do_rotary; ++b)
    for (int64_t i = 0; i < c.S; ++i) {
      int64_t p = position(c, b, i);
      if (p < 0 || p >= c.cos_rows) return fail("RowInvariantAttention: a position is outside the rotary tables");
    }
  c.bias = bias.value ? as<float>(bias) : nullptr;
  c.bias_batch = 1;
  c.bias_width = 0;
  if (c.bias) {
    if (bias.shape.size() != 4 || (bias.shape[0] != 1 && bias.shape[0] != c.B) || bias.shape[1] != 1 || bias.shape[2] != c.S)
      return fail("RowInvariantAttention: attention_bias must be [batch or 1, 1, seq, total]");
    c.bias_batch = bias.shape[0];
    c.bias_width = bias.shape[3];
    for (int64_t b = 0; b < c.B; ++b)
      if (c.past[b] + c.S > c.bias_width) return fail("RowInvariantAttention: attention_bias is narrower than the call's total length");
  }
  std::vector<int64_t> out_shape = {c.B, c.S, H * c.hd};
  float* pk_out = nullptr;
  float* pv_out = nullptr;
  RETURN_IF(output(ctx, 0, out_shape, &c.out));
  RETURN_IF(output(ctx, 1, pk.shape, &pk_out));
  RETURN_IF(output(ctx, 2, pv.shape, &pv_out));
  carry_past(as<float>(pk), pk_out, c.B * Hk, c.C, c.C, c.hd);
  carry_past(as<float>(pv), pv_out, c.B * Hk, c.C, c.C, c.hd);
  c.kc = pk_out;
  c.vc = pv_out;
  // all new keys and values first: a row reads those of the call's earlier rows
  // (inline: copies and rotations are cheap, and a pool wake-up per call is not)
  for (size_t item = 0; item < static_cast<size_t>(c.B * Hk * c.S); ++item) write_kv(&c, item);
  find_seen(c);
  // a kv head's query heads together read its cache once; with fewer such items than 4 (a one-token call of a
  // model with 3 kv heads), one head an item, which two threads share out more evenly
  c.group = c.B * Hk * c.S >= 4 ? H / Hk : 1;
  return g_api->KernelContext_ParallelFor(ctx, attend, static_cast<size_t>(c.B * (H / c.group) * c.S), 0, &c);
}

template <typename T>
OrtStatus* attribute(const OrtKernelInfo* info, const char* name, T* value);

template <>
OrtStatus* attribute(const OrtKernelInfo* info, const char* name, int64_t* value) {
  OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, name, value);
  if (st) g_api->ReleaseStatus(st);  // absent: keep the default
  return nullptr;
}

template <>
OrtStatus* attribute(const OrtKernelInfo* info, const char* name, float* value) {
  OrtStatus* st = g_api->KernelInfoGetAttribute_float(info, name, value);
  if (st) g_api->ReleaseStatus(st);
  return nullptr;
}

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  Kernel* kern = new Kernel;
  attribute(info, "num_heads", &kern->a.heads);
  attribute(info, "kv_num_heads", &kern->a.kv_heads);
  attribute(info, "do_rotary", &kern->a.do_rotary);
  attribute(info, "scale", &kern->a.scale);
  attribute(info, "softcap", &kern->a.softcap);
  if (kern->a.heads <= 0 || kern->a.kv_heads <= 0 || kern->a.heads % kern->a.kv_heads) {
    delete kern;
    return fail("RowInvariantAttention: num_heads must be a positive multiple of kv_num_heads");
  }
  kern->k = kernels_for(detect_isa());
  *out = kern;
  return nullptr;
}

struct Op : OrtCustomOp {
  Op(uint32_t api_version) {
    fill_common(this, api_version);
    GetName = [](const OrtCustomOp*) { return "RowInvariantAttention"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 11; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      if (i == 5 || i == 6) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
      if (i == 9) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    };
    GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 3; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t i) {
      bool required = i == 0 || i == 3 || i == 4 || i == 5 || i == 6;
      return required ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
    };
    CreateKernelV2 = create_kernel;
    KernelComputeV2 = compute;
    KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  }
};

}  // namespace

OrtCustomOp* SpecexportMatMulOp(const OrtApi* api, uint32_t version);  // native/row_matmul.cc
OrtCustomOp* SpecexportGatedSiluOp(const OrtApi* api, uint32_t version);  // native/gated_silu.cc
OrtCustomOp* SpecexportGatherRowsOp(const OrtApi* api, uint32_t version);  // native/row_gather.cc

extern "C" {

// The ONNX Runtime entry point, for the library's operators (this one, row_matmul.cc's RowInvariantMatMulNBits,
// gated_silu.cc's GatedSiLU and row_gather.cc's GatherRowsNBits). The newest API this library knows that the
// loading runtime offers is taken (ParallelFor, the oldest call used, came in API 17).
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                const OrtApiBase* base) {
  uint32_t version = ORT_API_VERSION;
  const OrtApi* api = nullptr;
  for (; version >= 17 && !api; --version) api = base->GetApi(version);
  if (!api) return nullptr;  // nothing to report the failure through; the session then lacks the op
  g_api = api;
  static Op op(version + 1);
  static OrtCustomOpDomain* domain = nullptr;
  if (!domain) {
    RETURN_IF(g_api->CreateCustomOpDomain("specexport", &domain));
    RETURN_IF(g_api->CustomOpDomain_Add(domain, &op));
    RETURN_IF(g_api->CustomOpDomain_Add(domain, SpecexportMatMulOp(api, version + 1)));
    RETURN_IF(g_api->CustomOpDomain_Add(domain, SpecexportGatedSiluOp(api, version + 1)));
    RETURN_IF(g_api->CustomOpDomain_Add(domain, SpecexportGatherRowsOp(api, version + 1)));
  }
  return g_api->AddCustomOpDomain(options, domain);
}

// The path the kernels take on this CPU, for `specexport doctor`.
__attribute__((visibility("default"))) const char* SpecexportAttentionIsa() { return isa_name(detect_isa()); }

}  // extern "C"
