#include "convert/patch.hpp"

#include "common/error.hpp"
#include "container/in_place.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"
#include "container/writer.hpp"
#include "convert/dtype_policy.hpp"
#include "convert/requant.hpp"

#include <boost/json.hpp>

#include <map>
#include <set>

namespace cmf::convert {

void patch_tensors(Runtime &rt, const PatchOptions &opts, const std::vector<PatchValues> &patches) {
    if (patches.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "patch-tensor: nothing to patch (give name=values pairs)");
    std::optional<DtypeChoice> forced;
    if (!opts.dtype.empty()) forced = quant_choice(opts.dtype);
    container::Model m;
    container::Model::open(m, rt, opts.model, 0);

    struct Encoded {
        size_t index;
        int32_t dtype;
        std::vector<uint8_t> bytes;
    };
    std::vector<Encoded> enc;
    std::set<std::string> seen;
    for (const PatchValues &p : patches) {
        if (!seen.insert(p.name).second) throw Error(CMF_ERR_INVALID_ARGUMENT, "patch-tensor: tensor \"" + p.name + "\" is given twice");
        const container::TensorRec *t = m.find(p.name);
        if (!t) throw Error(CMF_ERR_MISSING_TENSOR, opts.model + ": no tensor named \"" + p.name + "\"");
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->ndim; ++d) n *= t->shape[d];
        if (p.count != n)
            throw Error(CMF_ERR_BOUNDS, "tensor \"" + p.name + "\" holds " + std::to_string(n) + " values but " + std::to_string(p.count) + " were given");
        const DtypeChoice c = forced ? *forced : DtypeChoice{t->dtype, ""};
        enc.push_back(Encoded{static_cast<size_t>(t - m.tensors().data()), c.dtype,
                              encode_tensor(rt, t->name, c.dtype, c.options, t->ndim, t->shape, p.values)});
    }

    if (opts.output.empty()) {
        // In place: every payload must fit its slot (checked for all first).
        std::map<uint32_t, std::vector<container::SlotPatch>> by_shard;
        for (Encoded &e : enc) {
            const container::TensorRec &t = m.tensors()[e.index];
            if (e.bytes.size() > t.nbytes)
                throw Error(CMF_ERR_BOUNDS, "tensor \"" + t.name + "\": the " + dtype_name(e.dtype) + " payload of " + std::to_string(e.bytes.size()) +
                                                " bytes does not fit its " + std::to_string(t.nbytes) + "-byte slot; nothing was written: use --output");
            const auto &recs = m.shards()[t.shard].tensors;
            uint64_t rec = 0;
            while (rec < recs.size() && recs[rec].name != t.name) ++rec;
            by_shard[t.shard].push_back(container::SlotPatch{rec, e.dtype, std::move(e.bytes)});
        }
        std::vector<std::string> paths;
        for (auto &[shard, list] : by_shard) paths.push_back(m.shards()[shard].file->path());
        size_t k = 0;
        for (auto &[shard, list] : by_shard) container::rewrite_in_place(paths[k++], list);
        return;
    }

    namespace bj = boost::json;
    bj::error_code ec;
    bj::value header = bj::parse(m.header_text(), ec);
    if (ec || !header.is_object()) throw Error(CMF_ERR_PARSE, opts.model + ": header is not a JSON object");
    header.as_object().erase("section_hashes");
    header.as_object().erase("shard");
    std::optional<std::string> task;
    if (!m.masks().empty()) task = m.default_task();
    container::Writer w(rt, opts.output, container::json::emit_header(header), 0, task);
    std::map<size_t, const Encoded *> by_index;
    for (const Encoded &e : enc) by_index[e.index] = &e;
    for (size_t i = 0; i < m.tensors().size(); ++i) {
        const auto &t = m.tensors()[i];
        auto it = by_index.find(i);
        if (it == by_index.end()) w.add_tensor(t.name, t.dtype, t.ndim, t.shape, m.verified(t), t.nbytes);
        else w.add_tensor(t.name, it->second->dtype, t.ndim, t.shape, it->second->bytes.data(), it->second->bytes.size());
    }
    container::copy_masks_and_vocab(m, w);
    w.finish();
}

}  // namespace cmf::convert
