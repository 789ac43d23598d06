// mix8_4 (5), u8 (6), q4_col (7): ids the format reserves. The original opens
// files holding them with any payload size (u8 carries raw config blobs) but
// cannot decode them; registering them lets such files open and gives a clear
// error when someone tries to use the data as weights.
#include "dtypes/all.hpp"
#include "dtypes/common.hpp"

namespace cmf::codecs {

namespace {

class Reserved final : public Dtype {
public:
    Reserved(int32_t id, const char *name) : id_(id), name_(name) {}
    int32_t id() const override { return id_; }
    const char *name() const override { return name_; }
    uint32_t flags() const override { return CMF_CODEC_RESERVED | CMF_CODEC_VARIABLE_SIZE; }
    uint64_t expected_size(Shape shape) const override {
        elements(shape);
        return CMF_SIZE_VARIABLE;
    }
    void validate(const cmf_tensor_view &) const override {}
    void dequantize_rows(const cmf_tensor_view &, uint64_t, uint64_t, float *) const override {
        fail(CMF_ERR_UNSUPPORTED, "reserved dtype " + std::string(name_) + " (id " + std::to_string(id_) +
                                      ") has no defined decoding");
    }
    // Exposed so that a quantize request gets the "reserved dtype" message, not "no encoder".
    bool can_quantize() const override { return true; }
    void quantize(Shape, const float *, const cmf_quantize_params *, std::vector<uint8_t> &) const override {
        fail(CMF_ERR_UNSUPPORTED, "reserved dtype " + std::string(name_) + " (id " + std::to_string(id_) +
                                      ") has no defined encoding");
    }

private:
    int32_t id_;
    const char *name_;
};

}  // namespace

std::unique_ptr<Dtype> make_reserved(int32_t id) {
    switch (id) {
    case CMF_DTYPE_MIX8_4: return std::make_unique<Reserved>(id, "mix8_4");
    case CMF_DTYPE_U8: return std::make_unique<Reserved>(id, "u8");
    case CMF_DTYPE_Q4_COL: return std::make_unique<Reserved>(id, "q4_col");
    default: fail(CMF_ERR_INTERNAL, "dtype " + std::to_string(id) + " is not reserved");
    }
}

}  // namespace cmf::codecs
