package brokertest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// Coordinator is the stand-in. Its methods are safe for concurrent use.
type Coordinator struct {
	// Addr is the gRPC address brokers and clients dial.
	Addr string
	// LeaseTTL is the lease granted at registration and renewal.
	LeaseTTL time.Duration

	srv *grpc.Server

	mu         sync.Mutex
	st         *fsm.State
	index      uint64
	blockRenew map[string]bool
}

// Start serves a Coordinator of cluster on a free 127.0.0.1 port until
// Stop.
func Start(cluster string, leaseTTL time.Duration) (*Coordinator, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("brokertest: %w", err)
	}
	c := &Coordinator{Addr: ln.Addr().String(), LeaseTTL: leaseTTL, srv: grpc.NewServer(), st: fsm.New(cluster), blockRenew: map[string]bool{}}
	waldenv1.RegisterAgentServer(c.srv, agentSvc{c: c})
	waldenv1.RegisterCatalogServer(c.srv, catalogSvc{c: c})
	waldenv1.RegisterBrokersServer(c.srv, brokersSvc{c: c})
	go func() { _ = c.srv.Serve(ln) }()
	return c, nil
}

// Stop stops serving.
func (c *Coordinator) Stop() { c.srv.Stop() }

// State returns the state machine (its read API is safe to call).
func (c *Coordinator) State() *fsm.State { return c.st }

