package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"walden/coordclient"
	waldenv1 "walden/proto/walden/v1"
)

// Coordinators calls the coordinators' admin gRPC services (Catalog,
// Brokers): the member that answered last first, then each configured
// endpoint in turn while they answer Unavailable or time out. Followers
// forward writes to the leader. It is safe for concurrent use; load and
// verify use it too.
type Coordinators struct {
	client *coordclient.Client
}

// NewCoordinators returns a client of the given admin addresses. It dials
// lazily.
func NewCoordinators(endpoints []string, dialOpts ...grpc.DialOption) *Coordinators {
	return &Coordinators{client: coordclient.New(endpoints, nil, dialOpts...)}
}

// Do runs fn against one coordinator after another, each with perTry as
// its deadline, until one gives an answer other than Unavailable,
// DeadlineExceeded or Canceled (a success or a refusal), and returns it. A
// not-leader answer naming the leader is followed first.
func (c *Coordinators) Do(ctx context.Context, perTry time.Duration, fn func(ctx context.Context, conn *grpc.ClientConn) error) error {
	err := c.client.Do(ctx, coordclient.Policy{PerTry: perTry, MoveOn: moveOn},
		func(ctx context.Context, conn *grpc.ClientConn, _ ...grpc.CallOption) error { return fn(ctx, conn) })
	var none *coordclient.NoAnswerError
	if !errors.As(err, &none) {
		return err
	}
	last := none.Last()
	switch {
	case none.Ctx != nil:
		return fmt.Errorf("broker: coordinator %s: %w", last.Addr, none.Ctx)
	case last.Err == nil:
		return fmt.Errorf("%w: %w", ErrNoCoordinator, errors.New("no endpoints"))
	}
	return fmt.Errorf("%w: %w", ErrNoCoordinator, last.Err)
}

// moveOn lists the codes after which a catalog call asks the next member.
func moveOn(code codes.Code) bool {
	return code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled
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
	c.client.Close()
}

// Watch follows the replicated state's changes (walden.v1.Watch) through
// the coordinators until ctx ends or fn fails: see coordclient.Client.Watch
// (resumed on another member when a stream breaks, listed again when the
// revision is compacted).
func (c *Coordinators) Watch(ctx context.Context, req *waldenv1.WatchRequest, fn func(*waldenv1.WatchResponse) error) error {
	return c.client.Watch(ctx, req, coordclient.WatchOptions{}, fn)
}
