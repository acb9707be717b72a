package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"walden/fencing"
	waldenv1 "walden/proto/walden/v1"
)

// Leader hints and refusal reasons as the coordinators send them.
const (
	// trailerLeaderAddr carries the leader's admin address in a not-leader
	// (Unavailable) answer.
	trailerLeaderAddr = "walden-leader-addr"
	reasonNotLeader   = "NOT_LEADER"
)

// Refusal reasons the agent acts on (package fencing's reasons).
var (
	reasonNodeFenced      = fencing.Reason(fencing.ErrNodeFenced)
	reasonEpochExpired    = fencing.Reason(fencing.ErrEpochExpired)
	reasonRecoveryRunning = fencing.Reason(fencing.ErrRecoveryRunning)
	reasonUnknownNode     = fencing.Reason(fencing.ErrUnknownNode)
)

// refusalReason returns the walden reason of a gRPC error (the reason of
// its ErrorInfo detail of domain "walden", as fencing.GRPCStatus writes it),
// or else of a message that starts with an upper-case REASON followed by
// ':'. "" when it has none.
func refusalReason(err error) string {
	if r := fencing.ReasonFromStatus(err); r != "" {
		return r
	}
	s, ok := status.FromError(err)
	if !ok || s == nil {
		return ""
	}
	if r, _, ok := strings.Cut(s.Message(), ":"); ok && r != "" && strings.Trim(r, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == "" {
		return r
	}
	return ""
}

// leaderHint reads the leader's address from a not-leader answer.
func leaderHint(err error, trailer metadata.MD) string {
	if s, ok := status.FromError(err); ok {
		for _, d := range s.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reasonNotLeader {
				if a := info.GetMetadata()["leader_addr"]; a != "" {
					return a
				}
			}
		}
	}
	if v := trailer.Get(trailerLeaderAddr); len(v) > 0 {
		return v[0]
	}
	return ""
}

// coordinators sends Agent RPCs to the coordinator cluster: to the member
// that answered last, else to each configured endpoint in turn, following
// leader hints.
type coordinators struct {
	endpoints []string
	dialOpts  []grpc.DialOption
	log       *slog.Logger

	mu        sync.Mutex
	conns     map[string]*grpc.ClientConn
	preferred string // the address that answered last, or a hinted leader
}

func newCoordinators(endpoints []string, dialOpts []grpc.DialOption, log *slog.Logger) *coordinators {
	return &coordinators{endpoints: slices.Clone(endpoints), dialOpts: dialOpts, log: log, conns: map[string]*grpc.ClientConn{}}
}

func (c *coordinators) client(addr string) (waldenv1.AgentClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, ok := c.conns[addr]
	if !ok {
		var err error
		conn, err = grpc.NewClient(addr, c.dialOpts...)
		if err != nil {
			return nil, fmt.Errorf("agent: dial %s: %w", addr, err)
		}
		c.conns[addr] = conn
	}
	return waldenv1.NewAgentClient(conn), nil
}

// order is the sequence of addresses one call tries.
func (c *coordinators) order() []string {
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

func (c *coordinators) prefer(addr string) {
	c.mu.Lock()
	c.preferred = addr
	c.mu.Unlock()
}

// unprefer forgets addr as the preferred member after it failed.
func (c *coordinators) unprefer(addr string) {
	c.mu.Lock()
	if c.preferred == addr {
		c.preferred = ""
	}
	c.mu.Unlock()
}

// rpc is one Agent RPC attempt against one coordinator.
type rpc func(ctx context.Context, cl waldenv1.AgentClient, opts ...grpc.CallOption) error

// call runs fn against the coordinators until one answers something other
// than Unavailable or a per-attempt timeout, following a leader hint first.
// now is read just before each attempt; the reading of the attempt whose
// answer is returned comes back as sent (the moment the request was sent,
// or a moment just before it).
func (c *coordinators) call(ctx context.Context, perTry time.Duration, now func() time.Time, fn rpc) (sent time.Time, err error) {
	queue := c.order()
	tried := map[string]bool{}
	hops := 0
	for len(queue) > 0 && hops < len(c.endpoints)+3 {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		hops++
		cl, derr := c.client(addr)
		if derr != nil {
			err = derr
			continue
		}
		var trailer metadata.MD
		tctx, cancel := context.WithTimeout(ctx, perTry)
		sent = now()
		err = fn(tctx, cl, grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			c.prefer(addr)
			return sent, nil
		}
		if ctx.Err() != nil {
			return sent, fmt.Errorf("agent: %s: %w", addr, ctx.Err())
		}
		code := status.Code(err)
		if code != codes.Unavailable && code != codes.DeadlineExceeded {
			// A real answer (a refusal): the member is reachable.
			c.prefer(addr)
			return sent, err
		}
		if hint := leaderHint(err, trailer); hint != "" && hint != addr && !tried[hint] {
			c.log.Debug("following leader hint", "from", addr, "leader_addr", hint)
			queue = append([]string{hint}, queue...)
		}
		c.unprefer(addr)
	}
	if err == nil {
		err = errors.New("agent: no coordinator to ask")
	}
	return sent, err
}

func (c *coordinators) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, conn := range c.conns {
		_ = conn.Close()
		delete(c.conns, a)
	}
}
