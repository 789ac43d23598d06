package cmf

// The C-callable ends of the callbacks (a file of its own: cgo allows only
// declarations in the preamble of a file with //export).

/*
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
)

// tokenSink is what a generation's on_token user pointer names.
type tokenSink struct {
	onToken  func(int32) bool
	panicked interface{}
}

//export cmfgoOnToken
func cmfgoOnToken(user C.uintptr_t, token C.int32_t) (stop C.int32_t) {
	sink := cgo.Handle(user).Value().(*tokenSink)
	defer func() {
		// A panic must not unwind through the library's C++ frames: stop
		// generating and re-panic once the C call has returned.
		if r := recover(); r != nil {
			sink.panicked = r
			stop = 1
		}
	}()
	if sink.onToken(int32(token)) {
		return 1
	}
	return 0
}

//export cmfgoOnProgress
func cmfgoOnProgress(user C.uintptr_t, done, total C.uint64_t) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Println("cmf: verify progress callback panicked:", r)
		}
	}()
	cgo.Handle(user).Value().(func(uint64, uint64))(uint64(done), uint64(total))
}
