// Skill tooling (spec §9): grafting a donor checkpoint into a file as a
// skill, cutting a standalone skill file (SKILL_FILE, feature bit 6) out of
// a specialist, and applying one to its base. docs/tasks-and-skills.md
// describes them; the semantics are the original's `skill add/export/apply`
// except that `add` grows the file in place (new bytes appended, old bytes
// never moved; a crash leaves the old or the new file) instead of
// rewriting it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace cmf { class Runtime; }

namespace cmf::convert {

struct SkillAddOptions {
    std::string model;        // the .cmf to grow
    std::string output;       // "" or == model: grow it in place; else a new file
    std::string donor;        // Hugging Face checkpoint dir with the backbone's shapes
    std::string id, name;
    std::string layers = "all";   // "all" | "A-B" | "i,j,k"
    std::string tensors = "ffn";  // "ffn" | "attn" | "all"
    std::string prompts;      // one prompt per line: fits the selection descriptor
    int64_t phi_layer = -1;   // -1: 2/3 of the layers
    uint32_t rank = 2;
    float min_delta = 0;      // relative RMS change below which a tensor stays the backbone's
    std::string skill_quant;  // "" = each backbone tensor's dtype (vbit -> vbit_ro)
    std::string quality;      // text file: backbone and skill perplexity into the record
    uint64_t quality_tokens = 1024;
    std::function<void(const std::string &)> say;  // progress lines
};

// Returns a JSON report: tensors, bytes, layers, skipped, unchanged, selection, quality.
std::string skill_add(Runtime &rt, const SkillAddOptions &opts);

struct SkillExportOptions {
    std::string specialist, base, id, name, output;
};
std::string skill_export(Runtime &rt, const SkillExportOptions &opts);

struct SkillApplyOptions {
    std::string base, skill, output;
    bool force = false;  // a base of another directory hash: a warning instead of an error
};
std::string skill_apply(Runtime &rt, const SkillApplyOptions &opts);

}  // namespace cmf::convert
