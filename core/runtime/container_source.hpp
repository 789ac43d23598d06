// A cmf_model_source over an opened container (cmf_model): what
// cmf_session_create_for_model hands to the session, with the file's
// specialisations applied at bind time (docs/tasks-and-skills.md):
//  - a skill: tensor NAME reads skill.ID.NAME when the file has it (the
//    view points at that payload: nothing is copied);
//  - a blend of skills: every tensor a listed skill replaces becomes an
//    owned f32 working tensor, the weighted sum of the skills' tensors (the
//    backbone's where a skill has none);
//  - a task mask and a runtime MoE mask: decoded into the source's
//    cmf_task_mask, which the arch applies when it binds.
// Tensor views point into the model's mapping (or into the source), so the
// model must outlive the source and every session bound through it.
#pragma once

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <memory>
#include <string>

namespace cmf::runtime {

struct SourceSelection {
    std::string task;      // mask name; "" = none
    std::string skill;     // skill id; "" = backbone
    std::string blend;     // "id:w,id:w"; "" = none
    std::string moe_mask;  // CMF_MOE_STATS path; "" = none
    float moe_cover = 0.9f;
};
// The selection a C API options struct names (NULL = "", cover 0 = 0.9).
inline SourceSelection selection_of(const char *task, const char *skill, const char *blend, const char *moe_mask,
                                    float moe_cover) {
    SourceSelection sel;
    sel.task = task ? task : "";
    sel.skill = skill ? skill : "";
    sel.blend = blend ? blend : "";
    sel.moe_mask = moe_mask ? moe_mask : "";
    if (moe_cover != 0) sel.moe_cover = moe_cover;
    return sel;
}

// Immutable after creation; safe to share between sessions. Throws
// cmf::Error: CMF_ERR_NOT_FOUND for an unknown task or skill (the message
// lists what the file has), CMF_ERR_INVALID_ARGUMENT for a selection the
// file cannot take (a task on a file without masks, a skill and a blend
// together), CMF_ERR_UNSUPPORTED for a skill file (bit 6: a partial set of
// tensors, to be applied to its base first).
std::shared_ptr<const cmf_model_source> make_container_source(const cmf_model *m, const SourceSelection &sel = {});

}  // namespace cmf::runtime
