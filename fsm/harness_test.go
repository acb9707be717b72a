package fsm_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// harness drives one State through commands with consecutive indexes and a
// clock that the test moves.
type harness struct {
	t     testing.TB
	s     *fsm.State
	index uint64
	term  uint64
	nowMs int64
	// form, when set, rewrites every command before it is applied:
	// waldenv1.ToLegacy (an entry as a walden before the enums wrote it)
	// or waldenv1.UpgradeLegacy (enums only).
	form func(*waldenv1.Command)
	// viewUnchecked skips checkView (benchmarks over thousands of
	// brokers, where it would copy the registry at every entry).
	viewUnchecked bool
}

// newHarness returns a state with members c1, c2 and c3.
func newHarness(t testing.TB) *harness {
	t.Helper()
	h := &harness{t: t, s: fsm.New("demo"), nowMs: 1_700_000_000_000, term: 1}
	for _, id := range []string{"c1", "c2", "c3"} {
		h.index++
		if err := h.s.ApplyConfChange(h.index, addVoter(rid(id)), memberCtx(id), nil); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// cmd wraps an operation into a Command proposed by c1 now.
func (h *harness) cmd(op any) *waldenv1.Command {
	c := &waldenv1.Command{RequestId: h.index + 1, ProposedUnixMs: h.nowMs, ProposerId: "c1"}
	switch o := op.(type) {
	case *waldenv1.RegisterBroker:
		c.Op = &waldenv1.Command_RegisterBroker{RegisterBroker: o}
	case *waldenv1.ObserveBroker:
		c.Op = &waldenv1.Command_ObserveBroker{ObserveBroker: o}
	case *waldenv1.DeclareFailed:
		c.Op = &waldenv1.Command_DeclareFailed{DeclareFailed: o}
	case *waldenv1.SetPolicy:
		c.Op = &waldenv1.Command_SetPolicy{SetPolicy: o}
	case *waldenv1.AckBroker:
		c.Op = &waldenv1.Command_AckBroker{AckBroker: o}
	case *waldenv1.SetMaintenance:
		c.Op = &waldenv1.Command_SetMaintenance{SetMaintenance: o}
	case *waldenv1.RecordEvent:
		c.Op = &waldenv1.Command_RecordEvent{RecordEvent: o}
	case *waldenv1.RemoveBroker:
		c.Op = &waldenv1.Command_RemoveBroker{RemoveBroker: o}
	case *waldenv1.RequestFailover:
		c.Op = &waldenv1.Command_RequestFailover{RequestFailover: o}
	case *waldenv1.SeedPolicy:
		c.Op = &waldenv1.Command_SeedPolicy{SeedPolicy: o}
	case *waldenv1.OpenStreamRequest:
		c.Op = &waldenv1.Command_OpenStream{OpenStream: o}
	case *waldenv1.CommitObjectRequest:
		c.Op = &waldenv1.Command_CommitObject{CommitObject: o}
	case *waldenv1.CloseStreamRequest:
		c.Op = &waldenv1.Command_CloseStream{CloseStream: o}
	case *waldenv1.RenewJobLease:
		c.Op = &waldenv1.Command_RenewJobLease{RenewJobLease: o}
	case *waldenv1.ReassignJob:
		c.Op = &waldenv1.Command_ReassignJob{ReassignJob: o}
	case *waldenv1.CheckpointJob:
		c.Op = &waldenv1.Command_CheckpointJob{CheckpointJob: o}
	case *waldenv1.FinishJob:
		c.Op = &waldenv1.Command_FinishJob{FinishJob: o}
	case *waldenv1.CancelJob:
		c.Op = &waldenv1.Command_CancelJob{CancelJob: o}
	case *waldenv1.RetryJob:
		c.Op = &waldenv1.Command_RetryJob{RetryJob: o}
	case *waldenv1.ForceNewCluster:
		c.Op = &waldenv1.Command_ForceNewCluster{ForceNewCluster: o}
	case *waldenv1.BlockJob:
		c.Op = &waldenv1.Command_BlockJob{BlockJob: o}
	case *waldenv1.ResolveJob:
		c.Op = &waldenv1.Command_ResolveJob{ResolveJob: o}
	case *waldenv1.ReconcileScan:
		c.Op = &waldenv1.Command_ReconcileScan{ReconcileScan: o}
	case *waldenv1.ReconcileObjects:
		c.Op = &waldenv1.Command_ReconcileObjects{ReconcileObjects: o}
	case *waldenv1.ReconcilePlan:
		c.Op = &waldenv1.Command_ReconcilePlan{ReconcilePlan: o}
	case *waldenv1.ReconcileProgress:
		c.Op = &waldenv1.Command_ReconcileProgress{ReconcileProgress: o}
	default:
		h.t.Fatalf("unknown op %T", op)
	}
	return c
}

// apply applies op at the next index. An ObserveBroker without an epoch is
// made at the broker's current epoch and replaces the observer's current
// observation.
func (h *harness) apply(op any) (*waldenv1.Result, error) {
	if o, ok := op.(*waldenv1.ObserveBroker); ok && o.GetEpoch() == 0 {
		o = proto.Clone(o).(*waldenv1.ObserveBroker)
		if b, ok := h.s.Broker(o.GetBrokerId()); ok {
			o.Epoch = b.GetEpoch()
			for _, cur := range b.GetObservations() {
				if cur.GetObserverId() == o.GetObserverId() {
					o.ExpectedIndex = cur.GetIndex()
				}
			}
		}
		op = o
	}
	h.t.Helper()
	h.index++
	cmd := h.cmd(op)
	if h.form != nil {
		cmd = proto.Clone(cmd).(*waldenv1.Command)
		h.form(cmd)
	}
	res, err := h.s.Apply(h.index, h.term, cmd)
	if !h.viewUnchecked {
		h.checkView()
	}
	return res, err
}

// checkView fails the test when the registry copy the failure detector
// reads (BrokersView, kept up to date entry by entry) differs from the
// registry: every entry every test applies checks it.
func (h *harness) checkView() {
	h.t.Helper()
	view, all := h.s.BrokersView(), h.s.Brokers()
	if len(view) != len(all) {
		h.t.Fatalf("after index %d the brokers view holds %d brokers, the registry %d", h.index, len(view), len(all))
	}
	for i := range all {
		if !proto.Equal(view[i], all[i]) {
			h.t.Fatalf("after index %d the brokers view holds\n%v\nthe registry\n%v", h.index, view[i], all[i])
		}
	}
}

// ok applies op and fails the test on a refusal.
func (h *harness) ok(op any) *waldenv1.Result {
	h.t.Helper()
	res, err := h.apply(op)
	if err != nil {
		h.t.Fatalf("apply %T %v: %v", op, op, err)
	}
	return res
}

// refuse applies op, wants an error wrapping want, and checks that nothing
// but the applied index changed.
func (h *harness) refuse(op any, want error) error {
	h.t.Helper()
	before := domainSnapshot(h.t, h.s)
	_, err := h.apply(op)
	if !errors.Is(err, want) {
		h.t.Fatalf("apply %T %v = %v, want %v", op, op, err, want)
	}
	if after := domainSnapshot(h.t, h.s); !proto.Equal(before, after) {
		h.t.Fatalf("refused %T changed the state:\nbefore %v\nafter  %v", op, before, after)
	}
	return err
}

// domainSnapshot is the state's snapshot without the applied index and time.
func domainSnapshot(t testing.TB, s *fsm.State) *waldenv1.StateSnapshot {
	t.Helper()
	snap := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(mustSnapshot(t, s), snap); err != nil {
		t.Fatal(err)
	}
	snap.AppliedIndex, snap.LastAppliedUnixMs = 0, 0
	return snap
}

func (h *harness) register(id string) uint64 {
	h.t.Helper()
	res := h.ok(&waldenv1.RegisterBroker{BrokerId: id, AgentAddr: "127.0.0.1:75" + id[1:],
		Wal: &waldenv1.WalLocation{VolumeId: "vol-" + id, Path: "/var/lib/broker/" + id + ".wal"}})
	return res.GetRegisterBroker().GetEpoch()
}

func (h *harness) broker(id string) *waldenv1.Broker {
	h.t.Helper()
	b, ok := h.s.Broker(id)
	if !ok {
		h.t.Fatalf("broker %q not found", id)
	}
	return b
}

func (h *harness) job(id string) *waldenv1.Job {
	h.t.Helper()
	j, ok := h.s.Job(id)
	if !ok {
		h.t.Fatalf("job %q not found", id)
	}
	return j
}

func (h *harness) stream(id uint64) *waldenv1.Stream {
	h.t.Helper()
	st, ok := h.s.Stream(id)
	if !ok {
		h.t.Fatalf("stream %d not found", id)
	}
	return st
}

// declare fails broker id at its current epoch with live members c1..c3.
func (h *harness) declare(id string) *waldenv1.DeclareFailedResult {
	h.t.Helper()
	b := h.broker(id)
	return h.ok(&waldenv1.DeclareFailed{BrokerId: id, Epoch: b.GetEpoch(),
		Evidence:    &waldenv1.Evidence{Reason: "test", DecidedBy: "c1"},
		LiveMembers: []string{"c3", "c2", "c1"}}).GetDeclareFailed()
}

func obj(id string, ranges ...*waldenv1.ObjectRange) *waldenv1.Object {
	return &waldenv1.Object{ObjectId: id, Key: "objects/" + id, Size: 100, Ranges: ranges}
}

func rng(stream, streamEpoch, start, end uint64) *waldenv1.ObjectRange {
	return &waldenv1.ObjectRange{StreamId: stream, StreamEpoch: streamEpoch, StartOffset: start, EndOffset: end}
}

func fo(j *waldenv1.Job) *waldenv1.FailoverContext {
	return &waldenv1.FailoverContext{JobId: j.GetJobId(), Attempt: j.GetAttempt(), Token: j.GetToken()}
}

func protoEqual(a, b *waldenv1.StateSnapshot) bool { return proto.Equal(a, b) }

func errorsIs(err, target error) bool { return errors.Is(err, target) }

var errUnknownNode = refusal.ErrUnknownNode

func bytesContains(s, sub string) bool { return strings.Contains(s, sub) }
