package fencing

import (
	"fmt"
	"sync"

	"walden/refusal"
)

// Token is a fencing token: a broker epoch. Tokens are issued only by the
// replicated state machine when it applies a committed entry, are
// cluster-wide monotonic and never reused.
type Token uint64

// Check applies the broker-epoch rule to a request that presents token
// presented for a broker whose current token is current: a fenced broker is
// refused with refusal.ErrNodeFenced, a token other than the current one with
// ErrEpochExpired.
func Check(current Token, fenced bool, presented Token) error {
	if fenced {
		return fmt.Errorf("epoch %d presented, broker fenced at epoch %d: %w", presented, current, refusal.ErrNodeFenced)
	}
	if presented != current {
		return fmt.Errorf("epoch %d presented, current epoch is %d: %w", presented, current, refusal.ErrEpochExpired)
	}
	return nil
}

// Guard is for storage that verifies fencing tokens itself: it remembers the
// highest token seen per resource and refuses a lower one. The zero Guard is
// ready to use; it is safe for concurrent use.
type Guard struct {
	mu      sync.Mutex
	highest map[string]Token
}

// Check accepts t for resource if no higher token was seen for it, and then
// remembers t; a lower token is refused with refusal.ErrEpochExpired.
func (g *Guard) Check(resource string, t Token) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if h, ok := g.highest[resource]; ok && t < h {
		return fmt.Errorf("%s: token %d, highest seen %d: %w", resource, t, h, refusal.ErrEpochExpired)
	}
	if g.highest == nil {
		g.highest = map[string]Token{}
	}
	g.highest[resource] = t
	return nil
}

// Highest returns the highest token accepted for resource, and whether any
// was.
func (g *Guard) Highest(resource string) (Token, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.highest[resource]
	return t, ok
}
