// make_cli_model HF_DIR OUT.cmf [QUANT]: converts a Hugging Face checkpoint
// (the austen-tiny Qwen3 in models/) into a .cmf with the native converter
// and the container writer, for the cmfhost run/bench/ppl/logits tests.
// `cmfhost convert` is the user-facing path; this tool only exists so the
// tests do not depend on it.
#include "convert/convert.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <cstdio>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cmf_error *e) {
    if (!e) return;
    std::string m = cmf_error_message(e);
    cmf_error_free(e);
    throw std::runtime_error(m);
}

// A TensorSink over cmf_writer_*: the writer borrows payloads until finish,
// so they are copied (the test model is a few MiB).
struct WriterSink : cmf::convert::TensorSink {
    cmf_runtime *rt;
    std::string path;
    cmf_writer *w = nullptr;
    std::deque<std::vector<uint8_t>> keep;
    WriterSink(cmf_runtime *r, std::string p) : rt(r), path(std::move(p)) {}
    ~WriterSink() override { cmf_writer_free(w); }
    void begin(const std::string &header, uint64_t, uint64_t) override {
        check(cmf_writer_create(rt, path.c_str(), header.data(), header.size(), nullptr, &w));
    }
    void add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, const uint8_t *data,
             uint64_t nbytes) override {
        keep.emplace_back(data, data + nbytes);
        check(cmf_writer_add_tensor(w, name.c_str(), dtype, static_cast<uint32_t>(shape.size()), shape.data(),
                                    keep.back().data(), nbytes));
    }
    void finish(const std::string &vocab) override {
        check(cmf_writer_set_vocab(w, vocab.data(), vocab.size()));
        check(cmf_writer_finish(w));
    }
    void abort() noexcept override {
        cmf_writer_free(w);
        w = nullptr;
    }
};

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: make_cli_model HF_DIR OUT.cmf [QUANT]\n");
        return 2;
    }
    try {
        cmf_runtime *rt = nullptr;
        check(cmf_runtime_create(nullptr, &rt));
        {
            WriterSink sink(rt, argv[2]);
            cmf::convert::ConvertOptions o;
            o.model_dir = argv[1];
            o.quant = argc > 3 ? argv[3] : "f32";
            cmf::convert::convert_checkpoint(*rt, o, sink);
        }
        cmf_runtime_free(rt);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "make_cli_model: %s\n", e.what());
        return 1;
    }
    return 0;
}
