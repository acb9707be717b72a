package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	"walden/authz"
	"walden/config"
	"walden/internal/testutil"
	"walden/internal/testutil/testpki"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
)

// FuzzAPI sends randomly mutated valid requests of every RPC a coordinator
// serves (the admin and raft listeners, enumerated from the registered
// services), as every role (a certificate of each over mutual TLS), to an
// in-process member whose loops that propose on their own are off, and
// checks after each:
//
//   - no handler panicked (the recovery interceptor would have hidden it
//     as Internal) and the member still runs;
//   - a refusal changed nothing: the replicated state (the state
//     machine's snapshot, without its applied index and time) is what it
//     was before;
//   - the catalog's invariants hold: every stream's committed ranges are
//     contiguous from its start to its end offset, every committed object
//     passes fsm.CheckObject (its offsets below 2^63 and within what its
//     bytes can hold, its sections inside it), and broker and stream
//     epochs only grow.
//
// The seeds are a valid request of every method as a role it allows, and
// the inputs of the hardening issue's findings. `make test` runs the seeds,
// and fuzz-short fuzzes for FUZZTIME.
func FuzzAPI(f *testing.F) {
	fz := newAPIFuzz(f)
	// The issue's inputs first: the templates register b1 again, after
	// which its streams are another epoch's until it opens them again.
	for _, s := range fz.issueSeeds() {
		f.Add(s.method, s.role, s.body)
	}
	for i, m := range fz.methods {
		req := fz.template(m.name)
		if req == nil {
			mt, _ := protoregistry.GlobalTypes.FindMessageByName(m.desc.Input().FullName())
			req = mt.New().Interface()
		}
		body, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		// As a role the method allows; the fuzzer tries the others.
		role := 0
		if rule, ok := authz.Lookup(m.name); ok && len(rule.Roles) > 0 {
			for r, x := range authz.Roles {
				if x == rule.Roles[0] {
					role = r
				}
			}
		}
		f.Add(uint8(i), uint8(role), body)
	}
	f.Fuzz(func(t *testing.T, method, role uint8, body []byte) {
		fz.exec(t, method, role, body)
	})
}

// apiFuzz is the member the fuzzer calls and what it remembers between
// calls.
type apiFuzz struct {
	s       *Server
	methods []servedMethod
	conns   map[authz.Role]map[string]*grpc.ClientConn
	panics  atomic.Int32
	// e1, e2 are the epochs b1 and b2 registered with.
	e1, e2 uint64
	// seen are the largest epochs seen, to check they only grow.
	brokerEpochs map[string]uint64
	streamEpochs map[uint64]uint64
}

// panicCounter counts the log records of a recovered handler panic.
type panicCounter struct {
	slog.Handler
	n *atomic.Int32
}

func (h panicCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "panic in gRPC handler" {
		h.n.Add(1)
	}
	return nil
}

func (h panicCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panicCounter) WithGroup(string) slog.Handler      { return h }
func (h panicCounter) Enabled(context.Context, slog.Level) bool {
	return true
}

func newAPIFuzz(tb testing.TB) *apiFuzz {
	tb.Helper()
	fz := &apiFuzz{conns: map[authz.Role]map[string]*grpc.ClientConn{}, brokerEpochs: map[string]uint64{}, streamEpochs: map[uint64]uint64{}}
	p := testpki.New(tb)
	cfg := config.DefaultServerConfig()
	cfg.ClusterName, cfg.NodeID = "fuzz", "c1"
	cfg.DataDir = filepath.Join(tb.TempDir(), "c1")
	cfg.Listen = config.Listen{Admin: "127.0.0.1:0", Raft: "127.0.0.1:0"}
	cfg.InitialCluster = []config.Member{{ID: "c1", Raft: "127.0.0.1:1", Admin: "127.0.0.1:2"}}
	cfg.Raft.TickInterval = 10 * time.Millisecond
	cfg.TLS = p.Member(tb, "c1")
	logger := slog.New(panicCounter{Handler: slog.DiscardHandler, n: &fz.panics})
	s, err := New(cfg, logger, withoutLoops())
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			tb.Error("Run did not return after cancel")
		}
	})
	fz.s = s
	fz.methods = servedMethods(tb, map[string]*grpc.Server{"admin": s.adminGRPC, "raft": s.raftGRPC})
	sort.Slice(fz.methods, func(i, j int) bool { return fz.methods[i].name < fz.methods[j].name })
	for _, r := range authz.Roles {
		creds, err := mtls.ClientCreds(p.TLS(tb, roleIdentity(r)))
		if err != nil {
			tb.Fatal(err)
		}
		fz.conns[r] = map[string]*grpc.ClientConn{}
		for srv, addr := range map[string]string{"admin": s.Addrs().Admin, "raft": s.Addrs().Raft} {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { c.Close() })
			fz.conns[r][srv] = c
		}
	}
	fz.setUp(tb)
	return fz
}

