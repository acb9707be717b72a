package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
)

// fakeBrokers is a walden.v1.Brokers server with canned answers.
type fakeBrokers struct {
	waldenv1.UnimplementedBrokersServer
	brokers []*waldenv1.Broker
	got     []any
}

func (f *fakeBrokers) ListBrokers(context.Context, *waldenv1.ListBrokersRequest) (*waldenv1.ListBrokersResponse, error) {
	return &waldenv1.ListBrokersResponse{Brokers: f.brokers}, nil
}

func (f *fakeBrokers) GetBroker(_ context.Context, r *waldenv1.GetBrokerRequest) (*waldenv1.GetBrokerResponse, error) {
	for _, b := range f.brokers {
		if b.GetBrokerId() == r.GetBrokerId() {
			return &waldenv1.GetBrokerResponse{Broker: b}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "broker %q is not registered", r.GetBrokerId())
}

func (f *fakeBrokers) Failover(_ context.Context, r *waldenv1.FailoverRequest) (*waldenv1.FailoverResponse, error) {
	if r.GetPreview() {
		return &waldenv1.FailoverResponse{BrokerId: r.GetBrokerId(), Preview: true, Epoch: 3, NewEpoch: 9, JobId: "job-b2-9",
			AssigneeId: "c2", LeaseWaitMs: 2700, Holds: []string{"suspected by 1 of the 2 coordinators needed (suspicion_quorum)"},
			Evidence: &waldenv1.Evidence{Observations: []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT}}}}, nil
	}
	f.got = append(f.got, r)
	return &waldenv1.FailoverResponse{BrokerId: r.GetBrokerId(), NewEpoch: 8, JobId: "job-b1-8"}, nil
}

func (f *fakeBrokers) SetMaintenance(_ context.Context, r *waldenv1.SetMaintenanceRequest) (*waldenv1.SetMaintenanceResponse, error) {
	f.got = append(f.got, r)
	b := &waldenv1.Broker{BrokerId: r.GetBrokerId(), BrokerState: waldenv1.BrokerState_BROKER_STATE_MAINTENANCE, Maintenance: r.GetOn()}
	if r.GetOn() && r.GetTtlMs() == 0 && !r.GetTtlSet() {
		// As the coordinators do: a ttl it had is kept.
		b.MaintenanceTtlMs, b.MaintenanceUntilUnixMs = 3_600_000, time.Now().Add(time.Hour).UnixMilli()
	}
	return &waldenv1.SetMaintenanceResponse{Broker: b}, nil
}

func (f *fakeBrokers) SetPolicy(_ context.Context, r *waldenv1.SetPolicyRequest) (*waldenv1.SetPolicyResponse, error) {
	f.got = append(f.got, r)
	if _, ok := r.GetSet()["lease_ttl"]; ok {
		return nil, status.Error(codes.InvalidArgument, "failure_timeout: must be greater than lease_ttl + drift_margin")
	}
	return &waldenv1.SetPolicyResponse{Entries: []*waldenv1.PolicyEntry{{Key: "failure_timeout", Value: "8s", Source: "runtime", SetIndex: 40}}}, nil
}

