// The chat page `cmfhost serve` answers GET / with: one self-contained
// HTML document (inline CSS and JavaScript, no external resources) that
// talks to /v1/chat/completions and streams the answers.
#pragma once

namespace cmfhost::serve {
extern const char kChatPage[];
}