// setUp registers brokers b1 and b2, opens their streams and commits an
// object, so that the templates' requests reach the state machine.
func (fz *apiFuzz) setUp(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := fz.conns[authz.RoleAgent]["admin"]
	testutil.Eventually(tb, 30*time.Second, "the member leads", func() error {
		_, err := waldenv1.NewClusterClient(fz.conns[authz.RoleReader]["admin"]).Status(ctx, &waldenv1.StatusRequest{})
		if err != nil {
			return err
		}
		r, err := waldenv1.NewAgentClient(admin).Register(ctx, &waldenv1.RegisterRequest{ClusterName: "fuzz", BrokerId: "b1",
			AgentAddr: "127.0.0.1:1", Wal: &waldenv1.WalLocation{Path: "/wal/b1"}})
		if err == nil {
			fz.e1 = r.GetEpoch()
		}
		return err
	})
	// b2 is registered by the member itself (its agent is not a role of
	// the fuzzer: every agent identity acts for b1).
	res, err := fz.s.node.Propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_RegisterBroker{RegisterBroker: &waldenv1.RegisterBroker{
		BrokerId: "b2", AgentAddr: "127.0.0.1:1", Wal: &waldenv1.WalLocation{Path: "/wal/b2"}}}})
	if err != nil {
		tb.Fatal(err)
	}
	fz.e2 = res.GetRegisterBroker().GetEpoch()
	catalog := waldenv1.NewCatalogClient(fz.conns[authz.RoleBroker]["admin"])
	for _, id := range []uint64{1, 2} {
		if _, err := catalog.OpenStream(ctx, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: fz.e1, StreamId: id}); err != nil {
			tb.Fatal(err)
		}
	}
	commit := fz.template(waldenv1.Catalog_CommitObject_FullMethodName).(*waldenv1.CommitObjectRequest)
	fz.currentEpochs(commit.ProtoReflect())
	if _, err := catalog.CommitObject(ctx, commit); err != nil {
		tb.Fatal(err)
	}
	fz.remember()
}

