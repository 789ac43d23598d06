// Command generate opens a model and generates: one chat turn (or -raw
// completion), streamed.
//
//	go run ./examples/generate [-raw] [-n N] MODEL.cmf [PROMPT]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"cmf"
)

func main() {
	raw := flag.Bool("raw", false, "plain completion, no chat template")
	n := flag.Uint("n", 64, "tokens to generate")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: generate [-raw] [-n N] MODEL.cmf [PROMPT]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	prompt := "Tell me about Mr. Darcy."
	if flag.NArg() > 1 {
		prompt = flag.Arg(1)
	}
	if err := run(flag.Arg(0), prompt, *raw, uint32(*n)); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run(path, prompt string, raw bool, n uint32) error {
	rt, err := cmf.NewRuntime(nil)
	if err != nil {
		return err
	}
	defer rt.Close()
	model, err := rt.Open(path, nil)
	if err != nil {
		return err
	}
	session, err := model.NewSession(nil)
	if err != nil {
		return err
	}
	text := prompt
	if !raw {
		if text, err = model.RenderChat([]cmf.Message{{Role: "user", Content: prompt}}, true); err != nil {
			return err
		}
	}
	_, err = session.GenerateText(context.Background(), text, cmf.Greedy(n), func(piece string) bool {
		fmt.Print(piece)
		return false
	})
	fmt.Println()
	return err
}
