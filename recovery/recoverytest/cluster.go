package recoverytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// ErrDown is what a member that is down (killed or cut off) gets from its
// raft node.
var ErrDown = errors.New("member is down")

// Cluster is an in-process replicated state: one fsm.State that every
// member proposes to in order (as raft would apply), with a leader chosen
// by the test and members the test takes down.
type Cluster struct {
	t  testing.TB
	mu sync.Mutex
	s  *fsm.State
	ix uint64

	leader string
	term   uint64
	down   map[string]bool
	ids    []string
}

// NewCluster returns a cluster of the members ids; the first leads.
func NewCluster(t testing.TB, ids ...string) *Cluster {
	t.Helper()
	c := &Cluster{t: t, s: fsm.New("test"), down: map[string]bool{}, ids: ids, leader: ids[0], term: 1}
	for i, id := range ids {
		c.ix++
		cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(uint64(100 + i))}}}
		ctx := &waldenv1.ConfChangeContext{Member: &waldenv1.MemberContext{Id: id, RaftAddr: fmt.Sprintf("127.0.0.1:%d", 7100+i), AdminAddr: fmt.Sprintf("127.0.0.1:%d", 7000+i)}}
		if err := c.s.ApplyConfChange(c.ix, cc, ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// State is the replicated state.
func (c *Cluster) State() *fsm.State { return c.s }

// Restore replaces the state with a raft snapshot's data (a restored
// cluster: backup.Rewrite of a backup of cluster "test") at its applied
// index, in a new term.
func (c *Cluster) Restore(data []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.s.Restore(data); err != nil {
		return err
	}
	c.ix = c.s.AppliedIndex()
	c.term++
	return nil
}

// SetLeader makes id the leader in a new term.
func (c *Cluster) SetLeader(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader, c.term = id, c.term+1
}

// SetDown takes member id down or up.
func (c *Cluster) SetDown(id string, down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down[id] = down
}

// Apply applies cmd as proposed by proposer.
func (c *Cluster) Apply(proposer string, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down[proposer] {
		return nil, ErrDown
	}
	cmd = proto.Clone(cmd).(*waldenv1.Command)
	c.ix++
	cmd.RequestId, cmd.ProposerId, cmd.ProposedUnixMs = c.ix, proposer, time.Now().UnixMilli()
	fsm.PrepareProposal(cmd) // as raftnode does
	return c.s.Apply(c.ix, c.term, cmd)
}

// ApplyOld applies cmd as an entry of a walden before the check levels
// (Command.checks 0) would be: the state an older walden left.
func (c *Cluster) ApplyOld(cmd *waldenv1.Command) (*waldenv1.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ix++
	cmd.RequestId, cmd.ProposerId, cmd.ProposedUnixMs = c.ix, "old", time.Now().UnixMilli()
	return c.s.Apply(c.ix, c.term, cmd)
}

// Must applies the operation o as an operator would, failing the test on
// a refusal.
func (c *Cluster) Must(o proto.Message) *waldenv1.Result {
	c.t.Helper()
	res, err := c.Apply("admin", Op(o))
	if err != nil {
		c.t.Fatalf("%T: %v", o, err)
	}
	return res
}

// Declare fences the broker and creates its job, assigned among live.
func (c *Cluster) Declare(broker string, epoch uint64, live ...string) *waldenv1.Job {
	c.t.Helper()
	res := c.Must(&waldenv1.DeclareFailed{BrokerId: broker, Epoch: epoch, LiveMembers: live,
		Evidence: &waldenv1.Evidence{Manual: true, Reason: "test"}})
	j, ok := c.s.Job(res.GetDeclareFailed().GetJobId())
	if !ok {
		c.t.Fatal("no job")
	}
	return j
}

// WaitJob polls until cond holds for the job or d passes.
func (c *Cluster) WaitJob(id string, d time.Duration, what string, cond func(*waldenv1.Job) bool) *waldenv1.Job {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		j, _ := c.s.Job(id)
		if j != nil && cond(j) {
			return j
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("job %s not %s within %s: %v", id, what, d, j)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Member is one coordinator's access to the cluster (recovery.Cluster).
func (c *Cluster) Member(id string) recovery.Cluster { return member{c: c, id: id} }

type member struct {
	c  *Cluster
	id string
}

func (m member) Propose(ctx context.Context, cmd *waldenv1.Command) (*waldenv1.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return m.c.Apply(m.id, cmd)
}

func (m member) LinearizableRead(ctx context.Context) error {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.c.down[m.id] {
		return ErrDown
	}
	return ctx.Err()
}

func (m member) Leadership() (bool, uint64) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.c.leader == m.id && !m.c.down[m.id], m.c.term
}

func (m member) LiveMembers() []string {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	var out []string
	for _, id := range m.c.ids {
		if !m.c.down[id] {
			out = append(out, id)
		}
	}
	return out
}

// Op wraps an operation into a Command.
func Op(o proto.Message) *waldenv1.Command {
	c := &waldenv1.Command{}
	switch o := o.(type) {
	case *waldenv1.RegisterBroker:
		c.Op = &waldenv1.Command_RegisterBroker{RegisterBroker: o}
	case *waldenv1.DeclareFailed:
		c.Op = &waldenv1.Command_DeclareFailed{DeclareFailed: o}
	case *waldenv1.OpenStreamRequest:
		c.Op = &waldenv1.Command_OpenStream{OpenStream: o}
	case *waldenv1.CommitObjectRequest:
		c.Op = &waldenv1.Command_CommitObject{CommitObject: o}
	case *waldenv1.CloseStreamRequest:
		c.Op = &waldenv1.Command_CloseStream{CloseStream: o}
	case *waldenv1.ReassignJob:
		c.Op = &waldenv1.Command_ReassignJob{ReassignJob: o}
	case *waldenv1.CancelJob:
		c.Op = &waldenv1.Command_CancelJob{CancelJob: o}
	case *waldenv1.ResolveJob:
		c.Op = &waldenv1.Command_ResolveJob{ResolveJob: o}
	case *waldenv1.FinishJob:
		c.Op = &waldenv1.Command_FinishJob{FinishJob: o}
	case *waldenv1.ObserveBroker:
		c.Op = &waldenv1.Command_ObserveBroker{ObserveBroker: o}
	default:
		panic(fmt.Sprintf("recoverytest: op %T", o))
	}
	return c
}
