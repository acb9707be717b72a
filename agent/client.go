package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"walden/coordclient"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// Refusal reasons the agent acts on.
const (
	reasonNodeFenced      = refusal.NodeFenced
	reasonEpochExpired    = refusal.EpochExpired
	reasonRecoveryRunning = refusal.RecoveryRunning
	reasonUnknownNode     = refusal.UnknownNode
	// A restored cluster registers nobody until it is reconciled.
	reasonRestoreReconciling = refusal.RestoreReconciling
	// A coordinator that attested the lease expired, or whose broker's
	// failover was requested, grants nothing more for the epoch.
	reasonLeaseAttested     = refusal.LeaseAttested
	reasonFailoverRequested = refusal.FailoverRequested
)

// refusalReason returns the walden reason of a gRPC error (the reason of
// its ErrorInfo detail, as rpcerr.Status writes it), or else of a message
// that starts with an upper-case REASON followed by ':'. "" when it has
// none.
func refusalReason(err error) refusal.Reason {
	if r := rpcerr.Reason(err); r != "" {
		return r
	}
	s, ok := status.FromError(err)
	if !ok || s == nil {
		return ""
	}
	if r, _, ok := strings.Cut(s.Message(), ":"); ok && r != "" && strings.Trim(r, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == "" {
		return refusal.Reason(r)
	}
	return ""
}

// coordinators sends Agent RPCs to the coordinator cluster: to the member
// that answered last, else to each configured endpoint in turn, following
// leader hints.
type coordinators struct {
	client    *coordclient.Client
	endpoints int
}

func newCoordinators(endpoints []string, dialOpts []grpc.DialOption, log *slog.Logger) *coordinators {
	return &coordinators{client: coordclient.New(endpoints, log, dialOpts...), endpoints: len(endpoints)}
}

// rpc is one Agent RPC attempt against one coordinator.
type rpc func(ctx context.Context, cl waldenv1.AgentClient, opts ...grpc.CallOption) error

// call runs fn against the coordinators until one answers something other
// than Unavailable or a per-attempt timeout, following a leader hint first.
func (c *coordinators) call(ctx context.Context, perTry time.Duration, fn rpc) error {
	err := c.client.Do(ctx, coordclient.Policy{PerTry: perTry, MaxAttempts: c.endpoints + 3},
		func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			return fn(ctx, waldenv1.NewAgentClient(conn), opts...)
		})
	var none *coordclient.NoAnswerError
	if !errors.As(err, &none) {
		return err
	}
	last := none.Last()
	switch {
	case none.Ctx != nil:
		return fmt.Errorf("agent: %s: %w", last.Addr, none.Ctx)
	case last.Err != nil:
		return last.Err
	}
	return errors.New("agent: no coordinator to ask")
}

func (c *coordinators) close() {
	c.client.Close()
}
