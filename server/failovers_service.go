package server

import (
	"context"
	"fmt"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/timeline"
)

// failoversState is what the Failovers service reads (*fsm.State).
type failoversState interface {
	Job(id string) (*waldenv1.Job, bool)
	Jobs(brokerID string, state waldenv1.JobState) []*waldenv1.Job
	Broker(id string) (*waldenv1.Broker, bool)
	Events(brokerID string, limit int) []*waldenv1.Event
}

// failoversService implements walden.v1.Failovers: each failover told as a
// timeline (package timeline) from this member's replicated state.
type failoversService struct {
	waldenv1.UnimplementedFailoversServer
	state failoversState
}

// failovers returns the timelines of the failovers of broker brokerID (all
// when empty), oldest first.
func (s *failoversService) failovers(brokerID string) []*waldenv1.Failover {
	var out []*waldenv1.Failover
	events := map[string][]*waldenv1.Event{}
	for _, j := range s.state.Jobs(brokerID, waldenv1.JobState_JOB_STATE_UNSPECIFIED) {
		evs, ok := events[j.GetBrokerId()]
		if !ok {
			evs = s.state.Events(j.GetBrokerId(), 0)
			events[j.GetBrokerId()] = evs
		}
		out = append(out, timeline.Build(j, evs))
	}
	return out
}

// failover returns the timeline of the failover whose recovery job is id,
// or of the last failover of broker id.
func (s *failoversService) failover(id string) (*waldenv1.Failover, error) {
	j, ok := s.state.Job(id)
	if !ok {
		if b, isBroker := s.state.Broker(id); isBroker && b.GetLastJobId() != "" {
			j, ok = s.state.Job(b.GetLastJobId())
		}
	}
	if !ok {
		return nil, rpcerr.Status(fmt.Errorf("failover %q: %w", id, refusal.ErrUnknownJob)).Err()
	}
	return timeline.Build(j, s.state.Events(j.GetBrokerId(), 0)), nil
}

func (s *failoversService) ListFailovers(_ context.Context, req *waldenv1.ListFailoversRequest) (*waldenv1.ListFailoversResponse, error) {
	return &waldenv1.ListFailoversResponse{Failovers: s.failovers(req.GetBrokerId())}, nil
}

func (s *failoversService) GetFailover(_ context.Context, req *waldenv1.GetFailoverRequest) (*waldenv1.GetFailoverResponse, error) {
	if req.GetId() == "" {
		return nil, invalidArg("id", "must not be empty: give a recovery job's id or a broker's")
	}
	f, err := s.failover(req.GetId())
	if err != nil {
		return nil, err
	}
	return &waldenv1.GetFailoverResponse{Failover: f}, nil
}
