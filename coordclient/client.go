package coordclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrNoAnswer means no coordinator answered a call: every attempt failed
// with a code the call moves on after, the attempts ran out, or the call's
// context ended. The error is a *NoAnswerError.
var ErrNoAnswer = errors.New("coordclient: no coordinator answered")

// Attempt is one call to one coordinator over conn. It must pass opts (a
// grpc.Trailer that reads the leader hint) to its RPC.
type Attempt func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error

// Policy says how one call moves from member to member.
type Policy struct {
	// PerTry is the deadline of each attempt.
	PerTry time.Duration
	// MaxAttempts bounds the attempts, leader hints included; 0 tries each
	// known address once.
	MaxAttempts int
	// MoveOn reports whether the call goes on to the next member after an
	// attempt failed with code. nil: Unavailable and DeadlineExceeded.
	MoveOn func(code codes.Code) bool
}

func (p Policy) moveOn(code codes.Code) bool {
	if p.MoveOn != nil {
		return p.MoveOn(code)
	}
	return code == codes.Unavailable || code == codes.DeadlineExceeded
}

// Failure is one attempt that gave no answer.
type Failure struct {
	Addr string
	Err  error
}

// NoAnswerError reports a call that no coordinator answered.
type NoAnswerError struct {
	// Failures are the failed attempts in order.
	Failures []Failure
	// Ctx is the call context's error when it ended the call, else nil.
	Ctx error
}

// Last returns the last failed attempt, or a zero Failure when there was
// none (no endpoint to ask).
func (e *NoAnswerError) Last() Failure {
	if len(e.Failures) == 0 {
		return Failure{}
	}
	return e.Failures[len(e.Failures)-1]
}

func (e *NoAnswerError) Error() string {
	parts := make([]string, 0, len(e.Failures)+1)
	for _, f := range e.Failures {
		parts = append(parts, fmt.Sprintf("%s: %v", f.Addr, f.Err))
	}
	if e.Ctx != nil {
		parts = append(parts, e.Ctx.Error())
	}
	if len(parts) == 0 {
		return ErrNoAnswer.Error() + ": no endpoints"
	}
	return ErrNoAnswer.Error() + ": " + strings.Join(parts, "; ")
}

// Unwrap returns ErrNoAnswer, the context's error and the last failure.
func (e *NoAnswerError) Unwrap() []error {
	out := []error{ErrNoAnswer}
	if e.Ctx != nil {
		out = append(out, e.Ctx)
	}
	if last := e.Last(); last.Err != nil {
		out = append(out, last.Err)
	}
	return out
}

// Client sends calls to a coordinator cluster: to the member that answered
// last, else to each configured endpoint in turn, following leader hints.
// It is safe for concurrent use.
type Client struct {
	endpoints []string
	conns     *Conns
	log       *slog.Logger

	mu        sync.Mutex
	preferred string // the address that answered last, or "" after it failed
}

// New returns a client of the given coordinator addresses. It dials lazily
// with dialOpts; log (nil for none) gets the leader hints it follows.
func New(endpoints []string, log *slog.Logger, dialOpts ...grpc.DialOption) *Client {
	return &Client{endpoints: slices.Clone(endpoints), conns: NewConns(dialOpts...), log: log}
}

// order is the sequence of addresses one call tries.
func (c *Client) order() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.endpoints)+1)
	if c.preferred != "" {
		out = append(out, c.preferred)
	}
	for _, e := range c.endpoints {
		if e != c.preferred {
			out = append(out, e)
		}
	}
	return out
}

func (c *Client) prefer(addr string) {
	c.mu.Lock()
	c.preferred = addr
	c.mu.Unlock()
}

// unprefer forgets addr as the preferred member after it failed.
func (c *Client) unprefer(addr string) {
	c.mu.Lock()
	if c.preferred == addr {
		c.preferred = ""
	}
	c.mu.Unlock()
}

// Do runs fn against one coordinator after another, each attempt with
// p.PerTry as its deadline, until one gives an answer the policy does not
// move on after (a success or a refusal), and returns that answer as is. A
// not-leader answer naming the leader sends the next attempt there. When no
// member answers it returns a *NoAnswerError (ErrNoAnswer).
func (c *Client) Do(ctx context.Context, p Policy, fn Attempt) error {
	queue := c.order()
	tried := map[string]bool{}
	var failures []Failure
	for attempts := 0; len(queue) > 0 && (p.MaxAttempts == 0 || attempts < p.MaxAttempts); {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		attempts++
		conn, err := c.conns.Get(addr)
		if err != nil {
			failures = append(failures, Failure{Addr: addr, Err: fmt.Errorf("coordclient: dial %s: %w", addr, err)})
			continue
		}
		var trailer metadata.MD
		tctx, cancel := context.WithTimeout(ctx, p.PerTry)
		err = fn(tctx, conn, grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			c.prefer(addr)
			return nil
		}
		if ctx.Err() != nil {
			failures = append(failures, Failure{Addr: addr, Err: err})
			return &NoAnswerError{Failures: failures, Ctx: ctx.Err()}
		}
		if !p.moveOn(status.Code(err)) {
			// A real answer (a refusal): the member is reachable.
			c.prefer(addr)
			return err
		}
		failures = append(failures, Failure{Addr: addr, Err: err})
		if hint := LeaderAddr(err, trailer); hint != "" && hint != addr && !tried[hint] {
			if c.log != nil {
				c.log.Debug("following leader hint", "from", addr, "leader_addr", hint)
			}
			queue = append([]string{hint}, queue...)
		}
		c.unprefer(addr)
	}
	return &NoAnswerError{Failures: failures}
}

// Close closes every connection.
func (c *Client) Close() {
	c.conns.Close()
}
