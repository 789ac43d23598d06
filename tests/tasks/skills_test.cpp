// Skills on real files (austen-tiny converted; donors are its checkpoint
// with the FFN weights perturbed, written here as safetensors):
//  - skill add grows the file in place (the bytes before the old end never
//    change but for the envelope) and --skill runs exactly the donor's
//    tensors: the same logits as a file whose backbone holds them;
//  - a blend runs the weighted sum of the skills' tensors;
//  - route sends each skill's own prompts to it;
//  - a crash at any point of skill add leaves the old file or the new one;
//  - re-adding an id replaces it, compact drops the dead bytes;
//  - export cuts a skill file (bit 6) that does not run alone, and apply
//    rebuilds the specialist on its base (refusing another base unless forced).
#include <doctest/doctest.h>
#include "support/test_runtime.hpp"
#include "task_files.hpp"

#include "container/writer.hpp"
#include "convert/safetensors.hpp"
#include "runtime/routing.hpp"

#include <cmf/cmf.h>

#include <boost/json.hpp>

#include <cstring>
#include <fstream>
#include <random>
#include <set>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace tasks_test;

namespace {

const std::string kAusten = std::string(CMF_SOURCE_ROOT) + "/models/austen-tiny";

// A donor checkpoint: austen-tiny's with every FFN weight moved by
// `scale` x its std of Gaussian noise (seeded), the rest as it is.
std::string donor(const std::string &name, float scale, uint32_t seed) {
    const std::string dir = kWork + "/donor-" + name;
    if (fs::exists(dir + "/model.safetensors")) return dir;
    fs::create_directories(dir);
    fs::copy_file(kAusten + "/config.json", dir + "/config.json", fs::copy_options::overwrite_existing);
    cmf::convert::Checkpoint ck(kAusten);
    bj::object header;
    std::vector<std::vector<float>> data;
    uint64_t off = 0;
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    for (const auto *t : ck.tensors()) {
        std::vector<float> v(t->elements);
        cmf::convert::read_f32(*t, 0, t->elements, v.data());
        if (t->name.find(".mlp.") != std::string::npos) {
            double sq = 0;
            for (float x : v) sq += double(x) * x;
            const float sd = float(std::sqrt(sq / double(v.size())));
            for (float &x : v) x += scale * sd * gauss(rng);
        }
        bj::array shape;
        for (uint64_t d : t->shape) shape.push_back(d);
        header[t->name] = bj::object{{"dtype", "F32"}, {"shape", shape}, {"data_offsets", bj::array{off, off + 4 * v.size()}}};
        off += 4 * v.size();
        data.push_back(std::move(v));
    }
    std::string h = bj::serialize(header);
    h.resize((h.size() + 7) / 8 * 8, ' ');
    std::ofstream f(dir + "/model.safetensors", std::ios::binary);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char *>(&n), 8);
    f.write(h.data(), std::streamsize(h.size()));
    for (const auto &v : data) f.write(reinterpret_cast<const char *>(v.data()), std::streamsize(4 * v.size()));
    return dir;
}

std::string lines_file(const std::string &name, const std::vector<std::string> &lines) {
    const std::string p = kWork + "/" + name;
    std::ofstream f(p);
    for (const auto &l : lines) f << l << "\n";
    return p;
}

const std::vector<std::string> kProse = {"It is a truth universally acknowledged, that a single man",
                                         "Mr. Darcy walked into the room and bowed to Elizabeth",
                                         "Her sister laughed and said that she would dance"};
const std::vector<std::string> kSea = {"The ship sailed across the grey sea at dawn",
                                       "The captain shouted to the crew to lower the boats",
                                       "Waves crashed against the deck of the old vessel"};

std::string add(cmf_runtime *rt, const std::string &model, const std::string &from, const char *id, const char *tensors,
                const char *layers, const std::string &prompts, float min_delta = 0) {
    cmf_skill_add_options o;
    cmf_skill_add_options_init(&o);
    o.model = model.c_str();
    o.donor_dir = from.c_str();
    o.id = id;
    o.tensors = tensors;
    o.layers = layers;
    o.prompts_file = prompts.empty() ? nullptr : prompts.c_str();
    o.min_delta = min_delta;
    char *report = nullptr;
    cmf_error *e = cmf_skill_add(rt, &o, &report);
    REQUIRE_MESSAGE(e == nullptr, take(e));
    std::string r = report;
    cmf_string_free(report);
    return r;
}

