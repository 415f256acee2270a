// specexport.GatedSiLU: a gated MLP's activation, out = silu(gate) * up, where the input's last axis holds
// [gate; up] (each half of it), as one operator instead of ONNX Runtime's Split, QuickGelu (x * sigmoid(x)) and
// Mul: the exporter rewrites that chain behind a float [gate; up] MatMul (exporter/gated_silu.py). A one-token
// decode step runs it once per layer, where three small nodes cost more in dispatch than in arithmetic.
//
// The arithmetic is the matmul's gated epilogue (custom_op.h's silu_mul_*): the same float operations on the
// portable and AVX2 paths and for any number of rows, so a row's output does not depend on the call.
// Input: X float [..., 2 n]. Output: float [..., n]. SPECEXPORT_MATMUL_ISA=portable forces the portable path.

#define ORT_API_MANUAL_INIT
#include "onnxruntime_c_api.h"

#include <immintrin.h>

#include "custom_op.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace {

const OrtApi* g_api = nullptr;
constexpr int64_t kRowsPerItem = 8;  // rows a parallel work item takes

struct Call {
  const float* x;
  float* out;
  int64_t rows, half;
  void (*silu_mul)(const float* g, const float* u, float* out, int64_t n);
};

void run_item(void* data, size_t item) {
  const Call& c = *static_cast<const Call*>(data);
  int64_t first = static_cast<int64_t>(item) * kRowsPerItem, last = std::min(c.rows, first + kRowsPerItem);
  for (int64_t r = first; r < last; ++r)
    c.silu_mul(c.x + r * 2 * c.half, c.x + r * 2 * c.half + c.half, c.out + r * c.half, c.half);
}

struct Kernel {
  bool avx2;
};

OrtStatus* fail(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

OrtStatus* compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel& kern = *static_cast<Kernel*>(op_kernel);
  const OrtValue* value = nullptr;
  RETURN_IF(g_api->KernelContext_GetInput(ctx, 0, &value));
  if (!value) return fail("GatedSiLU: its input is missing");
  std::vector<int64_t> shape;
  RETURN_IF(shape_of(g_api, value, &shape));
  if (shape.empty() || shape.back() % 2) return fail("GatedSiLU: the input's last axis must be even ([gate; up])");
  const void* x = nullptr;
  RETURN_IF(data_of(g_api, value, &x));
  Call c;
  c.half = shape.back() / 2;
  c.rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) c.rows *= shape[i];
  shape.back() = c.half;
  OrtValue* out = nullptr;
  RETURN_IF(g_api->KernelContext_GetOutput(ctx, 0, shape.data(), shape.size(), &out));
  RETURN_IF(g_api->GetTensorMutableData(out, reinterpret_cast<void**>(&c.out)));
  if (c.rows == 0 || c.half == 0) return nullptr;
  c.x = static_cast<const float*>(x);
  c.silu_mul = kern.avx2 ? silu_mul_avx2 : silu_mul_portable;
  if (c.rows <= kRowsPerItem) {  // a decode step's rows: no pool round trip
    run_item(&c, 0);
    return nullptr;
  }
  return g_api->KernelContext_ParallelFor(ctx, run_item, static_cast<size_t>((c.rows + kRowsPerItem - 1) /
                                                                                kRowsPerItem), 0, &c);
}

struct Op : OrtCustomOp {
  explicit Op(uint32_t api_version) {
    fill_common(this, api_version);
    GetName = [](const OrtCustomOp*) { return "GatedSiLU"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
    GetInputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    CreateKernelV2 = [](const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void** out) -> OrtStatus* {
      *out = new Kernel{forced_isa("SPECEXPORT_MATMUL_ISA") != "portable" && cpu_has_avx2_fma()};
      return nullptr;
    };
    KernelComputeV2 = compute;
    KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  }
};

}  // namespace

// The operator for RegisterCustomOps (native/row_attention.cc), which holds the library's one domain.
OrtCustomOp* SpecexportGatedSiluOp(const OrtApi* api, uint32_t version) {
  g_api = api;
  static Op op(version);
  return &op;
}
