package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/webui"
)

// webSource is the web view's Source: this member's services and state.
// Brokers come from the leader (with its hold reasons) when it can be
// reached, as the API answers them.
type webSource struct {
	admin     *adminService
	brokers   *brokersService
	failovers *failoversService
	state     *fsm.State
}

func (w *webSource) Status(ctx context.Context) (*waldenv1.StatusResponse, error) {
	resp, err := w.admin.Status(ctx, &waldenv1.StatusRequest{})
	return resp, webErr(err)
}

func (w *webSource) Brokers(ctx context.Context) ([]*waldenv1.Broker, map[string][]string, error) {
	resp, err := w.brokers.ListBrokers(ctx, &waldenv1.ListBrokersRequest{})
	if err != nil {
		return nil, nil, webErr(err)
	}
	return resp.GetBrokers(), holdsOf(resp.GetBrokers()), nil
}

func (w *webSource) Jobs(context.Context) ([]*waldenv1.Job, error) {
	return w.state.Jobs("", waldenv1.JobState_JOB_STATE_UNSPECIFIED), nil
}

func (w *webSource) Failovers(_ context.Context, brokerID string) ([]*waldenv1.Failover, error) {
	return w.failovers.failovers(brokerID), nil
}

func (w *webSource) Failover(_ context.Context, id string) (*waldenv1.Failover, error) {
	f, err := w.failovers.failover(id)
	return f, webErr(err)
}

func (w *webSource) Events(_ context.Context, brokerID string, limit int) ([]*waldenv1.Event, error) {
	return w.state.Events(brokerID, limit), nil
}

func (w *webSource) Policy(ctx context.Context) (*waldenv1.Policy, error) {
	resp, err := w.brokers.GetPolicy(ctx, &waldenv1.GetPolicyRequest{})
	return resp.GetPolicy(), webErr(err)
}

// webErr is a service's refusal as the web view shows it: the message the
// service built (a sentence that starts with the refusal's reason), not
// gRPC's "rpc error: code = … desc = …"; a NotFound is webui.ErrNotFound
// (the view answers 404).
func webErr(err error) error {
	s, ok := status.FromError(err)
	switch {
	case err == nil || !ok:
		return err
	case s.Code() == codes.NotFound:
		return webui.ErrNotFound
	}
	return errors.New(s.Message())
}

// webMethods are the read calls whose answers the web view shows: an
// identity may see the view when the authorization table lets it make every
// one of them (the reader role and the roles above it).
var webMethods = []string{
	waldenv1.Cluster_Status_FullMethodName, waldenv1.Brokers_ListBrokers_FullMethodName,
	waldenv1.Brokers_ListEvents_FullMethodName, waldenv1.Brokers_GetPolicy_FullMethodName,
	waldenv1.Jobs_ListJobs_FullMethodName, waldenv1.Failovers_ListFailovers_FullMethodName,
	waldenv1.Failovers_GetFailover_FullMethodName,
}

// webAuthorize decides whether a request to the web view is served, as the
// gRPC API decides (package authz): with TLS off every caller is anonymous
// and allowed; with TLS on the listener has verified the client
// certificate, whose role must allow the reads the view makes. The identity
// goes into the request's context, so that a call forwarded to the leader
// names it.
func webAuthorize(r *http.Request) (context.Context, error) {
	if r.TLS == nil {
		return r.Context(), nil
	}
	if len(r.TLS.PeerCertificates) == 0 {
		return nil, errors.New("a client certificate signed by the cluster's CA is needed")
	}
	id, err := authz.FromCertificate(r.TLS.PeerCertificates[0])
	if err != nil {
		return nil, err
	}
	for _, m := range webMethods {
		if rule, ok := authz.Lookup(m); !ok || !rule.Allows(id.Role) {
			return nil, fmt.Errorf("%s may not read the cluster's state: the web view needs the reader role", id)
		}
	}
	return authz.NewContext(r.Context(), id), nil
}
