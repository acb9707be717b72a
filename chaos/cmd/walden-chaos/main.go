package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"walden/chaos"
	"walden/chaos/netns"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "walden-chaos: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		walden    = flag.String("walden", "bin/walden", "the walden binary every process runs")
		versity   = flag.String("versitygw", "bin/tools/versitygw", "the versitygw binary (S3)")
		dir       = flag.String("dir", "", "working directory: report.json and one sub-directory per scenario (default: a new temporary directory, removed when every scenario passed)")
		scenarios = flag.String("scenarios", "", "comma-separated scenario names (default: all; see -list)")
		short     = flag.Bool("short", false, "the short form: the scenarios of `make test`, the fast policy, shorter faults")
		policy    = flag.String("policy", "", "failover policy: default (walden's defaults) or fast (failure_timeout 2s); default: default, fast with -short")
		output    = flag.String("o", "table", "output: table (progress on stderr) or json")
		seed      = flag.Uint64("seed", 0, "seed of the delayer's drops and delays (default: from the clock)")
		list      = flag.Bool("list", false, "list the scenarios and exit")
	)
	flag.Parse()
	if *output != "table" && *output != "json" {
		return fmt.Errorf("-o: must be table or json, not %q", *output)
	}
	if *list {
		for _, s := range chaos.Catalog() {
			short := ""
			if s.Short {
				short = " (short form)"
			}
			fmt.Printf("%-32s %s%s\n", s.Name, s.Description, short)
		}
		return nil
	}
	if err := netns.Available(); err != nil {
		fmt.Printf("walden-chaos: skipped: %v\n", err)
		return nil
	}
	cfg := chaos.Config{Walden: *walden, Versity: *versity, Dir: *dir, Policy: *policy, Seed: *seed}
	var names []string
	if *scenarios != "" {
		names = strings.Split(*scenarios, ",")
	}
	if *short {
		if names == nil {
			names = chaos.ShortNames()
		}
		if cfg.Policy == "" {
			cfg.Policy = "fast"
		}
		cfg.Warmup, cfg.Hold, cfg.Cut, cfg.After = 3*time.Second, 20*time.Second, 8*time.Second, 2*time.Second
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	for _, p := range []*string{&cfg.Walden, &cfg.Versity} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%s: %w (make build; make versitygw)", *p, err)
		}
		*p = abs
	}
	removeDir := false
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "walden-chaos-")
		if err != nil {
			return err
		}
		cfg.Dir, removeDir = d, true
	}
	start := time.Now()
	cfg.Say = func(line string) {
		fmt.Fprintf(os.Stderr, "%s %7.1fs  %s\n", time.Now().Format("15:04:05.000"), time.Since(start).Seconds(), line)
	}
	ctx := context.Background()
	h, err := chaos.New(ctx, cfg)
	if err != nil {
		return err
	}
	results, runErr := h.Run(ctx, names)
	if err := h.Close(); err != nil {
		cfg.Say(fmt.Sprintf("cleaning up: %v", err))
	}
	if cfg.Policy == "" {
		cfg.Policy = "default"
	}
	rep := chaos.NewReport("walden-chaos "+strings.Join(os.Args[1:], " "), start.UTC().Format(time.RFC3339), cfg.Policy, cfg.Seed, results)
	// The JSON report stays beside the scenarios' logs and histories.
	if f, ferr := os.Create(filepath.Join(cfg.Dir, "report.json")); ferr == nil {
		_ = rep.WriteJSON(f)
		f.Close()
	}
	if *output == "json" {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteTable(os.Stdout)
	}
	if err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	if rep.Failed > 0 {
		return errors.New(fmt.Sprintf("%d of %d scenarios missed a goal (logs and histories in %s)", rep.Failed, len(results), cfg.Dir))
	}
	if removeDir {
		os.RemoveAll(cfg.Dir)
	}
	return nil
}
