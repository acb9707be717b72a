package authz_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/certs"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

var testCA = func() *certs.CA {
	ca, err := certs.NewCA("test CA", 0)
	if err != nil {
		panic(err)
	}
	return ca
}()

func certOf(t *testing.T, id authz.Identity) *x509.Certificate {
	t.Helper()
	certPEM, _, err := testCA.Issue(certs.Request{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// peerCtx is the context of a call from a peer that presented c (nil: no
// certificate), with incoming metadata md.
func peerCtx(c *x509.Certificate, md ...string) context.Context {
	st := tls.ConnectionState{}
	if c != nil {
		st.VerifiedChains = [][]*x509.Certificate{{c, testCA.Cert}}
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{
		Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}, AuthInfo: credentials.TLSInfo{State: st},
	})
	return metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
}

var (
	alice    = authz.Identity{Name: "alice", Role: authz.RoleOperator}
	grafana  = authz.Identity{Name: "grafana", Role: authz.RoleReader}
	agentB1  = authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}
	brokerB1 = authz.Identity{Name: "b1", Role: authz.RoleBroker, BrokerID: "b1"}
	c2       = authz.Identity{Name: "c2", Role: authz.RoleCoordinator}
)

func TestFromCertificate(t *testing.T) {
	for _, id := range []authz.Identity{alice, grafana, agentB1, brokerB1, c2, {Name: "root", Role: authz.RoleAdmin}} {
		got, err := authz.FromCertificate(certOf(t, id))
		if err != nil || got != id {
			t.Errorf("%v: got %+v %v", id, got, err)
		}
	}
	bad := map[string]pkix.Name{
		"no role":                {CommonName: "x", Organization: []string{"Acme Corp"}},
		"two roles":              {CommonName: "x", Organization: []string{"walden:reader", "walden:admin"}},
		"unknown role":           {CommonName: "x", Organization: []string{"walden:root"}},
		"agent without broker":   {CommonName: "x", Organization: []string{"walden:agent"}},
		"reader with a broker":   {CommonName: "x", Organization: []string{"walden:reader"}, OrganizationalUnit: []string{"walden:broker-id:b1"}},
		"broker with two ids":    {CommonName: "x", Organization: []string{"walden:broker"}, OrganizationalUnit: []string{"walden:broker-id:b1", "walden:broker-id:b2"}},
		"name with a slash":      {CommonName: "x/y", Organization: []string{"walden:reader"}},
		"empty name":             {Organization: []string{"walden:reader"}},
		"broker id with a space": {CommonName: "x", Organization: []string{"walden:broker"}, OrganizationalUnit: []string{"walden:broker-id:b 1"}},
	}
	for name, subj := range bad {
		_, err := authz.FromCertificate(&x509.Certificate{Subject: subj})
		var ie *authz.IdentityError
		if !errors.Is(err, authz.ErrNoIdentity) || !errors.As(err, &ie) || strings.Contains(ie.Reason, "authz:") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func denied(t *testing.T, err error, code codes.Code, parts ...string) {
	t.Helper()
	s := status.Convert(err)
	if s.Code() != code {
		t.Fatalf("code %v (%v), want %v", s.Code(), err, code)
	}
	for _, p := range parts {
		if !strings.Contains(s.Message(), p) {
			t.Fatalf("message %q lacks %q", s.Message(), p)
		}
	}
	if strings.Contains(s.Message(), "authz:") {
		t.Fatalf("message %q carries a package prefix", s.Message())
	}
	if code == codes.PermissionDenied {
		var info *errdetails.ErrorInfo
		for _, d := range s.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		if info == nil || info.GetReason() != string(refusal.PermissionDenied) || info.GetMetadata()["method"] == "" {
			t.Fatalf("details %v", s.Details())
		}
	}
}

func TestAuthorize(t *testing.T) {
	a := &authz.Authorizer{Secure: true}
	failover := waldenv1.Brokers_Failover_FullMethodName
	renew := waldenv1.Agent_RenewLease_FullMethodName

	id, err := a.Authorize(peerCtx(certOf(t, alice)), failover, &waldenv1.FailoverRequest{BrokerId: "b1"})
	if err != nil || id != alice {
		t.Fatalf("operator failover: %v %v", id, err)
	}
	_, err = a.Authorize(peerCtx(certOf(t, grafana)), failover, &waldenv1.FailoverRequest{BrokerId: "b1"})
	denied(t, err, codes.PermissionDenied, `"grafana" (reader)`, failover, "operator or admin")

	// Agents act for their own broker only.
	if _, err := a.Authorize(peerCtx(certOf(t, agentB1)), renew, &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: 3}); err != nil {
		t.Fatal(err)
	}
	_, err = a.Authorize(peerCtx(certOf(t, agentB1)), renew, &waldenv1.RenewLeaseRequest{BrokerId: "b2", Epoch: 3})
	denied(t, err, codes.PermissionDenied, `"b1-agent" (agent of broker b1)`, renew, `broker "b2"`)
	_, err = a.Authorize(peerCtx(certOf(t, agentB1)), waldenv1.Catalog_CommitObject_FullMethodName, &waldenv1.CommitObjectRequest{BrokerId: "b1"})
	denied(t, err, codes.PermissionDenied, "needs the role broker")
	if _, err := a.Authorize(peerCtx(certOf(t, brokerB1)), waldenv1.Catalog_CommitObject_FullMethodName, &waldenv1.CommitObjectRequest{BrokerId: "b1"}); err != nil {
		t.Fatal(err)
	}
	// A reader's GetOpeningStreams is not bound; a broker's is.
	if _, err := a.Authorize(peerCtx(certOf(t, grafana)), waldenv1.Catalog_GetOpeningStreams_FullMethodName, &waldenv1.GetOpeningStreamsRequest{BrokerId: "b9"}); err != nil {
		t.Fatal(err)
	}
	_, err = a.Authorize(peerCtx(certOf(t, brokerB1)), waldenv1.Catalog_GetOpeningStreams_FullMethodName, &waldenv1.GetOpeningStreamsRequest{BrokerId: "b9"})
	denied(t, err, codes.PermissionDenied, `broker "b9"`)

	// Unknown methods are refused to everyone, admins included.
	_, err = a.Authorize(peerCtx(certOf(t, authz.Identity{Name: "root", Role: authz.RoleAdmin})), "/walden.v1.Brokers/Unknown", &waldenv1.ListBrokersRequest{})
	denied(t, err, codes.PermissionDenied, "not in the authorization table")

	// No certificate; a certificate without a role.
	_, err = a.Authorize(peerCtx(nil), failover, &waldenv1.FailoverRequest{})
	denied(t, err, codes.Unauthenticated, "no verified client certificate", failover)
	noRole := &x509.Certificate{Subject: pkix.Name{CommonName: "web", Organization: []string{"Acme"}}}
	_, err = a.Authorize(peerCtx(noRole), waldenv1.Cluster_Status_FullMethodName, &waldenv1.StatusRequest{})
	denied(t, err, codes.PermissionDenied, `"web" carries no walden identity`, waldenv1.Cluster_Status_FullMethodName)

	// Without TLS every caller is anonymous and allowed.
	id, err = (&authz.Authorizer{}).Authorize(context.Background(), failover, &waldenv1.FailoverRequest{})
	if err != nil || !id.IsAnonymous() {
		t.Fatalf("insecure: %v %v", id, err)
	}
}

// TestForwardedCaller: a coordinator stands for the caller it names; anyone
// else naming a caller is judged as itself.
func TestForwardedCaller(t *testing.T) {
	a := &authz.Authorizer{Secure: true}
	failover := waldenv1.Brokers_Failover_FullMethodName
	req := &waldenv1.FailoverRequest{BrokerId: "b1"}
	fwd := func(id authz.Identity) []string {
		md := []string{authz.MetadataCallerName, id.Name, authz.MetadataCallerRole, string(id.Role)}
		if id.BrokerID != "" {
			md = append(md, authz.MetadataCallerBrokerID, id.BrokerID)
		}
		return md
	}

	id, err := a.Authorize(peerCtx(certOf(t, c2), fwd(alice)...), failover, req)
	if err != nil || id.Name != "alice" || id.Role != authz.RoleOperator || id.Via != "c2" {
		t.Fatalf("operator via c2: %+v %v", id, err)
	}
	_, err = a.Authorize(peerCtx(certOf(t, c2), fwd(grafana)...), failover, req)
	denied(t, err, codes.PermissionDenied, `"grafana" (reader, forwarded by c2)`)
	_, err = a.Authorize(peerCtx(certOf(t, c2), fwd(agentB1)...), waldenv1.Agent_RenewLease_FullMethodName, &waldenv1.RenewLeaseRequest{BrokerId: "b2"})
	denied(t, err, codes.PermissionDenied, `broker "b2"`)
	// The coordinator itself may not fail brokers over.
	_, err = a.Authorize(peerCtx(certOf(t, c2)), failover, req)
	denied(t, err, codes.PermissionDenied, `"c2" (coordinator)`)
	// A reader claiming to forward an operator's call is still a reader.
	_, err = a.Authorize(peerCtx(certOf(t, grafana), fwd(alice)...), failover, req)
	denied(t, err, codes.PermissionDenied, `"grafana" (reader)`)
	// A malformed forwarded caller is refused.
	_, err = a.Authorize(peerCtx(certOf(t, c2), authz.MetadataCallerName, "eve", authz.MetadataCallerRole, "root"), failover, req)
	denied(t, err, codes.PermissionDenied, `invalid caller "eve"`)

	// The client interceptor writes the caller of the handler's context.
	var out metadata.MD
	ctx := authz.NewContext(context.Background(), agentB1)
	if err := authz.ForwardUnary()(ctx, waldenv1.Agent_RenewLease_FullMethodName, nil, nil, nil, func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		out, _ = metadata.FromOutgoingContext(ctx)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out.Get(authz.MetadataCallerName)[0] != "b1-agent" || out.Get(authz.MetadataCallerRole)[0] != "agent" || out.Get(authz.MetadataCallerBrokerID)[0] != "b1" {
		t.Fatalf("forwarded metadata %v", out)
	}
}

func TestCheckMember(t *testing.T) {
	ctx := authz.NewContext(context.Background(), authz.Identity{Name: "c2", Role: authz.RoleCoordinator})
	if err := authz.CheckMember(ctx, "c2"); err != nil {
		t.Fatal(err)
	}
	denied(t, authz.CheckMember(ctx, "c3"), codes.PermissionDenied, `"c2" (coordinator)`, `member "c3"`)
	if err := authz.CheckMember(authz.NewContext(context.Background(), authz.Anonymous), "c3"); err != nil {
		t.Fatalf("insecure: %v", err)
	}
}

// TestTableIsWellFormed: every rule names at least one known role, and
// broker-bound rules only methods whose requests name a broker.
func TestTableIsWellFormed(t *testing.T) {
	for _, m := range authz.Methods() {
		r, _ := authz.Lookup(m)
		if len(r.Roles) == 0 {
			t.Errorf("%s: no role", m)
		}
		for _, role := range r.Roles {
			if _, err := authz.ParseRole(string(role)); err != nil {
				t.Errorf("%s: %v", m, err)
			}
		}
	}
}

// TestFailoverContextOnlyFromCoordinators is finding 3 of the hardening
// table: the failover context's token is the broker's readable epoch and
// its job id predictable, so a fenced broker's certificate could commit or
// close its own streams in failover mode while its recovery ran. Only a
// coordinator acting for itself may send one; everyone else is refused,
// naming the method and the identity.
func TestFailoverContextOnlyFromCoordinators(t *testing.T) {
	a := &authz.Authorizer{Secure: true}
	fo := &waldenv1.FailoverContext{JobId: "job-b1-4", Attempt: 1, Token: 4}
	for _, m := range []struct {
		method string
		req    any
	}{
		{waldenv1.Catalog_CommitObject_FullMethodName, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: 4, Failover: fo}},
		{waldenv1.Catalog_CloseStream_FullMethodName, &waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: 4, StreamId: 1, StreamEpoch: 1, Failover: fo}},
		{waldenv1.Catalog_GetOpeningStreams_FullMethodName, &waldenv1.GetOpeningStreamsRequest{BrokerId: "b1", BrokerEpoch: 4, Failover: fo}},
	} {
		_, err := a.Authorize(peerCtx(certOf(t, brokerB1)), m.method, m.req)
		denied(t, err, codes.PermissionDenied, `"b1" (broker of broker b1)`, m.method, "failover context", "coordinator")
	}
	// A reader may read the opening streams, not in failover mode.
	_, err := a.Authorize(peerCtx(certOf(t, grafana)), waldenv1.Catalog_GetOpeningStreams_FullMethodName,
		&waldenv1.GetOpeningStreamsRequest{BrokerId: "b1", BrokerEpoch: 4, Failover: fo})
	denied(t, err, codes.PermissionDenied, `"grafana" (reader)`, "failover context")
	// Without one the broker's own calls pass as before.
	if _, err := a.Authorize(peerCtx(certOf(t, brokerB1)), waldenv1.Catalog_CloseStream_FullMethodName,
		&waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: 4, StreamId: 1, StreamEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	// Without TLS there is no identity to tell (insecure allows all).
	if _, err := (&authz.Authorizer{}).Authorize(context.Background(), waldenv1.Catalog_CloseStream_FullMethodName,
		&waldenv1.CloseStreamRequest{BrokerId: "b1", Failover: fo}); err != nil {
		t.Fatal(err)
	}
}

// TestEmptyNameIsNotUnauthenticated is part of finding 8: a certificate
// of the CA whose common name is empty was reported as no certificate at
// all (Unauthenticated); it is a certificate that carries no identity.
func TestEmptyNameIsNotUnauthenticated(t *testing.T) {
	a := &authz.Authorizer{Secure: true}
	empty := &x509.Certificate{Subject: pkix.Name{Organization: []string{"walden:reader"}}}
	_, err := a.Authorize(peerCtx(empty), waldenv1.Cluster_Status_FullMethodName, &waldenv1.StatusRequest{})
	denied(t, err, codes.PermissionDenied, "has no common name (CN)", waldenv1.Cluster_Status_FullMethodName)
	if s := status.Convert(err); strings.Count(s.Message(), "permission denied") != 1 {
		t.Fatalf("message %q says permission denied more than once", s.Message())
	}
}
