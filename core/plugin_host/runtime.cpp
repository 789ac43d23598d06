#include "plugin_host/runtime.hpp"

#include "common/error.hpp"
#include "common/file_mappings.hpp"

#include <boost/dll/shared_library.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <sstream>

#ifndef CMF_PLUGIN_REL_DIR
#error "CMF_PLUGIN_REL_DIR must be set by the build (plugin dir relative to libdir)"
#endif

namespace fs = std::filesystem;

// Staged registrations of one plugin during its init; committed only when
// the whole init succeeds, so a failing plugin leaves nothing behind.
struct cmf_registrar {
    cmf::Runtime *rt = nullptr;
    size_t plugin_index = 0;
    std::vector<cmf::CodecEntry> codecs;
    std::vector<cmf::BackendEntry> backends;
    std::vector<cmf::ArchEntry> archs;
};

namespace cmf {

namespace {

// The smallest vtable a v1 plugin may hand in: everything up to the last
// member that v1 requires.
constexpr size_t kMinCodecVt = offsetof(cmf_codec_vt, dequantize_rows) + sizeof(void *);
constexpr size_t kMinBackendVt = offsetof(cmf_backend_vt, description) + sizeof(void *);
constexpr size_t kMinArchVt = offsetof(cmf_arch_vt, hf_model_types) + sizeof(void *);

template <class Vt>
Vt padded_copy(const Vt *vt) {
    Vt out;
    std::memset(&out, 0, sizeof out);
    std::memcpy(&out, vt, std::min<size_t>(vt->struct_size, sizeof out));
    out.struct_size = sizeof out;
    return out;
}

std::string str_or_empty(const char *s) { return s ? std::string(s) : std::string(); }

// Names and version strings reach logs, `cmfhost plugins` tables and JSON:
// at most 256 bytes of well-formed UTF-8 without control characters. The
// byte is shown escaped so the message itself stays printable.
std::string bad_string(const char *s) {
    const size_t n = std::strlen(s);
    if (n > 256) return "is " + std::to_string(n) + " bytes long (at most 256)";
    for (size_t i = 0; i < n;) {
        const auto c = static_cast<unsigned char>(s[i]);
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n && !(c < 0x20 || c == 0x7f);
        for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (ok && len == 2) ok = c >= 0xC2;  // no overlong forms
        if (ok && len == 3) {
            const auto c1 = static_cast<unsigned char>(s[i + 1]);
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);  // no overlong, no surrogates
        }
        if (ok && len == 4) {
            const auto c1 = static_cast<unsigned char>(s[i + 1]);
            ok = c <= 0xF4 && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
        }
        if (!ok) {
            char b[8];
            std::snprintf(b, sizeof b, "0x%02x", c);
            return std::string("has byte ") + b + " at " + std::to_string(i) +
                   " (must be UTF-8 without control characters)";
        }
        i += len;
    }
    return {};
}

// Optional strings of a vtable: NULL is fine, anything else must be clean.
void check_string(const char *s, const std::string &what) {
    if (s == nullptr) return;
    std::string why = bad_string(s);
    if (!why.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, what + " " + why);
}

void check_vt_header(uint32_t struct_size, uint32_t abi_version, size_t min_size, const char *name,
                     const char *what) {
    if (name == nullptr || *name == '\0')
        throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(what) + " vtable without a name");
    check_string(name, std::string(what) + " name");
    if (struct_size < min_size)
        throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(what) + " '" + name + "': vtable struct_size " +
                                                  std::to_string(struct_size) + " is smaller than the v1 minimum " +
                                                  std::to_string(min_size));
    if (abi_version < CMF_PLUGIN_ABI_MIN || abi_version > CMF_PLUGIN_ABI_VERSION)
        throw Error(CMF_ERR_PLUGIN, std::string(what) + " '" + name + "' speaks plugin ABI " +
                                        std::to_string(abi_version) + "; this host speaks " +
                                        std::to_string(CMF_PLUGIN_ABI_MIN) + ".." +
                                        std::to_string(CMF_PLUGIN_ABI_VERSION));
}

