// RoPE scaling as Hugging Face computes it (transformers'
// modeling_rope_utils.py: `_compute_*_parameters` and `dynamic_rope_update`),
// in one place for both sides of an arch plugin: the converter hook reads a
// config's `rope_scaling` / `rope_parameters`, refuses what is not
// implemented and records the rest in the arch block; the forward pass reads
// the record back and rotates with the frequencies computed here (backend
// operation rope_freqs). Static code linked into the arch plugins.
//
// Types: default (and "mrope", which is default RoPE for text: its three
// position axes are equal), linear, dynamic (NTK), yarn, llama3. longrope
// (Phi-3) and anything else are refused naming the type.
//
// Arithmetic follows HF's dtypes step by step (f32 tensors, Python doubles
// for scalars) so the tables match a PyTorch run to the last bit or two.
#pragma once

#include <cmf/json_read.hpp>
#include <cmf/json_writer.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cmf::archs::rope {

enum class Type { Default, Linear, Dynamic, Yarn, Llama3 };

const char *type_name(Type t);

struct Scaling {
    Type type = Type::Default;
    double factor = 1.0;
    // yarn: the pre-training window of the correction range; llama3: its
    // old_context_len. 0 = not given (yarn then uses max_position_embeddings).
    uint64_t original_max_position_embeddings = 0;
    // The config's max_position_embeddings (dynamic: the window past which
    // the base grows; yarn: the factor when none is given).
    uint64_t max_position_embeddings = 0;
    std::optional<double> attention_factor, mscale, mscale_all_dim;  // yarn
    double beta_fast = 32.0, beta_slow = 1.0;                        // yarn
    bool truncate = true;                                            // yarn
    double low_freq_factor = 0, high_freq_factor = 0;                // llama3

    bool scaled() const { return type != Type::Default; }
};

// A HF `rope_scaling` / `rope_parameters` object (`o`, errors name its file
// and path). `max_position_embeddings` is the config's. Refuses (Unsupported)
// a type that is not implemented and (Parse) values HF's formulas cannot
// use, naming the key and the value.
Scaling from_hf(const json::Object &o, uint64_t max_position_embeddings);

// Checks that `s` gives usable frequencies for `theta` and `rot_dim`
// (e.g. dynamic needs rot_dim > 2, yarn a base > 1); `where` starts the
// message.
void check(const Scaling &s, double theta, uint32_t rot_dim, const std::string &where);

// The arch block's `rope_scaling` object: written by the converter, read by
// the forward pass.
void write_arch(json::Writer &w, const Scaling &s);
Scaling from_arch(const json::Object &o);
// The `yarn` object the original converter writes (its attention_factor
// always given).
Scaling from_original_yarn(const json::Object &o, uint64_t max_position_embeddings);

// inv_freq [rot_dim / 2] and the factor cos and sin are multiplied by.
struct Freqs {
    std::vector<float> inv_freq;
    float attention_factor = 1.0f;
};

// The frequencies HF computes when the model is built (and dynamic's reset).
Freqs initial(const Scaling &s, double theta, uint32_t rot_dim);

// HF's dynamic_rope_update for one model state: before each forward call
// over positions [pos, pos + n), update(pos + n) gives the table that call
// rotates its queries and new keys with. Keys already in the cache keep the
// rotation they were stored with (HF caches rotated keys).
class Dynamic {
public:
    Dynamic(const Scaling &s, double theta, uint32_t rot_dim);
    const Freqs &update(uint64_t seq_len);
    const Freqs &current() const { return cur_; }

private:
    Scaling s_;
    double theta_;
    uint32_t rot_dim_;
    uint64_t max_seq_len_cached_;
    Freqs original_, cur_;
};

}  // namespace cmf::archs::rope
