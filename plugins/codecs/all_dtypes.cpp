#include "dtypes/all.hpp"

namespace cmf::codecs {

std::vector<std::unique_ptr<Dtype>> make_all_dtypes() {
    std::vector<std::unique_ptr<Dtype>> v;
    v.push_back(make_f32());
    v.push_back(make_f16());
    v.push_back(make_bf16());
    return v;
}

}  // namespace cmf::codecs
