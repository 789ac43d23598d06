// The object behind `cmf_runtime`: the plugins a runtime loaded, the
// components they registered, the host-services table handed to them, and
// the runtime's thread pool.
#pragma once

#include "plugin_host/thread_pool.hpp"

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace boost::dll { class shared_library; }

namespace cmf {

struct PluginRecord {
    std::string path;
    std::string name;
    std::string version;
    std::string message;  // why it was refused
    int32_t status = CMF_PLUGIN_STATUS_REFUSED;
    uint32_t abi_version = 0;
    std::shared_ptr<boost::dll::shared_library> library;
    void *state = nullptr;
    cmf_plugin_fini_fn fini = nullptr;
};

// Each entry holds a zero-padded copy of the plugin's vtable: members the
// plugin's (older) vtable does not have read as NULL.
struct CodecEntry {
    cmf_codec_vt vt{};
    void *ctx = nullptr;
    std::string name, version;
    size_t plugin = 0;
};
struct BackendEntry {
    cmf_backend_vt vt{};
    void *ctx = nullptr;
    std::string name, version, description;
    size_t plugin = 0;
};
struct ArchEntry {
    cmf_arch_vt vt{};
    void *ctx = nullptr;
    std::string name, version, arch_names, hf_model_types;
    size_t plugin = 0;
};

class Runtime {
public:
    explicit Runtime(const cmf_runtime_options &opts);
    ~Runtime();
    Runtime(const Runtime &) = delete;
    Runtime &operator=(const Runtime &) = delete;

    // Scan the configured directories (options, CMF_PLUGIN_PATH, default dir).
    void load_configured_plugins();
    // Load one file. Explicit loads throw cmf::Error(CMF_ERR_PLUGIN) on refusal;
    // scanned loads only record and log it.
    void load_plugin(const std::string &path, bool explicit_request);

    void log(int32_t level, const std::string &message) const;
    ThreadPool &pool() { return pool_; }
    const ThreadPool &pool() const { return pool_; }
    const cmf_host_api *host_api() const { return &host_; }

    // Queries (take the registry lock).
    size_t plugin_count() const;
    bool plugin_info(size_t index, cmf_plugin_info &out) const;  // strings borrowed
    size_t component_count(int32_t kind) const;
    bool component_info(int32_t kind, size_t index, cmf_component_info &out) const;
    const CodecEntry *codec(int32_t dtype_id) const;
    const BackendEntry *backend(const std::string &name) const;  // "" = default (first)
    const ArchEntry *arch_for(const std::string &arch_name) const;
    // The arch that converts checkpoints of this HF config `model_type` (converter).
    const ArchEntry *arch_for_hf_model_type(const std::string &model_type) const;

    // The directory libcmf's default plugins are installed in.
    static std::string default_plugin_dir();
    // The path of the plugin whose code this process runs from inside
    // load_plugin or ~Runtime (static constructors, init, fini), or NULL.
    // Async-signal-safe (cmf_plugin_in_progress).
    static const char *plugin_in_progress() noexcept;

private:
    friend struct RegistrarAccess;
    void refuse(PluginRecord rec, const std::string &why, bool explicit_request);

    ThreadPool pool_;
    cmf_log_fn log_fn_;
    void *log_user_;
    int32_t log_level_;
    std::string plugin_path_;
    uint32_t flags_;
    cmf_host_api host_{};

    mutable std::recursive_mutex mutex_;
    std::vector<PluginRecord> plugins_;
    // deques: entries never move, so pointers handed to plugins stay valid.
    std::deque<CodecEntry> codecs_;
    std::deque<BackendEntry> backends_;
    std::deque<ArchEntry> archs_;
};

}  // namespace cmf

// The opaque handle of the C API is the Runtime itself.
struct cmf_runtime : cmf::Runtime {
    using cmf::Runtime::Runtime;
};
