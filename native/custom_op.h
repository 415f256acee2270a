// What the library's operators (native/row_attention.cc, native/row_matmul.cc, native/gated_silu.cc) share: the
// OrtCustomOp fields they set alike, the status macro, reading an input tensor, the CPU check behind their ISA
// choice, the exp of the attention's softmax and the gated MLP's SiLU(gate) * up.
//
// Everything here has internal linkage: each source compiles its own copy with its own intrinsics (the attention
// and matmul sources' come from SIMDe in tools/check_avx512.py's build), so the copies of exp_avx2 must not be
// merged by the linker. Include it after the intrinsics headers.
#pragma once

#include "onnxruntime_c_api.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define RETURN_IF(expr)          \
  do {                           \
    OrtStatus* status_ = (expr); \
    if (status_) return status_; \
  } while (0)

namespace {

// An OrtCustomOp zeroed and given what both operators declare alike: the CPU provider, required outputs in
// default memory, no variadic arity, no in-place or aliased outputs, every opset version. The caller sets the
// name, the inputs and outputs, and the kernel's create, compute and destroy.
inline void fill_common(OrtCustomOp* op, uint32_t api_version) {
  std::memset(op, 0, sizeof(OrtCustomOp));
  op->version = api_version;
  op->GetExecutionProviderType = [](const OrtCustomOp*) { return "CPUExecutionProvider"; };
  op->GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op->GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  op->GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op->GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op->GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op->GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op->GetStartVersion = [](const OrtCustomOp*) { return 1; };
  op->GetEndVersion = [](const OrtCustomOp*) { return 1 << 30; };
  op->GetMayInplace = [](int**, int**) -> size_t { return 0; };
  op->ReleaseMayInplace = [](int*, int*) {};
  op->GetAliasMap = [](int**, int**) -> size_t { return 0; };
  op->ReleaseAliasMap = [](int*, int*) {};
}

// A tensor's dimensions; `api` is the caller's (each source holds the one RegisterCustomOps was given).
inline OrtStatus* shape_of(const OrtApi* api, const OrtValue* value, std::vector<int64_t>* shape) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  RETURN_IF(api->GetTensorTypeAndShape(value, &info));
  size_t rank = 0;
  OrtStatus* st = api->GetDimensionsCount(info, &rank);
  if (!st) {
    shape->resize(rank);
    st = api->GetDimensions(info, shape->data(), rank);
  }
  api->ReleaseTensorTypeAndShapeInfo(info);
  return st;
}

// An input's data, read only: API 21 has no const accessor.
inline OrtStatus* data_of(const OrtApi* api, const OrtValue* value, const void** data) {
  void* mutable_data = nullptr;
  RETURN_IF(api->GetTensorMutableData(const_cast<OrtValue*>(value), &mutable_data));
  *data = mutable_data;
  return nullptr;
}

// The path an environment variable forces ("" when unset), for the tests that compare the paths.
inline std::string forced_isa(const char* variable) {
  const char* forced = std::getenv(variable);
  return forced ? forced : "";
}

inline bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// e^x for x <= 88 (above, the result overflows), 0 below -87: the split x = n ln2 + r and a Cephes-style
// polynomial, with fused multiply-adds where written, so the scalar and AVX2 forms give the same bits.
inline float exp_lane(float x) {
  if (x < -87.0f) return 0.0f;
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  float y = std::fma(p, r * r, r) + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {  // exp_lane on 8 lanes
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 out = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  return _mm256_andnot_ps(under, out);  // the lanes below -87 to 0, as exp_lane returns early
}

// The gated MLP's SiLU(gate) * up, shared by the matmul's gated epilogue and GatedSiLU (native/gated_silu.cc).
// e^x, its range cut to [-87, 88] (below: 0, so silu(g) = g; above would overflow): exp_lane after the upper clamp
inline float exp_clamped(float x) {
  return exp_lane(x < 88.0f ? x : 88.0f);  // as _mm256_min_ps(x, 88): a NaN becomes 88 on both paths
}

inline void silu_mul_portable(const float* g, const float* u, float* out, int64_t n) {  // out = g / (1 + e^-g) * u
  for (int64_t j = 0; j < n; ++j) out[j] = g[j] / (1.0f + exp_clamped(-g[j])) * u[j];
}

__attribute__((target("avx2,fma"))) inline __m256 exp_clamped_avx2(__m256 x) {
  return exp_avx2(_mm256_min_ps(x, _mm256_set1_ps(88.0f)));
}

__attribute__((target("avx2,fma"))) inline void silu_mul_avx2(const float* g, const float* u, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 gv = _mm256_loadu_ps(g + j);
    __m256 e = exp_clamped_avx2(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0f)));  // -g, as the portable path negates
    __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(s, _mm256_loadu_ps(u + j)));
  }
  silu_mul_portable(g + j, u + j, out + j, n - j);  // the same operations on the last columns
}

}  // namespace
