package devcontroller

import (
	"sync"
	"time"
)

// FaultKind says what a fault does to the request it hits.
type FaultKind int

// The faults a test can inject. Each hits requests of one API key (or of
// every AutoMQ key) on one voter (or on every voter).
const (
	// FaultErrorCode answers the fault's Code as the response's top-level
	// ErrorCode without applying the request.
	FaultErrorCode FaultKind = iota + 1
	// FaultGarbage answers a frame with the request's correlation id and a
	// body no decoder accepts (the fault's Garbage, or one byte), without
	// applying the request.
	FaultGarbage
	// FaultCutFrame applies the request, writes the first half of its
	// response frame and closes the connection.
	FaultCutFrame
	// FaultDelay applies the request and answers after the fault's Delay.
	FaultDelay
	// FaultCloseAfterApply applies the request and closes the connection
	// without answering: the client cannot tell whether it was applied.
	FaultCloseAfterApply
)

// Fault is one injected fault.
type Fault struct {
	Kind    FaultKind
	APIKey  int16 // the AutoMQ API it hits (502...514); 0 for all of them
	Voter   int   // the voter it hits (1...N); 0 for all
	Code    Code  // FaultErrorCode: the code to answer
	Delay   time.Duration
	Garbage []byte // FaultGarbage: the body to answer
	// Times is how many requests the fault hits before it is spent; 0
	// means once, a negative count every request until Clear.
	Times int
}

// Faults holds the faults armed on a controller. A test creates it, passes
// it in Config.Faults and arms faults while the controller runs. It is safe
// for concurrent use.
type Faults struct {
	mu    sync.Mutex
	armed []*armedFault
	hits  int
}

type armedFault struct {
	f    Fault
	left int // < 0: unlimited
}

// NewFaults returns an empty set of faults.
func NewFaults() *Faults { return &Faults{} }

// Add arms a fault. Faults are tried in the order they were added.
func (fs *Faults) Add(f Fault) {
	left := f.Times
	if left == 0 {
		left = 1
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.armed = append(fs.armed, &armedFault{f: f, left: left})
}

// Clear disarms every fault.
func (fs *Faults) Clear() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.armed = nil
}

// Hits counts the requests faults have hit so far.
func (fs *Faults) Hits() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.hits
}

// take returns the first armed fault for the request and spends one of its
// times.
func (fs *Faults) take(voter int, key int16) (Fault, bool) {
	if fs == nil {
		return Fault{}, false
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for i, a := range fs.armed {
		if (a.f.APIKey != 0 && a.f.APIKey != key) || (a.f.Voter != 0 && a.f.Voter != voter) {
			continue
		}
		if a.left > 0 {
			a.left--
			if a.left == 0 {
				fs.armed = append(fs.armed[:i:i], fs.armed[i+1:]...)
			}
		}
		fs.hits++
		return a.f, true
	}
	return Fault{}, false
}
