#include "error.hpp"

#include <cmf/plugin.hpp>

#include <new>
#include <stdexcept>

namespace cmf {

namespace {
// Returned when even allocating an error fails; never freed.
cmf_error g_oom_error{CMF_ERR_OUT_OF_MEMORY, "out of memory"};
}  // namespace

const char *error_code_name(int32_t code) noexcept {
    switch (code) {
    case 0: return "Ok";
    case CMF_ERR_INVALID_ARGUMENT: return "InvalidArgument";
    case CMF_ERR_IO: return "Io";
    case CMF_ERR_FILE_NOT_FOUND: return "FileNotFound";
    case CMF_ERR_INVALID_MAGIC: return "InvalidMagic";
    case CMF_ERR_UNSUPPORTED_VERSION: return "UnsupportedVersion";
    case CMF_ERR_UNSUPPORTED_FEATURE: return "UnsupportedFeature";
    case CMF_ERR_UNKNOWN_DTYPE: return "UnknownDtype";
    case CMF_ERR_MISSING_TENSOR: return "MissingTensor";
    case CMF_ERR_BOUNDS: return "Bounds";
    case CMF_ERR_PARSE: return "Parse";
    case CMF_ERR_HASH_MISMATCH: return "HashMismatch";
    case CMF_ERR_SIGNATURE: return "Signature";
    case CMF_ERR_PLUGIN: return "Plugin";
    case CMF_ERR_UNSUPPORTED: return "Unsupported";
    case CMF_ERR_OUT_OF_MEMORY: return "OutOfMemory";
    case CMF_ERR_CANCELLED: return "Cancelled";
    case CMF_ERR_NOT_FOUND: return "NotFound";
    case CMF_ERR_TEMPLATE: return "Template";
    case CMF_ERR_INTERNAL: return "Internal";
    case CMF_ERR_BUSY: return "Busy";
    default: return "Unknown";
    }
}

cmf_error *make_error(int32_t code, const std::string &message) noexcept {
    try {
        return new cmf_error{code, message};
    } catch (...) {
        return &g_oom_error;
    }
}

bool is_static_error(const cmf_error *e) noexcept { return e == &g_oom_error; }

cmf_error *error_from_current_exception() noexcept {
    try {
        throw;
    } catch (const Error &e) {
        return make_error(e.code(), e.message());
    } catch (const sdk::Error &e) {  // from the header-only helpers libcmf shares with plugins
        return make_error(e.code(), e.what());
    } catch (const std::bad_alloc &) {
        return &g_oom_error;
    } catch (const std::invalid_argument &e) {
        return make_error(CMF_ERR_INVALID_ARGUMENT, e.what());
    } catch (const std::exception &e) {
        return make_error(CMF_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
        return make_error(CMF_ERR_INTERNAL, "internal error: unknown exception");
    }
}

void throw_if_error(cmf_error *e, const std::string &context) {
    if (e == nullptr) return;
    int32_t code = e->code;
    std::string msg = context.empty() ? e->message : context + ": " + e->message;
    if (!is_static_error(e)) delete e;
    throw Error(code, std::move(msg));
}

}  // namespace cmf