// The plugin whose code runs inside load_plugin or ~Runtime (its static
// constructors at dlopen, init, fini): read by crash handlers through
// cmf_plugin_in_progress(), so only a lock-free pointer.
std::atomic<const char *> g_in_progress{nullptr};
struct InProgress {
    explicit InProgress(const std::string &path) { g_in_progress.store(path.c_str()); }
    ~InProgress() { g_in_progress.store(nullptr); }
    InProgress(const InProgress &) = delete;
    InProgress &operator=(const InProgress &) = delete;
};

// ---- host services --------------------------------------------------------

cmf_error *host_error_create(int32_t code, const char *message) {
    return make_error(code, message ? message : "");
}

void host_error_free(cmf_error *e) {
    if (e && !is_static_error(e)) delete e;
}

void host_log(void *host_ctx, int32_t level, const char *message) {
    static_cast<Runtime *>(host_ctx)->log(level, message ? message : "");
}

void *host_alloc_aligned(size_t size, size_t alignment) {
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    if ((alignment & (alignment - 1)) != 0) return nullptr;
    size = (size + alignment - 1) / alignment * alignment;
    return std::aligned_alloc(alignment, size ? size : alignment);
}

void host_free_aligned(void *p) { std::free(p); }

void host_parallel_for(void *host_ctx, uint64_t begin, uint64_t end, uint64_t grain, cmf_range_fn fn,
                       void *user) {
    static_cast<Runtime *>(host_ctx)->pool().parallel_for(begin, end, grain, fn, user);
}

int32_t host_num_threads(void *host_ctx) { return static_cast<Runtime *>(host_ctx)->pool().threads(); }

cmf_error *host_register_codec(cmf_registrar *reg, const cmf_codec_vt *vt, void *ctx) {
    return guard([&] {
        if (reg == nullptr || vt == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "register_codec: NULL argument");
        check_vt_header(vt->struct_size, vt->abi_version, kMinCodecVt, vt->name, "codec");
        CodecEntry e;
        e.vt = padded_copy(vt);
        e.ctx = ctx;
        e.name = vt->name;
        check_string(vt->version, "codec '" + e.name + "': version");
        e.version = str_or_empty(vt->version);
        e.plugin = reg->plugin_index;
        if (e.vt.dtype_id < 0 || (e.vt.dtype_id > 255 && e.vt.dtype_id < CMF_DTYPE_MEMORY_FIRST) ||
            e.vt.dtype_id > CMF_DTYPE_MEMORY_LAST)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "codec '" + e.name + "': dtype id " + std::to_string(e.vt.dtype_id) +
                                                      " outside 0..255 (file dtypes) and " +
                                                      std::to_string(CMF_DTYPE_MEMORY_FIRST) + ".." +
                                                      std::to_string(CMF_DTYPE_MEMORY_LAST) + " (memory-only dtypes)");
        if (e.vt.expected_size == nullptr || e.vt.dequantize_rows == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT,
                        "codec '" + e.name + "': expected_size and dequantize_rows are required");
        for (const auto &c : reg->codecs)
            if (c.vt.dtype_id == e.vt.dtype_id)
                throw Error(CMF_ERR_INVALID_ARGUMENT, "codec '" + e.name + "': dtype id " +
                                                          std::to_string(e.vt.dtype_id) + " registered twice");
        reg->codecs.push_back(std::move(e));
    });
}

