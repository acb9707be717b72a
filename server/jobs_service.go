package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"walden/authz"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// jobsState is what the Jobs service reads (*fsm.State).
type jobsState interface {
	Job(id string) (*waldenv1.Job, bool)
	Jobs(brokerID string, state waldenv1.JobState) []*waldenv1.Job
	Changed() <-chan struct{}
}

// jobsService implements walden.v1.Jobs, the operator's view of recovery
// jobs.
type jobsService struct {
	waldenv1.UnimplementedJobsServer
	d     *serviceDeps
	state jobsState
	// liveMembers are the members the leader sees active (RetryJob's
	// candidates).
	liveMembers func() []string
}

// checkJobState refuses a filter that is not a job state. An older client
// names the state in the deprecated string field.
func checkJobState(req *waldenv1.ListJobsRequest) error {
	var le *waldenv1.LegacyNameError
	if err := waldenv1.UpgradeLegacy(req); errors.As(err, &le) {
		return invalidArg(le.Field, fmt.Sprintf("%q is not %s", le.Value, jobStateNames))
	}
	if st := req.GetJobState(); st != waldenv1.JobState_JOB_STATE_UNSPECIFIED {
		if _, ok := waldenv1.Parse[waldenv1.JobState](st.Name()); !ok {
			return invalidArg("job_state", fmt.Sprintf("%s is not %s", st.Name(), jobStateNames))
		}
	}
	return nil
}

// jobStateNames are the job states, for refusals.
const jobStateNames = "pending, running, succeeded, failed or cancelled"

func (s *jobsService) ListJobs(ctx context.Context, req *waldenv1.ListJobsRequest) (*waldenv1.ListJobsResponse, error) {
	if err := checkJobState(req); err != nil {
		return nil, err
	}
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	return &waldenv1.ListJobsResponse{Jobs: s.state.Jobs(req.GetBrokerId(), req.GetJobState())}, nil
}

func (s *jobsService) GetJob(ctx context.Context, req *waldenv1.GetJobRequest) (*waldenv1.GetJobResponse, error) {
	if req.GetJobId() == "" {
		return nil, invalidArg("job_id", "must not be empty")
	}
	if err := s.d.node.LinearizableRead(ctx); err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	j, ok := s.state.Job(req.GetJobId())
	if !ok {
		return nil, rpcerr.Status(fmt.Errorf("job %q: %w", req.GetJobId(), refusal.ErrUnknownJob)).Err()
	}
	return &waldenv1.GetJobResponse{Job: j}, nil
}

// WatchJobs sends the watched jobs at the start and again whenever an
// applied entry changes them, until the client goes away.
func (s *jobsService) WatchJobs(req *waldenv1.WatchJobsRequest, stream grpc.ServerStreamingServer[waldenv1.ListJobsResponse]) error {
	ctx := stream.Context()
	if req.GetJobId() != "" {
		if err := s.d.node.LinearizableRead(ctx); err != nil {
			return s.d.stateErr(ctx, err)
		}
		if _, ok := s.state.Job(req.GetJobId()); !ok {
			return rpcerr.Status(fmt.Errorf("job %q: %w", req.GetJobId(), refusal.ErrUnknownJob)).Err()
		}
	}
	var last *waldenv1.ListJobsResponse
	for {
		changed := s.state.Changed()
		cur := &waldenv1.ListJobsResponse{}
		for _, j := range s.state.Jobs(req.GetBrokerId(), waldenv1.JobState_JOB_STATE_UNSPECIFIED) {
			if req.GetJobId() == "" || j.GetJobId() == req.GetJobId() {
				cur.Jobs = append(cur.Jobs, j)
			}
		}
		if last == nil || !proto.Equal(last, cur) {
			if err := stream.Send(cur); err != nil {
				return err
			}
			last = cur
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

func (s *jobsService) CancelJob(ctx context.Context, req *waldenv1.CancelJobRequest) (*waldenv1.CancelJobResponse, error) {
	if req.GetJobId() == "" {
		return nil, invalidArg("job_id", "must not be empty")
	}
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_CancelJob{CancelJob: &waldenv1.CancelJob{JobId: req.GetJobId(), Actor: authz.Actor(ctx)}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	s.d.logger.WarnContext(ctx, "job cancelled", "job_id", req.GetJobId(), "broker_id", res.GetJob().GetBrokerId(), "actor", authz.Actor(ctx))
	return &waldenv1.CancelJobResponse{Job: res.GetJob()}, nil
}

// RetryJob starts a failed or cancelled job again; the leader proposes it
// with the members it sees live (a follower forwards).
func (s *jobsService) RetryJob(ctx context.Context, req *waldenv1.RetryJobRequest) (*waldenv1.RetryJobResponse, error) {
	if req.GetJobId() == "" {
		return nil, invalidArg("job_id", "must not be empty")
	}
	leader, st := s.d.isLeader()
	if !leader {
		return forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.RetryJobResponse, error) {
			return waldenv1.NewJobsClient(c).RetryJob(ctx, req)
		})
	}
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_RetryJob{RetryJob: &waldenv1.RetryJob{
		JobId: req.GetJobId(), Actor: authz.Actor(ctx), LiveMembers: s.liveMembers()}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	s.d.logger.WarnContext(ctx, "job retried", "actor", authz.Actor(ctx), "job_id", req.GetJobId(), "attempt", res.GetJob().GetAttempt(), "assignee_id", res.GetJob().GetAssigneeId())
	return &waldenv1.RetryJobResponse{Job: res.GetJob()}, nil
}

// ResolveJob is an operator's resolution of a blocked or failed job: a new
// attempt, recorded with the reason as an event; with wal_lost it reads
// nothing from the broker's WAL. The leader proposes it with the members it
// sees live (a follower forwards).
func (s *jobsService) ResolveJob(ctx context.Context, req *waldenv1.ResolveJobRequest) (*waldenv1.ResolveJobResponse, error) {
	if req.GetJobId() == "" {
		return nil, invalidArg("job_id", "must not be empty")
	}
	if strings.TrimSpace(req.GetReason()) == "" {
		return nil, invalidArg("reason", "must not be empty: a resolution is recorded with its reason (--reason)")
	}
	leader, st := s.d.isLeader()
	if !leader {
		return forwardToLeader(ctx, s.d, st, func(ctx context.Context, c *grpc.ClientConn) (*waldenv1.ResolveJobResponse, error) {
			return waldenv1.NewJobsClient(c).ResolveJob(ctx, req)
		})
	}
	res, err := s.d.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_ResolveJob{ResolveJob: &waldenv1.ResolveJob{
		JobId: req.GetJobId(), Reason: req.GetReason(), Actor: authz.Actor(ctx), WalLost: req.GetWalLost(), LiveMembers: s.liveMembers()}}})
	if err != nil {
		return nil, s.d.stateErr(ctx, err)
	}
	s.d.logger.WarnContext(ctx, "job resolved", "actor", authz.Actor(ctx), "job_id", req.GetJobId(), "reason", req.GetReason(),
		"wal_lost", req.GetWalLost(), "attempt", res.GetJob().GetAttempt(), "assignee_id", res.GetJob().GetAssigneeId())
	return &waldenv1.ResolveJobResponse{Job: res.GetJob()}, nil
}
