package server

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/detect"
	"walden/fsm"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
	"walden/refusal"
	"walden/rpcerr"
	"walden/webui"
)

// packageChain matches a Go package prefix ("fsm: ", "detect: ") at the
// start of a message or after a colon.
var packageChain = regexp.MustCompile(`(^|: )(fsm|detect|raftnode|server|fencing|refusal|rpcerr|policy|lease|recovery): `)

// TestRefusalMessages: the refusals a client reads carry their reason, the
// code of rpcerr's table, and a message that starts with the reason and
// holds no Go package chain, as they are built.
func TestRefusalMessages(t *testing.T) {
	st := fsm.New("demo")
	index := uint64(0)
	apply := func(op *waldenv1.Command) error {
		index++
		_, err := st.Apply(index, 1, op)
		return err
	}
	unknown := apply(&waldenv1.Command{Op: &waldenv1.Command_AckBroker{AckBroker: &waldenv1.AckBroker{BrokerId: "b9"}}})
	invalidCmd := apply(&waldenv1.Command{Op: &waldenv1.Command_RegisterBroker{RegisterBroker: &waldenv1.RegisterBroker{}}})
	d := &serviceDeps{nodeID: "c1", logger: slog.New(slog.DiscardHandler)}
	_, _, noLeader := d.leaderConn(t.Context(), raftnode.Status{})
	a := &adminService{}
	member := func(err error) error { return a.toStatus(t.Context(), err) }
	_, notSeeded := d.renewalAnswer(t.Context(), "b1", 1, nil, detect.ErrNotSeeded)
	_, notVoter := d.renewalAnswer(t.Context(), "b1", 1, nil, detect.ErrNotVoter)
	_, starting := d.renewalAnswer(t.Context(), "b1", 1, nil, lease.ErrQuiet)
	_, startingFor := d.renewalAnswer(t.Context(), "b1", 1, nil, &lease.QuietError{Remaining: 1500*time.Millisecond + time.Microsecond})
	_, unsaved := d.renewalAnswer(t.Context(), "b1", 1, nil, fmt.Errorf("save: %w", lease.ErrStore))
	for _, tc := range []struct {
		name   string
		err    error
		reason refusal.Reason
		code   codes.Code
		msg    string
	}{
		{"state machine: unknown broker", rpcerr.Err(unknown), refusal.UnknownNode, codes.NotFound, `UNKNOWN_NODE: ack: broker "b9": unknown node`},
		{"broker not registered", notRegistered("b9"), refusal.UnknownNode, codes.NotFound, `UNKNOWN_NODE: broker "b9" is not registered`},
		{"policy not seeded", rpcerr.Err(refusal.ErrPolicyNotSeeded), refusal.PolicyNotSeeded, codes.Unavailable,
			"POLICY_NOT_SEEDED: the cluster's policy is not seeded yet: no leader has been elected since the cluster was founded"},
		{"lease of an unseeded cluster", notSeeded, refusal.PolicyNotSeeded, codes.Unavailable,
			"POLICY_NOT_SEEDED: lease not granted: the cluster's policy is not seeded yet: no leader has been elected since the cluster was founded"},
		{"lease from a learner", notVoter, refusal.LeaseNotGranted, codes.Unavailable,
			"LEASE_NOT_GRANTED: lease not granted: c1 is not a voting member"},
		{"lease from a member in its quiet period", starting, refusal.LeaseNotGranted, codes.Unavailable,
			"LEASE_NOT_GRANTED: lease not granted: c1 started less than a lease ago and waits out the leases it may have granted before (" + lease.ErrQuiet.Error() + ")"},
		{"lease from a member in its quiet period, with what is left of it", startingFor, refusal.LeaseNotGranted, codes.Unavailable,
			"LEASE_NOT_GRANTED: lease not granted: c1 started less than a lease ago and waits out the leases it may have granted before (" + lease.ErrQuiet.Error() + " (1.5s more))"},
		{"lease that cannot be saved", unsaved, refusal.LeaseNotGranted, codes.Unavailable,
			"LEASE_NOT_GRANTED: lease not granted: c1 cannot save its lease state"},
		{"no leader to forward to", noLeader, refusal.NoLeader, codes.Unavailable, "no leader"},
		{"state machine: malformed command", rpcerr.Err(invalidCmd), refusal.InvalidArgument, codes.InvalidArgument,
			"INVALID_ARGUMENT: register broker: broker_id is empty: invalid argument"},
		{"unknown member", member(&raftnode.MemberError{Op: "remove member", ID: "c9", Err: raftnode.ErrUnknownMember}),
			refusal.MemberNotFound, codes.NotFound, `remove member "c9": no member has that id`},
		{"last voter", member(&raftnode.MemberError{Op: "remove member", ID: "c1", Err: raftnode.ErrLastVoter}),
			refusal.LastVoter, codes.FailedPrecondition, `remove member "c1": it is the last voter: the cluster could decide nothing without it`},
		{"learner cannot lead", member(&raftnode.MemberError{Op: "transfer leadership to", ID: "c4", Err: raftnode.ErrNotVoter}),
			refusal.NotVoter, codes.FailedPrecondition, `transfer leadership to "c4": it is a learner, not a voter`},
		{"proposal dropped", member(fmt.Errorf("%w: add member c4", raftnode.ErrProposalDropped)),
			refusal.ProposalDropped, codes.Unavailable, "the proposal was dropped (a leadership change); retrying is safe"},
		{"voter change too soon", member(&raftnode.VoterChangeTooSoonError{Op: "promote member c4", Wait: 4 * time.Second, Left: time.Second}),
			refusal.VoterChangeTooSoon, codes.FailedPrecondition, "promote member c4 refused: the previous change of the voters was 3s ago, and voter " +
				"changes are spaced by 4s (the longest lease_ttl + drift_margin the cluster has used), so that no broker lease granted under " +
				"the configuration before it is still running; try again in 1s"},
	} {
		s := status.Convert(tc.err)
		if rpcerr.Reason(tc.err) != tc.reason || s.Code() != tc.code || s.Message() != tc.msg {
			t.Errorf("%s: %s %s %q, want %s %s %q", tc.name, rpcerr.Reason(tc.err), s.Code(), s.Message(), tc.reason, tc.code, tc.msg)
		}
		if packageChain.MatchString(s.Message()) {
			t.Errorf("%s: %q holds a package chain", tc.name, s.Message())
		}
	}
	// A quiet period's refusal says when to ask again, rounded up to the
	// millisecond; without the time left it says only the cause.
	if md := rpcerr.Split(startingFor).Metadata; md["cause"] != "starting" || md["retry_after_ms"] != "1501" {
		t.Errorf("quiet period's refusal metadata %v, want cause starting and retry_after_ms 1501", md)
	}
	if md := rpcerr.Split(starting).Metadata; md["cause"] != "starting" || md["retry_after_ms"] != "" {
		t.Errorf("quiet period's refusal without its time left: metadata %v", md)
	}
	// The web view shows the message the service built, not gRPC's chain.
	if err := webErr(rpcerr.Err(refusal.ErrPolicyNotSeeded)); err.Error() != "POLICY_NOT_SEEDED: the cluster's policy is not seeded yet: "+
		"no leader has been elected since the cluster was founded" {
		t.Errorf("web view: %q", err)
	}
	if err := webErr(notRegistered("b9")); !errors.Is(err, webui.ErrNotFound) {
		t.Errorf("web view: %v is not webui.ErrNotFound", err)
	}
	if !errors.Is(detect.ErrNotSeeded, refusal.ErrPolicyNotSeeded) {
		t.Error("detect.ErrNotSeeded is not the refusal POLICY_NOT_SEEDED")
	}
}
