package fsm

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
)

// snapshotVersion is the StateSnapshot layout this package writes.
// Version 3 names states, steps, roles and kinds with the enums of
// types.proto only (broker_state, observation_state, job_state, job_step,
// event_kind, member_role, with every member's role set); versions 1 and 2
// carry the strings these replaced, and are still read (upgradeSnapshot).
// An older walden refuses a version 3 snapshot instead of reading its
// states as empty strings.
const snapshotVersion uint32 = 3

// snapshotVersionV2 added the fencing token counter, brokers, policy
// overrides, events, streams, objects and jobs (fields 7–13); a version 1
// snapshot (membership and noops only) restores with those empty. The
// streams' producer tables (field 14) came later within version 2: a
// snapshot without them restores with empty tables.
const (
	snapshotVersionV2 uint32 = 2
	snapshotVersionV1 uint32 = 1
)

// Snapshot serializes the state as of the last applied index as a
// walden.v1.StateSnapshot (deterministic encoding; members, brokers,
// streams, objects and jobs sorted by id, events oldest first), so that two
// members with the same applied entries produce byte-identical snapshots.
func (s *State) Snapshot() ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.snapshotLocked())
	if err != nil {
		return nil, fmt.Errorf("fsm: encode snapshot at index %d: %w", s.applied, err)
	}
	return b, nil
}

func (s *State) snapshotLocked() *waldenv1.StateSnapshot {
	return &waldenv1.StateSnapshot{
		Version:           snapshotVersion,
		ClusterName:       s.clusterName,
		AppliedIndex:      s.applied,
		Members:           s.sortedMembers(),
		NoopCount:         s.noopCount,
		LastAppliedUnixMs: s.lastAppliedUnixMs,
		NextEpoch:         s.nextEpoch,
		Brokers:           s.sortedBrokers(),
		Policy:            clone(s.overrides),
		Events:            s.copyEvents(),
		Streams:           s.sortedStreams(),
		Objects:           s.sortedObjects(),
		Jobs:              s.sortedJobsByID(),
		Producers:         s.sortedProducers(),
		ConfIndex:         s.confIndex,
		LeaseHorizonMs:    s.leaseHorizonMs,
		Restore:           clone(s.restore),
	}
}

func (s *State) sortedProducers() []*waldenv1.StreamProducers {
	var out []*waldenv1.StreamProducers
	for _, id := range sortedKeys(s.producers) {
		if t := s.producers[id]; t.Len() > 0 {
			out = append(out, &waldenv1.StreamProducers{StreamId: id, Producers: t.States()})
		}
	}
	return out
}

func (s *State) copyEvents() []*waldenv1.Event {
	out := make([]*waldenv1.Event, len(s.events))
	for i, e := range s.events {
		out[i] = clone(e)
	}
	return out
}

func (s *State) sortedStreams() []*waldenv1.Stream {
	out := make([]*waldenv1.Stream, 0, len(s.streams))
	for _, id := range sortedKeys(s.streams) {
		out = append(out, clone(s.streams[id]))
	}
	return out
}

func (s *State) sortedObjects() []*waldenv1.Object {
	out := make([]*waldenv1.Object, 0, len(s.objects))
	for _, id := range sortedKeys(s.objects) {
		out = append(out, clone(s.objects[id]))
	}
	return out
}

func (s *State) sortedJobsByID() []*waldenv1.Job {
	out := make([]*waldenv1.Job, 0, len(s.jobs))
	for _, id := range sortedKeys(s.jobs) {
		out = append(out, clone(s.jobs[id]))
	}
	return out
}

