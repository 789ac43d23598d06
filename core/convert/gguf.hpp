// Reading GGUF files (llama.cpp's model format, versions 2 and 3) and
// dequantizing their tensor types.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64
// metadata count; the metadata key/value pairs; the tensor infos (name,
// u32 n_dims, u64 dims[n_dims] with dims[0] varying fastest, u32 ggml type,
// u64 offset); padding to the alignment (general.alignment, default 32);
// the data section, which every offset is relative to.
//
// The file is memory-mapped read-only and validated whole on open, with the
// container reader's discipline: every count, string length, array length,
// dimension, offset and tensor extent is checked against the bytes that are
// actually there before it is used, so a later read can never leave the
// mapping. Refused with a cmf::Error naming the file and what is wrong:
// another magic, version 1 or > 3 (and big-endian files), a count that
// cannot fit in the file, a string or array running past the end, nested
// arrays, an unknown value or tensor type, a bool other than 0/1, duplicate
// keys or tensor names, a name over 64 bytes, 0 or > 4 dimensions, a zero
// dimension, an element count overflowing 64 bits, a row (dims[0]) that is
// not whole blocks of its type, general.alignment that is not a u32 power
// of two, an offset not aligned, a tensor past the end of the data, and two
// tensors overlapping.
#pragma once

#include "convert/source_tensor.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cmf::container { class MappedFile; }

namespace cmf::convert::gguf {

// ggml tensor type ids (ggml.h's enum ggml_type; stable across versions).
enum GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
    I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// Block geometry of a ggml type: `elems` values are stored in `bytes`.
struct TypeInfo {
    const char *name;
    uint32_t elems, bytes;
    bool decodable;  // dequantize() handles it
};
// nullptr for an id ggml does not define (or no longer uses).
const TypeInfo *type_info(uint32_t type) noexcept;
// "Q4_K", or "type 42" for an unknown id.
std::string type_name(uint32_t type);

// The --quant name of the CMF dtype nearest to a GGUF type, what
// `import-gguf --quant keep` gives its tensors (docs/convert.md):
// F32 f32, F16 f16, BF16 bf16, Q8_0/Q5_*/Q6_K q8, Q4_*/Q3_K/Q2_K q4tp.
std::string nearest_quant(uint32_t type);

// Decode `n` values (a whole number of blocks) of `type` from `src` (may be
// unaligned) into `dst`. Each value is computed as ggml's reference
// dequantize_row_* computes it, operation for operation, so the results are
// bit-identical to llama.cpp's reference dequantization. Throws for a type
// that is not decodable ("unsupported GGUF type IQ2_XXS").
void dequantize(uint32_t type, const uint8_t *src, uint64_t n, float *dst);

// Metadata value types (gguf_type).
enum ValueType : uint32_t {
    U8 = 0, I8v = 1, U16 = 2, I16v = 3, U32 = 4, I32v = 5, F32v = 6, BOOL = 7, STRING = 8, ARRAY = 9,
    U64 = 10, I64v = 11, F64v = 12,
};

struct Value {
    uint32_t type = 0;        // ValueType
    uint32_t elem_type = 0;   // arrays: the element type
    // Scalars: integers in i/u (both set when representable), floats in f,
    // bool in u. Strings in s. Arrays: ints/floats/bools in nums (as
    // doubles; u64/i64 elements also in ints), strings in strs.
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    bool is_signed = false;
    std::string s;
    std::vector<double> nums;
    std::vector<int64_t> ints;
    std::vector<std::string> strs;
    uint64_t count = 0;       // arrays: element count
};

struct TensorInfo {
    std::string name;
    uint32_t type = 0;                // GgmlType
    std::vector<uint64_t> dims;       // ggml order: dims[0] varies fastest
    uint64_t offset = 0;              // into the data section
    uint64_t elements = 0;
    uint64_t nbytes = 0;
    const uint8_t *data = nullptr;    // into the mapping
};

class File : public SourceFile {
public:
    // Maps and validates the whole file. Throws cmf::Error.
    explicit File(const std::string &path);
    // Validates an in-memory image (not copied: must outlive the object).
    File(const uint8_t *bytes, uint64_t size, const std::string &label);
    ~File() override;
    File(const File &) = delete;
    File &operator=(const File &) = delete;

    const std::string &path() const override { return path_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_off_; }
    uint64_t size() const { return size_; }
    const std::map<std::string, Value> &metadata() const { return kv_; }
    // Tensors in file order.
    const std::vector<TensorInfo> &tensors() const { return tensors_; }
    const TensorInfo *find(const std::string &name) const;
    const Value *get(const std::string &key) const;

    // Typed reads of a metadata key; a present key of another type is an
    // error naming it. Integers of any width (and sign, when non-negative)
    // read as u64; any number reads as double.
    std::optional<uint64_t> get_u64(const std::string &key) const;
    std::optional<double> get_f64(const std::string &key) const;
    std::optional<std::string> get_str(const std::string &key) const;
    std::optional<bool> get_bool(const std::string &key) const;

    void release_bytes(const uint8_t *from, const uint8_t *to) const override;

private:
    void parse();
    std::string path_;
    const uint8_t *bytes_ = nullptr;
    uint64_t size_ = 0;
    std::unique_ptr<container::MappedFile> mapped_;  // the file, when opened by path
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_off_ = 0;
    std::map<std::string, Value> kv_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t> by_name_;
};

}  // namespace cmf::convert::gguf