// Apply applies one operation (a message of the Command oneof) as the next
// entry.
func (c *Coordinator) Apply(op any) (*waldenv1.Result, error) {
	cmd := &waldenv1.Command{ProposedUnixMs: time.Now().UnixMilli(), ProposerId: "c1"}
	switch o := op.(type) {
	case *waldenv1.RegisterBroker:
		cmd.Op = &waldenv1.Command_RegisterBroker{RegisterBroker: o}
	case *waldenv1.DeclareFailed:
		cmd.Op = &waldenv1.Command_DeclareFailed{DeclareFailed: o}
	case *waldenv1.OpenStreamRequest:
		cmd.Op = &waldenv1.Command_OpenStream{OpenStream: o}
	case *waldenv1.CommitObjectRequest:
		cmd.Op = &waldenv1.Command_CommitObject{CommitObject: o}
	case *waldenv1.CloseStreamRequest:
		cmd.Op = &waldenv1.Command_CloseStream{CloseStream: o}
	case *waldenv1.FinishJob:
		cmd.Op = &waldenv1.Command_FinishJob{FinishJob: o}
	case *waldenv1.CancelJob:
		cmd.Op = &waldenv1.Command_CancelJob{CancelJob: o}
	default:
		return nil, fmt.Errorf("brokertest: unsupported operation %T", op)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	cmd.RequestId = c.index
	return c.st.Apply(c.index, 1, cmd)
}

func rpcErr(err error) error {
	if err == nil {
		return nil
	}
	return rpcerr.Status(err).Err()
}

// BlockRenewals makes renewals of broker fail (Unavailable) while on, so
// that its lease runs out.
func (c *Coordinator) BlockRenewals(brokerID string, on bool) {
	c.mu.Lock()
	c.blockRenew[brokerID] = on
	c.mu.Unlock()
}

// FailOver fences broker as a failover decision would — only after its
// lease has run out: renewals are refused for LeaseTTL first, as the
// leader waits for lease expiry before deciding — then plays its recovery
// job: the broker's OPENED streams are closed in failover mode
// (nothing is uploaded: the caller makes sure they hold nothing beyond the
// committed end, or accepts losing it) and the job finishes with
// recoveredWAL. It returns the broker's new (fenced) epoch.
func (c *Coordinator) FailOver(brokerID string, recoveredWAL int64) (uint64, error) {
	c.BlockRenewals(brokerID, true)
	time.Sleep(c.LeaseTTL)
	defer c.BlockRenewals(brokerID, false)
	b, ok := c.st.Broker(brokerID)
	if !ok {
		return 0, fmt.Errorf("brokertest: unknown broker %s", brokerID)
	}
	r, err := c.Apply(&waldenv1.DeclareFailed{BrokerId: brokerID, Epoch: b.GetEpoch(),
		Evidence: &waldenv1.Evidence{Manual: true}})
	if err != nil {
		return 0, err
	}
	d := r.GetDeclareFailed()
	fo := &waldenv1.FailoverContext{JobId: d.GetJobId(), Attempt: 1, Token: d.GetNewEpoch()}
	for _, s := range c.st.OpeningStreams(brokerID) {
		if _, err := c.Apply(&waldenv1.CloseStreamRequest{BrokerId: brokerID, BrokerEpoch: d.GetNewEpoch(),
			StreamId: s.GetStreamId(), StreamEpoch: s.GetEpoch(), Failover: fo}); err != nil {
			return 0, err
		}
	}
	if _, err := c.Apply(&waldenv1.FinishJob{JobId: d.GetJobId(), Attempt: 1, JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, RecoveredWalOffset: recoveredWAL}); err != nil {
		return 0, err
	}
	return d.GetNewEpoch(), nil
}

type agentSvc struct {
	waldenv1.UnimplementedAgentServer
	c *Coordinator
}

func (s agentSvc) Register(_ context.Context, req *waldenv1.RegisterRequest) (*waldenv1.RegisterResponse, error) {
	r, err := s.c.Apply(&waldenv1.RegisterBroker{BrokerId: req.GetBrokerId(), AgentAddr: req.GetAgentAddr(),
		BrokerAddr: req.GetBrokerAddr(), Wal: req.GetWal(), GossipName: req.GetGossipName()})
	if err != nil {
		return nil, rpcErr(err)
	}
	rb := r.GetRegisterBroker()
	return &waldenv1.RegisterResponse{BrokerId: req.GetBrokerId(), Epoch: rb.GetEpoch(),
		LeaseTtlMs: s.c.LeaseTTL.Milliseconds(), RecoveredWalOffset: rb.GetRecoveredWalOffset()}, nil
}

func (s agentSvc) RenewLease(_ context.Context, req *waldenv1.RenewLeaseRequest) (*waldenv1.RenewLeaseResponse, error) {
	s.c.mu.Lock()
	blocked := s.c.blockRenew[req.GetBrokerId()]
	s.c.mu.Unlock()
	if blocked {
		return nil, status.Error(codes.Unavailable, "renewals blocked by the test")
	}
	if err := s.c.st.CheckBroker(req.GetBrokerId(), req.GetEpoch(), nil); err != nil {
		return nil, rpcErr(err)
	}
	// The only voter: its grant alone is a majority.
	return &waldenv1.RenewLeaseResponse{Epoch: req.GetEpoch(), LeaseTtlMs: s.c.LeaseTTL.Milliseconds(), LeaderId: "c1",
		CoordinatorId: "c1", Voters: []*waldenv1.Voter{{Id: "c1", AdminAddr: s.c.Addr}}, ConfIndex: 1}, nil
}

type catalogSvc struct {
	waldenv1.UnimplementedCatalogServer
	c *Coordinator
}

func (s catalogSvc) OpenStream(_ context.Context, req *waldenv1.OpenStreamRequest) (*waldenv1.OpenStreamResponse, error) {
	r, err := s.c.Apply(req)
	if err != nil {
		return nil, rpcErr(err)
	}
	return r.GetOpenStream(), nil
}

func (s catalogSvc) CommitObject(_ context.Context, req *waldenv1.CommitObjectRequest) (*waldenv1.CommitObjectResponse, error) {
	r, err := s.c.Apply(req)
	if err != nil {
		return nil, rpcErr(err)
	}
	return r.GetCommitObject(), nil
}

func (s catalogSvc) CloseStream(_ context.Context, req *waldenv1.CloseStreamRequest) (*waldenv1.CloseStreamResponse, error) {
	r, err := s.c.Apply(req)
	if err != nil {
		return nil, rpcErr(err)
	}
	return r.GetCloseStream(), nil
}

func (s catalogSvc) GetOpeningStreams(_ context.Context, req *waldenv1.GetOpeningStreamsRequest) (*waldenv1.GetOpeningStreamsResponse, error) {
	return &waldenv1.GetOpeningStreamsResponse{Streams: s.c.st.OpeningStreams(req.GetBrokerId())}, nil
}

func (s catalogSvc) ListStreams(_ context.Context, req *waldenv1.ListStreamsRequest) (*waldenv1.ListStreamsResponse, error) {
	return &waldenv1.ListStreamsResponse{Streams: s.c.st.Streams(req.GetOwnerBrokerId(), req.GetState())}, nil
}

func (s catalogSvc) DescribeStream(_ context.Context, req *waldenv1.DescribeStreamRequest) (*waldenv1.DescribeStreamResponse, error) {
	st, ok := s.c.st.Stream(req.GetStreamId())
	if !ok {
		return nil, rpcErr(fmt.Errorf("stream %d: %w", req.GetStreamId(), refusal.ErrUnknownStream))
	}
	return &waldenv1.DescribeStreamResponse{Stream: st, Objects: s.c.st.StreamObjects(req.GetStreamId(), req.GetFromOffset(), int(req.GetMaxObjects()))}, nil
}

type brokersSvc struct {
	waldenv1.UnimplementedBrokersServer
	c *Coordinator
}

func (s brokersSvc) GetBroker(_ context.Context, req *waldenv1.GetBrokerRequest) (*waldenv1.GetBrokerResponse, error) {
	b, ok := s.c.st.Broker(req.GetBrokerId())
	if !ok {
		return nil, rpcErr(fmt.Errorf("broker %s: %w", req.GetBrokerId(), refusal.ErrUnknownNode))
	}
	return &waldenv1.GetBrokerResponse{Broker: b}, nil
}

func (s brokersSvc) ListBrokers(context.Context, *waldenv1.ListBrokersRequest) (*waldenv1.ListBrokersResponse, error) {
	return &waldenv1.ListBrokersResponse{Brokers: s.c.st.Brokers()}, nil
}