// template is a valid request of method (nil: the empty one will do).
func (fz *apiFuzz) template(method string) proto.Message {
	const e1 = currentEpoch
	obj := func(id string, start, end uint64) *waldenv1.Object {
		return &waldenv1.Object{ObjectId: id, Key: "k/" + id, Size: 16 + 64 + 4 + 56 + 32,
			Ranges: []*waldenv1.ObjectRange{{StreamId: 1, StreamEpoch: 1, StartOffset: start, EndOffset: end, Position: 16, Length: 64}}}
	}
	switch method {
	case waldenv1.Agent_Register_FullMethodName:
		return &waldenv1.RegisterRequest{ClusterName: "fuzz", BrokerId: "b1", AgentAddr: "127.0.0.1:1", Wal: &waldenv1.WalLocation{Path: "/wal/b1"}}
	case waldenv1.Agent_RenewLease_FullMethodName:
		return &waldenv1.RenewLeaseRequest{BrokerId: "b1", Epoch: e1}
	case waldenv1.Catalog_OpenStream_FullMethodName:
		return &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 1} // taken back after b1 registers again
	case waldenv1.Catalog_CommitObject_FullMethodName:
		return &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: e1, Object: obj("o1", 0, 10),
			Producers: []*waldenv1.StreamProducers{{StreamId: 1, Producers: []*waldenv1.ProducerState{{ProducerId: 7, Sequence: 0, Offset: 0, Count: 10}}}}}
	case waldenv1.Catalog_CloseStream_FullMethodName:
		return &waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: e1, StreamId: 2, StreamEpoch: 1}
	case waldenv1.Catalog_GetOpeningStreams_FullMethodName:
		return &waldenv1.GetOpeningStreamsRequest{BrokerId: "b1", BrokerEpoch: e1}
	case waldenv1.Catalog_DescribeStream_FullMethodName:
		return &waldenv1.DescribeStreamRequest{StreamId: 1, MaxObjects: 10}
	case waldenv1.Catalog_ListStreams_FullMethodName:
		return &waldenv1.ListStreamsRequest{OwnerBrokerId: "b1"}
	case waldenv1.Brokers_GetBroker_FullMethodName:
		return &waldenv1.GetBrokerRequest{BrokerId: "b1"}
	case waldenv1.Brokers_SetMaintenance_FullMethodName:
		return &waldenv1.SetMaintenanceRequest{BrokerId: "b2", On: true, Reason: "fuzz", TtlMs: 60_000}
	case waldenv1.Brokers_Ack_FullMethodName:
		return &waldenv1.AckRequest{BrokerId: "b2"}
	case waldenv1.Brokers_ListEvents_FullMethodName:
		return &waldenv1.ListEventsRequest{BrokerId: "b1", Limit: 10}
	case waldenv1.Brokers_SetPolicy_FullMethodName:
		return &waldenv1.SetPolicyRequest{Set: map[string]string{"cooldown": "5m"}}
	case waldenv1.Brokers_RemoveBroker_FullMethodName:
		return &waldenv1.RemoveBrokerRequest{BrokerId: "b2"}
	case waldenv1.Watch_Watch_FullMethodName:
		return &waldenv1.WatchRequest{Kinds: []waldenv1.WatchKind{waldenv1.WatchKind_WATCH_KIND_STREAM}, ProgressIntervalMs: 1000}
	case waldenv1.Cluster_MemberAdd_FullMethodName:
		return &waldenv1.MemberAddRequest{Id: "c9", RaftAddr: "127.0.0.1:7109", AdminAddr: "127.0.0.1:7009"}
	case waldenv1.Cluster_MemberRemove_FullMethodName:
		return &waldenv1.MemberRemoveRequest{Id: "c9"}
	case waldenv1.Cluster_LeaderTransfer_FullMethodName:
		return &waldenv1.LeaderTransferRequest{Id: "c1"}
	case waldenv1.Jobs_GetJob_FullMethodName:
		return &waldenv1.GetJobRequest{JobId: fmt.Sprintf("job-b2-%d", fz.e2+1)}
	case waldenv1.Jobs_CancelJob_FullMethodName:
		return &waldenv1.CancelJobRequest{JobId: fmt.Sprintf("job-b2-%d", fz.e2+1)}
	case waldenv1.Jobs_RetryJob_FullMethodName:
		return &waldenv1.RetryJobRequest{JobId: fmt.Sprintf("job-b2-%d", fz.e2+1)}
	case waldenv1.Brokers_Failover_FullMethodName:
		return &waldenv1.FailoverRequest{BrokerId: "b2", Reason: "fuzz", Preview: true}
	case waldenv1.Raft_Stream_FullMethodName:
		return &waldenv1.RaftFrame{ClusterName: "fuzz", FromId: "c9"}
	}
	return nil
}

// fuzzSeed is one input of the corpus.
type fuzzSeed struct {
	method, role uint8
	body         []byte
}

