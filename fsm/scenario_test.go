package fsm_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/scenarios")

// TestScenarios runs the datadriven histories in testdata/scenarios. Each
// block is a command line, a "----" line and the expected output, ended by
// a blank line. Commands take a subject and key=value arguments:
//
//	tick ms=N                       advance the proposers' clock
//	register B                      RegisterBroker
//	observe B by=C state=S [expired] [epoch=N] [expect=I]
//	                                ObserveBroker (epoch: the broker's; expect:
//	                                the index of C's current observation)
//	decide B epoch=N [term=T] [live=C,..] [dry_run] [manual]
//	request-failover B epoch=N      RequestFailover
//	seed k=v ..                     SeedPolicy (the defaults with k=v)
//	open B epoch=N stream=S
//	commit B epoch=N obj=ID ranges=S/E/FROM-TO,.. [job=J attempt=A token=T]
//	close B epoch=N stream=S sepoch=E [job=J attempt=A token=T]
//	renew J attempt=A by=C | reassign J attempt=A live=C,..
//	checkpoint J attempt=A step=S [done] [bytes=N] [closed=N] [offset=N]
//	finish J attempt=A state=S [offset=N] | cancel J | retry J live=C,..
//	ack B | maintenance B on|off | policy k=v ..
//	broker B | job J | stream S | streams B | events [B] [limit=N]
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/scenarios/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runScenario(t, file, nil) })
	}
}

// TestScenariosLegacyEntries runs the same histories with every command
// spelled as a walden before the enums wrote it (the deprecated strings
// only): each must give the same output.
func TestScenariosLegacyEntries(t *testing.T) {
	if *rewrite {
		t.Skip("-rewrite")
	}
	files, err := filepath.Glob("testdata/scenarios/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			runScenario(t, file, func(c *waldenv1.Command) { waldenv1.ToLegacy(c) })
		})
	}
}

// runScenario runs the history of file; form, when set, rewrites each
// command before it is applied (harness.form).
func runScenario(t *testing.T, file string, form func(*waldenv1.Command)) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	h.form = form
	var out strings.Builder
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without ---- line", file, i+1)
		}
		var want []string
		j := i + 2
		for ; j < len(lines) && lines[j] != ""; j++ {
			want = append(want, lines[j])
		}
		got := runCommand(t, h, line)
		out.WriteString(line + "\n----\n" + got + "\n")
		if !*rewrite && got != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", file, i+1, line, got, strings.Join(want, "\n"))
		}
		i = j - 1
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type args struct {
	subject string
	kv      map[string]string
	flags   map[string]bool
	t       *testing.T
}

func (a args) u(k string) uint64 {
	if a.kv[k] == "" {
		return 0
	}
	n, err := strconv.ParseUint(a.kv[k], 10, 64)
	if err != nil {
		a.t.Fatalf("%s=%q: %v", k, a.kv[k], err)
	}
	return n
}

func (a args) list(k string) []string {
	if a.kv[k] == "" {
		return nil
	}
	return strings.Split(a.kv[k], ",")
}

func (a args) failover() *waldenv1.FailoverContext {
	if a.kv["job"] == "" {
		return nil
	}
	return &waldenv1.FailoverContext{JobId: a.kv["job"], Attempt: uint32(a.u("attempt")), Token: a.u("token")}
}