cmf_error *host_register_backend(cmf_registrar *reg, const cmf_backend_vt *vt, void *ctx) {
    return guard([&] {
        if (reg == nullptr || vt == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "register_backend: NULL argument");
        check_vt_header(vt->struct_size, vt->abi_version, kMinBackendVt, vt->name, "backend");
        BackendEntry e;
        e.vt = padded_copy(vt);
        e.ctx = ctx;
        e.name = vt->name;
        check_string(vt->version, "backend '" + e.name + "': version");
        check_string(vt->description, "backend '" + e.name + "': description");
        e.version = str_or_empty(vt->version);
        e.description = str_or_empty(vt->description);
        e.plugin = reg->plugin_index;
        // The operations of plugin ABI 1 are what every arch calls without
        // looking: a backend lacking one is refused here, not crashed on later.
        const std::pair<const char *, bool> ops[] = {
            {"weight_bind", e.vt.weight_bind != nullptr}, {"weight_free", e.vt.weight_free != nullptr}, {"matmul", e.vt.matmul != nullptr},
            {"buffer_alloc", e.vt.buffer_alloc != nullptr}, {"buffer_free", e.vt.buffer_free != nullptr}, {"buffer_write", e.vt.buffer_write != nullptr},
            {"buffer_read", e.vt.buffer_read != nullptr}, {"copy", e.vt.copy != nullptr}, {"rms_norm", e.vt.rms_norm != nullptr}, {"rope", e.vt.rope != nullptr},
            {"attention", e.vt.attention != nullptr}, {"gated_act", e.vt.gated_act != nullptr}, {"add", e.vt.add != nullptr}, {"add_bias", e.vt.add_bias != nullptr},
            {"embed", e.vt.embed != nullptr}};
        std::string missing;
        for (auto [op, present] : ops)
            if (!present) missing += (missing.empty() ? "" : ", ") + std::string(op);
        if (!missing.empty())
            throw Error(CMF_ERR_INVALID_ARGUMENT, "backend '" + e.name + "': required operations are NULL: " + missing);
        reg->backends.push_back(std::move(e));
    });
}

cmf_error *host_register_arch(cmf_registrar *reg, const cmf_arch_vt *vt, void *ctx) {
    return guard([&] {
        if (reg == nullptr || vt == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "register_arch: NULL argument");
        check_vt_header(vt->struct_size, vt->abi_version, kMinArchVt, vt->name, "arch");
        ArchEntry e;
        e.vt = padded_copy(vt);
        e.ctx = ctx;
        e.name = vt->name;
        check_string(vt->version, "arch '" + e.name + "': version");
        check_string(vt->arch_names, "arch '" + e.name + "': arch_names");
        check_string(vt->hf_model_types, "arch '" + e.name + "': hf_model_types");
        e.version = str_or_empty(vt->version);
        e.arch_names = str_or_empty(vt->arch_names);
        e.hf_model_types = str_or_empty(vt->hf_model_types);
        e.plugin = reg->plugin_index;
        if (e.arch_names.empty())
            throw Error(CMF_ERR_INVALID_ARGUMENT, "arch '" + e.name + "': no arch_names");
        reg->archs.push_back(std::move(e));
    });
}

const cmf_codec_vt *host_find_codec(void *host_ctx, int32_t dtype_id, void **codec_ctx) {
    const CodecEntry *e = static_cast<Runtime *>(host_ctx)->codec(dtype_id);
    if (e == nullptr) return nullptr;
    if (codec_ctx) *codec_ctx = e->ctx;
    return &e->vt;
}

bool list_contains(const std::string &csv, const std::string &item) {
    std::stringstream ss(csv);
    std::string tok;
    while (std::getline(ss, tok, ','))
        if (tok == item) return true;
    return false;
}

std::vector<std::string> split_path_list(const std::string &s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, ':'))
        if (!tok.empty()) out.push_back(tok);
    return out;
}

}  // namespace

Runtime::Runtime(const cmf_runtime_options &opts) : pool_(opts.n_threads) {
    log_fn_ = opts.log_fn;
    log_user_ = opts.log_user;
    log_level_ = opts.log_level;
    plugin_path_ = str_or_empty(opts.plugin_path);
    flags_ = opts.flags;

    host_.struct_size = sizeof host_;
    host_.abi_version = CMF_PLUGIN_ABI_VERSION;
    host_.host_ctx = this;
    host_.error_create = host_error_create;
    host_.error_free = host_error_free;
    host_.log = host_log;
    host_.alloc_aligned = host_alloc_aligned;
    host_.free_aligned = host_free_aligned;
    host_.parallel_for = host_parallel_for;
    host_.num_threads = host_num_threads;
    host_.register_codec = host_register_codec;
    host_.register_backend = host_register_backend;
    host_.register_arch = host_register_arch;
    host_.find_codec = host_find_codec;
    host_.release_pages = [](void *, const void *data, uint64_t nbytes) { file_mappings::release_pages(data, nbytes); };
}

