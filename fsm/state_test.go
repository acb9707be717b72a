package fsm_test

import (
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
)

// stateMachine lists the methods raftnode.StateMachine requires (the server
// hands fsm.New to raftnode.NewNode, which checks the real interface at
// compile time; the fsm tests do not import raftnode so that they build on
// their own).
type stateMachine interface {
	Apply(index, term uint64, cmd *waldenv1.Command) (*waldenv1.Result, error)
	ApplyConfChange(index uint64, cc *raftpb.ConfChangeV2, ctx *waldenv1.ConfChangeContext, cs *raftpb.ConfState) error
	Snapshot() ([]byte, error)
	Restore(data []byte) error
	AppliedIndex() uint64
	Members() []*waldenv1.Member
}

var _ stateMachine = (*fsm.State)(nil)

func noop(ms int64, payload string) *waldenv1.Command {
	return &waldenv1.Command{RequestId: 1, ProposedUnixMs: ms, ProposerId: "c1",
		Op: &waldenv1.Command_Noop{Noop: &waldenv1.Noop{Payload: []byte(payload)}}}
}

func noopCount(t *testing.T, res *waldenv1.Result) uint64 {
	t.Helper()
	n, ok := res.GetValue().(*waldenv1.Result_Noop)
	if !ok {
		t.Fatalf("result %v is not a NoopResult", res)
	}
	return n.Noop.GetCount()
}

func mustSnapshot(t testing.TB, s *fsm.State) []byte {
	t.Helper()
	b, err := s.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return b
}

func TestApply(t *testing.T) {
	type step struct {
		index     uint64
		cmd       *waldenv1.Command
		wantErr   error
		wantCount uint64 // NoopResult.count when wantErr is nil
		// after the step
		wantApplied uint64
		wantNoops   uint64
		wantTimeMs  int64
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"noops count up", []step{
			{index: 1, cmd: noop(1000, "a"), wantCount: 1, wantApplied: 1, wantNoops: 1, wantTimeMs: 1000},
			{index: 2, cmd: noop(1001, ""), wantCount: 2, wantApplied: 2, wantNoops: 2, wantTimeMs: 1001},
			{index: 7, cmd: noop(1002, "b"), wantCount: 3, wantApplied: 7, wantNoops: 3, wantTimeMs: 1002},
		}},
		{"stale index changes nothing", []step{
			{index: 5, cmd: noop(1000, ""), wantCount: 1, wantApplied: 5, wantNoops: 1, wantTimeMs: 1000},
			{index: 5, cmd: noop(2000, ""), wantErr: fsm.ErrStaleIndex, wantApplied: 5, wantNoops: 1, wantTimeMs: 1000},
			{index: 3, cmd: noop(3000, ""), wantErr: fsm.ErrStaleIndex, wantApplied: 5, wantNoops: 1, wantTimeMs: 1000},
			{index: 0, cmd: noop(3000, ""), wantErr: fsm.ErrStaleIndex, wantApplied: 5, wantNoops: 1, wantTimeMs: 1000},
		}},
		{"unknown command still advances the applied index", []step{
			{index: 1, cmd: &waldenv1.Command{RequestId: 9, ProposedUnixMs: 500}, wantErr: fsm.ErrUnknownCommand, wantApplied: 1, wantTimeMs: 500},
			{index: 2, cmd: nil, wantErr: fsm.ErrUnknownCommand, wantApplied: 2, wantTimeMs: 500},
			{index: 3, cmd: noop(600, ""), wantCount: 1, wantApplied: 3, wantNoops: 1, wantTimeMs: 600},
		}},
		{"time comes from the entries and never runs backwards", []step{
			{index: 1, cmd: noop(5000, ""), wantCount: 1, wantApplied: 1, wantNoops: 1, wantTimeMs: 5000},
			{index: 2, cmd: noop(4000, ""), wantCount: 2, wantApplied: 2, wantNoops: 2, wantTimeMs: 5000},
			{index: 3, cmd: noop(0, ""), wantCount: 3, wantApplied: 3, wantNoops: 3, wantTimeMs: 5000},
			{index: 4, cmd: noop(5001, ""), wantCount: 4, wantApplied: 4, wantNoops: 4, wantTimeMs: 5001},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.New("demo")
			for i, st := range tc.steps {
				res, err := s.Apply(st.index, 1, st.cmd)
				if st.wantErr != nil {
					if !errors.Is(err, st.wantErr) || res != nil {
						t.Fatalf("step %d: Apply(%d) = %v, %v; want error %v", i, st.index, res, err, st.wantErr)
					}
				} else {
					if err != nil {
						t.Fatalf("step %d: Apply(%d): %v", i, st.index, err)
					}
					if res.GetIndex() != st.index || noopCount(t, res) != st.wantCount {
						t.Fatalf("step %d: result %v, want index %d count %d", i, res, st.index, st.wantCount)
					}
				}
				if got := s.AppliedIndex(); got != st.wantApplied {
					t.Errorf("step %d: AppliedIndex = %d, want %d", i, got, st.wantApplied)
				}
				if got := s.NoopCount(); got != st.wantNoops {
					t.Errorf("step %d: NoopCount = %d, want %d", i, got, st.wantNoops)
				}
				if got := s.LastAppliedUnixMs(); got != st.wantTimeMs {
					t.Errorf("step %d: LastAppliedUnixMs = %d, want %d", i, got, st.wantTimeMs)
				}
			}
		})
	}
}

