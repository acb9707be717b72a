package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/webui"
)

// webSource is the web view's Source: this member's services and state.
// Brokers and the policy come from the leader (its lease table and its
// effective policy) when it can be reached, as the API answers them.
type webSource struct {
	admin     *adminService
	brokers   *brokersService
	failovers *failoversService
	state     *fsm.State
}

func (w *webSource) Status(ctx context.Context) (*waldenv1.StatusResponse, error) {
	return w.admin.Status(ctx, &waldenv1.StatusRequest{})
}

func (w *webSource) Brokers(ctx context.Context) ([]*waldenv1.Broker, map[string][]string, error) {
	resp, err := w.brokers.ListBrokers(ctx, &waldenv1.ListBrokersRequest{})
	if err != nil {
		return nil, nil, err
	}
	p, err := w.Policy(ctx)
	if err != nil {
		return resp.GetBrokers(), nil, nil
	}
	var voters []string
	for _, m := range w.admin.node.Status().Members {
		if m.GetRole() != "learner" {
			voters = append(voters, m.GetId())
		}
	}
	holds := holdReasons(holdInput{Policy: p, Voters: voters, Brokers: resp.GetBrokers(),
		RunningRecoveries: w.state.ActiveJobs(), NowUnixMs: time.Now().UnixMilli()})
	return resp.GetBrokers(), holds, nil
}

func (w *webSource) Jobs(context.Context) ([]*waldenv1.Job, error) {
	return w.state.Jobs("", ""), nil
}

func (w *webSource) Failovers(_ context.Context, brokerID string) ([]*waldenv1.Failover, error) {
	return w.failovers.failovers(brokerID), nil
}

func (w *webSource) Failover(_ context.Context, id string) (*waldenv1.Failover, error) {
	f, err := w.failovers.failover(id)
	if status.Code(err) == codes.NotFound {
		return nil, webui.ErrNotFound
	}
	return f, err
}

func (w *webSource) Events(_ context.Context, brokerID string, limit int) ([]*waldenv1.Event, error) {
	return w.state.Events(brokerID, limit), nil
}

func (w *webSource) Policy(ctx context.Context) (*waldenv1.Policy, error) {
	resp, err := w.brokers.GetPolicy(ctx, &waldenv1.GetPolicyRequest{})
	return resp.GetPolicy(), err
}

// webAuthorize decides whether a request to the web view is served. The
// listener's TLS has verified the client certificate (when TLS is on);
// the role it carries must allow reading (the "reader" role, which every
// role above it includes). Until certificates carry roles every identity
// the listener accepted may read.
var webAuthorize = func(r *http.Request) error {
	if r.TLS != nil && len(r.TLS.PeerCertificates) == 0 && len(r.TLS.VerifiedChains) == 0 {
		return errors.New("a client certificate signed by the cluster's CA is needed")
	}
	return nil
}
