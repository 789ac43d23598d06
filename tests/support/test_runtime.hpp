// A cmf_runtime for one test case: 2 threads (the CI machine's cores), the
// build tree's plugins (CMF_PLUGIN_PATH from tests/meson.build), freed at
// scope end. Shared by the unit, runtime and container tests.
#pragma once

#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>
#include <doctest/doctest.h>

struct TestRuntime {
    cmf_runtime *rt = nullptr;
    // log_level: the runtime's default unless given (the container tests
    // quiet the log of the malformed files they open on purpose).
    explicit TestRuntime(int32_t log_level = -1) {
        cmf_runtime_options o;
        cmf_runtime_options_init(&o);
        o.n_threads = 2;
        if (log_level >= 0) o.log_level = log_level;
        REQUIRE(cmf_runtime_create(&o, &rt) == nullptr);
    }
    ~TestRuntime() { cmf_runtime_free(rt); }
    TestRuntime(const TestRuntime &) = delete;
    TestRuntime &operator=(const TestRuntime &) = delete;
};
