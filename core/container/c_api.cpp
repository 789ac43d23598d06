// C entry points of cmf.h's model and container sections: open, tensors,
// model info, masks, index, dequantize. (verify/sign: verify.cpp; writer:
// writer.cpp.)
#include "common/c_api_util.hpp"
#include "container/model.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

using cmf::Error;
using cmf::guard;
using namespace cmf::container;

namespace {
void fill_tensor(const TensorRec &t, cmf_tensor_info *out) {
    cmf_tensor_info info;
    cmf_tensor_info_init(&info);
    info.dtype = t.dtype;
    info.name = t.name.c_str();
    info.ndim = t.ndim;
    info.shard = t.shard;
    std::copy(t.shape, t.shape + CMF_MAX_DIMS, info.shape);
    info.data = t.data;
    info.nbytes = t.nbytes;
    info.hash = t.hash;
    info.offset = t.off;
    cmf::capi::copy_out(out, info);
}
const char *or_null(bool has, const std::string &s) { return has ? s.c_str() : nullptr; }
}  // namespace

extern "C" {

CMF_API void cmf_open_options_init(cmf_open_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API cmf_error *cmf_open(cmf_runtime *rt, const char *path, const cmf_open_options *opts, cmf_model **out) {
    return guard([&] {
        if (!rt || !path || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_open: NULL argument");
        cmf_open_options o = cmf::capi::copy_in(opts, cmf_open_options_init);
        auto m = std::make_unique<cmf_model>();
        Model::open(*m, *rt, path, o.flags);
        *out = m.release();
    });
}

CMF_API void cmf_close(cmf_model *m) { delete m; }

CMF_API void cmf_tensor_info_init(cmf_tensor_info *i) {
    if (!i) return;
    std::memset(i, 0, sizeof *i);
    i->struct_size = sizeof *i;
}

CMF_API size_t cmf_tensor_count(const cmf_model *m) { return m ? m->tensors().size() : 0; }

CMF_API cmf_error *cmf_tensor_at(const cmf_model *m, size_t index, cmf_tensor_info *out) {
    return guard([&] {
        if (!m || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_tensor_at: NULL argument");
        if (index >= m->tensors().size())
            throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor index " + std::to_string(index) + " out of range (" +
                                                      std::to_string(m->tensors().size()) + " tensors)");
        fill_tensor(m->tensors()[index], out);
    });
}

CMF_API cmf_error *cmf_tensor(const cmf_model *m, const char *name, cmf_tensor_info *out) {
    return guard([&] {
        if (!m || !name || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_tensor: NULL argument");
        const TensorRec *t = m->find(name);
        if (!t) throw Error(CMF_ERR_MISSING_TENSOR, std::string("no tensor named '") + name + "'");
        fill_tensor(*t, out);
    });
}

CMF_API cmf_error *cmf_tensor_index(const cmf_model *m, const char *name, size_t *index) {
    return guard([&] {
        if (!m || !name || !index) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_tensor_index: NULL argument");
        const TensorRec *t = m->find(name);
        if (!t) throw Error(CMF_ERR_MISSING_TENSOR, std::string("no tensor named '") + name + "'");
        *index = static_cast<size_t>(t - m->tensors().data());
    });
}

CMF_API void cmf_model_info_init(cmf_model_info *i) {
    if (!i) return;
    std::memset(i, 0, sizeof *i);
    i->struct_size = sizeof *i;
}

CMF_API cmf_error *cmf_model_get_info(const cmf_model *m, cmf_model_info *out) {
    return guard([&] {
        if (!m || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_model_get_info: NULL argument");
        const Shard &s = m->shards()[0];
        const Header &h = s.header;
        cmf_model_info i;
        cmf_model_info_init(&i);
        i.version = s.env.version;
        i.flags = s.env.flags;
        i.required_features = s.env.required_features;
        uint64_t *pairs[kSectionCount][2] = {{&i.header_off, &i.header_len}, {&i.dir_off, &i.dir_len},
                                             {&i.data_off, &i.data_len},     {&i.masks_off, &i.masks_len},
                                             {&i.vocab_off, &i.vocab_len},   {&i.index_off, &i.index_len}};
        for (int k = 0; k < kSectionCount; ++k) {
            *pairs[k][0] = s.env.off[k];
            *pairs[k][1] = s.env.len[k];
        }
        i.header_hash = s.env.header_hash;
        i.dir_hash = s.env.dir_hash;
        i.file_size = s.file->size();
        i.shard_count = uint32_t(m->shards().size());
        i.mask_count = uint32_t(m->masks().size());
        i.tensor_count = m->tensors().size();
        i.header_json = m->header_text().c_str();
        i.header_json_len = m->header_text().size();
        i.format = h.format.c_str();
        i.arch_name = h.arch.arch_name.c_str();
        i.quant_type = h.quant_type.c_str();
        i.arch_json = h.arch_json.c_str();
        i.tokenizer_config_json = h.tokenizer_config_json.c_str();
        i.skills_json = h.skills_json.c_str();
        i.provenance_json = h.provenance_json.c_str();
        i.skill_count = h.skill_count;
        cmf::capi::copy_out(out, i);
    });
}

CMF_API const char *cmf_model_shard_path(const cmf_model *m, uint32_t i) {
    if (!m || i >= m->shards().size()) return nullptr;
    return m->shards()[i].file->path().c_str();
}

CMF_API cmf_error *cmf_model_vocab(const cmf_model *m, const void **data, uint64_t *len) {
    return guard([&] {
        if (!m || !data || !len) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_model_vocab: NULL argument");
        *data = m->has_vocab() ? m->vocab() : nullptr;
        *len = m->vocab_len();
    });
}

CMF_API void cmf_mask_info_init(cmf_mask_info *i) {
    if (!i) return;
    std::memset(i, 0, sizeof *i);
    i->struct_size = sizeof *i;
}
CMF_API size_t cmf_mask_count(const cmf_model *m) { return m ? m->masks().size() : 0; }
CMF_API const char *cmf_mask_default_task(const cmf_model *m) { return m ? m->default_task().c_str() : ""; }

CMF_API cmf_error *cmf_mask_at(const cmf_model *m, size_t index, cmf_mask_info *out) {
    return guard([&] {
        if (!m || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_mask_at: NULL argument");
        if (index >= m->masks().size()) throw Error(CMF_ERR_INVALID_ARGUMENT, "mask index " + std::to_string(index) + " out of range");
        const MaskRec &r = m->masks()[index];
        const MaskLayout &l = m->mask_layout();
        cmf_mask_info i;
        cmf_mask_info_init(&i);
        i.task_id = r.task_id;
        i.name = r.name.c_str();
        i.description = or_null(r.has_description, r.description);
        i.parent = or_null(r.has_parent, r.parent);
        i.priority = r.priority.c_str();
        i.quality_json = or_null(!r.quality_json.empty(), r.quality_json);
        i.sparsity = r.sparsity;
        i.has_hot_pack = r.has_hot_pack;
        i.has_expert_fields = r.has_expert_fields;
        i.blob = r.blob;
        i.blob_len = r.blob_len;
        i.ffn_rows = r.ffn_rows;
        i.ffn_row_bytes = l.ffn_row_bytes;
        i.head_row_bytes = l.head_row_bytes;
        i.gate_bytes = l.gate_bytes;
        i.expert_row_bytes = r.has_expert_fields ? l.expert_row_bytes : 0;
        i.layers = l.physical_layers;
        cmf::capi::copy_out(out, i);
    });
}

CMF_API void cmf_index_entry_init(cmf_index_entry *e) {
    if (!e) return;
    std::memset(e, 0, sizeof *e);
    e->struct_size = sizeof *e;
}
CMF_API size_t cmf_index_entry_count(const cmf_model *m) { return m ? m->index().size() : 0; }

CMF_API cmf_error *cmf_index_entry_at(const cmf_model *m, size_t index, cmf_index_entry *out) {
    return guard([&] {
        if (!m || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_index_entry_at: NULL argument");
        if (index >= m->index().size()) throw Error(CMF_ERR_INVALID_ARGUMENT, "index entry " + std::to_string(index) + " out of range");
        const IndexEntry &r = m->index()[index];
        cmf_index_entry e;
        cmf_index_entry_init(&e);
        e.task_id = r.task_id;
        e.layer = r.layer;
        e.n_groups = uint32_t(r.groups.size());
        e.n_heads = uint32_t(r.heads.size());
        e.groups = r.groups.data();
        e.heads = r.heads.data();
        cmf::capi::copy_out(out, e);
    });
}

CMF_API cmf_error *cmf_tensor_dequantize(const cmf_model *m, size_t index, uint64_t row_begin, uint64_t row_end,
                                         float *dst, uint64_t dst_count) {
    return guard([&] {
        if (!m || (!dst && dst_count)) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_tensor_dequantize: NULL argument");
        m->dequantize(index, row_begin, row_end, dst, dst_count);
    });
}

}  // extern "C"
