package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	"walden/authz"
	"walden/config"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/raftnode"
)

// expectedAccess is who may call each method, written from the security
// model (docs/security.md) and not from authz's table, so that the two are
// checked against each other. "bound" marks methods where agent and broker
// identities act for their own broker id only.
//
// A method a coordinator serves that is missing here fails
// TestAuthorizationMatrix: add it to authz's table and here.
var expectedAccess = map[string]struct {
	roles []authz.Role
	bound bool
}{
	"/walden.v1.Cluster/Status":         {roles: people},
	"/walden.v1.Cluster/MemberList":     {roles: people},
	"/walden.v1.Cluster/MemberAdd":      {roles: []authz.Role{authz.RoleAdmin}},
	"/walden.v1.Cluster/MemberRemove":   {roles: []authz.Role{authz.RoleAdmin}},
	"/walden.v1.Cluster/LeaderTransfer": {roles: operatorsUp},

	"/walden.v1.Agent/Register":    {roles: []authz.Role{authz.RoleAgent, authz.RoleBroker}, bound: true},
	"/walden.v1.Agent/RenewLease":  {roles: []authz.Role{authz.RoleAgent, authz.RoleBroker}, bound: true},
	"/walden.v1.Agent/RenewLeases": {roles: []authz.Role{authz.RoleAgent, authz.RoleBroker}, bound: true},

	"/walden.v1.Brokers/ListBrokers":    {roles: append(slices.Clone(people), authz.RoleBroker)},
	"/walden.v1.Brokers/GetBroker":      {roles: append(slices.Clone(people), authz.RoleBroker)},
	"/walden.v1.Brokers/Failover":       {roles: operatorsUp},
	"/walden.v1.Brokers/Ack":            {roles: operatorsUp},
	"/walden.v1.Brokers/SetMaintenance": {roles: operatorsUp},
	"/walden.v1.Brokers/ListEvents":     {roles: people},
	"/walden.v1.Brokers/GetPolicy":      {roles: people},
	"/walden.v1.Brokers/SetPolicy":      {roles: operatorsUp},
	"/walden.v1.Brokers/RemoveBroker":   {roles: []authz.Role{authz.RoleAdmin}},

	"/walden.v1.Catalog/OpenStream":        {roles: []authz.Role{authz.RoleBroker}, bound: true},
	"/walden.v1.Catalog/CommitObject":      {roles: []authz.Role{authz.RoleBroker}, bound: true},
	"/walden.v1.Catalog/CloseStream":       {roles: []authz.Role{authz.RoleBroker}, bound: true},
	"/walden.v1.Catalog/GetOpeningStreams": {roles: append(slices.Clone(people), authz.RoleBroker), bound: true},
	"/walden.v1.Catalog/ListStreams":       {roles: append(slices.Clone(people), authz.RoleBroker)},
	"/walden.v1.Catalog/DescribeStream":    {roles: append(slices.Clone(people), authz.RoleBroker)},

	"/walden.v1.Jobs/ListJobs":   {roles: people},
	"/walden.v1.Jobs/GetJob":     {roles: people},
	"/walden.v1.Jobs/WatchJobs":  {roles: people},
	"/walden.v1.Jobs/CancelJob":  {roles: operatorsUp},
	"/walden.v1.Jobs/RetryJob":   {roles: operatorsUp},
	"/walden.v1.Jobs/ResolveJob": {roles: operatorsUp},

	// Brokers learn that streams closed from the watch.
	"/walden.v1.Watch/Watch": {roles: append(slices.Clone(people), authz.RoleBroker)},

	"/walden.v1.Failovers/ListFailovers": {roles: people},
	"/walden.v1.Failovers/GetFailover":   {roles: people},

	// A backup holds the whole state: admins only.
	"/walden.v1.Maintenance/Snapshot": {roles: []authz.Role{authz.RoleAdmin}},

	"/walden.v1.Raft/Stream": {roles: []authz.Role{authz.RoleCoordinator}},

	"/grpc.health.v1.Health/Check":                                   {roles: authz.Roles},
	"/grpc.health.v1.Health/List":                                    {roles: authz.Roles},
	"/grpc.health.v1.Health/Watch":                                   {roles: authz.Roles},
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      {roles: people},
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": {roles: people},
}

