// JSON text exactly as the original's W1 writer spells it (docs/container.md):
// serde_json compact output of typed Rust structs. Boost.JSON holds the value
// tree, but its serializer cannot be used for the text: it spells 10000.0 as
// "1E4" and 1e-6 as "1E-6", sorts nothing, and knows nothing of f32 fields,
// while byte identity needs serde's spelling ("10000.0", "1e-6"), struct
// declaration order for typed objects and sorted keys for free-form ones.
#pragma once

#include <boost/json/value.hpp>

#include <string>

namespace cmf::container::json {

// Float spelling of serde_json (shortest round-trip digits; plain when the
// leading digit's decimal exponent is in [-5, 15] for f64 / [-6, 12] for
// f32, integral values keep ".0"; otherwise d[.ddd]e±X). Non-finite: "null".
std::string format_f64(double v);
std::string format_f32(float v);
// A JSON string literal with serde_json's escaping.
void append_string(std::string &out, std::string_view s);

// The header JSON re-emitted in W1 form. Keys the original's typed structs
// do not know are kept (sorted, after the known ones) instead of dropped:
// the original would lose them; we prefer not to lose data, and headers the
// original writes never contain any.
std::string emit_header(const boost::json::value &header);

}  // namespace cmf::container::json

namespace cmf::container::json {
// A mask's "quality" object (the original's key order, f32 value fields).
std::string emit_mask_quality(const boost::json::value &quality);
}  // namespace cmf::container::json