// issueSeeds are the inputs of the hardening issue's findings, as the
// roles that sent them.
func (fz *apiFuzz) issueSeeds() []fuzzSeed {
	index := func(name string) uint8 {
		for i, m := range fz.methods {
			if m.name == name {
				return uint8(i)
			}
		}
		panic("no method " + name)
	}
	role := func(r authz.Role) uint8 {
		for i, x := range authz.Roles {
			if x == r {
				return uint8(i)
			}
		}
		panic("no role " + string(r))
	}
	seed := func(method string, r authz.Role, m proto.Message) fuzzSeed {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		return fuzzSeed{index(method), role(r), b}
	}
	fo := &waldenv1.FailoverContext{JobId: "job-b1-1", Attempt: 1, Token: currentEpoch}
	return []fuzzSeed{
		// 1: offsets [10, 2^64-1) in 10 bytes at position 0.
		seed(waldenv1.Catalog_CommitObject_FullMethodName, authz.RoleBroker, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: currentEpoch,
			Object: &waldenv1.Object{ObjectId: "k5", Key: "k5", Size: 100, Ranges: []*waldenv1.ObjectRange{
				{StreamId: 1, StreamEpoch: 1, StartOffset: 10, EndOffset: math.MaxUint64, Position: 0, Length: 10}}}}),
		// 1: a producer batch whose end wraps past 2^64.
		seed(waldenv1.Catalog_CommitObject_FullMethodName, authz.RoleBroker, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: currentEpoch,
			Object: &waldenv1.Object{ObjectId: "o9", Key: "k/o9", Size: 180, Ranges: []*waldenv1.ObjectRange{
				{StreamId: 1, StreamEpoch: 1, StartOffset: 10, EndOffset: 20, Position: 16, Length: 64}}},
			Producers: []*waldenv1.StreamProducers{{StreamId: 1, Producers: []*waldenv1.ProducerState{{ProducerId: 7, Offset: math.MaxUint64 - 1, Count: 3}}}}}),
		// 3: a broker's certificate in failover mode.
		seed(waldenv1.Catalog_CommitObject_FullMethodName, authz.RoleBroker, &waldenv1.CommitObjectRequest{BrokerId: "b1", BrokerEpoch: currentEpoch,
			Failover: fo, Object: &waldenv1.Object{ObjectId: "o8", Key: "k/o8", Size: 180, Ranges: []*waldenv1.ObjectRange{
				{StreamId: 1, StreamEpoch: 1, StartOffset: 10, EndOffset: 20, Position: 16, Length: 64}}}}),
		seed(waldenv1.Catalog_CloseStream_FullMethodName, authz.RoleBroker, &waldenv1.CloseStreamRequest{BrokerId: "b1", BrokerEpoch: currentEpoch,
			StreamId: 1, StreamEpoch: 1, Failover: fo}),
		// 5: a maintenance ttl of 2^63-1 ms.
		seed(waldenv1.Brokers_SetMaintenance_FullMethodName, authz.RoleOperator, &waldenv1.SetMaintenanceRequest{BrokerId: "b2", On: true, TtlMs: math.MaxInt64}),
		seed(waldenv1.Brokers_ListEvents_FullMethodName, authz.RoleReader, &waldenv1.ListEventsRequest{Limit: math.MaxUint32}),
		seed(waldenv1.Catalog_DescribeStream_FullMethodName, authz.RoleReader, &waldenv1.DescribeStreamRequest{StreamId: 1, MaxObjects: math.MaxUint32}),
		seed(waldenv1.Watch_Watch_FullMethodName, authz.RoleReader, &waldenv1.WatchRequest{ProgressIntervalMs: math.MaxUint32}),
		// Earlier rounds: stream 2^64-1, a member on c1's own address.
		seed(waldenv1.Catalog_OpenStream_FullMethodName, authz.RoleBroker, &waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: currentEpoch, StreamId: math.MaxUint64}),
		seed(waldenv1.Cluster_MemberAdd_FullMethodName, authz.RoleAdmin, &waldenv1.MemberAddRequest{Id: "c2", RaftAddr: fz.s.Addrs().Raft, AdminAddr: "127.0.0.1:9"}),
	}
}

