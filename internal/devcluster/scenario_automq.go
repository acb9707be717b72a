package devcluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"time"

	"walden/automq/devcontroller"
	"walden/loadgen"
	waldenv1 "walden/proto/walden/v1"
)

// AutomqSummary is the AutoMQ side of a failover of an AutoMQ-mode broker:
// what walden's recovery did at AutoMQ's controller (from the job's target
// report) and what the new leaders saw.
type AutomqSummary struct {
	ClusterID string `json:"cluster_id"`
	// NodeID and NodeEpoch are the node failed over and its epoch.
	NodeID    int64 `json:"node_id"`
	NodeEpoch int64 `json:"node_epoch"`
	// WALReset says the recovery emptied the victim's WAL.
	WALReset bool `json:"wal_reset"`
	// Objects are the objects the recovery committed.
	Objects []AutomqObject `json:"objects"`
	// Streams are the victim's streams: end offsets at the controller
	// before and after the recovery, record batches it committed, and the
	// broker that leads each one now.
	Streams []AutomqStream `json:"streams"`
	// NotClosedAnswers counts the OpenStreams answers STREAM_NOT_CLOSED the
	// controller gave (new leaders waiting for the failover to close the
	// streams) from the kill to the end of the failover.
	NotClosedAnswers int `json:"stream_not_closed_answers"`
	// NodeEpochAfter is the node's epoch at the controller at the end: the
	// epoch of the broker's restart by its agent (0 when it did not start
	// again yet).
	NodeEpochAfter int64 `json:"node_epoch_after"`
}

// AutomqObject is an object the recovery committed.
type AutomqObject struct {
	ObjectID int64  `json:"object_id"`
	Key      string `json:"key"`
	Size     uint64 `json:"size"`
	Kind     string `json:"kind"`
}

// AutomqStream is one stream of the node failed over.
type AutomqStream struct {
	StreamID        int64  `json:"stream_id"`
	EndOffsetBefore int64  `json:"end_offset_before"`
	EndOffsetAfter  int64  `json:"end_offset_after"`
	Records         uint64 `json:"records"`
	Leader          string `json:"leader"`
}

// automqWatch is what the watcher saw of the AutoMQ controller.
type automqWatch struct {
	streams     map[int64]string
	notClosed   int // STREAM_NOT_CLOSED answers counted so far
	notClosedAt int // the count at the kill
	// notClosedSaid is the count last printed, notClosedSaidAt when.
	notClosedSaid   int
	notClosedSaidAt time.Time
	checkpoints     map[string]int
	nodeEpoch       int64
}

// LoadConfig completes a load's configuration for this cluster: through
// the coordinators' catalog, or, with AutoMQ-mode brokers, through the
// brokers themselves.
func (c *Cluster) LoadConfig(lc loadgen.LoadConfig) loadgen.LoadConfig {
	lc.DialOptions = c.DialOptions()
	if c.IsAutomq() {
		lc.Brokers = c.BrokerAddrs()
	} else {
		lc.Coordinators = c.AdminAddrs()
	}
	return lc
}

// Verify checks a ledger: through the brokers, or, with AutoMQ-mode
// brokers, through AutoMQ's objects in S3 and the controller's view.
func (c *Cluster) Verify(ctx context.Context, ledger string, wait time.Duration) (*loadgen.VerifyReport, error) {
	if c.IsAutomq() {
		return loadgen.VerifyAutomq(ctx, loadgen.AutomqVerifyConfig{MetadataURL: c.MetadataURL(), S3: c.S3Config, Ledger: ledger, Wait: wait,
			HTTPClient: c.HTTPClient(5 * time.Second)})
	}
	return loadgen.Verify(ctx, loadgen.VerifyConfig{Coordinators: c.AdminAddrs(), Ledger: ledger, Wait: wait, DialOptions: c.DialOptions()})
}