// TestApplyStaleIndexLeavesStateUnchanged compares the serialized state
// around refused applies.
func TestApplyStaleIndexLeavesStateUnchanged(t *testing.T) {
	s := fsm.New("demo")
	if _, err := s.Apply(3, 1, noop(10, "")); err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyConfChange(4, addVoter(rid("c1")), memberCtx("c1"), nil); err != nil {
		t.Fatal(err)
	}
	before := mustSnapshot(t, s)
	if _, err := s.Apply(4, 1, noop(99, "")); !errors.Is(err, fsm.ErrStaleIndex) {
		t.Fatalf("Apply(4) after 4: %v", err)
	}
	if err := s.ApplyConfChange(2, addVoter(rid("c2")), memberCtx("c2"), nil); !errors.Is(err, fsm.ErrStaleIndex) {
		t.Fatalf("ApplyConfChange(2) after 4: %v", err)
	}
	if after := mustSnapshot(t, s); string(after) != string(before) {
		t.Fatal("a refused stale entry changed the state")
	}
}

// rid is a stand-in raft id for a member name (the fsm takes raft ids from
// the changes, whatever their derivation).
func rid(id string) uint64 {
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "c"))
	return uint64(100 + n)
}

func memberCtx(id string) *waldenv1.ConfChangeContext {
	return &waldenv1.ConfChangeContext{RequestId: 7, Member: &waldenv1.MemberContext{
		Id: id, RaftAddr: "127.0.0.1:71" + strings.TrimPrefix(id, "c"), AdminAddr: "127.0.0.1:70" + strings.TrimPrefix(id, "c")}}
}

func change(t raftpb.ConfChangeType, id uint64) *raftpb.ConfChangeV2 {
	return &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: t.Enum(), NodeId: new(id)}}}
}

func addVoter(id uint64) *raftpb.ConfChangeV2   { return change(raftpb.ConfChangeAddNode, id) }
func addLearner(id uint64) *raftpb.ConfChangeV2 { return change(raftpb.ConfChangeAddLearnerNode, id) }
func remove(id uint64) *raftpb.ConfChangeV2     { return change(raftpb.ConfChangeRemoveNode, id) }

const (
	voter   = waldenv1.MemberRole_MEMBER_ROLE_VOTER
	learner = waldenv1.MemberRole_MEMBER_ROLE_LEARNER
)

// member is the expected Members() entry for name with role.
func member(name string, role waldenv1.MemberRole) *waldenv1.Member {
	mc := memberCtx(name).GetMember()
	return &waldenv1.Member{Id: name, RaftId: rid(name), RaftAddr: mc.GetRaftAddr(), AdminAddr: mc.GetAdminAddr(), MemberRole: role}
}