func runCommand(t *testing.T, h *harness, line string) string {
	fields := strings.Fields(line)
	verb := fields[0]
	a := args{kv: map[string]string{}, flags: map[string]bool{}, t: t}
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			a.kv[k] = v
		} else if a.subject == "" {
			a.subject = f
		} else {
			a.flags[f] = true
		}
	}
	var op any
	switch verb {
	case "tick":
		h.nowMs += int64(a.u("ms"))
		return fmt.Sprintf("now=%d", h.nowMs)
	case "register":
		op = &waldenv1.RegisterBroker{BrokerId: a.subject, Wal: &waldenv1.WalLocation{Path: "/wal/" + a.subject}}
	case "observe":
		o := &waldenv1.ObserveBroker{BrokerId: a.subject, ObserverId: a.kv["by"], ObservationState: named[waldenv1.ObservationState](a.kv["state"]),
			LeaseExpired: a.flags["expired"], Epoch: a.u("epoch"), ExpectedIndex: a.u("expect")}
		if b, ok := h.s.Broker(a.subject); ok {
			if a.kv["epoch"] == "" {
				o.Epoch = b.GetEpoch()
			}
			for _, cur := range b.GetObservations() {
				if cur.GetObserverId() == o.GetObserverId() && a.kv["expect"] == "" {
					o.ExpectedIndex = cur.GetIndex()
				}
			}
		}
		op = o
	case "decide":
		op = &waldenv1.DeclareFailed{BrokerId: a.subject, Epoch: a.u("epoch"), DryRun: a.flags["dry_run"], Term: a.u("term"),
			LiveMembers: a.list("live"), Evidence: &waldenv1.Evidence{Manual: a.flags["manual"], DecidedBy: a.kv["by"]}}
	case "request-failover":
		op = &waldenv1.RequestFailover{BrokerId: a.subject, Epoch: a.u("epoch"), Reason: a.kv["reason"], Actor: "operator"}
	case "seed":
		p := policy.Defaults()
		for _, k := range policy.SortedKeys(a.kv) {
			if err := policy.Set(p, k, a.kv[k]); err != nil {
				t.Fatal(err)
			}
		}
		op = &waldenv1.SeedPolicy{Policy: p, SeededBy: "c1"}
	case "open":
		op = &waldenv1.OpenStreamRequest{BrokerId: a.subject, BrokerEpoch: a.u("epoch"), StreamId: a.u("stream")}
	case "commit":
		o := &waldenv1.Object{ObjectId: a.kv["obj"], Key: "k/" + a.kv["obj"]}
		for _, r := range a.list("ranges") {
			var s, e, from, to uint64
			if _, err := fmt.Sscanf(r, "%d/%d/%d-%d", &s, &e, &from, &to); err != nil {
				t.Fatalf("range %q: %v", r, err)
			}
			o.Ranges = append(o.Ranges, rng(s, e, from, to))
		}
		op = &waldenv1.CommitObjectRequest{BrokerId: a.subject, BrokerEpoch: a.u("epoch"), Object: o, Failover: a.failover()}
	case "close":
		op = &waldenv1.CloseStreamRequest{BrokerId: a.subject, BrokerEpoch: a.u("epoch"), StreamId: a.u("stream"),
			StreamEpoch: a.u("sepoch"), Failover: a.failover()}
	case "renew":
		op = &waldenv1.RenewJobLease{JobId: a.subject, Attempt: uint32(a.u("attempt")), AssigneeId: a.kv["by"]}
	case "reassign":
		op = &waldenv1.ReassignJob{JobId: a.subject, Attempt: uint32(a.u("attempt")), LiveMembers: a.list("live"), Reason: "job lease expired"}
	case "checkpoint":
		off, _ := strconv.ParseInt(a.kv["offset"], 10, 64)
		op = &waldenv1.CheckpointJob{JobId: a.subject, Attempt: uint32(a.u("attempt")), JobStep: named[waldenv1.JobStep](a.kv["step"]),
			StepDone: a.flags["done"], BytesUploaded: a.u("bytes"), StreamsClosed: uint32(a.u("closed")), RecoveredWalOffset: off}
	case "finish":
		off, _ := strconv.ParseInt(a.kv["offset"], 10, 64)
		op = &waldenv1.FinishJob{JobId: a.subject, Attempt: uint32(a.u("attempt")), JobState: named[waldenv1.JobState](a.kv["state"]), RecoveredWalOffset: off}
	case "cancel":
		op = &waldenv1.CancelJob{JobId: a.subject, Actor: "operator"}
	case "retry":
		op = &waldenv1.RetryJob{JobId: a.subject, Actor: "operator", LiveMembers: a.list("live")}
	case "ack":
		op = &waldenv1.AckBroker{BrokerId: a.subject, Actor: "operator"}
	case "maintenance":
		op = &waldenv1.SetMaintenance{BrokerId: a.subject, On: a.flags["on"] || a.subject == "on", Actor: "operator"}
	case "policy":
		op = &waldenv1.SetPolicy{Set: a.kv, Actor: "operator"}
	case "broker":
		b, ok := h.s.Broker(a.subject)
		if !ok {
			return "not found"
		}
		return renderBroker(b)
	case "job":
		j, ok := h.s.Job(a.subject)
		if !ok {
			return "not found"
		}
		return renderJob(j)
	case "stream":
		st, ok := h.s.Stream(a.u("stream"))
		if !ok {
			n, _ := strconv.ParseUint(a.subject, 10, 64)
			if st, ok = h.s.Stream(n); !ok {
				return "not found"
			}
		}
		return renderStream(st)
	case "streams":
		var out []string
		for _, st := range h.s.Streams(a.subject, "") {
			out = append(out, renderStream(st))
		}
		return strings.Join(out, "\n")
	case "events":
		var out []string
		for _, e := range h.s.Events(a.subject, int(a.u("limit"))) {
			out = append(out, fmt.Sprintf("%s %s %s", e.GetEventKind().Name(), e.GetBrokerId(), e.GetMessage()))
		}
		return strings.Join(out, "\n")
	default:
		t.Fatalf("unknown command %q", verb)
	}
	before := domainSnapshot(t, h.s)
	res, err := h.apply(op)
	if err != nil {
		if !protoEqual(before, domainSnapshot(t, h.s)) {
			t.Fatalf("refused %q changed the state", line)
		}
		return "error: " + string(refusal.Of(err))
	}
	return renderResult(res)
}

