// safetensors dtype names and sizes, and the bit-exact half-precision conversions.
#include <cctype>
#include <cstring>

#include "io/safetensors.h"
#include "util/error.h"

namespace sr1 {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},     {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},   {DType::U16, "U16", 2},   {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I32, "I32", 4},   {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},   {DType::F64, "F64", 8},   {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d;
  throw Error("invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

uint32_t f32_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

float f32_from_bits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// Rounds `value >> shift` to nearest, ties to even (shift >= 1).
uint32_t shift_rne(uint32_t value, uint32_t shift) {
  uint32_t kept = value >> shift;
  uint32_t rest = value & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1))) ++kept;
  return kept;
}

}  // namespace

const char* dtype_name(DType dtype) { return info(dtype).name; }

size_t dtype_size(DType dtype) { return info(dtype).size; }

DType dtype_from_name(const std::string& name, const std::string& where) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  throw Error(where + ": unknown or unsupported dtype '" + name + "'");
}

bool float_dtype_from_text(const std::string& text, DType* out) {
  std::string t = text;
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "bf16" || t == "bfloat16") {
    *out = DType::BF16;
  } else if (t == "fp16" || t == "float16" || t == "f16") {
    *out = DType::F16;
  } else if (t == "fp32" || t == "float32" || t == "f32") {
    *out = DType::F32;
  } else {
    return false;
  }
  return true;
}

float bf16_to_f32(uint16_t v) { return f32_from_bits(static_cast<uint32_t>(v) << 16); }

uint16_t f32_to_bf16(float v) {
  uint32_t b = f32_bits(v);
  // NaN: keep sign and top payload bits, force the quiet bit so it cannot become inf.
  if ((b & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((b >> 16) | 0x0040);
  // Overflow past the largest bf16 carries into the exponent and gives inf, as it should.
  return static_cast<uint16_t>(shift_rne(b, 16));
}

float f16_to_f32(uint16_t v) {
  uint32_t sign = static_cast<uint32_t>(v & 0x8000) << 16;
  uint32_t exp = (v >> 10) & 0x1F;
  uint32_t mant = v & 0x3FF;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000 | (mant << 13));  // inf, NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);
  // Subnormal: mant * 2^-24, renormalised.
  uint32_t e = 113;
  while ((mant & 0x400) == 0) {
    mant <<= 1;
    --e;
  }
  return f32_from_bits(sign | (e << 23) | ((mant & 0x3FF) << 13));
}

uint16_t f32_to_f16(float v) {
  uint32_t b = f32_bits(v);
  uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  uint32_t x = b & 0x7FFFFFFF;
  if (x > 0x7F800000) return sign | 0x7E00 | ((x >> 13) & 0x3FF);  // NaN, made quiet
  if (x >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds past 65504: inf
  if (x >= 0x38800000) {                      // normal in f16 (>= 2^-14)
    // Re-bias the exponent (127 -> 15) in place, then round off 13 mantissa bits; a carry
    // out of the mantissa correctly bumps the exponent.
    return sign | static_cast<uint16_t>(shift_rne(x - (112u << 23), 13));
  }
  if (x <= 0x33000000) return sign;  // <= 2^-25: rounds to zero (2^-25 is a tie, to even)
  // Subnormal: the value in units of 2^-24 is mant * 2^(exp - 126).
  uint32_t exp = x >> 23;
  uint32_t mant = (x & 0x7FFFFF) | 0x800000;
  return sign | static_cast<uint16_t>(shift_rne(mant, 126 - exp));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace sr1
