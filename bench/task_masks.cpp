// task_masks IN OUT SPARSITY...: OUT = IN with one task mask per sparsity
// ("s0", "s50", "s75" for 0 0.5 0.75), written with the container writer,
// for benchmarking task masks (bench/tasks06b.sh). Each mask drops the
// given share of every layer's FFN neurons in whole groups of 32 (the
// sparse index's unit), picked at random per layer (seeded); every head
// and layer stays live. No quality is recorded (the masks are not trained).
#include <cmf/cmf.h>

#include <boost/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cmf_error *e, const char *what) {
    if (e == nullptr) return;
    std::string m = std::string(what) + ": " + cmf_error_message(e);
    cmf_error_free(e);
    throw std::runtime_error(m);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: task_masks IN.cmf OUT.cmf SPARSITY... (e.g. 0 0.5 0.75)\n");
        return 2;
    }
    try {
        cmf_runtime *rt = nullptr;
        check(cmf_runtime_create(nullptr, &rt), "runtime");
        cmf_model *m = nullptr;
        check(cmf_open(rt, argv[1], nullptr, &m), argv[1]);
        cmf_model_info info;
        cmf_model_info_init(&info);
        check(cmf_model_get_info(m, &info), "info");
        boost::json::object header = boost::json::parse(std::string(info.header_json, info.header_json_len)).as_object();
        header.erase("section_hashes");
        const boost::json::object &arch = header.at("arch").as_object();
        const uint64_t layers = arch.at("num_layers").to_number<uint64_t>(),
                       inter = arch.at("intermediate_size").to_number<uint64_t>(),
                       heads = arch.at("num_attention_heads").to_number<uint64_t>();
        const uint64_t loops = arch.contains("num_loops") ? arch.at("num_loops").to_number<uint64_t>() : 1;
        const std::string text = boost::json::serialize(header);
        cmf_writer *w = nullptr;
        check(cmf_writer_create(rt, argv[2], text.data(), text.size(), nullptr, &w), argv[2]);
        for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
            cmf_tensor_info t;
            cmf_tensor_info_init(&t);
            check(cmf_tensor_at(m, i, &t), "tensor");
            check(cmf_writer_add_tensor(w, t.name, t.dtype, t.ndim, t.shape, t.data, t.nbytes), t.name);
        }
        const uint64_t fb = (inter + 7) / 8, hb = (heads + 7) / 8, gb = (layers + 7) / 8, groups = (inter + 31) / 32;
        std::vector<std::string> names;
        for (int a = 3; a < argc; ++a) {
            const double sparsity = std::strtod(argv[a], nullptr);
            if (!(sparsity >= 0 && sparsity < 1)) throw std::runtime_error(std::string("sparsity ") + argv[a] + " not in [0, 1)");
            std::mt19937 rng(uint32_t(1000 * sparsity) + 1);
            std::vector<uint8_t> blob;
            const uint64_t drop = uint64_t(sparsity * double(groups) + 0.5);
            for (uint64_t v = 0; v < layers * loops; ++v) {
                std::vector<uint32_t> order(groups);
                std::iota(order.begin(), order.end(), 0u);
                std::shuffle(order.begin(), order.end(), rng);
                std::vector<uint8_t> row(fb, 0);
                for (uint64_t k = drop; k < groups; ++k)
                    for (uint64_t i = 32 * uint64_t(order[k]); i < std::min(inter, 32 * uint64_t(order[k]) + 32); ++i)
                        row[i / 8] |= uint8_t(1u << (i % 8));
                blob.insert(blob.end(), row.begin(), row.end());
            }
            for (uint64_t l = 0; l < layers; ++l)
                for (uint64_t b = 0; b < hb; ++b) blob.push_back(uint8_t(b + 1 < hb || heads % 8 == 0 ? 0xff : (1u << (heads % 8)) - 1));
            for (uint64_t b = 0; b < gb; ++b) blob.push_back(uint8_t(b + 1 < gb || layers % 8 == 0 ? 0xff : (1u << (layers % 8)) - 1));
            names.push_back("s" + std::to_string(int(sparsity * 100 + 0.5)));
            cmf_mask_spec ms;
            cmf_mask_spec_init(&ms);
            ms.task_id = uint32_t(a - 3);
            ms.name = names.back().c_str();
            ms.sparsity = float(double(drop) / double(groups));
            ms.blob = blob.data();
            ms.blob_len = blob.size();
            check(cmf_writer_add_mask(w, &ms), "mask");
        }
        const void *vocab = nullptr;
        uint64_t vlen = 0;
        if (cmf_model_vocab(m, &vocab, &vlen) == nullptr) check(cmf_writer_set_vocab(w, vocab, vlen), "vocab");
        check(cmf_writer_finish(w), argv[2]);
        cmf_writer_free(w);
        cmf_close(m);
        cmf_runtime_free(rt);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "task_masks: %s\n", e.what());
        return 1;
    }
    return 0;
}