var (
	people      = []authz.Role{authz.RoleReader, authz.RoleOperator, authz.RoleAdmin}
	operatorsUp = []authz.Role{authz.RoleOperator, authz.RoleAdmin}
)

// roleIdentity is the identity the matrix calls with for each role; agents
// and brokers act for broker b1.
func roleIdentity(r authz.Role) authz.Identity {
	switch r {
	case authz.RoleAgent:
		return authz.Identity{Name: "b1-agent", Role: r, BrokerID: "b1"}
	case authz.RoleBroker:
		return authz.Identity{Name: "b1", Role: r, BrokerID: "b1"}
	case authz.RoleCoordinator:
		return authz.Identity{Name: "c9", Role: r}
	}
	return authz.Identity{Name: "the-" + string(r), Role: r}
}

// servedMethod is one method of a service registered on a gRPC server.
type servedMethod struct {
	server   string // "admin" or "raft"
	name     string // full method name
	desc     protoreflect.MethodDescriptor
	streamed bool
}

// servedMethods enumerates the methods of every service registered on the
// servers, from the services' descriptors.
func servedMethods(t testing.TB, servers map[string]*grpc.Server) []servedMethod {
	t.Helper()
	var out []servedMethod
	for srvName, s := range servers {
		for svc, info := range s.GetServiceInfo() {
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
			if err != nil {
				t.Fatalf("service %s: no descriptor: %v", svc, err)
			}
			sd := d.(protoreflect.ServiceDescriptor)
			for _, m := range info.Methods {
				md := sd.Methods().ByName(protoreflect.Name(m.Name))
				if md == nil {
					t.Fatalf("%s/%s: no method descriptor", svc, m.Name)
				}
				out = append(out, servedMethod{server: srvName, name: "/" + svc + "/" + m.Name, desc: md, streamed: m.IsClientStream || m.IsServerStream})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// request builds the method's request message, with broker_id set when the
// message has one.
func (m servedMethod) request(t *testing.T, brokerID string) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(m.desc.Input().FullName())
	if err != nil {
		t.Fatalf("%s: request type: %v", m.name, err)
	}
	msg := mt.New()
	if f := msg.Descriptor().Fields().ByName("broker_id"); f != nil && brokerID != "" {
		msg.Set(f, protoreflect.ValueOfString(brokerID))
	}
	return msg.Interface()
}

// hasBrokerID reports whether the method's request names a broker.
func (m servedMethod) hasBrokerID() bool {
	return m.desc.Input().Fields().ByName("broker_id") != nil
}

// call invokes the method once with req and returns the call's status.
func (m servedMethod) call(ctx context.Context, conn *grpc.ClientConn, req proto.Message) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !m.streamed {
		return conn.Invoke(ctx, m.name, req, new(emptypb.Empty))
	}
	desc := &grpc.StreamDesc{StreamName: string(m.desc.Name()), ClientStreams: m.desc.IsStreamingClient(), ServerStreams: m.desc.IsStreamingServer()}
	s, err := conn.NewStream(ctx, desc, m.name)
	if err != nil {
		return err
	}
	if m.desc.IsStreamingClient() && m.name == waldenv1.Raft_Stream_FullMethodName {
		// An empty raft stream: the frames are another test's.
	} else if err := s.SendMsg(req); err != nil {
		_ = err // the status comes from RecvMsg
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	return s.RecvMsg(new(emptypb.Empty))
}

// isDenied tells a refusal of the authorization apart from what the method
// itself answers (InvalidArgument for the matrix's empty requests, NotFound,
// OK...). Every refusal must name the method and the identity.
func isDenied(t *testing.T, err error, method string, id authz.Identity) bool {
	t.Helper()
	s := status.Convert(err)
	if s.Code() != codes.PermissionDenied {
		return false
	}
	if !strings.Contains(s.Message(), method) || !strings.Contains(s.Message(), fmt.Sprintf("%q", id.Name)) {
		t.Errorf("%s as %s: refusal %q does not name the method and the identity", method, id, s.Message())
	}
	return true
}

// TestAuthorizationMatrix calls every method of every service a
// coordinator registers (enumerated from the services' descriptors) with
// the certificate of every role, over mutual TLS, and checks each answer
// against expectedAccess: allowed calls reach the method, refused ones get
// PermissionDenied naming the method and the identity. Agents and brokers
// are also refused every bound method for another broker id.
func TestAuthorizationMatrix(t *testing.T) {
	p := newTestPKI(t)
	cfg := singleMember(t)
	cfg.TLS = p.Member(t, "c1")
	s := startServer(t, cfg)
	a := s.Addrs()

	methods := servedMethods(t, map[string]*grpc.Server{"admin": s.adminGRPC, "raft": s.raftGRPC})
	if len(methods) < 30 {
		t.Fatalf("only %d methods found", len(methods))
	}
	for _, m := range methods {
		if _, ok := expectedAccess[m.name]; !ok {
			t.Errorf("%s is served but the matrix does not say who may call it: add it to authz's table and to expectedAccess", m.name)
		}
		if _, ok := authz.Lookup(m.name); !ok {
			t.Errorf("%s is served but has no entry in authz's table: it is refused to everyone", m.name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	ctx := context.Background()
	conns := map[authz.Role]map[string]*grpc.ClientConn{}
	for _, r := range authz.Roles {
		id := roleIdentity(r)
		creds, err := mtls.ClientCreds(p.TLS(t, id))
		if err != nil {
			t.Fatal(err)
		}
		conns[r] = map[string]*grpc.ClientConn{}
		for srv, addr := range map[string]string{"admin": a.Admin, "raft": a.Raft} {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			conns[r][srv] = c
		}
	}
	waitServing(t, conns[authz.RoleReader]["admin"])

	calls, refusals := 0, 0
	for _, m := range methods {
		want := expectedAccess[m.name]
		for _, r := range authz.Roles {
			id := roleIdentity(r)
			err := m.call(ctx, conns[r][m.server], m.request(t, id.BrokerID))
			calls++
			allowed := slices.Contains(want.roles, r)
			if got := !isDenied(t, err, m.name, id); got != allowed {
				t.Errorf("%s as %s: allowed=%v (%v), want allowed=%v", m.name, id, got, err, allowed)
			}
			if !allowed {
				refusals++
			}
			// A bound method for another broker: refused to agents and
			// brokers, unchanged for everyone else.
			if r.BrokerBound() && allowed && m.hasBrokerID() {
				err := m.call(ctx, conns[r][m.server], m.request(t, "b2"))
				calls++
				if got := isDenied(t, err, m.name, id); got != want.bound {
					t.Errorf("%s as %s for broker b2: denied=%v (%v), want denied=%v", m.name, id, got, err, want.bound)
				}
			}
		}
	}
	t.Logf("%d methods x %d roles: %d calls, %d refusals by role", len(methods), len(authz.Roles), calls, refusals)
}

// TestForwardedCallsAuthorizeTheOriginalCaller: a follower forwards with
// its coordinator certificate, and the leader authorizes (and the event
// log names) the original caller; a reader is refused wherever it asks;
// nobody but a coordinator is believed when it names another caller.
func TestForwardedCallsAuthorizeTheOriginalCaller(t *testing.T) {
	p := newTestPKI(t)
	initial, listeners := bindMembers(t, "c1", "c2", "c3")
	for _, m := range initial {
		cfg := config.DefaultServerConfig()
		cfg.ClusterName, cfg.NodeID = "authz", m.ID
		cfg.DataDir = filepath.Join(t.TempDir(), m.ID)
		cfg.Listen = config.Listen{Admin: m.Admin, Raft: m.Raft}
		cfg.InitialCluster = initial
		cfg.TLS = p.Member(t, m.ID)
		cfg.Raft.TickInterval = 20 * time.Millisecond
		startServer(t, cfg, WithListeners(listeners[m.ID]))
	}
	dial := func(id authz.Identity, addr string) *grpc.ClientConn {
		creds, err := mtls.ClientCreds(p.TLS(t, id))
		if err != nil {
			t.Fatal(err)
		}
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice := authz.Identity{Name: "alice", Role: authz.RoleOperator}
	reader := authz.Identity{Name: "grafana", Role: authz.RoleReader}
	agent := authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Find the leader and a follower (as the reader: Status is a read).
	var leader, follower config.Member
	deadline := time.Now().Add(10 * time.Second)
	for leader.ID == "" {
		st, err := waldenv1.NewClusterClient(dial(reader, initial[0].Admin)).Status(ctx, &waldenv1.StatusRequest{})
		if err == nil && st.GetLeaderId() != "" {
			for _, m := range initial {
				if m.ID == st.GetLeaderId() {
					leader = m
				} else {
					follower = m
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader: %v %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The agent registers through the follower: the leader sees the agent.
	reg, err := waldenv1.NewAgentClient(dial(agent, follower.Admin)).Register(ctx, &waldenv1.RegisterRequest{
		ClusterName: "authz", BrokerId: "b1", AgentAddr: "127.0.0.1:1", Wal: &waldenv1.WalLocation{Path: "/wal/b1"}})
	if err != nil {
		t.Fatalf("register through a follower: %v", err)
	}
	_, err = waldenv1.NewAgentClient(dial(agent, follower.Admin)).RenewLease(ctx, &waldenv1.RenewLeaseRequest{BrokerId: "b2", Epoch: reg.GetEpoch()})
	if !isDenied(t, err, waldenv1.Agent_RenewLease_FullMethodName, agent) {
		t.Fatalf("agent of b1 renewing b2 through a follower: %v", err)
	}

	// A reader is refused a failover at a follower and at the leader.
	for _, m := range []config.Member{follower, leader} {
		_, err := waldenv1.NewBrokersClient(dial(reader, m.Admin)).Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "test"})
		if !isDenied(t, err, waldenv1.Brokers_Failover_FullMethodName, reader) {
			t.Fatalf("reader failover at %s: %v", m.ID, err)
		}
	}
	// The operator's maintenance through the follower is recorded as hers.
	if _, err := waldenv1.NewBrokersClient(dial(alice, follower.Admin)).SetMaintenance(ctx, &waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: true}); err != nil {
		t.Fatalf("operator maintenance through a follower: %v", err)
	}
	fo, err := waldenv1.NewBrokersClient(dial(alice, follower.Admin)).Failover(ctx, &waldenv1.FailoverRequest{BrokerId: "b1", Reason: "drill"})
	if err != nil {
		t.Fatalf("operator failover through a follower: %v", err)
	}
	ev, err := waldenv1.NewBrokersClient(dial(reader, leader.Admin)).ListEvents(ctx, &waldenv1.ListEventsRequest{BrokerId: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	actors := map[string]string{}
	for _, e := range ev.GetEvents() {
		actors[e.GetEventKind().Name()] = e.GetActor()
	}
	if actors["register"] != "b1-agent" || actors["maintenance"] != "alice" || actors["decision"] != "alice" {
		t.Fatalf("event actors %v (job %s)", actors, fo.GetJobId())
	}

	// A reader's certificate naming alice as the caller is still a reader.
	rc := dial(reader, leader.Admin)
	fctx := metadataCaller(ctx, alice)
	_, err = waldenv1.NewBrokersClient(rc).Ack(fctx, &waldenv1.AckRequest{BrokerId: "b1"})
	if !isDenied(t, err, waldenv1.Brokers_Ack_FullMethodName, reader) {
		t.Fatalf("reader posing as alice: %v", err)
	}
}

// metadataCaller names id as the forwarded caller, as a coordinator does.
func metadataCaller(ctx context.Context, id authz.Identity) context.Context {
	return metadata.AppendToOutgoingContext(ctx, authz.MetadataCallerName, id.Name, authz.MetadataCallerRole, string(id.Role))
}

// TestRaftRefusesForgedFrames: only coordinators may open a raft stream,
// and a coordinator's frames must claim its own member id. A forged frame
// (another member's id, term 1000) changes nothing.
func TestRaftRefusesForgedFrames(t *testing.T) {
	p := newTestPKI(t)
	cfg := singleMember(t)
	cfg.TLS = p.Member(t, "c1")
	s := startServer(t, cfg)
	a := s.Addrs()
	admin, err := mtls.ClientCreds(p.Admin(t))
	if err != nil {
		t.Fatal(err)
	}
	ac, err := grpc.NewClient(a.Admin, grpc.WithTransportCredentials(admin))
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	waitServing(t, ac)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before, err := waldenv1.NewClusterClient(ac).Status(ctx, &waldenv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}

	forged := forgedVote(t, "c3", "c1", before.GetTerm()+1000)
	send := func(id authz.Identity) error {
		creds, err := mtls.ClientCreds(p.TLS(t, id))
		if err != nil {
			t.Fatal(err)
		}
		c, err := grpc.NewClient(a.Raft, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		st, err := waldenv1.NewRaftClient(c).Stream(ctx)
		if err != nil {
			return err
		}
		_ = st.Send(&waldenv1.RaftFrame{ClusterName: cfg.ClusterName, FromId: "c3", Message: forged})
		_, err = st.CloseAndRecv()
		return err
	}
	c2 := authz.Identity{Name: "c2", Role: authz.RoleCoordinator}
	if err := send(c2); !isDenied(t, err, waldenv1.Raft_Stream_FullMethodName, c2) || !strings.Contains(err.Error(), `as member "c3"`) {
		t.Fatalf("c2 sending as c3: %v", err)
	}
	admin1 := authz.Identity{Name: "root", Role: authz.RoleAdmin}
	if err := send(admin1); !isDenied(t, err, waldenv1.Raft_Stream_FullMethodName, admin1) {
		t.Fatalf("an admin on the raft port: %v", err)
	}
	after, err := waldenv1.NewClusterClient(ac).Status(ctx, &waldenv1.StatusRequest{})
	if err != nil || after.GetTerm() != before.GetTerm() || after.GetLeaderId() != "c1" {
		t.Fatalf("status after forged frames: %v %v (before: term %d)", after, err, before.GetTerm())
	}
}

// forgedVote is a marshaled raft vote request from member from to member
// to at term.
func forgedVote(t *testing.T, from, to string, term uint64) []byte {
	t.Helper()
	b, err := proto.Marshal(&raftpb.Message{Type: raftpb.MsgVote.Enum(), From: new(raftnode.RaftID(from)), To: new(raftnode.RaftID(to)), Term: new(term)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHTTPListeners: with TLS on, the HTTP listener serves the web view to
// readers and up only, and the plain listen.metrics listener serves
// /healthz, /readyz and /metrics without a certificate, and no web view.
func TestHTTPListeners(t *testing.T) {
	p := newTestPKI(t)
	cfg := singleMember(t)
	cfg.TLS = p.Member(t, "c1")
	cfg.Listen.Metrics = "127.0.0.1:0"
	s := startServer(t, cfg)
	a := s.Addrs()

	get := func(id *authz.Identity, url string) (int, string) {
		t.Helper()
		tr := &http.Transport{}
		if id != nil {
			m, err := mtls.Load(p.TLS(t, *id))
			if err != nil {
				t.Fatal(err)
			}
			tr.TLSClientConfig = m.Client
		}
		c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	reader := authz.Identity{Name: "grafana", Role: authz.RoleReader}
	agent := authz.Identity{Name: "b1-agent", Role: authz.RoleAgent, BrokerID: "b1"}
	if code, _ := get(&reader, "https://"+a.HTTP+"/ui/"); code != http.StatusOK {
		t.Fatalf("reader's web view: %d", code)
	}
	code, body := get(&agent, "https://"+a.HTTP+"/ui/")
	if code != http.StatusForbidden || !strings.Contains(body, `"b1-agent" (agent of broker b1) may not read the cluster's state`) {
		t.Fatalf("agent's web view: %d %q", code, body)
	}
	if code, _ := get(&agent, "https://"+a.HTTP+"/healthz"); code != http.StatusOK {
		t.Fatalf("agent's /healthz: %d", code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _ := get(nil, "http://"+a.Metrics+"/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("plain /readyz: %d", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		if code, _ := get(nil, "http://"+a.Metrics+path); code != http.StatusOK {
			t.Fatalf("plain %s: %d", path, code)
		}
	}
	if code, _ := get(nil, "http://"+a.Metrics+"/ui/"); code != http.StatusNotFound {
		t.Fatalf("plain /ui/: %d, want 404 (the web view is not on the plain listener)", code)
	}
}
