package coordclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// Compacted reports whether err is the answer to a watch from a revision
// the member no longer keeps (reason COMPACTED; its metadata holds
// compact_revision).
func Compacted(err error) bool {
	return rpcerr.Reason(err) == refusal.Compacted
}

// watchFinal lists the codes after which a watch is not tried again: the
// request or the caller is refused, or the members do not serve Watch.
func watchFinal(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return true
	}
	return false
}

// Watch backoff between rounds of members that all failed.
const (
	watchBackoffMin = 50 * time.Millisecond
	watchBackoffMax = time.Second
)

// WatchOptions tune Watch for a client that must not wait forever.
type WatchOptions struct {
	// FirstAnswer, when positive, bounds the wait for a member's first
	// response on each stream: a member that accepts the watch and stays
	// silent (hung, or behind a black-holing proxy) is given up
	// (DeadlineExceeded) and the next one asked.
	FirstAnswer time.Duration
	// GiveUp, when positive, makes Watch return a *NoAnswerError once
	// GiveUp rounds of the members in a row gave nothing (one round while
	// none has answered yet). 0: try again until ctx ends.
	GiveUp int
}

// Watch follows the replicated state's changes (walden.v1.Watch) until ctx
// ends or fn returns an error. It watches from req's start revision (0: the
// current values first, in a response with Snapshot set) on the member
// that answered last, else on each endpoint in turn, and calls fn with
// every response, in order, the fragments of a revision joined into one.
// When a stream breaks it resumes on the same member or the next from the
// revision after the last response fn got, so fn sees every change once
// and in revision order. When a member no longer keeps that revision
// (COMPACTED) it starts over from revision 0: fn then gets a new snapshot
// and must replace what it knew.
//
// It returns nil when ctx ends, fn's error, the refusal of a member that
// retrying does not fix (InvalidArgument, PermissionDenied,
// Unauthenticated, Unimplemented: members of a walden without Watch), or,
// with opts.GiveUp, a *NoAnswerError.
func (c *Client) Watch(ctx context.Context, req *waldenv1.WatchRequest, opts WatchOptions, fn func(*waldenv1.WatchResponse) error) error {
	next := req.GetStartRevision()
	backoff := watchBackoffMin
	answered := false
	failedRounds := 0
	for ctx.Err() == nil {
		progressed := false
		var failures []Failure
		for _, addr := range c.order() {
			got, err := c.watchOn(ctx, addr, req, opts.FirstAnswer, &next, fn)
			progressed = progressed || got
			var fnErr fnError
			switch {
			case errors.As(err, &fnErr):
				return fnErr.err
			case ctx.Err() != nil:
				return nil
			case Compacted(err):
				if c.log != nil {
					c.log.Info("watch: the revision is compacted; listing again", "addr", addr, "from", next, "err", err)
				}
				next = 0 // start over with a snapshot, on this member first
				progressed = true
			case watchFinal(status.Code(err)):
				return fmt.Errorf("coordclient: watch on %s: %w", addr, err)
			default:
				if c.log != nil {
					c.log.Debug("watch broke; resuming", "addr", addr, "from", next, "err", err)
				}
				failures = append(failures, Failure{Addr: addr, Err: err})
				c.unprefer(addr)
				continue
			}
			break
		}
		if progressed {
			answered, failedRounds = true, 0
			backoff = watchBackoffMin
			continue
		}
		if failedRounds++; opts.GiveUp > 0 && (!answered || failedRounds >= opts.GiveUp) {
			return &NoAnswerError{Failures: failures}
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, watchBackoffMax)
	}
	return nil
}

// fnError carries the handler's error out of watchOn.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// watchOn runs one watch stream on addr from *next, advancing *next past
// every response fn got; a positive firstAnswer bounds the wait for the
// first response. It reports whether fn got any.
func (c *Client) watchOn(ctx context.Context, addr string, req *waldenv1.WatchRequest, firstAnswer time.Duration, next *uint64, fn func(*waldenv1.WatchResponse) error) (bool, error) {
	conn, err := c.conns.Get(addr)
	if err != nil {
		return false, status.Error(codes.Unavailable, fmt.Sprintf("dial %s: %v", addr, err))
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	silent := func() bool { return false }
	if firstAnswer > 0 {
		t := time.AfterFunc(firstAnswer, cancel)
		defer t.Stop()
		silent = func() bool { return !t.Stop() && parent.Err() == nil }
	}
	answered := false
	fail := func(err error) error {
		if !answered && silent() {
			return status.Error(codes.DeadlineExceeded, fmt.Sprintf("no answer within %s", firstAnswer))
		}
		return err
	}
	r := proto.Clone(req).(*waldenv1.WatchRequest)
	r.StartRevision = *next
	stream, err := waldenv1.NewWatchClient(conn).Watch(ctx, r)
	if err != nil {
		return false, fail(err)
	}
	got := false
	var pending *waldenv1.WatchResponse
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, status.Error(codes.Unavailable, "the member ended the watch")
		}
		if err != nil {
			return got, fail(err)
		}
		if !answered {
			answered = true
			silent() // stops the first-answer timer
		}
		c.prefer(addr)
		if pending != nil {
			pending.Changes = append(pending.Changes, resp.GetChanges()...)
			pending.Fragment = resp.GetFragment()
		} else {
			pending = resp
		}
		if pending.GetFragment() {
			continue
		}
		whole := pending
		pending = nil
		if err := fn(whole); err != nil {
			return got, fnError{err}
		}
		got = true
		*next = whole.GetRevision() + 1
	}
}
