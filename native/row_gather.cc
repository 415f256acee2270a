// specexport.GatherRowsNBits: the rows of a tied table read from the LM head that RowInvariantMatMulNBits
// multiplies by (native/row_matmul.cc's layout), so that a bundle stores the table once: token t's row is the
// LM head's column t, value i being (code - zero point) * scale of its block, the very floats the matmul
// dequantizes (exporter/tied_rows.py writes the node; its PyTorch reference rounds the same way). One multiply of
// an exact small integer per value, no sum: the result has the same bits on every CPU and path.
//
// Inputs: ids int64 [...], B uint8, scales float, zero_points uint8 (the matmul's B, scales and zero points, flat).
// Attributes: K (the row's width), N (rows: the vocabulary), bits (4 or 8), block_size (a multiple of 32 up to
// 256, dividing K), packing (2 at 4 bits: the matmul's int4 layout). Output: float [..., K].

#define ORT_API_MANUAL_INIT
#include "onnxruntime_c_api.h"

#include <immintrin.h>

#include "custom_op.h"

#include <cstdint>
#include <string>
#include <vector>

namespace {

const OrtApi* g_api = nullptr;
constexpr int64_t kTile = 8, kChunk = 32, kMaxBlock = 256, kInt4Packing = 2;  // native/row_matmul.cc's

struct Kernel {
  int64_t K = 0, N = 0, bits = 0, block = 0;
};

OrtStatus* fail(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

// value i of column j in one tile's block of codes (`wb`), as row_matmul.cc's code_at reads it
inline int32_t code_at(const uint8_t* wb, int64_t bits, int64_t j, int64_t i) {
  int64_t chunk = i / kChunk, v = i % kChunk;
  if (bits == 8) return wb[(chunk * kTile + j) * kChunk + v];
  // run p = v / 8 of the chunk: column j's 4 bytes at 4 j, byte m holding value 8 p + m low, 8 p + 4 + m high
  const uint8_t* run = wb + chunk * kTile * kChunk / 2 + (v / 8) * kTile * 4 + j * 4;
  int64_t m = v % 8;
  return m < 4 ? run[m] & 0x0F : run[m - 4] >> 4;
}

OrtStatus* input(OrtKernelContext* ctx, size_t i, const void** data, std::vector<int64_t>* shape) {
  const OrtValue* value = nullptr;
  RETURN_IF(g_api->KernelContext_GetInput(ctx, i, &value));
  if (!value) return fail("GatherRowsNBits: an input is missing");
  RETURN_IF(shape_of(g_api, value, shape));
  return data_of(g_api, value, data);
}

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

OrtStatus* compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel& k = *static_cast<Kernel*>(op_kernel);
  const void *ids_v, *b_v, *s_v, *z_v;
  std::vector<int64_t> ids_shape, b_shape, s_shape, z_shape;
  RETURN_IF(input(ctx, 0, &ids_v, &ids_shape));
  RETURN_IF(input(ctx, 1, &b_v, &b_shape));
  RETURN_IF(input(ctx, 2, &s_v, &s_shape));
  RETURN_IF(input(ctx, 3, &z_v, &z_shape));
  const int64_t blocks = k.K / k.block, tiles = (k.N + kTile - 1) / kTile;
  const int64_t tile_block_bytes = kTile * k.block * k.bits / 8;
  if (count(b_shape) != tiles * blocks * tile_block_bytes || count(s_shape) != tiles * blocks * kTile ||
      count(z_shape) != tiles * blocks * kTile)
    return fail("GatherRowsNBits: B, scales or zero_points do not hold K, N, bits and block_size's tiles");
  std::vector<int64_t> out_shape = ids_shape;
  out_shape.push_back(k.K);
  OrtValue* out = nullptr;
  RETURN_IF(g_api->KernelContext_GetOutput(ctx, 0, out_shape.data(), out_shape.size(), &out));
  float* y = nullptr;
  RETURN_IF(g_api->GetTensorMutableData(out, reinterpret_cast<void**>(&y)));
  const int64_t* ids = static_cast<const int64_t*>(ids_v);
  const uint8_t* b = static_cast<const uint8_t*>(b_v);
  const float* scales = static_cast<const float*>(s_v);
  const uint8_t* zeros = static_cast<const uint8_t*>(z_v);
  const int64_t rows = count(ids_shape);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = ids[r];
    if (id < 0 || id >= k.N) return fail("GatherRowsNBits: token id " + std::to_string(id) + " is outside 0.." +
                                         std::to_string(k.N - 1));
    const int64_t t = id / kTile, j = id % kTile;
    float* row = y + r * k.K;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t at = (t * blocks + blk) * kTile + j;
      const float scale = scales[at], zero = static_cast<float>(zeros[at]);
      const uint8_t* wb = b + (t * blocks + blk) * tile_block_bytes;
      for (int64_t i = 0; i < k.block; ++i)
        row[blk * k.block + i] = (static_cast<float>(code_at(wb, k.bits, j, i)) - zero) * scale;
    }
  }
  return nullptr;
}

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  Kernel kern;
  const char* names[] = {"K", "N", "bits", "block_size"};
  int64_t* fields[] = {&kern.K, &kern.N, &kern.bits, &kern.block};
  for (int i = 0; i < 4; ++i) {
    OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, names[i], fields[i]);
    if (st) {
      g_api->ReleaseStatus(st);
      return fail(std::string("GatherRowsNBits needs the attribute ") + names[i]);
    }
  }
  if (kern.K <= 0 || kern.N <= 0 || (kern.bits != 4 && kern.bits != 8) || kern.block < kChunk ||
      kern.block > kMaxBlock || kern.block % kChunk || kern.K % kern.block)
    return fail("GatherRowsNBits: K and N must be positive, bits 4 or 8, block_size a multiple of 32 up to 256"
                " that divides K");
  int64_t packing = 0;
  OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, "packing", &packing);
  if (st) g_api->ReleaseStatus(st);
  if (kern.bits == 4 && packing != kInt4Packing)
    return fail("GatherRowsNBits: this model's int4 rows are packed in another layout than this library reads;"
                " rebuild the bundle with this specexport");
  *out = new Kernel(kern);
  return nullptr;
}

struct Op : OrtCustomOp {
  explicit Op(uint32_t api_version) {
    fill_common(this, api_version);
    GetName = [](const OrtCustomOp*) { return "GatherRowsNBits"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 4; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
                    : i == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
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
OrtCustomOp* SpecexportGatherRowsOp(const OrtApi* api, uint32_t version) {
  g_api = api;
  static Op op(version);
  return &op;
}
