package devcontroller

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"walden/automq/protocol"
	"walden/internal/testutil"
	"walden/internal/testutil/testpki"
)

// reqTimeout bounds every request of these tests; generous for a loaded
// machine.
var reqTimeout = testutil.Deadline(15 * time.Second)

// start runs a controller with n voters on loopback listeners.
func start(t *testing.T, cfg Config, n int) *Controller {
	t.Helper()
	if cfg.ClusterID == "" {
		cfg.ClusterID = "dev-cluster"
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lns := make([]net.Listener, n)
	for i := range lns {
		lns[i] = testutil.Listen(t, "127.0.0.1")
	}
	if err := c.Start(lns...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// automqVersions lets kgo send the six AutoMQ keys (it refuses keys its
// version table does not list).
func automqVersions() *kversion.Versions {
	v := kversion.Stable()
	for _, a := range protocol.APIs {
		v.SetMaxKeyVersion(a.Key, a.MaxVersion)
	}
	return v
}

// client is a franz-go client of one voter.
func client(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts = append([]kgo.Opt{
		kgo.SeedBrokers(addr),
		kgo.MaxVersions(automqVersions()),
		kgo.RequestRetries(0),
		kgo.ClientID("walden-test"),
	}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// send issues req to the client's seed broker.
func send[R kmsg.Response](t *testing.T, cl *kgo.Client, req kmsg.Request) (R, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	var zero R
	resp, err := cl.SeedBrokers()[0].Request(ctx, req)
	if err != nil {
		return zero, err
	}
	r, ok := resp.(R)
	if !ok {
		t.Fatalf("response %T, want %T", resp, zero)
	}
	return r, nil
}

// must is send for requests that must get an answer.
func must[R kmsg.Response](t *testing.T, cl *kgo.Client, req kmsg.Request) R {
	t.Helper()
	r, err := send[R](t, cl, req)
	if err != nil {
		t.Fatalf("%s: %v", protocol.NameForKey(req.Key()), err)
	}
	return r
}

// resend is must for a request sent again after the server closed the
// connection under the previous one: the client may still hand it to the
// dead connection once and report it dead ("will be retried on a new
// connection"), so it is sent up to five times before the test fails.
func resend[R kmsg.Response](t *testing.T, cl *kgo.Client, req kmsg.Request) R {
	t.Helper()
	var err error
	for range 5 {
		var r R
		if r, err = send[R](t, cl, req); err == nil {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s, sent five times: %v", protocol.NameForKey(req.Key()), err)
	var zero R
	return zero
}

func openReq(node int32, nodeEpoch int64, streams ...[2]int64) *protocol.OpenStreamsRequest {
	r := &protocol.OpenStreamsRequest{NodeID: node, NodeEpoch: nodeEpoch}
	for _, s := range streams {
		r.OpenStreamRequests = append(r.OpenStreamRequests, protocol.OpenStreamRequest{StreamID: s[0], StreamEpoch: s[1]})
	}
	return r
}

func closeReq(node int32, nodeEpoch int64, streams ...[2]int64) *protocol.CloseStreamsRequest {
	r := &protocol.CloseStreamsRequest{NodeID: node, NodeEpoch: nodeEpoch}
	for _, s := range streams {
		r.CloseStreamRequests = append(r.CloseStreamRequests, protocol.CloseStreamRequest{StreamID: s[0], StreamEpoch: s[1]})
	}
	return r
}

func openCodes(r *protocol.OpenStreamsResponse) []Code {
	out := []Code{}
	for _, s := range r.OpenStreamResponses {
		out = append(out, Code(s.ErrorCode))
	}
	return out
}

func closeCodes(r *protocol.CloseStreamsResponse) []Code {
	out := []Code{}
	for _, s := range r.CloseStreamResponses {
		out = append(out, Code(s.ErrorCode))
	}
	return out
}

func wantCodes(t *testing.T, what string, got []Code, want ...Code) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: codes %v, want %v", what, got, want)
	}
}

func wantCode(t *testing.T, what string, got int16, want Code) {
	t.Helper()
	if Code(got) != want {
		t.Fatalf("%s: code %v, want %v", what, Code(got), want)
	}
}

// TestFailoverOverTCP plays the reference's failover through a real
// listener with franz-go: node 1 holds streams OPENED and dies; node 2's
// opens get STREAM_NOT_CLOSED; the failover (GetOpeningStreams in failover
// mode, PrepareS3Object, CommitStreamSetObject in failover mode,
// CloseStreams as node 1) hands them over, and node 2's opens succeed at the
// new end offsets. The HTTP view shows the outcome.
func TestFailoverOverTCP(t *testing.T) {
	c := start(t, Config{Streams: []int64{100, 101, 102}}, 1)
	cl := client(t, c.Addrs()[0])
	const dead, e1, heir, e2 = int32(1), int64(1_717_000_000_000), int32(2), int64(1_717_000_000_900)

	g := must[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: dead, NodeEpoch: e1})
	wantCode(t, "node 1 starts", g.ErrorCode, None)
	must[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: heir, NodeEpoch: e2})
	o := must[*protocol.OpenStreamsResponse](t, cl, openReq(dead, e1, [2]int64{100, 0}, [2]int64{101, 0}))
	wantCodes(t, "node 1 opens", openCodes(o), None, None)
	p := must[*protocol.PrepareS3ObjectResponse](t, cl, &protocol.PrepareS3ObjectRequest{NodeID: dead, PreparedCount: 1, TimeToLiveMillis: 60_000})
	cm := must[*protocol.CommitStreamSetObjectResponse](t, cl, &protocol.CommitStreamSetObjectRequest{
		NodeID: dead, NodeEpoch: e1, ObjectID: p.FirstS3ObjectID, OrderID: p.FirstS3ObjectID, ObjectSize: 4000,
		ObjectStreamRanges: []protocol.ObjectStreamRange{{StreamID: 100, StreamEpoch: -1, StartOffset: 0, EndOffset: 50}},
	})
	wantCode(t, "node 1 commits", cm.ErrorCode, None)

	// Node 1 is killed. The new leader cannot open its streams.
	o = must[*protocol.OpenStreamsResponse](t, cl, openReq(heir, e2, [2]int64{100, 1}, [2]int64{101, 1}))
	wantCodes(t, "node 2 opens before the failover", openCodes(o), StreamNotClosed, StreamNotClosed)

	// The failover.
	g = must[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: dead, NodeEpoch: e1, FailoverMode: true})
	wantCode(t, "failover GetOpeningStreams", g.ErrorCode, None)
	want := []protocol.StreamMetadata{{StreamID: 100, Epoch: 0, EndOffset: 50}, {StreamID: 101, Epoch: 0}}
	if !reflect.DeepEqual(g.StreamMetadataList, want) {
		t.Fatalf("opening streams %+v, want %+v", g.StreamMetadataList, want)
	}
	o = must[*protocol.OpenStreamsResponse](t, cl, openReq(dead, e1, [2]int64{102, 0}))
	wantCodes(t, "the fenced node opens", openCodes(o), NodeFenced)
	p = must[*protocol.PrepareS3ObjectResponse](t, cl, &protocol.PrepareS3ObjectRequest{NodeID: dead, PreparedCount: 1, TimeToLiveMillis: 3_600_000})
	if p.FirstS3ObjectID != 1 {
		t.Fatalf("second prepared id %d, want 1", p.FirstS3ObjectID)
	}
	commit := &protocol.CommitStreamSetObjectRequest{
		Version: 1, NodeID: dead, NodeEpoch: e1, ObjectID: 1, OrderID: 1, ObjectSize: 777, FailoverMode: true,
		ObjectStreamRanges: []protocol.ObjectStreamRange{
			{StreamID: 100, StreamEpoch: -1, StartOffset: 50, EndOffset: 80},
			{StreamID: 101, StreamEpoch: -1, StartOffset: 0, EndOffset: 9},
		},
	}
	cm = must[*protocol.CommitStreamSetObjectResponse](t, cl, commit)
	wantCode(t, "failover commit", cm.ErrorCode, None)
	plain := *commit
	plain.FailoverMode = false
	cm = must[*protocol.CommitStreamSetObjectResponse](t, cl, &plain)
	wantCode(t, "the fenced node's own commit", cm.ErrorCode, NodeFenced)
	o = must[*protocol.OpenStreamsResponse](t, cl, openReq(heir, e2, [2]int64{100, 1}))
	wantCodes(t, "node 2 opens before the close", openCodes(o), StreamNotClosed)
	cs := must[*protocol.CloseStreamsResponse](t, cl, closeReq(dead, e1, [2]int64{100, 0}, [2]int64{101, 0}))
	wantCodes(t, "failover close", closeCodes(cs), None, None)
	o = must[*protocol.OpenStreamsResponse](t, cl, openReq(heir, e2, [2]int64{100, 1}, [2]int64{101, 1}))
	wantCodes(t, "node 2 opens after the close", openCodes(o), None, None)
	if o.OpenStreamResponses[0].NextOffset != 80 || o.OpenStreamResponses[1].NextOffset != 9 {
		t.Fatalf("node 2 opens at %+v, want next offsets 80 and 9", o.OpenStreamResponses)
	}

	// The inspection endpoint shows it all.
	srv := httptest.NewServer(c.HTTPHandler())
	defer srv.Close()
	var view View
	getJSON(t, srv.URL+"/v1/state", &view)
	if len(view.Streams) != 3 || view.Streams[0].EndOffset != 80 || view.Streams[0].Owner != heir ||
		!reflect.DeepEqual(view.Streams[0].Ranges, []RangeView{
			{Index: 0, NodeID: dead, Epoch: 0, StartOffset: 0, EndOffset: 80},
			{Index: 1, NodeID: heir, Epoch: 1, StartOffset: 80, EndOffset: 80},
		}) {
		t.Fatalf("streams %+v", view.Streams)
	}
	var objs struct{ Objects []ObjectView }
	getJSON(t, srv.URL+"/v1/objects?state=COMMITTED", &objs)
	if len(objs.Objects) != 2 || objs.Objects[1].Key != "10000000/_kafka_dev-cluster/1" || objs.Objects[1].Kind != KindStreamSet ||
		objs.Objects[1].Size != 777 || len(objs.Objects[1].Ranges) != 2 {
		t.Fatalf("objects %+v", objs.Objects)
	}
	if view.Nodes[0] != (NodeView{NodeID: dead, NodeEpoch: e1, FailoverMode: true}) {
		t.Fatalf("node 1 %+v", view.Nodes[0])
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestApiVersions checks what franz-go learns from the controller (it
// offers ApiVersions v5 and is downgraded to v3, KIP-511) and the answer to
// a version above 3 on a raw connection.
func TestApiVersions(t *testing.T) {
	c := start(t, Config{}, 1)
	cl := client(t, c.Addrs()[0])
	r := must[*kmsg.ApiVersionsResponse](t, cl, kmsg.NewPtrApiVersionsRequest())
	if r.Version != 3 {
		t.Fatalf("ApiVersions answered at v%d, want v3", r.Version)
	}
	got := map[int16][2]int16{}
	for _, k := range r.ApiKeys {
		got[k.ApiKey] = [2]int16{k.MinVersion, k.MaxVersion}
	}
	want := map[int16][2]int16{18: {0, 3}, 502: {0, 1}, 503: {0, 0}, 505: {0, 0}, 506: {0, 1}, 508: {0, 0}, 514: {0, 0}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("keys %v, want %v", got, want)
	}

	conn := dial(t, c.Addrs()[0])
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 4
	frame, err := protocol.AppendRequest(nil, 77, nil, req)
	if err != nil {
		t.Fatal(err)
	}
	body := roundTrip(t, conn, frame, 77)
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	if Code(resp.ErrorCode) != UnsupportedVersion || len(resp.ApiKeys) != 1 || resp.ApiKeys[0].MaxVersion != 3 {
		t.Fatalf("ApiVersions v4 answered %+v", resp)
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, reqTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(reqTimeout))
	return conn
}

// roundTrip writes a request frame and returns the body of the answer,
// after the response header v0 (its correlation id, checked).
func roundTrip(t *testing.T, conn net.Conn, frame []byte, correlationID int32) []byte {
	t.Helper()
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	resp, err := protocol.ReadFrame(conn, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got := int32(binary.BigEndian.Uint32(resp)); got != correlationID {
		t.Fatalf("correlation id %d, want %d", got, correlationID)
	}
	return resp[4:]
}

// TestGoldenRequestFrames sends AutoMQ's own request frames (made by its
// Java classes, testdata/) on one raw connection and checks the answers,
// decoded by package protocol, against the rules.
func TestGoldenRequestFrames(t *testing.T) {
	c := start(t, Config{
		Streams: []int64{3, 5, 6, 10, 11, 12},
		Nodes:   []NodeRegistration{{NodeID: 1, NodeEpoch: 99, WALConfig: "0@file:///wal"}},
	}, 1)
	conn := dial(t, c.Addrs()[0])
	r := bufio.NewReader(conn)
	exchange := func(name string) kmsg.Response {
		t.Helper()
		frame, err := os.ReadFile(filepath.Join("testdata", name+"_request.bin"))
		if err != nil {
			t.Fatal(err)
		}
		hdr, req, err := protocol.ParseRequest(frame[4:])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := conn.Write(frame); err != nil {
			t.Fatal(err)
		}
		raw, err := protocol.ReadFrame(r, 1<<20)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rh, resp, err := protocol.ParseResponse(raw, hdr.APIKey, req.GetVersion())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if rh.CorrelationID != hdr.CorrelationID {
			t.Fatalf("%s: correlation id %d, want %d", name, rh.CorrelationID, hdr.CorrelationID)
		}
		return resp
	}
	if r := exchange("API_VERSIONS_v3").(*kmsg.ApiVersionsResponse); len(r.ApiKeys) != 7 {
		t.Fatalf("ApiVersions: %+v", r)
	}
	wantCodes(t, "open by an unknown node", openCodes(exchange("OPEN_STREAMS_v0").(*protocol.OpenStreamsResponse)),
		NodeEpochNotExist, NodeEpochNotExist, NodeEpochNotExist)
	g := exchange("GET_OPENING_STREAMS_v0").(*protocol.GetOpeningStreamsResponse)
	wantCode(t, "failover GetOpeningStreams", g.ErrorCode, None)
	wantCodes(t, "open by the fenced node", openCodes(exchange("OPEN_STREAMS_v1").(*protocol.OpenStreamsResponse)),
		NodeFenced, NodeFenced, NodeFenced)
	p := exchange("PREPARE_S3_OBJECT_v0").(*protocol.PrepareS3ObjectResponse)
	if p.ErrorCode != 0 || p.FirstS3ObjectID != 0 {
		t.Fatalf("prepare: %+v", p)
	}
	wantCode(t, "plain commit by the fenced node", exchange("COMMIT_STREAM_SET_OBJECT_v0").(*protocol.CommitStreamSetObjectResponse).ErrorCode, NodeFenced)
	wantCode(t, "failover commit of an unprepared object", exchange("COMMIT_STREAM_SET_OBJECT_v1").(*protocol.CommitStreamSetObjectResponse).ErrorCode, ObjectNotExist)
	wantCodes(t, "close above the streams' epoch", closeCodes(exchange("CLOSE_STREAMS_v0").(*protocol.CloseStreamsResponse)),
		StreamInnerError, StreamInnerError)
	nodes := exchange("AUTOMQ_GET_NODES_v0").(*protocol.AutomqGetNodesResponse)
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].NodeID != 1 || nodes.Nodes[0].NodeEpoch != 99 || nodes.Nodes[0].State != "ACTIVE" {
		t.Fatalf("nodes: %+v", nodes.Nodes)
	}
	v := c.Snapshot()
	if len(v.Objects) != 4 || v.Nodes[0].NodeID != 3 || !v.Nodes[0].FailoverMode {
		t.Fatalf("state after the golden frames: %+v", v)
	}
}

// TestNotControllerWalk: with three voters, the standbys answer
// NOT_CONTROLLER (per stream for OpenStreams and CloseStreams, top-level
// for the others); a client that walks the voters finds the active one,
// and again after it moves.
func TestNotControllerWalk(t *testing.T) {
	c := start(t, Config{Streams: []int64{1}}, 3)
	addrs := c.Addrs()
	clients := make([]*kgo.Client, len(addrs))
	for i, a := range addrs {
		clients[i] = client(t, a)
	}
	if err := c.SetActive(2); err != nil {
		t.Fatal(err)
	}
	if err := c.SetActive(4); !errors.Is(err, ErrNoSuchVoter) {
		t.Fatalf("SetActive(4) = %v", err)
	}
	p := must[*protocol.PrepareS3ObjectResponse](t, clients[0], &protocol.PrepareS3ObjectRequest{NodeID: 1, PreparedCount: 1})
	wantCode(t, "prepare at a standby", p.ErrorCode, NotController)
	o := must[*protocol.OpenStreamsResponse](t, clients[2], openReq(1, 1, [2]int64{1, 0}))
	wantCode(t, "open at a standby, top level", o.ErrorCode, None)
	wantCodes(t, "open at a standby", openCodes(o), NotController)
	cs := must[*protocol.CloseStreamsResponse](t, clients[0], closeReq(1, 1, [2]int64{1, 0}))
	wantCodes(t, "close at a standby", closeCodes(cs), NotController)

	// walk asks each voter in turn, from the one that answered last, and
	// returns the voter that applied the request.
	last := 0
	walk := func(req func() kmsg.Request, notController func(kmsg.Response) bool) (int, kmsg.Response) {
		t.Helper()
		for i := 0; i < len(clients); i++ {
			v := (last + i) % len(clients)
			resp := must[kmsg.Response](t, clients[v], req())
			if !notController(resp) {
				last = v
				return v + 1, resp
			}
		}
		t.Fatal("no voter is active")
		return 0, nil
	}
	topLevel := func(r kmsg.Response) bool {
		return Code(reflect.ValueOf(r).Elem().FieldByName("ErrorCode").Int()) == NotController
	}
	perStream := func(r kmsg.Response) bool {
		codes := openCodes(r.(*protocol.OpenStreamsResponse))
		return len(codes) > 0 && codes[0] == NotController
	}
	v, _ := walk(func() kmsg.Request {
		return &protocol.GetOpeningStreamsRequest{NodeID: 1, NodeEpoch: 1}
	}, topLevel)
	if v != 2 {
		t.Fatalf("GetOpeningStreams applied by voter %d, want 2", v)
	}
	if err := c.SetActive(3); err != nil {
		t.Fatal(err)
	}
	v, resp := walk(func() kmsg.Request { return openReq(1, 1, [2]int64{1, 0}) }, perStream)
	if v != 3 {
		t.Fatalf("OpenStreams applied by voter %d, want 3", v)
	}
	wantCodes(t, "open at the new active voter", openCodes(resp.(*protocol.OpenStreamsResponse)), None)
	if st := c.Snapshot().Streams[0]; st.State != StreamOpened || st.Owner != 1 {
		t.Fatalf("stream after the walk: %+v", st)
	}
	var nc int
	for _, r := range c.Snapshot().Requests {
		if r.Code == "NOT_CONTROLLER" {
			nc += r.Count
		}
	}
	if nc != 5 {
		t.Fatalf("%d NOT_CONTROLLER answers counted, want 5", nc)
	}
}

// TestTLS serves the controller over TLS: a client that trusts the CA
// gets through, one that speaks plaintext does not.
func TestTLS(t *testing.T) {
	pki := testpki.New(t)
	files := pki.Broker(t, "devcontroller")
	cert, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	c := start(t, Config{Streams: []int64{1}, TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}}, 1)
	cl := client(t, c.Addrs()[0], kgo.DialTLSConfig(clientTLS(t, pki.CA)))
	g := must[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: 1, NodeEpoch: 1})
	wantCode(t, "over TLS", g.ErrorCode, None)

	plainCl := client(t, c.Addrs()[0])
	if _, err := send[*protocol.GetOpeningStreamsResponse](t, plainCl, &protocol.GetOpeningStreamsRequest{NodeID: 1, NodeEpoch: 1}); err == nil {
		t.Fatal("a plaintext client got an answer from a TLS listener")
	}
}

func clientTLS(t *testing.T, caFile string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no CA certificate")
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: "127.0.0.1"}
}

// TestSASL authenticates with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, over
// plaintext and over TLS, and refuses wrong passwords, unknown users,
// disabled mechanisms and requests before authentication.
func TestSASL(t *testing.T) {
	pki := testpki.New(t)
	files := pki.Broker(t, "devcontroller")
	cert, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]string{"walden": "s3cret", "odd,user=": "p,=w"}
	plainText := start(t, Config{SASL: &SASLConfig{Users: users}}, 1)
	overTLS := start(t, Config{SASL: &SASLConfig{Users: users}, TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}}, 1)
	scramOnly := start(t, Config{SASL: &SASLConfig{Users: users, Mechanisms: []string{MechanismSCRAMSHA512}}}, 1)

	mechs := map[string]func(user, pass string) sasl.Mechanism{
		"PLAIN":         func(u, p string) sasl.Mechanism { return plain.Auth{User: u, Pass: p}.AsMechanism() },
		"SCRAM-SHA-256": func(u, p string) sasl.Mechanism { return scram.Auth{User: u, Pass: p}.AsSha256Mechanism() },
		"SCRAM-SHA-512": func(u, p string) sasl.Mechanism { return scram.Auth{User: u, Pass: p}.AsSha512Mechanism() },
	}
	for name, mech := range mechs {
		for _, srv := range []struct {
			name string
			c    *Controller
			opts []kgo.Opt
		}{
			{"SASL_PLAINTEXT", plainText, nil},
			{"SASL_SSL", overTLS, []kgo.Opt{kgo.DialTLSConfig(clientTLS(t, pki.CA))}},
		} {
			t.Run(name+"/"+srv.name, func(t *testing.T) {
				for user, pass := range users {
					cl := client(t, srv.c.Addrs()[0], append(srv.opts, kgo.SASL(mech(user, pass)))...)
					g := must[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: 7, NodeEpoch: 1})
					wantCode(t, "authenticated as "+user, g.ErrorCode, None)
				}
				for _, bad := range [][2]string{{"walden", "wrong"}, {"nobody", "s3cret"}} {
					cl := client(t, srv.c.Addrs()[0], append(srv.opts, kgo.SASL(mech(bad[0], bad[1])))...)
					_, err := send[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: 7, NodeEpoch: 1})
					if err == nil || !strings.Contains(err.Error(), "SASL_AUTHENTICATION_FAILED") {
						t.Fatalf("%s/%s: err = %v, want SASL_AUTHENTICATION_FAILED", bad[0], bad[1], err)
					}
				}
			})
		}
	}

	t.Run("a disabled mechanism", func(t *testing.T) {
		cl := client(t, scramOnly.Addrs()[0], kgo.SASL(plain.Auth{User: "walden", Pass: "s3cret"}.AsMechanism()))
		_, err := send[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: 7, NodeEpoch: 1})
		if err == nil || !strings.Contains(err.Error(), "UNSUPPORTED_SASL_MECHANISM") {
			t.Fatalf("err = %v, want UNSUPPORTED_SASL_MECHANISM", err)
		}
	})
	t.Run("a request before authenticating closes the connection", func(t *testing.T) {
		conn := dial(t, plainText.Addrs()[0])
		frame, err := protocol.AppendRequest(nil, 1, nil, &protocol.GetOpeningStreamsRequest{NodeID: 99, NodeEpoch: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(frame); err != nil {
			t.Fatal(err)
		}
		if _, err := protocol.ReadFrame(conn, 1<<20); !errors.Is(err, io.EOF) {
			t.Fatalf("read after an unauthenticated request: %v, want EOF", err)
		}
		for _, n := range plainText.Snapshot().Nodes {
			if n.NodeID == 99 {
				t.Fatalf("the unauthenticated request was applied: %+v", n)
			}
		}
	})
}

// TestFaults injects each fault and checks what the client sees and what
// the state holds; a commit whose answer was lost is retried and counts
// once.
func TestFaults(t *testing.T) {
	faults := NewFaults()
	c := start(t, Config{Streams: []int64{1}, Faults: faults}, 2)
	cl := client(t, c.Addrs()[0])
	standby := client(t, c.Addrs()[1])
	must[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: 1, NodeEpoch: 1})
	wantCodes(t, "open", openCodes(must[*protocol.OpenStreamsResponse](t, cl, openReq(1, 1, [2]int64{1, 0}))), None)

	faults.Add(Fault{Kind: FaultErrorCode, APIKey: protocol.KeyPrepareS3Object, Code: UnknownServerError})
	p := must[*protocol.PrepareS3ObjectResponse](t, cl, &protocol.PrepareS3ObjectRequest{NodeID: 1, PreparedCount: 2, TimeToLiveMillis: 60_000})
	wantCode(t, "injected error", p.ErrorCode, UnknownServerError)
	if n := c.Snapshot().NextObjectID; n != 0 {
		t.Fatalf("an injected error applied the request: next object id %d", n)
	}
	p = must[*protocol.PrepareS3ObjectResponse](t, cl, &protocol.PrepareS3ObjectRequest{NodeID: 1, PreparedCount: 2, TimeToLiveMillis: 60_000})
	wantCode(t, "after the fault is spent", p.ErrorCode, None)

	faults.Add(Fault{Kind: FaultGarbage, APIKey: protocol.KeyGetOpeningStreams})
	if _, err := send[*protocol.GetOpeningStreamsResponse](t, cl, &protocol.GetOpeningStreamsRequest{NodeID: 1, NodeEpoch: 1}); err == nil {
		t.Fatal("a garbage answer decoded")
	}

	commit := &protocol.CommitStreamSetObjectRequest{NodeID: 1, NodeEpoch: 1, ObjectID: 0, OrderID: 0, ObjectSize: 10,
		ObjectStreamRanges: []protocol.ObjectStreamRange{{StreamID: 1, StreamEpoch: -1, StartOffset: 0, EndOffset: 5}}}
	faults.Add(Fault{Kind: FaultCloseAfterApply, APIKey: protocol.KeyCommitStreamSetObject})
	if _, err := send[*protocol.CommitStreamSetObjectResponse](t, cl, commit); err == nil {
		t.Fatal("an answer arrived from a connection closed before answering")
	}
	if e := c.Snapshot().Streams[0].EndOffset; e != 5 {
		t.Fatalf("the commit before the close was not applied: end offset %d", e)
	}
	// The client retries on a new connection: a redundant success.
	wantCode(t, "retried commit", resend[*protocol.CommitStreamSetObjectResponse](t, cl, commit).ErrorCode, None)

	commit2 := *commit
	commit2.ObjectID, commit2.OrderID = 1, 1
	commit2.ObjectStreamRanges = []protocol.ObjectStreamRange{{StreamID: 1, StreamEpoch: -1, StartOffset: 5, EndOffset: 8}}
	faults.Add(Fault{Kind: FaultCutFrame, APIKey: protocol.KeyCommitStreamSetObject})
	if _, err := send[*protocol.CommitStreamSetObjectResponse](t, cl, &commit2); err == nil {
		t.Fatal("a cut frame decoded")
	}
	if e := c.Snapshot().Streams[0].EndOffset; e != 8 {
		t.Fatalf("the commit whose answer was cut was not applied: end offset %d", e)
	}
	wantCode(t, "retried commit", resend[*protocol.CommitStreamSetObjectResponse](t, cl, &commit2).ErrorCode, None)

	faults.Add(Fault{Kind: FaultDelay, APIKey: protocol.KeyAutomqGetNodes, Delay: 200 * time.Millisecond})
	began := time.Now()
	must[*protocol.AutomqGetNodesResponse](t, cl, &protocol.AutomqGetNodesRequest{})
	if d := time.Since(began); d < 200*time.Millisecond {
		t.Fatalf("a delayed answer came after %v", d)
	}

	// A fault aimed at voter 2 leaves voter 1 alone.
	faults.Add(Fault{Kind: FaultErrorCode, Voter: 2, Code: InvalidRequest, Times: -1})
	wantCode(t, "voter 1", must[*protocol.AutomqGetNodesResponse](t, cl, &protocol.AutomqGetNodesRequest{}).ErrorCode, None)
	wantCode(t, "voter 2", must[*protocol.AutomqGetNodesResponse](t, standby, &protocol.AutomqGetNodesRequest{}).ErrorCode, InvalidRequest)
	wantCode(t, "voter 2 again", must[*protocol.AutomqGetNodesResponse](t, standby, &protocol.AutomqGetNodesRequest{}).ErrorCode, InvalidRequest)
	faults.Clear()
	wantCode(t, "voter 2 after Clear", must[*protocol.AutomqGetNodesResponse](t, standby, &protocol.AutomqGetNodesRequest{}).ErrorCode, NotController)
	if h := faults.Hits(); h != 7 {
		t.Fatalf("faults hit %d requests, want 7", h)
	}
}

