package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
)

// Coordinators calls the coordinators' admin gRPC services (Catalog,
// Brokers): the member that answered last first, then each configured
// endpoint in turn while they answer Unavailable or time out. Followers
// forward writes to the leader. It is safe for concurrent use; load and
// verify use it too.
type Coordinators struct {
	endpoints []string
	dialOpts  []grpc.DialOption

	mu        sync.Mutex
	conns     map[string]*grpc.ClientConn
	preferred string
}

// NewCoordinators returns a client of the given admin addresses. It dials
// lazily.
func NewCoordinators(endpoints []string, dialOpts ...grpc.DialOption) *Coordinators {
	return &Coordinators{endpoints: slices.Clone(endpoints), dialOpts: dialOpts, conns: map[string]*grpc.ClientConn{}}
}

func (c *Coordinators) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, ok := c.conns[addr]; ok {
		return conn, nil
	}
	conn, err := grpc.NewClient(addr, c.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("broker: dial coordinator %s: %w", addr, err)
	}
	c.conns[addr] = conn
	return conn, nil
}

func (c *Coordinators) order() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.endpoints))
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

// Do runs fn against one coordinator after another, each with perTry as
// its deadline, until one gives an answer other than Unavailable or
// DeadlineExceeded (a success or a refusal), and returns it. A not-leader
// answer naming the leader is followed first.
func (c *Coordinators) Do(ctx context.Context, perTry time.Duration, fn func(ctx context.Context, conn *grpc.ClientConn) error) error {
	var last error
	queue := c.order()
	tried := map[string]bool{}
	for len(queue) > 0 {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		conn, err := c.conn(addr)
		if err != nil {
			last = err
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, perTry)
		err = fn(tctx, conn)
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("broker: coordinator %s: %w", addr, ctx.Err())
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			last = err
			if hint := leaderHint(err); hint != "" && !tried[hint] {
				queue = append([]string{hint}, queue...)
			}
			c.mu.Lock()
			if c.preferred == addr {
				c.preferred = ""
			}
			c.mu.Unlock()
			continue
		}
		c.mu.Lock()
		c.preferred = addr
		c.mu.Unlock()
		return err
	}
	if last == nil {
		last = errors.New("no endpoints")
	}
	return fmt.Errorf("%w: %w", ErrNoCoordinator, last)
}

// leaderHint reads the leader's admin address from a not-leader answer
// (ErrorInfo reason NOT_LEADER, metadata leader_addr).
func leaderHint(err error) string {
	s, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "NOT_LEADER" {
			return info.GetMetadata()["leader_addr"]
		}
	}
	return ""
}

// DescribeStream returns a stream and up to maxObjects of its committed
// objects ending after from.
func (c *Coordinators) DescribeStream(ctx context.Context, id, from uint64, maxObjects uint32) (*waldenv1.DescribeStreamResponse, error) {
	var resp *waldenv1.DescribeStreamResponse
	err := c.Do(ctx, 3*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = waldenv1.NewCatalogClient(conn).DescribeStream(ctx, &waldenv1.DescribeStreamRequest{StreamId: id, FromOffset: from, MaxObjects: maxObjects})
		return err
	})
	return resp, err
}

// ListStreams lists the streams, filtered by owner and state when set.
func (c *Coordinators) ListStreams(ctx context.Context, owner, state string) ([]*waldenv1.Stream, error) {
	var resp *waldenv1.ListStreamsResponse
	err := c.Do(ctx, 3*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = waldenv1.NewCatalogClient(conn).ListStreams(ctx, &waldenv1.ListStreamsRequest{OwnerBrokerId: owner, State: state})
		return err
	})
	return resp.GetStreams(), err
}

// BrokerAddr returns the API address a broker registered (broker_addr).
func (c *Coordinators) BrokerAddr(ctx context.Context, brokerID string) (string, error) {
	var resp *waldenv1.GetBrokerResponse
	err := c.Do(ctx, 3*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = waldenv1.NewBrokersClient(conn).GetBroker(ctx, &waldenv1.GetBrokerRequest{BrokerId: brokerID})
		return err
	})
	if err != nil {
		return "", err
	}
	return resp.GetBroker().GetBrokerAddr(), nil
}

// Brokers lists the registered brokers.
func (c *Coordinators) Brokers(ctx context.Context) ([]*waldenv1.Broker, error) {
	var resp *waldenv1.ListBrokersResponse
	err := c.Do(ctx, 3*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = waldenv1.NewBrokersClient(conn).ListBrokers(ctx, &waldenv1.ListBrokersRequest{})
		return err
	})
	return resp.GetBrokers(), err
}

// Close closes every connection.
func (c *Coordinators) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, conn := range c.conns {
		_ = conn.Close()
		delete(c.conns, a)
	}
}