std::vector<uint8_t> bytes_of(const std::string &p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string verify(cmf_runtime *rt, const std::string &path) {
    Model m = open(rt, path);
    cmf_verify_options vo;
    cmf_verify_options_init(&vo);
    vo.flags = CMF_VERIFY_SKIP_SIGNATURE;
    cmf_verify_report *r = nullptr;
    OK(cmf_verify(m.get(), &vo, &r));
    std::string out;
    for (size_t i = 0; i < cmf_verify_problem_count(r); ++i) out += std::string(cmf_verify_problem(r, i)) + "\n";
    cmf_verify_report_free(r);
    return out;
}

std::set<std::string> names_of(const cmf_model *m) {
    std::set<std::string> s;
    for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor_at(m, i, &t));
        s.insert(t.name);
    }
    return s;
}

// The file whose backbone tensors are the skill's (the specialist), with
// no skills of its own.
void write_specialist(cmf_runtime *rt, const cmf_model *m, const std::string &id, const std::string &out) {
    Variant v;
    v.drop_skills = true;
    for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor_at(m, i, &t));
        const std::string n = t.name, pre = "skill." + id + ".";
        if (n.compare(0, pre.size(), pre) == 0)
            v.replace[n.substr(pre.size())] = std::vector<uint8_t>(static_cast<const uint8_t *>(t.data),
                                                                   static_cast<const uint8_t *>(t.data) + t.nbytes);
    }
    // Same dtypes as the backbone (skill add encodes in them): payloads swap 1:1.
    write_variant(rt, m, out, v);
}

// Runs `body` in a child that SIGKILLs itself at the writer's hook `point`.
void kill_at(const char *point, const std::function<void()> &body) {
    fflush(nullptr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        static const char *target;
        target = point;
        cmf::container::write_crash_hook = [](const char *p) {
            if (std::strcmp(p, target) == 0) ::raise(SIGKILL);
        };
        body();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
}

}  // namespace

TEST_CASE("skills: add grows the file in place and --skill runs the donor's tensors") {
    TestRuntime trt(CMF_LOG_ERROR);
    const std::string path = kWork + "/skills.cmf";
    fs::copy_file(converted(trt.rt, "q8"), path, fs::copy_options::overwrite_existing);
    const std::vector<uint8_t> before = bytes_of(path);
    const std::string report = add(trt.rt, path, donor("prose", 0.6f, 1), "prose", "ffn", "all", lines_file("prose.txt", kProse));
    const std::vector<uint8_t> after = bytes_of(path);
    // In place: everything past the envelope up to the old end is as it was.
    REQUIRE(after.size() > before.size());
    CHECK(std::equal(before.begin() + 128, before.end(), after.begin() + 128));
    CHECK(verify(trt.rt, path) == "");
    Model m = open(trt.rt, path);
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(m.get(), &info));
    bj::array skills = bj::parse(info.skills_json).as_array();
    REQUIRE(skills.size() == 1);
    const bj::object &rec = skills[0].as_object();
    CHECK(rec.at("id") == "prose");
    CHECK(bj::serialize(rec.at("layers")) == "[0,1,2,3]");
    CHECK(rec.at("selection").as_object().at("rank").to_number<int>() == 2);
    CHECK(rec.at("selection").as_object().at("phi_layer").to_number<int>() == 2);
    const auto names = names_of(m.get());
    CHECK(names.count("skill.prose.model.layers.3.mlp.down_proj.weight") == 1);
    CHECK(names.count("skill.prose.model.layers.0.self_attn.q_proj.weight") == 0);
    // --skill = the backbone holding the skill's tensors, bit for bit.
    const std::string spec = kWork + "/prose-specialist.cmf";
    write_specialist(trt.rt, m.get(), "prose", spec);
    Model sm = open(trt.rt, spec);
    const auto got = logits_all(trt.rt, m.get(), prompt(), Pick{nullptr, "prose"});
    const auto want = logits_all(trt.rt, sm.get(), prompt(), Pick{});
    CHECK(got == want);
    CHECK(max_rel_diff(logits_all(trt.rt, m.get(), prompt(), Pick{}), want) > 0.05);  // the skill matters
    std::string err;
    logits_all(trt.rt, m.get(), prompt(), Pick{nullptr, "poetry"}, &err);
    CHECK(err.find("NotFound: skill 'poetry' is not in the file (its skills: prose)") == 0);
}