// TestConcurrentClients runs several clients at once against two voters
// while the active voter moves (for the race detector): every stream ends
// up opened exactly once and every prepared id is distinct.
func TestConcurrentClients(t *testing.T) {
	const workers, streamsEach = 6, 5
	var streams []int64
	for i := range workers * streamsEach {
		streams = append(streams, int64(i))
	}
	c := start(t, Config{Streams: streams}, 2)
	addrs := c.Addrs()
	var wg sync.WaitGroup
	ids := make(chan int64, workers*streamsEach)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cls := []*kgo.Client{client(t, addrs[0]), client(t, addrs[1])}
			node := int32(w)
			ctx, cancel := context.WithTimeout(context.Background(), 4*reqTimeout)
			defer cancel()
			do := func(req func() kmsg.Request, ok func(kmsg.Response) bool) error {
				for attempt := 0; attempt < 200; attempt++ {
					resp, err := cls[attempt%2].SeedBrokers()[0].Request(ctx, req())
					if err != nil {
						return err
					}
					if ok(resp) {
						return nil
					}
				}
				return errors.New("no voter applied the request")
			}
			err := do(func() kmsg.Request { return &protocol.GetOpeningStreamsRequest{NodeID: node, NodeEpoch: 1} },
				func(r kmsg.Response) bool { return r.(*protocol.GetOpeningStreamsResponse).ErrorCode == 0 })
			for s := range streamsEach {
				if err != nil {
					break
				}
				stream := int64(w*streamsEach + s)
				err = do(func() kmsg.Request { return openReq(node, 1, [2]int64{stream, 0}) },
					func(r kmsg.Response) bool { return openCodes(r.(*protocol.OpenStreamsResponse))[0] == None })
				if err != nil {
					break
				}
				err = do(func() kmsg.Request { return &protocol.PrepareS3ObjectRequest{NodeID: node, PreparedCount: 1} },
					func(r kmsg.Response) bool {
						p := r.(*protocol.PrepareS3ObjectResponse)
						if p.ErrorCode == 0 {
							ids <- p.FirstS3ObjectID
						}
						return p.ErrorCode == 0
					})
			}
			errs <- err
		}()
	}
	stop := make(chan struct{})
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				_ = c.SetActive(i%2 + 1)
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-moved
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	close(ids)
	seen := map[int64]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("object id %d prepared twice", id)
		}
		seen[id] = true
	}
	if len(seen) != workers*streamsEach {
		t.Fatalf("%d object ids, want %d", len(seen), workers*streamsEach)
	}
	for _, st := range c.Snapshot().Streams {
		if st.State != StreamOpened || st.Owner != int32(st.StreamID/streamsEach) || len(st.Ranges) != 1 {
			t.Fatalf("stream %+v", st)
		}
	}
}

