#include "runtime/bound_model.hpp"

#include "common/error.hpp"
#include "common/json.hpp"
#include "plugin_host/runtime.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstddef>

namespace cmf::runtime {

std::string arch_name_of(const char *arch_json, size_t len) {
    if (arch_json == nullptr || len == 0) throw Error(CMF_ERR_PARSE, "the model has no arch object");
    simdjson::dom::parser parser;
    simdjson::dom::element root = parse_json(parser, std::string_view(arch_json, len), "arch");
    std::string_view name;
    if (root["arch_name"].get_string().get(name) != simdjson::SUCCESS)
        throw Error(CMF_ERR_PARSE, "arch.arch_name: required string is missing");
    return std::string(name);
}

BoundModel::BoundModel(Runtime &rt, const cmf_model_source &src, const BindConfig &cfg) : src_(src) {
    arch_name_ = arch_name_of(src.arch_json, src.arch_json_len);
    arch_ = rt.arch_for(arch_name_);
    if (arch_ == nullptr)
        throw Error(CMF_ERR_UNSUPPORTED, "no arch plugin runs arch_name \"" + arch_name_ + "\"");
    if (!arch_->vt.model_create || !arch_->vt.model_free || !arch_->vt.model_info || !arch_->vt.state_create ||
        !arch_->vt.state_free || !arch_->vt.state_truncate || !arch_->vt.forward) {
        if (arch_->vt.struct_size >= offsetof(cmf_arch_vt, pipeline_create) + sizeof(void *) && arch_->vt.pipeline_create)
            throw Error(CMF_ERR_UNSUPPORTED, "arch \"" + arch_name_ + "\" is an image pipeline, not a text model: "
                                                 "generate images with cmf_image_pipeline_create and cmf_imagine");
        throw Error(CMF_ERR_UNSUPPORTED, "arch plugin '" + arch_->name + "' cannot run models (converter only)");
    }
    const BackendEntry *be = rt.backend(cfg.backend);
    if (be == nullptr)
        throw Error(CMF_ERR_NOT_FOUND, cfg.backend.empty() ? std::string("no compute backend is loaded")
                                                           : "no backend named \"" + cfg.backend + "\"");
    cmf_arch_model_params params{};
    params.struct_size = sizeof params;
    params.options = cfg.arch_options.empty() ? nullptr : cfg.arch_options.c_str();
    const cmf_backend_vt *be_vt = &be->vt;
    void *be_ctx = be->ctx;
    if (cfg.profile) {
        profile_ = std::make_unique<BackendProfile>(be->vt, be->ctx);
        be_vt = profile_->vt();
        be_ctx = profile_->ctx();
    }
    throw_if_error(arch_->vt.model_create(arch_->ctx, &src_, be_vt, be_ctx, &params, &model_),
                   "arch '" + arch_->name + "'");
    try {
        cmf_arch_model_info info{};
        info.struct_size = sizeof info;
        throw_if_error(arch_->vt.model_info(arch_->ctx, model_, &info));
        vocab_ = info.vocab_size;
        max_context_ = info.max_context;
    } catch (...) {
        arch_->vt.model_free(arch_->ctx, model_);
        throw;
    }
}

BoundModel::~BoundModel() { arch_->vt.model_free(arch_->ctx, model_); }

uint64_t BoundModel::default_n_ctx() const { return max_context_ ? std::min<uint64_t>(max_context_, 4096) : 4096; }

cmf_arch_state *BoundModel::state_create(uint64_t n_ctx) {
    cmf_arch_state *s = nullptr;
    throw_if_error(arch_->vt.state_create(arch_->ctx, model_, n_ctx, &s));
    return s;
}

void BoundModel::state_free(cmf_arch_state *s) {
    if (s != nullptr) arch_->vt.state_free(arch_->ctx, s);
}

void BoundModel::state_truncate(cmf_arch_state *s, uint64_t n_keep) {
    throw_if_error(arch_->vt.state_truncate(arch_->ctx, s, n_keep));
}

void BoundModel::forward(cmf_arch_state *s, const cmf_forward_args &a) {
    if (profile_)
        profile_->set_phase(a.n_tokens > 1 ? BackendProfile::Phase::prefill : BackendProfile::Phase::decode);
    throw_if_error(arch_->vt.forward(arch_->ctx, model_, s, &a));
}

bool BoundModel::has_forward_batch() const { return arch_->vt.forward_batch != nullptr; }

cmf_error *BoundModel::forward_batch(uint32_t n, cmf_arch_state *const *states, const cmf_forward_args *const *args) {
    if (!has_forward_batch()) return make_error(CMF_ERR_UNSUPPORTED, "arch '" + arch_->name + "' has no forward_batch");
    if (profile_) {
        uint64_t tokens = 0;
        for (uint32_t i = 0; i < n; ++i) tokens += args[i]->n_tokens;
        profile_->set_phase(tokens > n ? BackendProfile::Phase::prefill : BackendProfile::Phase::decode);
    }
    return arch_->vt.forward_batch(arch_->ctx, model_, n, states, args);
}

}  // namespace cmf::runtime