TEST_CASE("skills: route, blends, replacing an id, compaction") {
    TestRuntime trt(CMF_LOG_ERROR);
    const std::string path = kWork + "/two-skills.cmf";
    fs::copy_file(converted(trt.rt, "q8"), path, fs::copy_options::overwrite_existing);
    add(trt.rt, path, donor("prose", 0.6f, 1), "prose", "ffn", "all", lines_file("prose.txt", kProse));
    add(trt.rt, path, donor("sea", 0.6f, 2), "sea", "ffn", "1-3", lines_file("sea.txt", kSea));
    Model m = open(trt.rt, path);
    // Each skill's own prompts route to it.
    cmf_tokenizer *tok = nullptr;
    OK(cmf_model_tokenizer(m.get(), &tok));
    for (const auto &[id, prompts] : {std::pair{"prose", &kProse}, std::pair{"sea", &kSea}})
        for (const auto &p : *prompts) {
            CAPTURE(p);
            int32_t *ids = nullptr;
            size_t n = 0;
            OK(cmf_tokenizer_encode(tok, p.data(), p.size(), 0, &ids, &n));
            cmf_route *r = nullptr;
            OK(cmf_route_prompt(trt.rt, m.get(), ids, n, nullptr, &r));
            cmf_ids_free(ids);
            cmf_route_score s;
            cmf_route_score_init(&s);
            OK(cmf_route_score_at(r, 0, &s));
            CHECK(std::string(s.id) == id);
            cmf_route_free(r);
        }
    cmf_tokenizer_free(tok);
    // A blend: the f32 weighted sum of each skill's tensor (the backbone's
    // where a skill has none: layer 0 of "sea").
    Variant bv;
    for (size_t i = 0; i < cmf_tensor_count(m.get()); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor_at(m.get(), i, &t));
        const std::string n = t.name;
        if (n.find(".mlp.") == std::string::npos || n.compare(0, 6, "skill.") == 0) continue;
        auto deq = [&](const std::string &name) {
            cmf_tensor_info s;
            cmf_tensor_info_init(&s);
            size_t idx = 0;
            for (; idx < cmf_tensor_count(m.get()); ++idx) {
                OK(cmf_tensor_at(m.get(), idx, &s));
                if (name == s.name) break;
            }
            std::vector<float> v(s.shape[0] * s.shape[1]);
            OK(cmf_tensor_dequantize(m.get(), idx, 0, s.shape[0], v.data(), v.size()));
            return v;
        };
        const std::string sp = "skill.prose." + n, ss = "skill.sea." + n;
        const auto a = deq(sp), b = deq(names_of(m.get()).count(ss) ? ss : n);
        std::vector<uint8_t> out(4 * a.size());
        for (size_t k = 0; k < a.size(); ++k) {
            const float w = 0.75f * a[k] + 0.25f * b[k];
            std::memcpy(out.data() + 4 * k, &w, 4);
        }
        bv.replace[n] = std::move(out);
        bv.retype[n] = CMF_DTYPE_F32;
    }
    const std::string blended = kWork + "/blended.cmf";
    write_variant(trt.rt, m.get(), blended, bv);
    Model bm = open(trt.rt, blended);
    CHECK(max_rel_diff(logits_all(trt.rt, m.get(), prompt(), Pick{nullptr, nullptr, "prose:3,sea:1"}),
                       logits_all(trt.rt, bm.get(), prompt(), Pick{})) < 1e-5);
    // Re-adding an id replaces its tensors and record; the old bytes are
    // dead until compaction, which keeps every live tensor as it is.
    // The donor's attention is the backbone's (q8 rounding apart): below
    // --min-delta it stays the backbone's, its FFN (moved by 0.6 std) is added.
    const bj::object rep = bj::parse(add(trt.rt, path, donor("sea", 0.6f, 2), "sea", "all", "2", "", 0.05f)).as_object();
    CHECK(rep.at("tensors").to_number<int>() == 3);
    CHECK(rep.at("unchanged").as_array().size() == 4);
    Model m2 = open(trt.rt, path);
    const auto names = names_of(m2.get());
    CHECK(names.count("skill.sea.model.layers.1.mlp.up_proj.weight") == 0);
    CHECK(names.count("skill.sea.model.layers.2.mlp.up_proj.weight") == 1);
    CHECK(names.count("skill.sea.model.layers.2.self_attn.k_proj.weight") == 0);
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(m2.get(), &info));
    CHECK(bj::parse(info.skills_json).as_array().size() == 2);
    const std::string compacted = kWork + "/two-skills-compact.cmf";
    OK(cmf_compact(trt.rt, path.c_str(), compacted.c_str()));
    CHECK(fs::file_size(compacted) < fs::file_size(path));
    CHECK(verify(trt.rt, compacted) == "");
    Model cm = open(trt.rt, compacted);
    CHECK(names_of(cm.get()) == names);
    CHECK(logits_all(trt.rt, cm.get(), prompt(), Pick{nullptr, "prose"}) ==
          logits_all(trt.rt, m2.get(), prompt(), Pick{nullptr, "prose"}));
}