Runtime::~Runtime() {
    // Components go first, then each plugin's fini, newest plugin first; the
    // libraries are unloaded last (shared_ptr), after nothing can call them.
    codecs_.clear();
    backends_.clear();
    archs_.clear();
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it)
        if (it->status == CMF_PLUGIN_STATUS_LOADED && it->fini) {
            InProgress busy(it->path);
            it->fini(it->state);
        }
    plugins_.clear();
}

const char *Runtime::plugin_in_progress() noexcept { return g_in_progress.load(); }

void Runtime::log(int32_t level, const std::string &message) const {
    if (level > log_level_) return;
    if (log_fn_) {
        log_fn_(log_user_, level, message.c_str());
        return;
    }
    static const char *names[] = {"error", "warning", "info", "debug"};
    std::fprintf(stderr, "cmf: %s: %s\n", names[std::clamp(level, 0, 3)], message.c_str());
}

std::string Runtime::default_plugin_dir() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&cmf_abi_version), &info) == 0 || info.dli_fname == nullptr) return {};
    std::error_code ec;
    fs::path lib = fs::canonical(info.dli_fname, ec);
    if (ec) return {};
    return (lib.parent_path() / CMF_PLUGIN_REL_DIR).string();
}

void Runtime::load_configured_plugins() {
    std::vector<std::string> entries = split_path_list(plugin_path_);
    if (!(flags_ & CMF_RUNTIME_IGNORE_ENV)) {
        if (const char *env = std::getenv("CMF_PLUGIN_PATH")) {
            auto more = split_path_list(env);
            entries.insert(entries.end(), more.begin(), more.end());
        }
    }
    if (!(flags_ & CMF_RUNTIME_NO_DEFAULT_PLUGINS)) {
        std::string def = default_plugin_dir();
        if (!def.empty()) entries.push_back(def);
    }
    for (const auto &entry : entries) {
        std::error_code ec;
        if (fs::is_regular_file(entry, ec)) {
            load_plugin(entry, false);
            continue;
        }
        if (!fs::is_directory(entry, ec)) {
            log(CMF_LOG_DEBUG, "plugin path entry '" + entry + "' does not exist");
            continue;
        }
        // Only files named cmf-*.so are plugins: a plugin dir may hold other
        // libraries, and loading code is a privilege.
        std::vector<fs::path> files;
        for (const auto &de : fs::directory_iterator(entry, ec)) {
            std::string fname = de.path().filename().string();
            if (fname.rfind("cmf-", 0) == 0 && de.path().extension() == ".so" && de.is_regular_file(ec))
                files.push_back(de.path());
        }
        std::sort(files.begin(), files.end());
        for (const auto &f : files) load_plugin(f.string(), false);
    }
}

void Runtime::refuse(PluginRecord rec, const std::string &why, bool explicit_request) {
    rec.status = CMF_PLUGIN_STATUS_REFUSED;
    rec.message = why;
    rec.library.reset();
    std::string msg = "plugin " + rec.path + " refused: " + why;
    plugins_.push_back(std::move(rec));
    if (explicit_request) throw Error(CMF_ERR_PLUGIN, msg);
    log(CMF_LOG_WARN, msg);
}

