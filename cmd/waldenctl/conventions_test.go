package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
)

func TestEveryGlobalFlagHasAnEnvironmentVariable(t *testing.T) {
	root, _ := newRootCmd(nil, nil)
	want := map[string]bool{"WALDENCTL_ENDPOINTS": true, "WALDENCTL_CACERT": true, "WALDENCTL_CERT": true,
		"WALDENCTL_KEY": true, "WALDENCTL_TIMEOUT": true, "WALDENCTL_OUTPUT": true}
	n := 0
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		n++
		if !strings.Contains(f.Usage, "(env "+envName(f.Name)+")") {
			t.Errorf("--%s does not name its variable: %q", f.Name, f.Usage)
		}
		delete(want, envName(f.Name))
	})
	if len(want) > 0 || n < 6 {
		t.Fatalf("variables without a flag: %v (%d flags)", want, n)
	}

	addr := serveFake(t, &fakeCluster{status: sampleStatus()})
	t.Setenv("WALDENCTL_ENDPOINTS", "http://"+addr)
	t.Setenv("WALDENCTL_OUTPUT", "json")
	t.Setenv("WALDENCTL_TIMEOUT", "2s")
	code, out, errOut := runCtl(t, "status")
	if code != 0 || !strings.HasPrefix(out, "{") {
		t.Fatalf("env output json: exit %d %q %q", code, out, errOut)
	}
	// The command line wins over the environment.
	code, out, _ = runCtl(t, "status", "-o", "table")
	if code != 0 || !strings.HasPrefix(out, "CLUSTER") {
		t.Fatalf("flag over env: exit %d %q", code, out)
	}
	t.Setenv("WALDENCTL_TIMEOUT", "soon")
	code, _, errOut = runCtl(t, "status")
	if code != exitUsage || !strings.Contains(errOut, `WALDENCTL_TIMEOUT=\"soon\"`) || !strings.Contains(errOut, `"exit_code":2`) {
		t.Fatalf("bad env value: exit %d %q", code, errOut)
	}
}

func TestEndpointsWithOrWithoutScheme(t *testing.T) {
	for _, c := range []struct {
		in      []string
		tlsFlag bool
		want    string
		tls     bool
		err     string
	}{
		{in: []string{"127.0.0.1:7001"}, want: "127.0.0.1:7001"},
		{in: []string{"http://127.0.0.1:7001/", " 127.0.0.2:7001"}, want: "127.0.0.1:7001,127.0.0.2:7001"},
		{in: []string{"https://c1.example:7001"}, want: "c1.example:7001", tls: true},
		{in: []string{"c1:7001"}, tlsFlag: true, want: "c1:7001", tls: true},
		{in: []string{"http://c1:7001"}, tlsFlag: true, err: "is plaintext"},
		{in: []string{"http://c1:7001", "https://c2:7001"}, err: "mixes"},
		{in: []string{"grpc://c1:7001"}, err: "scheme must be http or https"},
		{in: []string{"c1"}, err: "not host:port"},
		{in: []string{","}, err: "no endpoint"},
	} {
		got, tls, err := parseEndpoints(c.in, c.tlsFlag)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != c.want || tls != c.tls {
			t.Errorf("%v: %v tls %v err %v", c.in, got, tls, err)
		}
	}
}

func TestYAMLOutput(t *testing.T) {
	addr := serveFake(t, &fakeCluster{status: sampleStatus()})
	code, out, errOut := runCtl(t, "--endpoints", addr, "status", "-o", "yaml")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errOut)
	}
	for _, want := range []string{"cluster_name: demo\n", "term: \"3\"\n", "members:\n  - id: c1\n", "    reachable: false\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("yaml lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "{") {
		t.Errorf("yaml in flow style:\n%s", out)
	}
}

func TestWideShowsMoreColumns(t *testing.T) {
	addr := serveBrokers(t, &fakeBrokers{brokers: sampleBrokers()})
	_, narrow, _ := runCtl(t, "--endpoints", addr, "brokers")
	_, wide, _ := runCtl(t, "--endpoints", addr, "brokers", "-o", "wide")
	h1, h2 := strings.SplitN(narrow, "\n", 2)[0], strings.SplitN(wide, "\n", 2)[0]
	if len(strings.Fields(h2)) <= len(strings.Fields(h1)) || !strings.Contains(h2, "AGENT") {
		t.Fatalf("wide header %q, table header %q", h2, h1)
	}
}

// refusing is a Brokers server whose Failover and Ack answer err.
type refusing struct {
	fakeBrokers
	err error
}

func (r *refusing) Failover(context.Context, *waldenv1.FailoverRequest) (*waldenv1.FailoverResponse, error) {
	return nil, r.err
}

func serveRefusing(t *testing.T, r *refusing) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	waldenv1.RegisterBrokersServer(s, r)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func refusedWith(code codes.Code, reason, msg string, md map[string]string) error {
	s, _ := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "walden", Metadata: md})
	return s.Err()
}

