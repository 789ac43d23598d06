// A cmf_model_source over an opened container (cmf_model): what
// cmf_session_create_for_model hands to the session. Tensor views point into
// the model's mapping, so the model must outlive the source and every
// session bound through it.
#pragma once

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <memory>

namespace cmf::runtime {

// Immutable after creation; safe to share between sessions.
std::shared_ptr<const cmf_model_source> make_container_source(const cmf_model *m);

}  // namespace cmf::runtime