// TestHTTPEndpoint covers the endpoint's writes and its refusals.
func TestHTTPEndpoint(t *testing.T) {
	c := start(t, Config{Streams: []int64{1}}, 2)
	srv := httptest.NewServer(c.HTTPHandler())
	defer srv.Close()
	post := func(path, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}
	if code, out := post("/v1/nodes", `{"node_id": 3, "node_epoch": 50, "wal_config": "w", "state": "FENCED"}`); code != 200 {
		t.Fatalf("register: %d %v", code, out)
	}
	if code, out := post("/v1/nodes", `{"node_id": 3, "node_epoch": 49}`); code != http.StatusConflict || out["code"] != "NODE_EPOCH_EXPIRED" {
		t.Fatalf("older registration: %d %v", code, out)
	}
	for _, bad := range []string{`{"node_id": 3, "epoch": 1}`, `{"node_id": -1}`, `{"node_id": 1, "state": "DEAD"}`, `nonsense`} {
		if code, out := post("/v1/nodes", bad); code != http.StatusBadRequest || out["error"] == "" {
			t.Fatalf("%s: %d %v", bad, code, out)
		}
	}
	if code, out := post("/v1/active", `{"voter": 3}`); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), "there is no voter 3") {
		t.Fatalf("voter 3: %d %v", code, out)
	}
	if code, _ := post("/v1/active", `{"voter": 2}`); code != 200 || c.Active() != 2 {
		t.Fatalf("voter 2: %d, active %d", code, c.Active())
	}
	var nodes struct {
		Registered []NodeInfo `json:"registered_nodes"`
	}
	getJSON(t, srv.URL+"/v1/nodes", &nodes)
	if len(nodes.Registered) != 1 || nodes.Registered[0].State != NodeFencedState || nodes.Registered[0].WALConfig != "w" {
		t.Fatalf("nodes %+v", nodes)
	}
	var objs struct{ Objects []ObjectView }
	getJSON(t, srv.URL+"/v1/objects?state=PREPARED", &objs)
	if len(objs.Objects) != 0 {
		t.Fatalf("objects %+v", objs)
	}
}