func (f *fakeBrokers) ListEvents(_ context.Context, r *waldenv1.ListEventsRequest) (*waldenv1.ListEventsResponse, error) {
	f.got = append(f.got, r)
	return &waldenv1.ListEventsResponse{Events: []*waldenv1.Event{{Index: 9, UnixMs: 1700000000000, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", Actor: "c1", Message: "declared failed"}}}, nil
}

func serveBrokers(t *testing.T, f waldenv1.BrokersServer) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	waldenv1.RegisterBrokersServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func sampleBrokers() []*waldenv1.Broker {
	return []*waldenv1.Broker{
		{BrokerId: "b1", BrokerState: waldenv1.BrokerState_BROKER_STATE_FAILED, Epoch: 7, Fenced: true, LeaseRemainingMs: 0, Failovers: 1,
			Observations: []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_DEAD, SinceUnixMs: 1700000000000, Reason: "gossip: dead"}}},
		{BrokerId: "b2", BrokerState: waldenv1.BrokerState_BROKER_STATE_ALIVE, Epoch: 3, LeaseRemainingMs: 2500},
	}
}

// TestBrokersAutomqNode: the AutoMQ node an agent reported shows in both
// tables and in -o json; a list without AutoMQ brokers has no such column.
func TestBrokersAutomqNode(t *testing.T) {
	bs := sampleBrokers()
	bs[1].Automq = &waldenv1.AutomqNode{NodeId: 0, NodeEpoch: 1732870000000}
	addr := serveBrokers(t, &fakeBrokers{brokers: bs})
	code, out, _ := runCtl(t, "--endpoints", addr, "brokers")
	if code != 0 || !strings.Contains(out, "AUTOMQ NODE") || !strings.Contains(out, "0 (epoch 1732870000000)") {
		t.Fatalf("brokers table (%d):\n%s", code, out)
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "broker", "b2")
	if code != 0 || !strings.Contains(out, "automq node:") || !strings.Contains(out, "0 (epoch 1732870000000)") {
		t.Fatalf("broker table (%d):\n%s", code, out)
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "brokers", "-o", "json")
	var doc struct {
		Brokers []struct {
			Automq *struct {
				NodeID    *int32 `json:"node_id"`
				NodeEpoch string `json:"node_epoch"`
			} `json:"automq"`
		} `json:"brokers"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Brokers) != 2 || doc.Brokers[0].Automq != nil ||
		doc.Brokers[1].Automq == nil || doc.Brokers[1].Automq.NodeID == nil || *doc.Brokers[1].Automq.NodeID != 0 ||
		doc.Brokers[1].Automq.NodeEpoch != "1732870000000" {
		t.Fatalf("brokers -o json (%d, %v):\n%s", code, err, out)
	}
	code, out, _ = runCtl(t, "--endpoints", serveBrokers(t, &fakeBrokers{brokers: sampleBrokers()}), "brokers")
	if code != 0 || strings.Contains(out, "AUTOMQ") {
		t.Fatalf("brokers table without AutoMQ brokers (%d):\n%s", code, out)
	}
}

func TestBrokersJSONShape(t *testing.T) {
	addr := serveBrokers(t, &fakeBrokers{brokers: sampleBrokers()})
	code, out, errOut := runCtl(t, "--endpoints", addr, "brokers", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Brokers []map[string]any `json:"brokers"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(doc.Brokers) != 2 {
		t.Fatalf("%s", out)
	}
	for _, k := range []string{"broker_id", "state", "epoch", "lease_remaining_ms", "observations"} {
		if _, ok := doc.Brokers[1][k]; !ok {
			t.Fatalf("key %s missing from %v", k, doc.Brokers[1])
		}
	}
	obs := doc.Brokers[0]["observations"].([]any)[0].(map[string]any)
	for _, k := range []string{"observer_id", "state", "since_unix_ms"} {
		if _, ok := obs[k]; !ok {
			t.Fatalf("key %s missing from %v", k, obs)
		}
	}
}

func TestBrokersTables(t *testing.T) {
	f := &fakeBrokers{brokers: sampleBrokers()}
	addr := serveBrokers(t, f)
	code, out, _ := runCtl(t, "--endpoints", addr, "brokers")
	if code != 0 || !strings.Contains(out, "b1") || !strings.Contains(out, "c1=dead") || !strings.Contains(out, "2.5s") || !strings.Contains(out, "expired") {
		t.Fatalf("brokers table (%d):\n%s", code, out)
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "broker", "b1")
	if code != 0 || !strings.Contains(out, "gossip: dead") || !strings.Contains(out, "2023-11-14T22:13:20Z") {
		t.Fatalf("broker table (%d):\n%s", code, out)
	}
	code, _, errOut := runCtl(t, "--endpoints", addr, "broker", "nope")
	if code == 0 || errOut != "waldenctl: broker nope is not registered\n" {
		t.Fatalf("unknown broker (%d): %s", code, errOut)
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "failover", "b1", "--reason", "host lost")
	if code != 0 || !strings.Contains(out, "new epoch 8") || f.got[0].(*waldenv1.FailoverRequest).GetReason() != "host lost" {
		t.Fatalf("failover (%d): %s", code, out)
	}
	if code, _, _ = runCtl(t, "--endpoints", addr, "failover", "b1"); code == 0 {
		t.Fatal("failover without --reason accepted")
	}
	n := len(f.got)
	code, out, _ = runCtl(t, "--endpoints", addr, "failover", "b2", "--dry-run")
	for _, want := range []string{"dry run: nothing changed", "epoch 3", "epoch 9 and recovery job job-b2-9", "c2", "2.700s", "c1=suspect", "suspected by 1 of the 2"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("dry run (%d) lacks %q:\n%s", code, want, out)
		}
	}
	if len(f.got) != n {
		t.Fatal("the dry run made a failover")
	}
	code, _, _ = runCtl(t, "--endpoints", addr, "maintenance", "on", "b2", "--reason", "kernel upgrade", "--ttl", "90m")
	if r := f.got[1].(*waldenv1.SetMaintenanceRequest); code != 0 || !r.GetOn() || r.GetReason() != "kernel upgrade" || r.GetTtlMs() != 90*60*1000 {
		t.Fatalf("maintenance (%d) %v", code, f.got)
	}
	if code, _, errOut := runCtl(t, "--endpoints", addr, "maintenance", "offf", "b2"); code == 0 || !strings.Contains(errOut, "did you mean off?") {
		t.Fatalf("maintenance offf: %d %q", code, errOut)
	}
	if code, _, _ := runCtl(t, "--endpoints", addr, "maintenance", "off", "b2", "--ttl", "1h"); code == 0 {
		t.Fatal("maintenance off with a ttl accepted")
	}
	if code, _, _ = runCtl(t, "--endpoints", addr, "maintenance", "maybe", "b2"); code == 0 {
		t.Fatal("maintenance maybe accepted")
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "events", "--broker", "b1", "--limit", "5")
	if r := f.got[2].(*waldenv1.ListEventsRequest); code != 0 || r.GetBrokerId() != "b1" || !strings.Contains(out, "decision") {
		t.Fatalf("events (%d): %s", code, out)
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "policy", "set", "failure_timeout=8s")
	if r := f.got[3].(*waldenv1.SetPolicyRequest); code != 0 || r.GetSet()["failure_timeout"] != "8s" || !strings.Contains(out, "runtime (index 40)") {
		t.Fatalf("policy set (%d): %s", code, out)
	}
	code, _, errOut = runCtl(t, "--endpoints", addr, "policy", "set", "lease_ttl=9s")
	if code == 0 || !strings.Contains(errOut, "failure_timeout: must be greater") {
		t.Fatalf("unsafe policy set (%d): %s", code, errOut)
	}
	if code, _, _ = runCtl(t, "--endpoints", addr, "policy", "set", "nokey"); code == 0 {
		t.Fatal("policy set without = accepted")
	}
}

// TestMaintenanceOnAgainKeepsTheTTL: maintenance on without --ttl asks the
// coordinators to keep a ttl the broker had, and says so; --ttl 0 and
// --no-ttl replace it.
func TestMaintenanceOnAgainKeepsTheTTL(t *testing.T) {
	f := &fakeBrokers{brokers: sampleBrokers()}
	addr := serveBrokers(t, f)
	code, out, errOut := runCtl(t, "--endpoints", addr, "maintenance", "on", "b1", "--reason", "kernel")
	if code != 0 || !strings.Contains(out, "it keeps the ttl it had (--ttl 0 or --no-ttl drops it)") {
		t.Fatalf("on again: exit %d %q %q", code, out, errOut)
	}
	for _, args := range [][]string{{"--ttl", "0"}, {"--no-ttl"}, {"--ttl", "2h"}} {
		code, out, errOut = runCtl(t, append([]string{"--endpoints", addr, "maintenance", "on", "b1"}, args...)...)
		if code != 0 || strings.Contains(out, "keeps the ttl") {
			t.Fatalf("%v: exit %d %q %q", args, code, out, errOut)
		}
	}
	var sets []bool
	var ttls []int64
	for _, g := range f.got {
		r := g.(*waldenv1.SetMaintenanceRequest)
		sets, ttls = append(sets, r.GetTtlSet()), append(ttls, r.GetTtlMs())
	}
	if fmt.Sprint(sets) != "[false true true true]" || fmt.Sprint(ttls) != "[0 0 0 7200000]" {
		t.Fatalf("requests: ttl_set %v, ttl_ms %v", sets, ttls)
	}
	code, _, errOut = runCtl(t, "--endpoints", addr, "maintenance", "on", "b1", "--no-ttl", "--ttl", "1h")
	if code != exitUsage || !strings.Contains(errOut, "contradict") {
		t.Fatalf("--no-ttl with --ttl: exit %d %q", code, errOut)
	}
}

// TestMessages is the table of messages people read that issue 23 found
// wrong: each as it reads now.
func TestMessages(t *testing.T) {
	addr := serveBrokers(t, &fakeBrokers{brokers: sampleBrokers()})
	for _, tc := range []struct {
		name string
		args []string
		want []string // substrings of stdout+stderr
		not  []string
	}{
		{"a dry run's yaml says it was one", []string{"failover", "b2", "--dry-run", "-o", "yaml"}, []string{"dry_run: true", "policy_dry_run: false", "preview: true"}, []string{"\ndry_run: false\n"}},
		{"failover show of a broker never failed over", []string{"--endpoints", serveFailovers(t, &fakeFailovers{f: sampleFailover()}), "failover", "show", "b3"},
			[]string{"broker b3 has no failover: it was never failed over"}, []string{"no recovery job with that id"}},
		{"a failover that got no answer names the command that tells", []string{"--endpoints", silentEndpoint(t), "--timeout", "200ms", "failover", "b1", "--reason", "x", "--wait", "200ms"},
			[]string{"may or may not have been carried out", "check with: waldenctl failover show b1"}, nil},
	} {
		args := tc.args
		if args[0] != "--endpoints" {
			args = append([]string{"--endpoints", addr}, args...)
		}
		_, out, errOut := runCtl(t, args...)
		for _, w := range tc.want {
			if !strings.Contains(out+errOut, w) {
				t.Errorf("%s: %q lacks %q", tc.name, out+errOut, w)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(out+errOut, w) {
				t.Errorf("%s: %q has %q", tc.name, out+errOut, w)
			}
		}
	}
}