// streamsLedBy returns the streams broker p owns: in the catalog, or
// OPENED by its node at the AutoMQ controller.
func (c *Cluster) streamsLedBy(ctx context.Context, p *Proc) (map[uint64]bool, error) {
	owned := map[uint64]bool{}
	if !c.IsAutomq() {
		ss, err := c.ListStreams(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range StreamsOf(ss, p.Name) {
			owned[s.GetStreamId()] = true
		}
		return owned, nil
	}
	ss, err := c.View().Streams(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		if s.State == devcontroller.StreamOpened && s.Owner == NodeOf(p) {
			owned[uint64(s.StreamID)] = true
		}
	}
	return owned, nil
}

// signalAutomqBroker sends the scenario's signal to the victim's broker
// process (not to its agent, which must see the broker dead).
func (c *Cluster) signalAutomqBroker(ctx context.Context, f *Failover, victim *Proc, owned int) error {
	sig := f.Signal
	if sig == 0 {
		sig = syscall.SIGKILL
	}
	if sig == syscall.SIGKILL {
		st, _ := c.AgentBroker(ctx, victim)
		f.say("kill -9 %s's broker (pid %d, AutoMQ node %d), leader of %d streams; its agent (pid %d) lives on and must see it dead",
			f.Victim, st.PID, NodeOf(victim), owned, victim.Pid())
		_, err := c.KillBroker(ctx, victim)
		return err
	}
	st, err := c.AgentBroker(ctx, victim)
	if err != nil {
		return err
	}
	f.say("kill -%d %s's broker (pid %d: %v, AutoMQ node %d), leader of %d streams", int(sig), f.Victim, st.PID, sig, NodeOf(victim), owned)
	if err := syscall.Kill(st.PID, sig); err != nil {
		return fmt.Errorf("signal the broker of %s (pid %d): %w", victim.Name, st.PID, err)
	}
	return nil
}

// UploadAutomqWALs has every running AutoMQ-mode broker upload what its WAL
// holds (SIGUSR1, as its upload timer would) and waits until each reports
// nothing pending.
func (c *Cluster) UploadAutomqWALs(ctx context.Context, timeout time.Duration) error {
	var live []*Proc
	for _, b := range c.Brokers {
		st, err := c.AgentBroker(ctx, b)
		if err != nil || st.PID <= 0 || st.State != "up" {
			continue
		}
		if err := syscall.Kill(st.PID, syscall.SIGUSR1); err != nil {
			continue
		}
		live = append(live, b)
	}
	return Poll(ctx, timeout, "the brokers' WALs uploaded", func() error {
		for _, b := range live {
			st, err := c.BrokerStatus(ctx, b)
			if err != nil {
				return err
			}
			if n := st.GetWalPendingBytes(); n > 0 {
				return fmt.Errorf("%s still holds %s not in S3", b.Name, FormatBytes(n))
			}
		}
		return nil
	})
}

// sayCheckpoints prints the checkpoints of job j not printed yet: the
// AutoMQ failover's steps with their details.
func (w *watcher) sayCheckpoints(j *waldenv1.Job) {
	if w.amq.checkpoints == nil {
		w.amq.checkpoints = map[string]int{}
	}
	cps := j.GetCheckpoints()
	for _, cp := range cps[min(w.amq.checkpoints[j.GetJobId()], len(cps)):] {
		w.f.say("job %s: %s done (attempt %d): %s", j.GetJobId(), cp.GetJobStep().Name(), cp.GetAttempt(), cp.GetDetail())
	}
	w.amq.checkpoints[j.GetJobId()] = len(cps)
}

// pollAutomqStreams reads the AutoMQ controller's view: it prints changes
// of the streams' state and leader and the new leaders' STREAM_NOT_CLOSED
// answers, and notes when the victim's streams were all closed and all
// opened by other nodes.
func (w *watcher) pollAutomqStreams(ctx context.Context) {
	v, err := w.c.View().State(ctx)
	if err != nil {
		return
	}
	if w.amq.streams == nil {
		w.amq.streams = map[int64]string{}
	}
	w.mu.Lock()
	owned, victim, killed := w.owned, w.f.Victim, !w.killed.IsZero()
	w.mu.Unlock()
	victimNode := NodeOf(w.c.Proc(victim))
	closed, reopened := 0, 0
	for _, s := range v.Streams {
		key := fmt.Sprintf("OPENED by node %d (%s), stream epoch %d", s.Owner, w.c.BrokerOfNode(s.Owner), s.Epoch)
		if s.State != devcontroller.StreamOpened {
			key = fmt.Sprintf("CLOSED at end offset %d, stream epoch %d", s.EndOffset, s.Epoch)
		}
		if w.amq.streams[s.StreamID] != key {
			w.amq.streams[s.StreamID] = key
			w.f.say("AutoMQ stream %d: %s", s.StreamID, key)
		}
		if owned[uint64(s.StreamID)] {
			if s.State != devcontroller.StreamOpened || s.Owner != victimNode {
				closed++
			}
			if s.State == devcontroller.StreamOpened && s.Owner != victimNode {
				reopened++
			}
		}
	}
	notClosed := 0
	for _, r := range v.Requests {
		if r.API == "OpenStreams" && r.Code == "STREAM_NOT_CLOSED" {
			notClosed += r.Count
		}
	}
	// Said at the first answer, then at most once a second.
	if notClosed > w.amq.notClosedSaid && (w.amq.notClosedSaid == w.amq.notClosedAt || time.Since(w.amq.notClosedSaidAt) >= time.Second) {
		w.f.say("AutoMQ controller: OpenStreams answered STREAM_NOT_CLOSED %d times so far: new leaders wait for the old one's streams to close",
			notClosed-w.amq.notClosedAt)
		w.amq.notClosedSaid, w.amq.notClosedSaidAt = notClosed, time.Now()
	}
	w.amq.notClosed = notClosed
	if !killed {
		w.amq.notClosedAt, w.amq.notClosedSaid = notClosed, notClosed
	}
	for _, n := range v.Nodes {
		if n.NodeID == victimNode {
			if n.NodeEpoch != w.amq.nodeEpoch && w.amq.nodeEpoch != 0 {
				w.f.say("AutoMQ node %d (%s): epoch %d, failover flag %t", n.NodeID, victim, n.NodeEpoch, n.FailoverMode)
			}
			w.amq.nodeEpoch = n.NodeEpoch
		}
	}
	now := time.Now()
	w.mu.Lock()
	if len(owned) > 0 && closed == len(owned) && w.closedAt.IsZero() {
		w.closedAt = now
	}
	if len(owned) > 0 && reopened == len(owned) && w.reopened.IsZero() {
		w.reopened = now
	}
	w.mu.Unlock()
}

// reopenAfterCloseAutomq is the time from the recovery job's close step to
// the moment the watcher saw the last of the victim's streams opened by
// another node (-1 when the job does not say).
func (w *watcher) reopenAfterCloseAutomq(j *waldenv1.Job) int64 {
	var closed int64
	for _, cp := range j.GetCheckpoints() {
		if cp.GetJobStep() == waldenv1.JobStep_JOB_STEP_CLOSE {
			closed = cp.GetUnixMs()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if closed == 0 || w.reopened.IsZero() {
		return -1
	}
	return max(w.reopened.UnixMilli()-closed, 0)
}

// automqSummary fills the AutoMQ side of the summary from the job's target
// report and the controller's view.
func (c *Cluster) automqSummary(ctx context.Context, w *watcher, job *waldenv1.Job) (*AutomqSummary, error) {
	rep := job.GetTargetReport()
	if rep == nil {
		return nil, errors.New("the recovery job carries no AutoMQ report: is recovery.action automq?")
	}
	out := &AutomqSummary{ClusterID: AutomqClusterID, NodeID: rep.GetNodeId(), NodeEpoch: rep.GetNodeEpoch(), WALReset: rep.GetWalReset(),
		Objects: []AutomqObject{}, Streams: []AutomqStream{}}
	for _, o := range rep.GetObjects() {
		if o.GetState() == "committed" {
			out.Objects = append(out.Objects, AutomqObject{ObjectID: o.GetObjectId(), Key: o.GetKey(), Size: o.GetSize(), Kind: o.GetKind()})
		}
	}
	v, err := c.View().State(ctx)
	if err != nil {
		return nil, err
	}
	leaders := map[int64]string{}
	for _, s := range v.Streams {
		if s.State == devcontroller.StreamOpened {
			leaders[s.StreamID] = c.BrokerOfNode(s.Owner)
		}
	}
	for _, s := range rep.GetStreams() {
		out.Streams = append(out.Streams, AutomqStream{StreamID: s.GetStreamId(), EndOffsetBefore: s.GetEndOffsetBefore(),
			EndOffsetAfter: s.GetEndOffsetAfter(), Records: s.GetRecords(), Leader: leaders[s.GetStreamId()]})
	}
	sort.Slice(out.Streams, func(i, j int) bool { return out.Streams[i].StreamID < out.Streams[j].StreamID })
	for _, n := range v.Nodes {
		if int64(n.NodeID) == rep.GetNodeId() && n.NodeEpoch != rep.GetNodeEpoch() {
			out.NodeEpochAfter = n.NodeEpoch
		}
	}
	w.mu.Lock()
	out.NotClosedAnswers = w.amq.notClosed - w.amq.notClosedAt
	w.mu.Unlock()
	return out, nil
}

// describeAutomq is the AutoMQ summary for people, one line per fact.
func (s *AutomqSummary) describe() []string {
	var out []string
	var objs []string
	for _, o := range s.Objects {
		objs = append(objs, fmt.Sprintf("%d (%s, %s)", o.ObjectID, o.Kind, FormatBytes(o.Size)))
	}
	out = append(out, fmt.Sprintf("AutoMQ node %d epoch %d failed over at the controller of cluster %s: objects %s committed, WAL reset %t",
		s.NodeID, s.NodeEpoch, s.ClusterID, strings.Join(objs, ", "), s.WALReset))
	for _, st := range s.Streams {
		out = append(out, fmt.Sprintf("stream %d: end offset %d -> %d (%d record batches from the WAL), led by %s now", st.StreamID,
			st.EndOffsetBefore, st.EndOffsetAfter, st.Records, st.Leader))
	}
	out = append(out, fmt.Sprintf("new leaders' OpenStreams answered STREAM_NOT_CLOSED %d times before the failover closed the streams",
		s.NotClosedAnswers))
	return out
}
