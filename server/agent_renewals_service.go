package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"walden/config"
	"walden/detect"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/rpcerr"
)

// renewalConfirmTimeout bounds the ReadIndex round that confirms a
// streamed renewal's refusal that may come from lagging behind the log.
const renewalConfirmTimeout = 5 * time.Second

// RenewLeases serves one agent's renewal stream: each request is one
// renewal, answered in order on the stream with RenewLease's grant or
// refusal. The stream's goroutine grants each renewal itself, as it
// arrives: the renewals of all streams granted at about the same time
// share one boot-clock reading taken after they arrived
// (lease.Readings, docs/safety.md), and the refusals that must be
// confirmed share the ReadIndex rounds of every concurrent read
// (raftnode.Node.LinearizableRead). A stream carries one agent's renewals
// to this member for as long as the agent runs; a renewal for another
// broker than its certificate names ends it (PermissionDenied).
func (s *agentService) RenewLeases(stream waldenv1.Agent_RenewLeasesServer) error {
	defer s.renewalsOpened(config.RenewalsStream)()
	ctx := stream.Context()
	var sess renewalSession
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(s.renew(ctx, &sess, req, s.readings.Arrived())); err != nil {
			return err
		}
	}
}

// renewalsOpened counts one more agent's renewal connection open over
// transport (config.RenewalsStream or config.RenewalsFrames, the
// transport label of walden_lease_renewal_streams); the function it
// returns counts it closed.
func (s *agentService) renewalsOpened(transport string) func() {
	s.d.decisions.RenewalStreams(transport, 1)
	s.streams.Add(1)
	return func() {
		s.d.decisions.RenewalStreams(transport, -1)
		s.streams.Add(-1)
	}
}

// renewalSession is what one agent's renewal connection (a stream or a
// framed connection) keeps from one renewal to the next.
type renewalSession struct {
	// checked is the broker id checked last: an agent renews one.
	checked string
	// The voters travel once per configuration on a connection: the
	// agent keeps the last ones it was sent.
	sentConf   uint64
	sentVoters bool
}

// renew answers one renewal of a stream or framed connection, whose
// authorization was checked, that arrived with ticket: RenewLease's grant,
// without the voters the connection was sent for the same configuration,
// or its refusal.
func (s *agentService) renew(ctx context.Context, sess *renewalSession, req *waldenv1.RenewLeasesRequest, ticket lease.Ticket) *waldenv1.RenewLeasesResponse {
	d := s.d
	broker, epoch := req.GetBrokerId(), req.GetEpoch()
	var grant *waldenv1.RenewLeaseResponse
	var err error
	if broker != sess.checked || epoch == 0 {
		err = checkRenewalRequest(broker, epoch)
	}
	if err == nil {
		sess.checked = broker
		grant, err = s.renewStreamed(ctx, broker, epoch, ticket)
	}
	countRenewal(d.decisions, err)
	resp := &waldenv1.RenewLeasesResponse{Seq: req.GetSeq()}
	if err != nil {
		p := rpcerr.Split(err)
		lvl := slog.LevelDebug
		if p.Code == codes.InvalidArgument {
			lvl = slog.LevelInfo
		}
		d.logger.Log(ctx, lvl, "streamed renewal refused", "broker_id", broker, "epoch", epoch, "err", err)
		resp.Refusal = renewalRefusal(err)
		return resp
	}
	if sess.sentVoters && grant.GetConfIndex() == sess.sentConf {
		grant.Voters = nil
	} else {
		sess.sentConf, sess.sentVoters = grant.GetConfIndex(), true
	}
	resp.Grant = grant
	return resp
}

// renewalRefusal is the refusal a stream or framed connection answers for
// err: its gRPC code, message, reason and metadata.
func renewalRefusal(err error) *waldenv1.RenewalRefusal {
	p := rpcerr.Split(err)
	return &waldenv1.RenewalRefusal{Code: uint32(p.Code), Message: p.Message, Reason: string(p.Reason), Metadata: p.Metadata}
}

// renewStreamed grants or refuses one streamed renewal that arrived with
// ticket, by RenewLease's rule: a refusal that may come from this member
// lagging behind the log is confirmed by a ReadIndex round first.
func (s *agentService) renewStreamed(ctx context.Context, broker string, epoch uint64, ticket lease.Ticket) (*waldenv1.RenewLeaseResponse, error) {
	d := s.d
	lagging, err := d.renewalEpoch(broker, epoch)
	if err != nil && !lagging {
		return nil, d.stateErr(ctx, err)
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(ctx, renewalConfirmTimeout)
		err = d.node.LinearizableRead(rctx)
		cancel()
		if err != nil {
			return nil, d.stateErr(ctx, err)
		}
		if err := d.state.CheckBroker(broker, epoch, nil); err != nil {
			return nil, d.stateErr(ctx, err)
		}
	}
	resp, err := detect.GrantAt(d.state, d.grantor, d.nodeID, broker, epoch, s.readings.For(ticket))
	return d.renewalAnswer(ctx, broker, epoch, resp, err)
}