void Runtime::load_plugin(const std::string &path_in, bool explicit_request) {
    std::lock_guard lock(mutex_);
    std::error_code ec;
    fs::path abs = fs::absolute(path_in, ec);
    if (ec || !fs::exists(abs, ec))
        throw Error(CMF_ERR_FILE_NOT_FOUND, "plugin file not found: " + path_in);
    fs::path canon = fs::canonical(abs, ec);
    if (!ec) abs = canon;

    // A file of the same name seen earlier in the search order wins: that is
    // how CMF_PLUGIN_PATH overrides an installed plugin.
    for (const auto &p : plugins_) {
        if (p.path == abs.string()) return;
        if (!explicit_request && fs::path(p.path).filename() == abs.filename()) {
            log(CMF_LOG_DEBUG, "plugin " + abs.string() + " shadowed by " + p.path);
            return;
        }
    }

    PluginRecord rec;
    rec.path = abs.string();
    // From dlopen (static constructors) to the end of init or refusal. A
    // refused plugin's library is unloaded before `busy` ends: lib is
    // declared after it.
    const std::string busy_path = rec.path;
    InProgress busy(busy_path);
    auto lib = std::make_shared<boost::dll::shared_library>();
    try {
        // Absolute path (Boost.DLL would prefix "./" to a bare name);
        // rtld_now so an unresolved symbol is found here, not mid-run.
        lib->load(boost::dll::fs::path(rec.path),
                  boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    } catch (const std::exception &e) {
        // Boost wraps dlerror()'s text; keep just that part for the user.
        std::string what = e.what();
        const std::string marker = "dlerror system message: ";
        size_t at = what.find(marker);
        if (at != std::string::npos) {
            what = what.substr(at + marker.size());
            size_t end = what.rfind("):");
            if (end != std::string::npos) what = what.substr(0, end);
        }
        refuse(std::move(rec), "cannot load: " + what, explicit_request);
        return;
    }
    if (!lib->has(CMF_PLUGIN_INIT_SYMBOL)) {
        std::string why = std::string("no entry point ") + CMF_PLUGIN_INIT_SYMBOL;
        for (int v = CMF_PLUGIN_ABI_VERSION + 1; v <= CMF_PLUGIN_ABI_VERSION + 8; ++v)
            if (lib->has("cmf_plugin_init_v" + std::to_string(v))) {
                why += " (it is built for plugin ABI " + std::to_string(v) + "; this host speaks " +
                       std::to_string(CMF_PLUGIN_ABI_MIN) + ".." + std::to_string(CMF_PLUGIN_ABI_VERSION) + ")";
                break;
            }
        refuse(std::move(rec), why, explicit_request);
        return;
    }
    auto init = lib->get<cmf_error *(const cmf_host_api *, uint32_t *, cmf_registrar *, void **)>(
        CMF_PLUGIN_INIT_SYMBOL);
    cmf_plugin_fini_fn fini = nullptr;
    if (lib->has(CMF_PLUGIN_FINI_SYMBOL))
        fini = lib->get<void(void *)>(CMF_PLUGIN_FINI_SYMBOL);

    cmf_registrar reg;
    reg.rt = this;
    reg.plugin_index = plugins_.size();
    uint32_t abi = CMF_PLUGIN_ABI_VERSION;
    void *state = nullptr;
    cmf_error *err = nullptr;
    try {
        err = init(&host_, &abi, &reg, &state);
    } catch (...) {
        err = error_from_current_exception();  // a C++ plugin broke the no-throw rule
    }
    std::string why;
    if (err != nullptr) {
        why = std::string("init failed: ") + err->message;
        if (!is_static_error(err)) delete err;
    } else if (abi > CMF_PLUGIN_ABI_VERSION) {
        why = "it speaks plugin ABI " + std::to_string(abi) + ", newer than this host's " +
              std::to_string(CMF_PLUGIN_ABI_VERSION);
    } else if (abi < CMF_PLUGIN_ABI_MIN) {
        why = "it speaks plugin ABI " + std::to_string(abi) + ", older than this host's minimum " +
              std::to_string(CMF_PLUGIN_ABI_MIN) + " (host speaks " + std::to_string(CMF_PLUGIN_ABI_MIN) + ".." +
              std::to_string(CMF_PLUGIN_ABI_VERSION) + ")";
    } else if (reg.codecs.empty() && reg.backends.empty() && reg.archs.empty()) {
        why = "it registered no component";
    }
    if (!why.empty()) {
        if (err == nullptr && fini) fini(state);
        rec.abi_version = abi;
        refuse(std::move(rec), why, explicit_request);
        return;
    }

    // Commit. A dtype/backend/arch already provided by an earlier plugin
    // keeps its first provider; the later one is logged and skipped.
    for (auto &c : reg.codecs) {
        if (const CodecEntry *prev = codec(c.vt.dtype_id)) {
            log(CMF_LOG_WARN, "plugin " + rec.path + ": dtype " + std::to_string(c.vt.dtype_id) + " ('" + c.name +
                                  "') already provided by " + plugins_[prev->plugin].path + "; ignored");
            continue;
        }
        codecs_.push_back(std::move(c));
    }
    for (auto &b : reg.backends) backends_.push_back(std::move(b));
    for (auto &a : reg.archs) archs_.push_back(std::move(a));

    rec.status = CMF_PLUGIN_STATUS_LOADED;
    rec.abi_version = abi;
    rec.library = std::move(lib);
    rec.state = state;
    rec.fini = fini;
    rec.name = abs.stem().string();
    if (rec.name.rfind("cmf-", 0) == 0) rec.name = rec.name.substr(4);
    plugins_.push_back(std::move(rec));
    log(CMF_LOG_DEBUG, "loaded plugin " + plugins_.back().path);
}

size_t Runtime::plugin_count() const {
    std::lock_guard lock(mutex_);
    return plugins_.size();
}

bool Runtime::plugin_info(size_t index, cmf_plugin_info &out) const {
    std::lock_guard lock(mutex_);
    if (index >= plugins_.size()) return false;
    const PluginRecord &p = plugins_[index];
    out.status = p.status;
    out.path = p.path.c_str();
    out.name = p.name.c_str();
    out.version = p.version.c_str();
    out.abi_version = p.abi_version;
    out.message = p.message.c_str();
    return true;
}

size_t Runtime::component_count(int32_t kind) const {
    std::lock_guard lock(mutex_);
    switch (kind) {
    case CMF_COMPONENT_CODEC: return codecs_.size();
    case CMF_COMPONENT_BACKEND: return backends_.size();
    case CMF_COMPONENT_ARCH: return archs_.size();
    default: return 0;
    }
}

bool Runtime::component_info(int32_t kind, size_t index, cmf_component_info &out) const {
    std::lock_guard lock(mutex_);
    auto fill = [&](const std::string &name, const std::string &version, int32_t dtype, uint32_t abi,
                    const std::string &detail, size_t plugin) {
        out.kind = kind;
        out.name = name.c_str();
        out.version = version.c_str();
        out.dtype_id = dtype;
        out.abi_version = abi;
        out.detail = detail.c_str();
        out.plugin_path = plugins_[plugin].path.c_str();
    };
    static const std::string empty;
    switch (kind) {
    case CMF_COMPONENT_CODEC:
        if (index >= codecs_.size()) return false;
        fill(codecs_[index].name, codecs_[index].version, codecs_[index].vt.dtype_id, codecs_[index].vt.abi_version,
             empty, codecs_[index].plugin);
        return true;
    case CMF_COMPONENT_BACKEND:
        if (index >= backends_.size()) return false;
        fill(backends_[index].name, backends_[index].version, -1, backends_[index].vt.abi_version,
             backends_[index].description, backends_[index].plugin);
        return true;
    case CMF_COMPONENT_ARCH:
        if (index >= archs_.size()) return false;
        fill(archs_[index].name, archs_[index].version, -1, archs_[index].vt.abi_version, archs_[index].arch_names,
             archs_[index].plugin);
        return true;
    default: return false;
    }
}

const CodecEntry *Runtime::codec(int32_t dtype_id) const {
    std::lock_guard lock(mutex_);
    for (const auto &c : codecs_)
        if (c.vt.dtype_id == dtype_id) return &c;
    return nullptr;
}

const BackendEntry *Runtime::backend(const std::string &name) const {
    std::lock_guard lock(mutex_);
    for (const auto &b : backends_)
        if (name.empty() || b.name == name) return &b;
    return nullptr;
}

const ArchEntry *Runtime::arch_for(const std::string &arch_name) const {
    std::lock_guard lock(mutex_);
    for (const auto &a : archs_)
        if (list_contains(a.arch_names, arch_name)) return &a;
    return nullptr;
}

const ArchEntry *Runtime::arch_for_hf_model_type(const std::string &model_type) const {
    std::lock_guard lock(mutex_);
    for (const auto &a : archs_)
        if (list_contains(a.hf_model_types, model_type)) return &a;
    return nullptr;
}

}  // namespace cmf
