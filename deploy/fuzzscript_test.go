package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The outputs of a fuzz target's failures, as go test prints them.
const (
	engineDeadline = "fuzz: elapsed: 10s, execs: 354187 (0/sec), new interesting: 3 (total: 40)\n--- FAIL: FuzzReader (10.21s)\n    context deadline exceeded\nFAIL\nexit status 1\nFAIL\twalden/wal\t10.3s\n"
	finding        = "--- FAIL: FuzzReader (3.02s)\n    --- FAIL: FuzzReader (0.00s)\n        reader_test.go:40: read past the end\n\n    Failing input written to testdata/fuzz/FuzzReader/0123\n    To re-run:\n    go test -run=FuzzReader/0123\n    context deadline exceeded\nFAIL\n"
	assertion      = "--- FAIL: FuzzReader (0.31s)\n    reader_test.go:52: seed 3: want an error\nFAIL\n"
	passed         = "fuzz: elapsed: 10s, execs: 550823 (50319/sec)\nPASS\nok  \twalden/wal\t10.1s\n"
)

// TestFuzzScript runs make fuzz-short's script with a go command that
// answers each run with the next output given: the fuzzing engine's own
// deadline, alone and with no input written, runs the target once more;
// every other failure, and a second failure, fails.
func TestFuzzScript(t *testing.T) {
	for _, c := range []struct {
		name    string
		outputs []string
		ok      bool
		runs    int
	}{
		{"passes", []string{passed}, true, 1},
		{"the engine's deadline, then a pass", []string{engineDeadline, passed}, true, 2},
		{"the engine's deadline twice", []string{engineDeadline, engineDeadline}, false, 2},
		{"a finding", []string{finding, passed}, false, 1},
		{"a failed assertion", []string{assertion, passed}, false, 1},
		{"the engine's deadline, then a finding", []string{engineDeadline, finding}, false, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			var script strings.Builder
			script.WriteString("#!/usr/bin/env bash\nn=$(cat " + filepath.Join(dir, "runs") + " 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > " + filepath.Join(dir, "runs") + "\n")
			script.WriteString("echo \"$@\" >> " + filepath.Join(dir, "args") + "\ncase $n in\n")
			for i, o := range c.outputs {
				status := 1
				if o == passed {
					status = 0
				}
				f := filepath.Join(dir, fmt.Sprintf("output-%d", i+1))
				if err := os.WriteFile(f, []byte(o), 0o644); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&script, "%d) cat %s; exit %d;;\n", i+1, f, status)
			}
			script.WriteString("esac\nexit 2\n")
			goCmd := filepath.Join(dir, "go")
			if err := os.WriteFile(goCmd, []byte(script.String()), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("../scripts/fuzz.sh", "FuzzReader", "./wal", "10s", "1s")
			cmd.Env = append(os.Environ(), "GO="+goCmd)
			out, err := cmd.CombinedOutput()
			if (err == nil) != c.ok {
				t.Fatalf("fuzz.sh: %v, want success %v; output:\n%s", err, c.ok, out)
			}
			runs, _ := os.ReadFile(filepath.Join(dir, "runs"))
			if got := strings.TrimSpace(string(runs)); got != fmt.Sprint(c.runs) {
				t.Fatalf("the target ran %s times, want %d; output:\n%s", got, c.runs, out)
			}
			args, _ := os.ReadFile(filepath.Join(dir, "args"))
			if want := "test -run=^$ -fuzz=^FuzzReader$ -fuzztime=10s -fuzzminimizetime=1s ./wal"; !strings.HasPrefix(string(args), want) {
				t.Fatalf("go was run with %q, want %q", args, want)
			}
		})
	}
}