func TestRefusalsReadAsSentences(t *testing.T) {
	r := &refusing{err: refusedWith(codes.FailedPrecondition, "EPOCH_EXPIRED",
		`EPOCH_EXPIRED: fsm: declare broker "b1" failed at epoch 4: broker epoch 5, fenced true: fencing: epoch expired`, nil)}
	r.brokers = sampleBrokers()
	addr := serveRefusing(t, r)
	code, out, errOut := runCtl(t, "--endpoints", addr, "failover", "b1", "--reason", "again")
	if code != exitRefused || out != "" || errOut != "waldenctl: broker b1 is already failed over: it was fenced and has not registered again since\n" {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
	}
	// -o json keeps the code, the reason and the server's message.
	code, _, errOut = runCtl(t, "--endpoints", addr, "failover", "b1", "--reason", "again", "-o", "json")
	var doc struct {
		Error callError `json:"error"`
	}
	if err := json.Unmarshal([]byte(errOut), &doc); code != exitRefused || err != nil || doc.Error.Exit != exitRefused {
		t.Fatalf("json error: exit %d %v %q", code, err, errOut)
	}
	if doc.Error.Code != "FailedPrecondition" || doc.Error.Reason != "EPOCH_EXPIRED" || !strings.Contains(doc.Error.Detail, "fsm: declare") ||
		!strings.Contains(doc.Error.Message, "already failed over") {
		t.Fatalf("json error: %+v", doc.Error)
	}
	// The coordinator's own refusal of a second failover (NODE_FENCED)
	// reads the same as the documented one.
	r.err = refusedWith(codes.FailedPrecondition, "NODE_FENCED", `NODE_FENCED: broker "b1" was already failed over (epoch 4 is fenced; job job-b1-4): node fenced`, nil)
	code, _, errOut = runCtl(t, "--endpoints", addr, "failover", "b1", "--reason", "again")
	if code != exitRefused || errOut != "waldenctl: broker b1 is already failed over: it was fenced and has not registered again since\n" {
		t.Fatalf("NODE_FENCED: exit %d %q", code, errOut)
	}
}

// TestPlainDropsOnlyTheReason: a server's message reaches people as the
// server built it, a sentence without package chains; only the reason it
// starts with is dropped (it is printed with -o json).
func TestPlainDropsOnlyTheReason(t *testing.T) {
	for _, tc := range []struct{ reason, in, want string }{
		{"JOB_NOT_RUNNING", `JOB_NOT_RUNNING: cancel job: job job-b1-4 is succeeded: job not running`, `cancel job: job job-b1-4 is succeeded: job not running`},
		{"", `failure_timeout: must be greater than lease_ttl + drift_margin`, `failure_timeout: must be greater than lease_ttl + drift_margin`},
		{"UNKNOWN_NODE", `UNKNOWN_NODE: broker "b1" is not registered`, `broker "b1" is not registered`},
		{"MEMBER_NOT_FOUND", `transfer leadership to "c9": no member has that id`, `transfer leadership to "c9": no member has that id`},
		{"NOT_OWNER", "EPOCH_EXPIRED: epoch 3  is old", "EPOCH_EXPIRED: epoch 3 is old"},
	} {
		if got := plain(tc.reason, tc.in); got != tc.want {
			t.Errorf("plain(%q, %q) = %q, want %q", tc.reason, tc.in, got, tc.want)
		}
	}
	f := &fakeCluster{status: sampleStatus(), transfer: func(r *waldenv1.LeaderTransferRequest) (*waldenv1.LeaderTransferResponse, error) {
		return nil, refusedWith(codes.NotFound, "MEMBER_NOT_FOUND", `transfer leadership to "c9": no member has that id`, nil)
	}}
	addr := serveFake(t, f)
	code, _, errOut := runCtl(t, "--endpoints", addr, "leader", "transfer", "c9")
	if code != exitNotFound || errOut != "waldenctl: there is no member c9 in the cluster\ndid you mean c1?\n" {
		t.Fatalf("exit %d %q", code, errOut)
	}
}

func TestTypoSuggestionsOnTheirOwnLine(t *testing.T) {
	for args, want := range map[string]string{
		"stauts":                    "did you mean status?",
		"brokers --endpoint x:1":    "did you mean --endpoints?",
		"jobs --brokr b1":           "did you mean --broker?",
		"--endpoints 127.0.0.1:1 x": "",
	} {
		code, out, errOut := runCtl(t, strings.Fields(args)...)
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if code != exitUsage || out != "" || !strings.HasPrefix(lines[0], "waldenctl: ") {
			t.Errorf("%s: exit %d %q %q", args, code, out, errOut)
			continue
		}
		if want == "" {
			if len(lines) != 1 {
				t.Errorf("%s: a suggestion where none fits: %q", args, errOut)
			}
			continue
		}
		if len(lines) != 2 || lines[1] != want {
			t.Errorf("%s: stderr %q, want second line %q", args, errOut, want)
		}
	}
	addr := serveBrokers(t, &fakeBrokers{brokers: sampleBrokers()})
	code, _, errOut := runCtl(t, "--endpoints", addr, "broker", "b3")
	if code != exitNotFound || errOut != "waldenctl: broker b3 is not registered\ndid you mean b1?\n" {
		t.Fatalf("unknown broker: exit %d %q", code, errOut)
	}
}

func TestCompletionOfIDs(t *testing.T) {
	addr := serveBrokers(t, &fakeBrokers{brokers: sampleBrokers()})
	for _, args := range [][]string{
		{"__complete", "--endpoints", addr, "broker", ""},
		{"__complete", "--endpoints", addr, "maintenance", "on", ""},
	} {
		code, out, errOut := runCtl(t, args...)
		// The ids follow the subcommands, if any ("broker remove").
		if code != 0 || !strings.Contains(out, "b1\nb2\n:4\n") {
			t.Errorf("%v: exit %d %q %q", args, code, out, errOut)
		}
	}
	code, out, _ := runCtl(t, "__complete", "--endpoints", addr, "maintenance", "")
	if code != 0 || !strings.HasPrefix(out, "on\noff\n") {
		t.Errorf("maintenance: %q", out)
	}
	code, out, _ = runCtl(t, "completion", "bash")
	if code != 0 || !strings.Contains(out, "__start_waldenctl") {
		t.Errorf("completion bash: exit %d", code)
	}
}