TEST_CASE("skills: a crash at any point of skill add leaves the old file or the new one") {
    TestRuntime trt(CMF_LOG_ERROR);
    const std::string path = kWork + "/crash.cmf";
    const std::string from = donor("prose", 0.6f, 1), prompts = lines_file("prose.txt", kProse);
    for (const char *point : {"payload", "before-envelope"}) {
        CAPTURE(point);
        fs::copy_file(converted(trt.rt, "q8"), path, fs::copy_options::overwrite_existing);
        const std::vector<uint8_t> before = bytes_of(path);
        kill_at(point, [&] { add(trt.rt, path, from, "prose", "ffn", "all", prompts); });
        // The old file, whole (a tail of appended bytes past its end changes nothing).
        const std::vector<uint8_t> after = bytes_of(path);
        REQUIRE(after.size() >= before.size());
        CHECK(std::equal(before.begin(), before.end(), after.begin()));
        CHECK(verify(trt.rt, path) == "");
        Model m = open(trt.rt, path);
        CHECK(names_of(m.get()).count("skill.prose.model.layers.0.mlp.gate_proj.weight") == 0);
    }
    // Killed in the second append (the quality record): the first one stands.
    fs::copy_file(converted(trt.rt, "q8"), path, fs::copy_options::overwrite_existing);
    const std::string quality = std::string(CMF_SOURCE_ROOT) + "/models/austen-tiny/heldout.txt";
    fs::remove(kWork + "/crash-marker");
    kill_at("before-envelope", [&] {
        cmf::container::write_crash_hook = [](const char *p) {
            // Let the first append finish; die before the second's envelope.
            static int envelopes = 0;
            if (std::strcmp(p, "before-envelope") == 0 && ++envelopes == 2) ::raise(SIGKILL);
        };
        cmf_skill_add_options o;
        cmf_skill_add_options_init(&o);
        o.model = path.c_str();
        o.donor_dir = from.c_str();
        o.id = "prose";
        o.quality_file = quality.c_str();
        o.quality_tokens = 64;
        cmf_error *e = cmf_skill_add(trt.rt, &o, nullptr);
        cmf_error_free(e);
    });
    CHECK(verify(trt.rt, path) == "");
    Model m = open(trt.rt, path);
    CHECK(names_of(m.get()).count("skill.prose.model.layers.0.mlp.gate_proj.weight") == 1);
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(m.get(), &info));
    CHECK(!bj::parse(info.skills_json).as_array()[0].as_object().contains("quality"));
}