// named is the value of E that the scenario names s: unspecified for "",
// a value no walden knows for a name that is none (a command the state
// machine must refuse).
func named[E waldenv1.Named](s string) E {
	if s == "" {
		return 0
	}
	if v, ok := waldenv1.Parse[E](s); ok {
		return v
	}
	return E(999)
}

func renderResult(res *waldenv1.Result) string {
	switch v := res.GetValue().(type) {
	case *waldenv1.Result_RegisterBroker:
		return fmt.Sprintf("epoch=%d recovered_wal_offset=%d", v.RegisterBroker.GetEpoch(), v.RegisterBroker.GetRecoveredWalOffset())
	case *waldenv1.Result_DeclareFailed:
		d := v.DeclareFailed
		return fmt.Sprintf("new_epoch=%d job=%s dry_run=%t", d.GetNewEpoch(), d.GetJobId(), d.GetDryRun())
	case *waldenv1.Result_Broker:
		return renderBroker(v.Broker)
	case *waldenv1.Result_Policy:
		var kv []string
		for _, k := range sortedMapKeys(v.Policy.GetValues()) {
			kv = append(kv, k+"="+v.Policy.GetValues()[k])
		}
		if v.Policy.GetSeed() == nil {
			return strings.Join(kv, " ")
		}
		eff, _ := policy.Effective(v.Policy.GetSeed(), v.Policy)
		return fmt.Sprintf("seeded_by=%s effective lease_ttl=%s failure_timeout=%s overrides=[%s]", v.Policy.GetSeededBy(),
			policy.Format(eff, policy.KeyLeaseTTL), policy.Format(eff, policy.KeyFailureTimeout), strings.Join(kv, " "))
	case *waldenv1.Result_OpenStream:
		return renderStream(v.OpenStream.GetStream())
	case *waldenv1.Result_CloseStream:
		return renderStream(v.CloseStream.GetStream())
	case *waldenv1.Result_CommitObject:
		c := v.CommitObject
		out := []string{fmt.Sprintf("object %s redundant=%t failover=%t job=%s", c.GetObject().GetObjectId(), c.GetRedundant(),
			c.GetObject().GetFailover(), c.GetObject().GetJobId())}
		for _, st := range c.GetStreams() {
			out = append(out, renderStream(st))
		}
		return strings.Join(out, "\n")
	case *waldenv1.Result_Job:
		return renderJob(v.Job)
	default:
		return fmt.Sprintf("%v", res)
	}
}

func renderBroker(b *waldenv1.Broker) string {
	var obs []string
	for _, o := range b.GetObservations() {
		s := o.GetObserverId() + ":" + o.GetObservationState().Name()
		if o.GetLeaseExpired() {
			s += ":expired"
		}
		obs = append(obs, s)
	}
	return fmt.Sprintf("%s state=%s epoch=%d fenced=%t failovers=%d last_job=%s recovered_wal_offset=%d cooldown_blocked=%t observations=[%s]",
		b.GetBrokerId(), b.GetBrokerState().Name(), b.GetEpoch(), b.GetFenced(), b.GetFailovers(), b.GetLastJobId(),
		b.GetRecoveredWalOffset(), b.GetCooldownBlocked(), strings.Join(obs, " "))
}

func renderJob(j *waldenv1.Job) string {
	var cps []string
	for _, c := range j.GetCheckpoints() {
		cps = append(cps, fmt.Sprintf("%s@%d", c.GetJobStep().Name(), c.GetAttempt()))
	}
	return fmt.Sprintf("%s broker=%s token=%d attempt=%d assignee=%s state=%s step=%s bytes=%d closed=%d objects=[%s] checkpoints=[%s]",
		j.GetJobId(), j.GetBrokerId(), j.GetToken(), j.GetAttempt(), j.GetAssigneeId(), j.GetJobState().Name(), j.GetJobStep().Name(),
		j.GetBytesUploaded(), j.GetStreamsClosed(), strings.Join(j.GetObjects(), " "), strings.Join(cps, " "))
}

func renderStream(st *waldenv1.Stream) string {
	return fmt.Sprintf("stream %d state=%s epoch=%d owner=%s@%d start=%d end=%d objects=%d", st.GetStreamId(), st.GetState(),
		st.GetEpoch(), st.GetOwnerBrokerId(), st.GetOwnerEpoch(), st.GetStartOffset(), st.GetEndOffset(), st.GetObjects())
}

func sortedMapKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
