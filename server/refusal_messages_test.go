package server

import (
	"errors"
	"regexp"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/detect"
	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// packageChain matches a Go package prefix ("fsm: ", "detect: ") at the
// start of a message or after a colon.
var packageChain = regexp.MustCompile(`(^|: )(fsm|detect|raftnode|server|fencing|refusal|rpcerr|policy|lease|recovery): `)

// TestRefusalMessages: the refusals a client reads carry their reason, the
// code of rpcerr's table, and a message that starts with the reason and
// holds no Go package chain, as they are built.
func TestRefusalMessages(t *testing.T) {
	st := fsm.New("demo")
	apply := func(op *waldenv1.Command) error {
		_, err := st.Apply(1, 1, op)
		return err
	}
	unknown := apply(&waldenv1.Command{Op: &waldenv1.Command_AckBroker{AckBroker: &waldenv1.AckBroker{BrokerId: "b9"}}})
	d := &serviceDeps{nodeID: "c1"}
	_, notSeeded := d.renewalAnswer(t.Context(), "b1", 1, nil, detect.ErrNotSeeded)
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
	} {
		s := status.Convert(tc.err)
		if rpcerr.Reason(tc.err) != tc.reason || s.Code() != tc.code || s.Message() != tc.msg {
			t.Errorf("%s: %s %s %q, want %s %s %q", tc.name, rpcerr.Reason(tc.err), s.Code(), s.Message(), tc.reason, tc.code, tc.msg)
		}
		if packageChain.MatchString(s.Message()) {
			t.Errorf("%s: %q holds a package chain", tc.name, s.Message())
		}
	}
	if !errors.Is(detect.ErrNotSeeded, refusal.ErrPolicyNotSeeded) {
		t.Error("detect.ErrNotSeeded is not the refusal POLICY_NOT_SEEDED")
	}
}
