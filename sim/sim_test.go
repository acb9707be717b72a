package sim

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

var (
	flagRuns     = flag.Int("sim.runs", 4, "number of seeds to run per profile")
	flagFirst    = flag.Uint64("sim.first", 1, "first seed")
	flagSeed     = flag.Uint64("sim.seed", 0, "run only this seed and print its trace")
	flagDuration = flag.Duration("sim.duration", 10*time.Minute, "simulated time per run")
	flagProfile  = flag.String("sim.profile", "", "run only this fault profile")
)

func TestSimulate(t *testing.T) {
	for _, p := range Profiles() {
		if *flagProfile != "" && p.Name != *flagProfile {
			continue
		}
		t.Run(p.Name, func(t *testing.T) {
			cfg := Config{Duration: *flagDuration, RateBound: 0.001, Faults: p.Faults}
			if *flagSeed != 0 {
				w := NewWorld(*flagSeed, cfg)
				v := w.Run()
				t.Log("trace:\n" + w.Trace())
				if len(v) > 0 {
					t.Fatalf("seed %d: %v", *flagSeed, v)
				}
				return
			}
			var bad []string
			kinds := map[string]int{}
			for s := *flagFirst; s < *flagFirst+uint64(*flagRuns); s++ {
				w := NewWorld(s, cfg)
				if v := w.Run(); len(v) > 0 {
					bad = append(bad, fmt.Sprintf("seed %d: %v", s, v[0]))
					kinds[v[0].Kind]++
				}
			}
			t.Logf("%s: seeds %d..%d run (%s simulated each): %d with a violation %v", p.Name, *flagFirst, *flagFirst+uint64(*flagRuns)-1, *flagDuration, len(bad), kinds)
			if len(bad) > 0 {
				t.Fatalf("violations (replay one with -sim.profile=%s -sim.seed=N -v):\n%s", p.Name, strings.Join(bad, "\n"))
			}
		})
	}
}