// definiteRefusal reports whether code says the request was refused as a
// whole, so that nothing may have changed (a deadline or an unavailable
// member leaves the outcome open).
func definiteRefusal(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition, codes.NotFound,
		codes.AlreadyExists, codes.OutOfRange, codes.Aborted, codes.ResourceExhausted, codes.Unimplemented:
		return true
	}
	return false
}

// exec sends one mutated request and checks what it did.
func (fz *apiFuzz) exec(t *testing.T, method, role uint8, body []byte) {
	m := fz.methods[int(method)%len(fz.methods)]
	r := authz.Roles[int(role)%len(authz.Roles)]
	mt, err := protoregistry.GlobalTypes.FindMessageByName(m.desc.Input().FullName())
	if err != nil {
		t.Fatal(err)
	}
	req := mt.New().Interface()
	if err := proto.Unmarshal(body, req); err != nil {
		return // not a request of this method
	}
	fz.currentEpochs(req.ProtoReflect())
	if m.name == waldenv1.Raft_Stream_FullMethodName && r != authz.RoleCoordinator {
		r = authz.RoleCoordinator // only a coordinator gets as far as a frame; it is c9, not a member
	}
	before := fz.digest(t)
	err = fz.call(m, fz.conns[r][m.server], req)
	code := status.Code(err)
	if n := fz.panics.Load(); n > 0 {
		t.Fatalf("%s as %s (%v): a handler panicked (%d so far): %v", m.name, r, req, n, err)
	}
	if definiteRefusal(code) {
		if after := fz.digest(t); !bytes.Equal(before, after) {
			t.Fatalf("%s as %s was refused (%v) but the state changed:\nrequest %v", m.name, r, err, req)
		}
	}
	fz.checkInvariants(t, m.name, r, req)
}

// currentEpoch in a request's broker_epoch (or RenewLease's epoch, or a
// failover context's token) stands for the current epoch of the broker the
// request names: the seeds stay valid while the brokers register again,
// and the fuzzer mutates the value like any other.
const currentEpoch = 4242

// currentEpochs replaces currentEpoch in m (and its messages) by the
// current epoch of the broker m names (b1 when it names none).
func (fz *apiFuzz) currentEpochs(m protoreflect.Message) {
	broker := "b1"
	if f := m.Descriptor().Fields().ByName("broker_id"); f != nil && m.Get(f).String() != "" {
		broker = m.Get(f).String()
	}
	epoch := uint64(0)
	if b, ok := fz.s.state.Broker(broker); ok {
		epoch = b.GetEpoch()
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() == protoreflect.Uint64Kind && !fd.IsList() && v.Uint() == currentEpoch &&
			(fd.Name() == "broker_epoch" || fd.Name() == "epoch" || fd.Name() == "token"):
			m.Set(fd, protoreflect.ValueOfUint64(epoch))
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap():
			fz.currentEpochs(v.Message())
		}
		return true
	})
}

// call invokes m with req on conn: a unary call, or a stream's first
// answer.
func (fz *apiFuzz) call(m servedMethod, conn *grpc.ClientConn, req proto.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if !m.streamed {
		return conn.Invoke(ctx, m.name, req, new(emptypb.Empty))
	}
	desc := &grpc.StreamDesc{StreamName: string(m.desc.Name()), ClientStreams: m.desc.IsStreamingClient(), ServerStreams: m.desc.IsStreamingServer()}
	s, err := conn.NewStream(ctx, desc, m.name)
	if err != nil {
		return err
	}
	_ = s.SendMsg(req) // the status comes from RecvMsg
	if err := s.CloseSend(); err != nil {
		return err
	}
	return s.RecvMsg(new(emptypb.Empty))
}