func TestApplyConfChange(t *testing.T) {
	type step struct {
		cc      *raftpb.ConfChangeV2
		ctx     *waldenv1.ConfChangeContext
		wantErr error
		want    []*waldenv1.Member
	}
	founders := []step{
		{cc: addVoter(rid("c1")), ctx: memberCtx("c1"), want: []*waldenv1.Member{member("c1", voter)}},
		{cc: addVoter(rid("c2")), ctx: memberCtx("c2"), want: []*waldenv1.Member{member("c1", voter), member("c2", voter)}},
	}
	two := []*waldenv1.Member{member("c1", voter), member("c2", voter)}
	cases := []struct {
		name  string
		steps []step
	}{
		{"add voters", founders},
		{"add learner then promote", append(founders[:2:2],
			step{cc: addLearner(rid("c3")), ctx: memberCtx("c3"), want: []*waldenv1.Member{member("c1", voter), member("c2", voter), member("c3", learner)}},
			step{cc: addVoter(rid("c3")), ctx: nil, want: []*waldenv1.Member{member("c1", voter), member("c2", voter), member("c3", voter)}},
		)},
		{"demote voter to learner", append(founders[:2:2],
			step{cc: addLearner(rid("c2")), want: []*waldenv1.Member{member("c1", voter), member("c2", learner)}},
		)},
		{"remove", append(founders[:2:2],
			step{cc: remove(rid("c1")), want: []*waldenv1.Member{member("c2", voter)}},
		)},
		{"remove unknown", append(founders[:2:2],
			step{cc: remove(rid("c9")), wantErr: fsm.ErrUnknownMember, want: two},
		)},
		{"add without context", append(founders[:2:2],
			step{cc: addVoter(rid("c3")), wantErr: fsm.ErrNoMemberContext, want: two},
		)},
		{"add a taken id under another raft id", append(founders[:2:2],
			step{cc: addVoter(999), ctx: memberCtx("c2"), wantErr: fsm.ErrDuplicateMember, want: two},
		)},
		{"update addresses", append(founders[:2:2],
			step{cc: change(raftpb.ConfChangeUpdateNode, rid("c2")),
				ctx:  &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: "c2", RaftAddr: "10.0.0.2:7102", AdminAddr: "10.0.0.2:7002"}},
				want: []*waldenv1.Member{member("c1", voter), {Id: "c2", RaftId: rid("c2"), RaftAddr: "10.0.0.2:7102", AdminAddr: "10.0.0.2:7002", MemberRole: voter}}},
			step{cc: change(raftpb.ConfChangeUpdateNode, rid("c7")), wantErr: fsm.ErrUnknownMember,
				want: []*waldenv1.Member{member("c1", voter), {Id: "c2", RaftId: rid("c2"), RaftAddr: "10.0.0.2:7102", AdminAddr: "10.0.0.2:7002", MemberRole: voter}}},
		)},
		{"joint change applies every part", append(founders[:2:2],
			step{cc: &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{
				{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: new(rid("c3"))},
				{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(rid("c9"))},
				{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: new(rid("c1"))},
			}}, ctx: memberCtx("c3"), wantErr: fsm.ErrUnknownMember,
				want: []*waldenv1.Member{member("c2", voter), member("c3", learner)}},
		)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.New("demo")
			for i, st := range tc.steps {
				index := uint64(10 + i)
				err := s.ApplyConfChange(index, st.cc, st.ctx, nil)
				if (st.wantErr == nil && err != nil) || (st.wantErr != nil && !errors.Is(err, st.wantErr)) {
					t.Fatalf("step %d: ApplyConfChange = %v, want %v", i, err, st.wantErr)
				}
				if s.AppliedIndex() != index {
					t.Errorf("step %d: AppliedIndex = %d, want %d", i, s.AppliedIndex(), index)
				}
				got := s.Members()
				for _, m := range got {
					// The incarnation is the index of the change that
					// added the member last (TestMemberIncarnation).
					m.Incarnation = 0
				}
				if len(got) != len(st.want) {
					t.Fatalf("step %d: Members = %v, want %v", i, got, st.want)
				}
				for j := range got {
					if !proto.Equal(got[j], st.want[j]) {
						t.Fatalf("step %d: Members[%d] = %v, want %v", i, j, got[j], st.want[j])
					}
				}
			}
		})
	}
}

// TestMembersAreCopies checks that callers cannot change the state through
// Members.
func TestMembersAreCopies(t *testing.T) {
	s := fsm.New("demo")
	if err := s.ApplyConfChange(1, addVoter(rid("c1")), memberCtx("c1"), nil); err != nil {
		t.Fatal(err)
	}
	s.Members()[0].RaftAddr = "changed"
	if got := s.Members()[0].GetRaftAddr(); got == "changed" {
		t.Fatal("Members returned the state's own member")
	}
}

