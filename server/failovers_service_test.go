package server

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
	"walden/rpcerr"
)

type fakeFailoverState struct {
	jobs    []*waldenv1.Job
	brokers map[string]*waldenv1.Broker
	events  []*waldenv1.Event
}

func (f *fakeFailoverState) Job(id string) (*waldenv1.Job, bool) {
	for _, j := range f.jobs {
		if j.GetJobId() == id {
			return j, true
		}
	}
	return nil, false
}

func (f *fakeFailoverState) Jobs(brokerID string, _ waldenv1.JobState) []*waldenv1.Job {
	var out []*waldenv1.Job
	for _, j := range f.jobs {
		if brokerID == "" || j.GetBrokerId() == brokerID {
			out = append(out, j)
		}
	}
	return out
}

func (f *fakeFailoverState) Broker(id string) (*waldenv1.Broker, bool) {
	b, ok := f.brokers[id]
	return b, ok
}

func (f *fakeFailoverState) Events(brokerID string, _ int) []*waldenv1.Event {
	var out []*waldenv1.Event
	for _, e := range f.events {
		if e.GetBrokerId() == brokerID {
			out = append(out, e)
		}
	}
	return out
}

func TestFailoversService(t *testing.T) {
	st := &fakeFailoverState{
		jobs: []*waldenv1.Job{
			{JobId: "job-b1-4", BrokerId: "b1", Token: 4, JobState: waldenv1.JobState_JOB_STATE_SUCCEEDED, AssigneeId: "c2", CreatedUnixMs: 1000},
			{JobId: "job-b2-6", BrokerId: "b2", Token: 6, JobState: waldenv1.JobState_JOB_STATE_RUNNING, JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD, AssigneeId: "c3", CreatedUnixMs: 2000},
			{JobId: "job-b1-9", BrokerId: "b1", Token: 9, JobState: waldenv1.JobState_JOB_STATE_RUNNING, JobStep: waldenv1.JobStep_JOB_STEP_READ, AssigneeId: "c1", CreatedUnixMs: 3000},
		},
		brokers: map[string]*waldenv1.Broker{"b1": {BrokerId: "b1", LastJobId: "job-b1-9"}, "b3": {BrokerId: "b3"}},
		events: []*waldenv1.Event{{Index: 5, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", JobId: "job-b1-4", Actor: "c1", UnixMs: 990,
			Message: "declared failed: epoch 2 fenced, new epoch 4", Evidence: &waldenv1.Evidence{DecidedBy: "c1"}}},
	}
	s := &failoversService{state: st}
	ctx := context.Background()
	all, err := s.ListFailovers(ctx, &waldenv1.ListFailoversRequest{})
	if err != nil || len(all.GetFailovers()) != 3 {
		t.Fatalf("list: %v %v", all, err)
	}
	b1, _ := s.ListFailovers(ctx, &waldenv1.ListFailoversRequest{BrokerId: "b1"})
	if len(b1.GetFailovers()) != 2 || b1.GetFailovers()[0].GetOldEpoch() != 2 || b1.GetFailovers()[0].GetDecidedBy() != "c1" {
		t.Fatalf("b1: %v", b1)
	}
	for id, want := range map[string]string{"job-b2-6": "job-b2-6", "b1": "job-b1-9"} {
		got, err := s.GetFailover(ctx, &waldenv1.GetFailoverRequest{Id: id})
		if err != nil || got.GetFailover().GetId() != want {
			t.Errorf("get %s: %v %v", id, got, err)
		}
	}
	for id, code := range map[string]codes.Code{"": codes.InvalidArgument, "b3": codes.NotFound, "job-x": codes.NotFound} {
		_, err := s.GetFailover(ctx, &waldenv1.GetFailoverRequest{Id: id})
		if status.Code(err) != code {
			t.Errorf("get %q: %v, want %s", id, err, code)
		}
		if code == codes.NotFound && rpcerr.Reason(err) != "JOB_NOT_FOUND" {
			t.Errorf("get %q: reason %q", id, rpcerr.Reason(err))
		}
	}
}
