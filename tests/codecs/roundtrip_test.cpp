#include "codec_test_util.hpp"