// digest is the replicated state without the applied index and the state
// machine's time, which every applied entry moves.
func (fz *apiFuzz) digest(t *testing.T) []byte {
	b, err := fz.s.state.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	snap := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(b, snap); err != nil {
		t.Fatal(err)
	}
	snap.AppliedIndex, snap.LastAppliedUnixMs = 0, 0
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkInvariants checks the catalog and the epochs after a call.
func (fz *apiFuzz) checkInvariants(t *testing.T, method string, r authz.Role, req proto.Message) {
	st := fz.s.state
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("after %s as %s (%v): %s", method, r, req, fmt.Sprintf(format, args...))
	}
	for _, s := range st.Streams("", "") {
		next := s.GetStartOffset()
		for _, o := range st.StreamObjects(s.GetStreamId(), 0, 0) {
			if why := objectFits(o); why != "" {
				fail("committed object %s: %s", o.GetObjectId(), why)
			}
			for _, rg := range o.GetRanges() {
				if rg.GetStreamId() != s.GetStreamId() {
					continue
				}
				if rg.GetStartOffset() != next {
					fail("stream %d: object %s starts at %d, the previous range ends at %d", s.GetStreamId(), o.GetObjectId(), rg.GetStartOffset(), next)
				}
				next = rg.GetEndOffset()
			}
		}
		if next != s.GetEndOffset() {
			fail("stream %d: ranges end at %d, the stream's end offset is %d", s.GetStreamId(), next, s.GetEndOffset())
		}
		if s.GetEpoch() < fz.streamEpochs[s.GetStreamId()] {
			fail("stream %d: epoch %d, was %d", s.GetStreamId(), s.GetEpoch(), fz.streamEpochs[s.GetStreamId()])
		}
	}
	for _, b := range st.Brokers() {
		if b.GetEpoch() < fz.brokerEpochs[b.GetBrokerId()] {
			fail("broker %s: epoch %d, was %d", b.GetBrokerId(), b.GetEpoch(), fz.brokerEpochs[b.GetBrokerId()])
		}
	}
	fz.remember()
}

// objectFits says what of a committed object breaks the catalog's rules,
// checked here apart from fsm.CheckObject, which the API and the state
// machine use: its ranges' offsets below 2^63 and no more than their bytes
// can hold (16 bytes per batch of at most 2^32-1 offsets), their sections
// between the object's header and its index and footer, in order.
func objectFits(o *waldenv1.Object) string {
	trailer := uint64(4+32) + 56*uint64(len(o.GetRanges()))
	prev := uint64(16)
	for i, r := range o.GetRanges() {
		switch {
		case r.GetEndOffset() <= r.GetStartOffset() || r.GetEndOffset() >= 1<<63:
			return fmt.Sprintf("range %d: offsets [%d, %d)", i, r.GetStartOffset(), r.GetEndOffset())
		case r.GetPosition() < prev || r.GetLength() == 0 || o.GetSize() < trailer ||
			r.GetPosition() > o.GetSize()-trailer || r.GetLength() > o.GetSize()-trailer-r.GetPosition():
			return fmt.Sprintf("range %d: section [%d, +%d) outside [%d, %d)", i, r.GetPosition(), r.GetLength(), prev, o.GetSize()-min(o.GetSize(), trailer))
		}
		if batches := r.GetLength() / 16; batches < math.MaxUint64/math.MaxUint32 && r.GetEndOffset()-r.GetStartOffset() > batches*math.MaxUint32 {
			return fmt.Sprintf("range %d: %d offsets in %d bytes", i, r.GetEndOffset()-r.GetStartOffset(), r.GetLength())
		}
		prev = r.GetPosition() + r.GetLength()
	}
	return ""
}

// remember notes the epochs now.
func (fz *apiFuzz) remember() {
	for _, s := range fz.s.state.Streams("", "") {
		fz.streamEpochs[s.GetStreamId()] = max(fz.streamEpochs[s.GetStreamId()], s.GetEpoch())
	}
	for _, b := range fz.s.state.Brokers() {
		fz.brokerEpochs[b.GetBrokerId()] = max(fz.brokerEpochs[b.GetBrokerId()], b.GetEpoch())
	}
}
