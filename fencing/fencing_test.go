package fencing_test

import (
	"errors"
	"sync"
	"testing"

	"walden/fencing"
	"walden/refusal"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		name      string
		current   fencing.Token
		fenced    bool
		presented fencing.Token
		want      error
	}{
		{"current epoch", 7, false, 7, nil},
		{"older epoch", 7, false, 6, refusal.ErrEpochExpired},
		{"newer epoch than issued", 7, false, 8, refusal.ErrEpochExpired},
		{"fenced, old epoch", 8, true, 7, refusal.ErrNodeFenced},
		{"fenced, current epoch", 8, true, 8, refusal.ErrNodeFenced},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := fencing.Check(c.current, c.fenced, c.presented)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Check = %v, want %v", err, c.want)
			}
		})
	}
}

func TestGuard(t *testing.T) {
	var g fencing.Guard
	if _, ok := g.Highest("s"); ok {
		t.Fatal("empty guard has a highest token")
	}
	for _, step := range []struct {
		res  string
		tok  fencing.Token
		want error
	}{
		{"a", 3, nil}, {"a", 3, nil}, {"a", 5, nil}, {"a", 4, refusal.ErrEpochExpired},
		{"b", 1, nil}, {"a", 5, nil}, {"b", 0, refusal.ErrEpochExpired},
	} {
		err := g.Check(step.res, step.tok)
		if (step.want == nil) != (err == nil) || (step.want != nil && !errors.Is(err, step.want)) {
			t.Fatalf("Check(%q, %d) = %v, want %v", step.res, step.tok, err, step.want)
		}
	}
	if h, _ := g.Highest("a"); h != 5 {
		t.Fatalf("Highest(a) = %d, want 5", h)
	}
}

// TestGuardConcurrent checks under -race that concurrent checks never let a
// token below the highest accepted one through after it was accepted.
func TestGuardConcurrent(t *testing.T) {
	var g fencing.Guard
	const workers, perWorker = 8, 200
	var wg sync.WaitGroup
	accepted := make([][]fencing.Token, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				tok := fencing.Token(i*workers + w)
				if g.Check("r", tok) == nil {
					accepted[w] = append(accepted[w], tok)
				}
			}
		}()
	}
	wg.Wait()
	top, _ := g.Highest("r")
	if top != workers*perWorker-1 {
		t.Fatalf("Highest = %d, want %d", top, workers*perWorker-1)
	}
	for w, toks := range accepted {
		for i := 1; i < len(toks); i++ {
			if toks[i] < toks[i-1] {
				t.Fatalf("worker %d accepted %d after %d", w, toks[i], toks[i-1])
			}
		}
	}
	if err := g.Check("r", top-1); !errors.Is(err, refusal.ErrEpochExpired) {
		t.Fatalf("Check below highest = %v", err)
	}
}