// buildState applies a mix of commands and conf changes.
func buildState(t *testing.T) *fsm.State {
	t.Helper()
	s := fsm.New("demo")
	steps := []func(i uint64) error{
		func(i uint64) error { return s.ApplyConfChange(i, addVoter(rid("c1")), memberCtx("c1"), nil) },
		func(i uint64) error { return s.ApplyConfChange(i, addVoter(rid("c2")), memberCtx("c2"), nil) },
		func(i uint64) error { return s.ApplyConfChange(i, addLearner(rid("c3")), memberCtx("c3"), nil) },
		func(i uint64) error { _, err := s.Apply(i, 1, noop(1700000000000, "x")); return err },
		func(i uint64) error { _, err := s.Apply(i, 1, noop(1700000000123, "y")); return err },
	}
	for i, f := range steps {
		if err := f(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	s := buildState(t)
	data := mustSnapshot(t, s)
	r := fsm.New("demo")
	if err := r.Restore(data); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	a, b := &waldenv1.StateSnapshot{}, &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, a); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(mustSnapshot(t, r), b); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(a, b) {
		t.Fatalf("restored state differs:\n %v\n %v", a, b)
	}
	if a.GetVersion() != 3 || a.GetAppliedIndex() != 5 || a.GetNoopCount() != 2 || len(a.GetMembers()) != 3 || a.GetLastAppliedUnixMs() != 1700000000123 {
		t.Fatalf("snapshot content = %v", a)
	}
	// Both go on identically.
	for _, st := range []*fsm.State{s, r} {
		res, err := st.Apply(6, 1, noop(1, ""))
		if err != nil || noopCount(t, res) != 3 {
			t.Fatalf("Apply after restore = %v, %v", res, err)
		}
	}
	if string(mustSnapshot(t, s)) != string(mustSnapshot(t, r)) {
		t.Fatal("states diverged after restore")
	}
	// A restore replaces everything, including a later state.
	if err := s.Restore(data); err != nil || s.AppliedIndex() != 5 || s.NoopCount() != 2 {
		t.Fatalf("Restore over a newer state: %v, applied %d", err, s.AppliedIndex())
	}
}

func TestRestoreRefuses(t *testing.T) {
	good := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(mustSnapshot(t, buildState(t)), good); err != nil {
		t.Fatal(err)
	}
	edit := func(f func(s *waldenv1.StateSnapshot)) []byte {
		c := proto.Clone(good).(*waldenv1.StateSnapshot)
		f(c)
		b, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name     string
		data     []byte
		want     error
		wantText string
	}{
		{"unknown version", edit(func(s *waldenv1.StateSnapshot) { s.Version = 4 }), fsm.ErrSnapshotVersion, "version 4, this walden reads versions 1 to 3"},
		{"no version", edit(func(s *waldenv1.StateSnapshot) { s.Version = 0 }), fsm.ErrSnapshotVersion, "version 0"},
		{"other cluster", edit(func(s *waldenv1.StateSnapshot) { s.ClusterName = "prod" }), fsm.ErrForeignSnapshot, `snapshot of cluster "prod", this is cluster "demo"`},
		{"garbage", []byte{0xff, 0xff, 0xff, 0xff}, fsm.ErrInvalidSnapshot, "invalid snapshot"},
		{"member twice", edit(func(s *waldenv1.StateSnapshot) { s.Members = append(s.Members, s.Members[0]) }), fsm.ErrInvalidSnapshot, `member "c1"`},
		{"member without raft id", edit(func(s *waldenv1.StateSnapshot) { s.Members[1].RaftId = 0 }), fsm.ErrInvalidSnapshot, `member "c2" with raft id 0`},
		{"unknown role", edit(func(s *waldenv1.StateSnapshot) { s.Members[0].MemberRole = waldenv1.MemberRole_MEMBER_ROLE_LEADER }), fsm.ErrInvalidSnapshot, `role "leader"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.New("demo")
			if _, err := s.Apply(1, 1, noop(5, "")); err != nil {
				t.Fatal(err)
			}
			before := mustSnapshot(t, s)
			err := s.Restore(tc.data)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("Restore = %v, want %v saying %q", err, tc.want, tc.wantText)
			}
			if string(mustSnapshot(t, s)) != string(before) {
				t.Fatal("a refused Restore changed the state")
			}
		})
	}
}

// randomStep applies one random entry at index to every state in ss (the
// same entry to all) and returns a description.
func randomStep(rng *rand.Rand, index uint64, ss []*fsm.State) (string, []string) {
	names := []string{"c1", "c2", "c3", "c4", "c5"}
	name := names[rng.IntN(len(names))]
	var apply func(s *fsm.State) string
	desc := ""
	switch rng.IntN(6) {
	case 0, 1:
		cmd := noop(rng.Int64N(1<<42), strconv.Itoa(rng.IntN(1000)))
		desc = "noop"
		apply = func(s *fsm.State) string { r, err := s.Apply(index, 1, cmd); return fmt.Sprint(r, err) }
	case 2:
		cmd := &waldenv1.Command{RequestId: rng.Uint64(), ProposedUnixMs: rng.Int64N(1 << 42)}
		desc = "unknown"
		apply = func(s *fsm.State) string { r, err := s.Apply(index, 1, cmd); return fmt.Sprint(r, err) }
	case 3:
		types := []raftpb.ConfChangeType{raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode, raftpb.ConfChangeRemoveNode, raftpb.ConfChangeUpdateNode}
		typ := types[rng.IntN(len(types))]
		cc := change(typ, rid(name))
		var ctx *waldenv1.ConfChangeContext
		if rng.IntN(4) != 0 {
			ctx = memberCtx(name)
		}
		desc = fmt.Sprintf("%v %s", typ, name)
		apply = func(s *fsm.State) string { return fmt.Sprint(s.ApplyConfChange(index, cc, ctx, nil)) }
	case 4:
		stale := index - uint64(rng.IntN(int(index)))
		desc = fmt.Sprintf("stale %d", stale)
		apply = func(s *fsm.State) string { r, err := s.Apply(stale-1, 1, noop(1, "")); return fmt.Sprint(r, err) }
	default:
		// An index gap, as when the node skips an empty or undecodable entry.
		cmd := noop(rng.Int64N(1<<42), "")
		desc = "noop after gap"
		apply = func(s *fsm.State) string { r, err := s.Apply(index+1, 1, cmd); return fmt.Sprint(r, err) }
	}
	results := make([]string, len(ss))
	for i, s := range ss {
		results[i] = apply(s)
	}
	return desc, results
}

// TestDeterminism feeds the same random entries to several states, one of
// which is rebuilt from a snapshot along the way, and requires identical
// results and identical final snapshots.
func TestDeterminism(t *testing.T) {
	for seed := range 50 {
		rng := rand.New(rand.NewPCG(uint64(seed), 99))
		ss := []*fsm.State{fsm.New("demo"), fsm.New("demo"), fsm.New("demo")}
		index := uint64(0)
		for step := range 300 {
			index += 2
			desc, results := randomStep(rng, index, ss)
			for i := 1; i < len(results); i++ {
				if results[i] != results[0] {
					t.Fatalf("seed %d step %d (%s): state %d answered %q, state 0 %q", seed, step, desc, i, results[i], results[0])
				}
			}
			if rng.IntN(50) == 0 {
				// Replace the third state by a restore of the second.
				r := fsm.New("demo")
				if err := r.Restore(mustSnapshot(t, ss[1])); err != nil {
					t.Fatal(err)
				}
				ss[2] = r
			}
			index = max(index, ss[0].AppliedIndex())
		}
		want := mustSnapshot(t, ss[0])
		for i, s := range ss[1:] {
			if string(mustSnapshot(t, s)) != string(want) {
				t.Fatalf("seed %d: state %d ended different from state 0", seed, i+1)
			}
		}
	}
}

// TestNoClockRandomnessOrIO keeps the state machine deterministic by
// construction: its non-test files import nothing that reads a clock, draws
// random numbers or does I/O.
func TestNoClockRandomnessOrIO(t *testing.T) {
	forbidden := map[string]bool{
		"time": true, "math/rand": true, "math/rand/v2": true, "crypto/rand": true,
		"os": true, "io/ioutil": true, "net": true, "net/http": true, "syscall": true, "log": true, "log/slog": true,
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if forbidden[p] {
				t.Errorf("%s imports %q: the state machine must not read clocks, draw random numbers or do I/O", f, p)
			}
		}
		checked++
	}
	if checked < 4 {
		t.Fatalf("checked only %d files", checked)
	}
}
