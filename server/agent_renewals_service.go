package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

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
	d := s.d
	ctx := stream.Context()
	d.decisions.RenewalStreams(1)
	s.streams.Add(1)
	defer func() {
		d.decisions.RenewalStreams(-1)
		s.streams.Add(-1)
	}()
	// The broker id checked last on this stream: an agent renews one.
	var checked string
	// The voters travel once per configuration on a stream: the agent
	// keeps the last ones it was sent.
	var sentConf uint64
	sentVoters := false
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ticket := s.readings.Arrived()
		broker, epoch := req.GetBrokerId(), req.GetEpoch()
		var grant *waldenv1.RenewLeaseResponse
		if broker != checked || epoch == 0 {
			err = checkRenewalRequest(broker, epoch)
		}
		if err == nil {
			checked = broker
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
			resp.Refusal = &waldenv1.RenewalRefusal{Code: uint32(p.Code), Message: p.Message, Reason: string(p.Reason), Metadata: p.Metadata}
		} else {
			if sentVoters && grant.GetConfIndex() == sentConf {
				grant.Voters = nil
			} else {
				sentConf, sentVoters = grant.GetConfIndex(), true
			}
			resp.Grant = grant
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
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
