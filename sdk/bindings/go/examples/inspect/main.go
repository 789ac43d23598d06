// Command inspect shows a model's facts, its tensors, one tensor's first
// rows decoded to f32, and verifies every hash (with -trusted-key: the
// signature too).
//
//	go run ./examples/inspect [-tensor NAME] [-trusted-key HEX] MODEL.cmf
package main

import (
	"flag"
	"fmt"
	"os"

	"cmf"
)

func main() {
	tensor := flag.String("tensor", "model.embed_tokens.weight", "tensor to decode")
	key := flag.String("trusted-key", "", "64-hex public key or 16-hex fingerprint that must have signed the file")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: inspect [-tensor NAME] [-trusted-key HEX] MODEL.cmf")
		os.Exit(2)
	}
	ok, err := run(flag.Arg(0), *tensor, *key)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inspect:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(path, tensor, key string) (bool, error) {
	rt, err := cmf.NewRuntime(nil)
	if err != nil {
		return false, err
	}
	defer rt.Close()
	model, err := rt.Open(path, nil)
	if err != nil {
		return false, err
	}
	info, err := model.Info()
	if err != nil {
		return false, err
	}
	fmt.Printf("%s: arch %s, %s, %d tensors, %d shard(s)\n", path, info.ArchName, info.QuantType, info.TensorCount, info.ShardCount)
	tensors, err := model.Tensors()
	if err != nil {
		return false, err
	}
	for _, t := range tensors {
		fmt.Printf("  %-50s dtype %2d %v\n", t.Name, t.Dtype, t.Shape)
	}
	t, err := model.Tensor(tensor)
	if err != nil {
		return false, err
	}
	end := t.Rows()
	if end > 2 {
		end = 2
	}
	rows, err := model.DequantizeRows(t.Index, 0, end)
	if err != nil {
		return false, err
	}
	if len(rows) > 4 {
		rows = rows[:4]
	}
	fmt.Printf("%s rows 0..2, first values: %v\n", t.Name, rows)
	opts := &cmf.VerifyOptions{}
	if key != "" {
		opts.TrustedKeys = []string{key}
	}
	report, err := model.Verify(opts)
	if err != nil {
		return false, err
	}
	for _, p := range report.Problems {
		fmt.Println("problem:", p)
	}
	for _, s := range report.Signatures {
		fmt.Printf("signed by %s (trusted: %v)\n", s.Fingerprint, s.Trusted)
	}
	if report.OK() {
		fmt.Println("verify: ok")
	} else {
		fmt.Printf("verify: %d problem(s)\n", len(report.Problems))
	}
	return report.OK(), nil
}