TEST_CASE("skills: export cuts a skill file, apply rebuilds the specialist on its base") {
    TestRuntime trt(CMF_LOG_ERROR);
    const std::string base = converted(trt.rt, "q8");
    const std::string grown = kWork + "/export-src.cmf";
    fs::copy_file(base, grown, fs::copy_options::overwrite_existing);
    add(trt.rt, grown, donor("prose", 0.6f, 1), "prose", "ffn", "1-2", "");
    Model gm = open(trt.rt, grown);
    const std::string spec = kWork + "/export-specialist.cmf", skill = kWork + "/prose.skill.cmf",
                      applied = kWork + "/applied.cmf";
    write_specialist(trt.rt, gm.get(), "prose", spec);
    char *rep = nullptr;
    OK(cmf_skill_export(trt.rt, spec.c_str(), base.c_str(), "prose", "Austen prose", skill.c_str(), &rep));
    cmf_string_free(rep);
    Model sk = open(trt.rt, skill);
    cmf_model_info si;
    cmf_model_info_init(&si);
    OK(cmf_model_get_info(sk.get(), &si));
    CHECK((si.required_features & CMF_FEATURE_SKILL_FILE) != 0);
    CHECK(si.vocab_len == 0);
    CHECK(cmf_tensor_count(sk.get()) == 6);  // gate/up/down of layers 1 and 2
    const bj::object rec = bj::parse(si.skills_json).as_array()[0].as_object();
    Model bm = open(trt.rt, base);
    cmf_model_info bi;
    cmf_model_info_init(&bi);
    OK(cmf_model_get_info(bm.get(), &bi));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(bi.dir_hash));
    CHECK(rec.at("base_dir_hash") == hex);
    CHECK(rec.at("task") == "general");
    CHECK(bj::serialize(rec.at("layers")) == "[1,2]");
    CHECK(bj::serialize(rec.at("provenance")) == R"({"cut_from":"export-specialist.cmf","tensors":6})");
    // A skill file does not run alone.
    std::string err;
    logits_all(trt.rt, sk.get(), prompt(), Pick{}, &err);
    CHECK(err.find("Unsupported: this is a skill file") == 0);
    // Applied to its base: the specialist's tensors, byte for byte.
    OK(cmf_skill_apply(trt.rt, base.c_str(), skill.c_str(), applied.c_str(), 0, nullptr));
    Model am = open(trt.rt, applied), spm = open(trt.rt, spec);
    for (size_t i = 0; i < cmf_tensor_count(spm.get()); ++i) {
        cmf_tensor_info a, b;
        cmf_tensor_info_init(&a);
        cmf_tensor_info_init(&b);
        OK(cmf_tensor_at(spm.get(), i, &a));
        OK(cmf_tensor(am.get(), a.name, &b));
        CHECK(a.hash == b.hash);
    }
    cmf_model_info ai;
    cmf_model_info_init(&ai);
    OK(cmf_model_get_info(am.get(), &ai));
    CHECK((ai.required_features & CMF_FEATURE_SKILL_FILE) == 0);
    CHECK(!bj::parse(ai.skills_json).as_array()[0].as_object().contains("base_dir_hash"));
    CHECK(logits_all(trt.rt, am.get(), prompt(), Pick{}) == logits_all(trt.rt, spm.get(), prompt(), Pick{}));
    // Another base: refused, unless forced.
    const std::string other = converted(trt.rt, "f32");
    err = take(cmf_skill_apply(trt.rt, other.c_str(), skill.c_str(), applied.c_str(), 0, nullptr));
    CHECK(err.find("InvalidArgument: this skill was cut against another base") == 0);
    OK(cmf_skill_apply(trt.rt, other.c_str(), skill.c_str(), applied.c_str(), 1, nullptr));
}

TEST_CASE("skills: the routing decision as the original computes it") {
    using cmf::runtime::ErrorRow;
    // Uncalibrated: sorted by e, E = e / |phi|^2, novel when E_min > tau.
    std::vector<ErrorRow> rows = {{"b", 6.0f, {}, {}, 10.0f}, {"a", 2.0f, {}, {}, 10.0f}};
    auto r = cmf::runtime::decide(rows, std::nullopt, 0.3f);
    REQUIRE(r.scores.size() == 2);
    CHECK(r.scores[0].id == "a");
    CHECK(r.scores[0].error == doctest::Approx(0.2));
    CHECK(!r.is_novel);
    CHECK(cmf::runtime::decide(rows, std::nullopt, 0.1f).is_novel);
    // Calibrated: p = softmax(-e/T), margin 1/(1+e0) - 1/(1+e1), novelty
    // 0.5 sigmoid((e0 - mean)/std) + 0.25/(1 + 8 margin) + 0.25 (1 - p0).
    cmf::runtime::RoutingCalibration c;
    c.temperature = 2.0f;
    c.novelty_theta = 0.5f;
    rows[1].err_mean = 1.0f;
    rows[1].err_std = 2.0f;
    r = cmf::runtime::decide(rows, c, 0.3f);
    const double p0 = 1.0 / (1.0 + std::exp(-2.0));  // softmax of (-1, -3)
    const double margin = 1.0 / 3.0 - 1.0 / 7.0;
    const double novelty = 0.5 / (1.0 + std::exp(-0.5)) + 0.25 / (1.0 + 8.0 * margin) + 0.25 * (1.0 - p0);
    CHECK(r.confidence == doctest::Approx(p0));
    CHECK(r.scores[1].probability == doctest::Approx(1.0 - p0));
    CHECK(r.margin == doctest::Approx(margin));
    CHECK(r.novelty == doctest::Approx(novelty));
    CHECK(r.is_novel == (novelty > 0.5));
}