// Restore replaces the state with a snapshot's data. A snapshot of another
// version or cluster, or with inconsistent members, is refused and the state
// is left unchanged. A snapshot of an older version is read in this
// version's form (upgradeSnapshot).
func (s *State) Restore(data []byte) error {
	snap, err := UpgradeSnapshot(data)
	if err != nil {
		return err
	}
	if c := snap.GetClusterName(); c != s.clusterName {
		return fmt.Errorf("fsm: restore: %w: snapshot of cluster %q, this is cluster %q", ErrForeignSnapshot, c, s.clusterName)
	}
	members := make(map[uint64]*waldenv1.Member, len(snap.GetMembers()))
	ids := make(map[string]bool, len(snap.GetMembers()))
	for _, m := range snap.GetMembers() {
		switch {
		case m.GetId() == "" || m.GetRaftId() == 0:
			return fmt.Errorf("fsm: restore: %w: member %q with raft id %d", ErrInvalidSnapshot, m.GetId(), m.GetRaftId())
		case ids[m.GetId()] || members[m.GetRaftId()] != nil:
			return fmt.Errorf("fsm: restore: %w: member %q (raft id %d) twice", ErrInvalidSnapshot, m.GetId(), m.GetRaftId())
		case m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_VOTER && m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER:
			return fmt.Errorf("fsm: restore: %w: member %q has role %q", ErrInvalidSnapshot, m.GetId(), m.GetMemberRole().Name())
		}
		ids[m.GetId()] = true
		members[m.GetRaftId()] = proto.Clone(m).(*waldenv1.Member)
	}

	d, err := restoreDomains(snap)
	if err != nil {
		return err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied = snap.GetAppliedIndex()
	s.lastAppliedUnixMs = snap.GetLastAppliedUnixMs()
	s.members = members
	s.confIndex = snap.GetConfIndex()
	s.leaseHorizonMs = snap.GetLeaseHorizonMs()
	s.noopCount = snap.GetNoopCount()
	s.nextEpoch = d.nextEpoch
	s.brokers = d.brokers
	s.overrides = d.overrides
	s.events = d.events
	s.streams = d.streams
	s.objects = d.objects
	s.jobs = d.jobs
	s.producers = d.producers
	s.restore = clone(snap.GetRestore())
	s.indexStreamObjects()
	s.watch.reset(s.applied)
	s.brokersView.invalidate()
	s.notifyLocked()
	return nil
}

// checkSnapshotVersion refuses a snapshot of a version Restore does not
// read.
func checkSnapshotVersion(snap *waldenv1.StateSnapshot) error {
	switch v := snap.GetVersion(); v {
	case snapshotVersion, snapshotVersionV2, snapshotVersionV1:
		return nil
	default:
		return fmt.Errorf("fsm: restore: %w: version %d, this walden reads versions %d to %d", ErrSnapshotVersion, v, snapshotVersionV1, snapshotVersion)
	}
}

// domains are the parts of the state added in snapshot version 2.
type domains struct {
	nextEpoch uint64
	brokers   map[string]*waldenv1.Broker
	overrides *waldenv1.PolicyOverrides
	events    []*waldenv1.Event
	streams   map[uint64]*waldenv1.Stream
	objects   map[string]*waldenv1.Object
	jobs      map[string]*waldenv1.Job
	producers map[uint64]*producer.Table
}

// restoreDomains copies and checks the brokers, policy, events, catalog and
// jobs of snap: unique non-empty ids, every issued token below next_epoch,
// objects naming known streams, jobs naming known brokers. Each part is
// checked against those restored before it.
func restoreDomains(snap *waldenv1.StateSnapshot) (*domains, error) {
	d := &domains{
		nextEpoch: snap.GetNextEpoch(),
		brokers:   map[string]*waldenv1.Broker{},
		overrides: clone(snap.GetPolicy()),
		streams:   map[uint64]*waldenv1.Stream{},
		objects:   map[string]*waldenv1.Object{},
		jobs:      map[string]*waldenv1.Job{},
		producers: map[uint64]*producer.Table{},
	}
	if d.nextEpoch == 0 {
		d.nextEpoch = 1
	}
	if d.overrides == nil {
		d.overrides = &waldenv1.PolicyOverrides{}
	}
	if n := len(snap.GetEvents()); n > MaxEvents {
		return nil, badSnapshot("%d events, at most %d are kept", n, MaxEvents)
	}
	for _, restore := range []func(*waldenv1.StateSnapshot) error{
		d.restoreBrokers, d.restoreStreams, d.restoreObjects, d.restoreJobs, d.restoreProducers,
	} {
		if err := restore(snap); err != nil {
			return nil, err
		}
	}
	for _, e := range snap.GetEvents() {
		d.events = append(d.events, clone(e))
	}
	return d, nil
}

// badSnapshot is the error of a snapshot whose content is not valid.
func badSnapshot(format string, args ...any) error {
	return fmt.Errorf("fsm: restore: %w: "+format, append([]any{ErrInvalidSnapshot}, args...)...)
}

func (d *domains) restoreBrokers(snap *waldenv1.StateSnapshot) error {
	for _, b := range snap.GetBrokers() {
		switch {
		case b.GetBrokerId() == "":
			return badSnapshot("broker without id")
		case d.brokers[b.GetBrokerId()] != nil:
			return badSnapshot("broker %q twice", b.GetBrokerId())
		case b.GetEpoch() >= d.nextEpoch:
			return badSnapshot("broker %q has epoch %d, next epoch is %d", b.GetBrokerId(), b.GetEpoch(), d.nextEpoch)
		}
		d.brokers[b.GetBrokerId()] = clone(b)
	}
	return nil
}

func (d *domains) restoreStreams(snap *waldenv1.StateSnapshot) error {
	for _, st := range snap.GetStreams() {
		if d.streams[st.GetStreamId()] != nil {
			return badSnapshot("stream %d twice", st.GetStreamId())
		}
		d.streams[st.GetStreamId()] = clone(st)
	}
	return nil
}

func (d *domains) restoreObjects(snap *waldenv1.StateSnapshot) error {
	for _, o := range snap.GetObjects() {
		switch {
		case o.GetObjectId() == "":
			return badSnapshot("object without id")
		case d.objects[o.GetObjectId()] != nil:
			return badSnapshot("object %q twice", o.GetObjectId())
		}
		for _, r := range o.GetRanges() {
			if d.streams[r.GetStreamId()] == nil {
				return badSnapshot("object %q names unknown stream %d", o.GetObjectId(), r.GetStreamId())
			}
		}
		d.objects[o.GetObjectId()] = clone(o)
	}
	return nil
}

func (d *domains) restoreJobs(snap *waldenv1.StateSnapshot) error {
	for _, j := range snap.GetJobs() {
		switch {
		case j.GetJobId() == "":
			return badSnapshot("job without id")
		case d.jobs[j.GetJobId()] != nil:
			return badSnapshot("job %q twice", j.GetJobId())
		case d.brokers[j.GetBrokerId()] == nil:
			return badSnapshot("job %q of unknown broker %q", j.GetJobId(), j.GetBrokerId())
		case j.GetToken() >= d.nextEpoch:
			return badSnapshot("job %q has token %d, next epoch is %d", j.GetJobId(), j.GetToken(), d.nextEpoch)
		}
		d.jobs[j.GetJobId()] = clone(j)
	}
	return nil
}

func (d *domains) restoreProducers(snap *waldenv1.StateSnapshot) error {
	for _, sp := range snap.GetProducers() {
		switch {
		case d.streams[sp.GetStreamId()] == nil:
			return badSnapshot("producers of unknown stream %d", sp.GetStreamId())
		case d.producers[sp.GetStreamId()] != nil:
			return badSnapshot("producers of stream %d twice", sp.GetStreamId())
		case len(sp.GetProducers()) > producer.MaxPerStream:
			return badSnapshot("stream %d has %d producers, at most %d are kept", sp.GetStreamId(), len(sp.GetProducers()), producer.MaxPerStream)
		}
		seen := map[uint64]bool{}
		for _, p := range sp.GetProducers() {
			if p.GetProducerId() == 0 || p.GetCount() == 0 || seen[p.GetProducerId()] {
				return badSnapshot("stream %d: producer %d with count %d (ids must be unique and not 0, counts not 0)", sp.GetStreamId(), p.GetProducerId(), p.GetCount())
			}
			seen[p.GetProducerId()] = true
		}
		d.producers[sp.GetStreamId()] = producer.NewTable(sp.GetProducers())
	}
	return nil
}
