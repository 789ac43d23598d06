// A text-to-image pipeline container bound by its arch plugin (the
// cmf_arch_vt pipeline members), and the host's part of generating an
// image: the prompt through the pipeline's text template and the file's
// tokenizer (with its special tokens, truncated), the initial noise, and
// the decoded [0, 1] planes to RGB8.
#pragma once

#include "text/tokenizer.hpp"

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cmf {
class Runtime;
struct ArchEntry;
}  // namespace cmf

namespace cmf::runtime {

// The original's initial noise: n standard-normal floats from SplitMix64
// (state = seed), u = (next >> 11) / 2^53, pairs by Box-Muller in double
// (r = sqrt(-2 ln max(u1, 1e-300)), r cos(2 pi u2) then r sin(2 pi u2)).
std::vector<float> gaussian_noise(uint64_t n, uint64_t seed);

// "{prompt}" in `tmpl` replaced by `text` (every occurrence).
std::string render_template(const std::string &tmpl, const std::string &text);

class ImagePipeline {
public:
    // src must outlive the pipeline (the bound weights view it); vocab is
    // the file's tokenizer.json (empty: CMF_ERR_NOT_FOUND).
    ImagePipeline(Runtime &rt, std::shared_ptr<const cmf_model_source> src, std::string_view vocab,
                  const std::string &backend, const std::string &arch_options);
    ~ImagePipeline();
    ImagePipeline(const ImagePipeline &) = delete;
    ImagePipeline &operator=(const ImagePipeline &) = delete;

    const cmf_image_pipeline_info &info() const { return info_; }
    // The token ids a text becomes (template applied, special tokens, cut
    // at max_text_tokens).
    std::vector<int32_t> tokens(const std::string &tmpl, const std::string &text) const;
    // One image; opts already defaulted. rgb: width*height*3 or NULL.
    void imagine(const cmf_imagine_options &opts, uint8_t *rgb, uint64_t rgb_len);

private:
    Runtime &rt_;
    std::shared_ptr<const cmf_model_source> src_;
    const ArchEntry *arch_ = nullptr;
    cmf_arch_pipeline *pipeline_ = nullptr;
    std::unique_ptr<text::Tokenizer> tokenizer_;
    std::string arch_name_, description_, prompt_template_, negative_template_;
    cmf_image_pipeline_info info_{};
};

}  // namespace cmf::runtime
