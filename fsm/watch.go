package fsm

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	waldenv1 "walden/proto/walden/v1"
)

// MaxChanges is the number of newest changes the watch log keeps (whole
// revisions: the oldest revisions are dropped together).
const MaxChanges = 10000

// ErrCompacted is returned by Changes for a revision whose changes the
// watch log no longer holds (dropped beyond MaxChanges, or applied before
// this state was restored from a snapshot): the watcher lists again.
var ErrCompacted = errors.New("fsm: revision compacted")

// The watch log: the changes of the watched objects (streams, jobs,
// brokers, events), each with the value the object has after the entry
// that changed it, by revision (the entry's raft index: the same change has
// the same revision on every member). It is derived from the applied
// entries, in memory only: not part of the state's snapshots, and a state
// restored from one starts an empty log at the snapshot's index.
//
// Which objects an entry changed is found without diffing the whole state:
// the candidates are the objects the command names (its broker_id,
// owner_broker_id, job_id, last_job_id, closed_by_job_id and stream_id
// fields, at any depth), the owners of those streams and the jobs that
// closed them, the last jobs of those brokers and the brokers of those
// jobs; each candidate's value after the entry is compared with its value
// before it. Objects only the result names count when they are new (a
// failover decision's job). A test checks this against a full comparison
// of the state over random command sequences.
type changeLog struct {
	changes []*waldenv1.Change // oldest first; values are never modified
	// compacted is the newest revision whose changes are not (all) kept.
	compacted uint64
}

// watchIDs are the objects an entry may change.
type watchIDs struct {
	streams map[uint64]bool
	jobs    map[string]bool
	brokers map[string]bool
}

func newWatchIDs() *watchIDs {
	return &watchIDs{streams: map[uint64]bool{}, jobs: map[string]bool{}, brokers: map[string]bool{}}
}

// collect adds the ids named by the fields of m, at any depth (a stream id
// 0 too: it is a valid id, and proto3 does not mark it present).
func (w *watchIDs) collect(m protoreflect.Message) {
	if fd := m.Descriptor().Fields().ByName("stream_id"); fd != nil && fd.Kind() == protoreflect.Uint64Kind && !fd.IsList() {
		w.streams[m.Get(fd).Uint()] = true
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					w.collect(l.Get(i).Message())
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			w.collect(v.Message())
		case fd.Kind() == protoreflect.StringKind:
			switch fd.Name() {
			case "broker_id", "owner_broker_id":
				w.brokers[v.String()] = true
			case "job_id", "last_job_id", "closed_by_job_id":
				w.jobs[v.String()] = true
			}
		}
		return true
	})
}

// watchEverything adds every stream, job and broker to w.
func (s *State) watchEverything(w *watchIDs) {
	for id := range s.streams {
		w.streams[id] = true
	}
	for id := range s.jobs {
		w.jobs[id] = true
	}
	for id := range s.brokers {
		w.brokers[id] = true
	}
}

// expand adds the owners of the candidate streams and the jobs that closed
// them, the last jobs of the candidate brokers, and the brokers of the
// candidate jobs.
func (s *State) expandWatchIDs(w *watchIDs) {
	for id := range w.streams {
		if st := s.streams[id]; st != nil {
			if st.GetClosedByJobId() != "" {
				w.jobs[st.GetClosedByJobId()] = true
			}
			if st.GetOwnerBrokerId() != "" {
				w.brokers[st.GetOwnerBrokerId()] = true
			}
		}
	}
	for id := range w.brokers {
		if b := s.brokers[id]; b != nil && b.GetLastJobId() != "" {
			w.jobs[b.GetLastJobId()] = true
		}
	}
	for id := range w.jobs {
		if j := s.jobs[id]; j != nil {
			w.brokers[j.GetBrokerId()] = true
		}
	}
}

// watchBefore is what an entry's changes are compared with.
type watchBefore struct {
	ids     *watchIDs
	streams map[uint64]*waldenv1.Stream
	jobs    map[string]*waldenv1.Job
	brokers map[string]*waldenv1.Broker
	lastEv  uint64 // index of the newest event
	// everything: every object after the entry is a candidate too.
	everything bool
	// the number of streams, jobs and brokers: an object only the result
	// names (not the command) is reported only when its kind grew, as it
	// is then new (what the command changes, it names or points to).
	nStreams, nJobs, nBrokers int
}

// beforeApply records the candidates of cmd and their values; nil for a
// command that changes no watched object (a Noop: the commands of the raft
// benchmark and of leadership changes, applied at the highest rates).
func (s *State) beforeApply(cmd *waldenv1.Command) *watchBefore {
	if _, ok := cmd.GetOp().(*waldenv1.Command_Noop); ok {
		return nil
	}
	w := newWatchIDs()
	w.collect(cmd.ProtoReflect())
	everything := false
	switch cmd.GetOp().(type) {
	case *waldenv1.Command_ForceNewCluster, *waldenv1.Command_ReconcileScan, *waldenv1.Command_ReconcilePlan:
		// They change every broker, or every stream, without naming them
		// (and a scan creates jobs and brokers).
		everything = true
		s.watchEverything(w)
	}
	s.expandWatchIDs(w)
	b := &watchBefore{ids: w, everything: everything, streams: map[uint64]*waldenv1.Stream{}, jobs: map[string]*waldenv1.Job{}, brokers: map[string]*waldenv1.Broker{},
		nStreams: len(s.streams), nJobs: len(s.jobs), nBrokers: len(s.brokers)}
	if n := len(s.events); n > 0 {
		b.lastEv = s.events[n-1].GetIndex()
	}
	for id := range w.streams {
		if st := s.streams[id]; st != nil {
			b.streams[id] = clone(st)
		}
	}
	for id := range w.jobs {
		if j := s.jobs[id]; j != nil {
			b.jobs[id] = clone(j)
		}
	}
	for id := range w.brokers {
		if br := s.brokers[id]; br != nil {
			b.brokers[id] = clone(br)
		}
	}
	return b
}

// afterApply appends the changes of the entry at index (applied with result
// res) to the watch log: the streams, jobs and brokers it changed or
// created, then the events it appended.
func (s *State) afterApply(index uint64, before *watchBefore, res *waldenv1.Result) {
	if before == nil {
		return
	}
	w := before.ids
	if before.everything {
		s.watchEverything(w)
	}
	s.watchCreated(w, before, res)
	out := s.changedValues(index, w, before)
	out = append(out, s.appendedEvents(index, before.lastEv)...)
	s.watch.append(out)
}

// watchCreated adds to w the ids the result names of what the entry
// created: a stream, job or broker the state did not hold before.
func (s *State) watchCreated(w *watchIDs, before *watchBefore, res *waldenv1.Result) {
	post := newWatchIDs()
	if res != nil {
		post.collect(res.ProtoReflect())
	}
	s.expandWatchIDs(post)
	addNew(w.streams, post.streams, len(s.streams) > before.nStreams)
	addNew(w.jobs, post.jobs, len(s.jobs) > before.nJobs)
	addNew(w.brokers, post.brokers, len(s.brokers) > before.nBrokers)
}

// addNew adds the ids of post to w when the map they name grew.
func addNew[K comparable](w, post map[K]bool, grew bool) {
	if !grew {
		return
	}
	for id := range post {
		w[id] = true
	}
}

// changedValues are the changes of the watched streams, jobs and brokers
// that differ from their values before the entry, each kind in id order.
func (s *State) changedValues(index uint64, w *watchIDs, before *watchBefore) []*waldenv1.Change {
	var out []*waldenv1.Change
	for _, id := range sortedKeys(w.streams) {
		if st := s.streams[id]; st != nil && !proto.Equal(st, before.streams[id]) {
			out = append(out, &waldenv1.Change{Revision: index, Kind: waldenv1.WatchKind_WATCH_KIND_STREAM, Value: &waldenv1.Change_Stream{Stream: clone(st)}})
		}
	}
	for _, id := range sortedKeys(w.jobs) {
		if j := s.jobs[id]; j != nil && !proto.Equal(j, before.jobs[id]) {
			out = append(out, &waldenv1.Change{Revision: index, Kind: waldenv1.WatchKind_WATCH_KIND_JOB, Value: &waldenv1.Change_Job{Job: clone(j)}})
		}
	}
	for _, id := range sortedKeys(w.brokers) {
		if b := s.brokers[id]; b != nil && !proto.Equal(b, before.brokers[id]) {
			out = append(out, &waldenv1.Change{Revision: index, Kind: waldenv1.WatchKind_WATCH_KIND_BROKER, Value: &waldenv1.Change_Broker{Broker: clone(b)}})
		}
	}
	return out
}

// appendedEvents are the changes of the events the entry at index appended:
// those after lastEv, the last one before it (the log drops its oldest, so
// count from the end).
func (s *State) appendedEvents(index, lastEv uint64) []*waldenv1.Change {
	first := len(s.events)
	for first > 0 && s.events[first-1].GetIndex() > lastEv && s.events[first-1].GetIndex() == index {
		first--
	}
	var out []*waldenv1.Change
	for _, e := range s.events[first:] {
		out = append(out, &waldenv1.Change{Revision: index, Kind: waldenv1.WatchKind_WATCH_KIND_EVENT, Value: &waldenv1.Change_Event{Event: clone(e)}})
	}
	return out
}

func (l *changeLog) append(changes []*waldenv1.Change) {
	l.changes = append(l.changes, changes...)
	if len(l.changes) <= MaxChanges+MaxChanges/4 {
		return
	}
	// Drop the oldest revisions whole, down to MaxChanges changes at most.
	drop := len(l.changes) - MaxChanges
	rev := l.changes[drop-1].GetRevision()
	for drop < len(l.changes) && l.changes[drop].GetRevision() == rev {
		drop++
	}
	l.compacted = max(l.compacted, rev)
	l.changes = append([]*waldenv1.Change(nil), l.changes[drop:]...)
}

// reset empties the log; changes up to revision are not known.
func (l *changeLog) reset(revision uint64) {
	l.changes = nil
	l.compacted = revision
}

// Changes returns the watch log's changes with a revision from from on,
// oldest first, and the applied index they reach (every change up to it is
// included). The changes are shared: callers must not modify them. A from
// at or below the compacted revision is ErrCompacted (with that revision).
func (s *State) Changes(from uint64) (changes []*waldenv1.Change, revision uint64, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if from <= s.watch.compacted {
		return nil, s.applied, fmt.Errorf("%w: changes from revision %d on were asked, the log keeps those after revision %d", ErrCompacted, from, s.watch.compacted)
	}
	// Binary search for the first change at or after from.
	lo, hi := 0, len(s.watch.changes)
	for lo < hi {
		mid := (lo + hi) / 2
		if s.watch.changes[mid].GetRevision() < from {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return s.watch.changes[lo:len(s.watch.changes):len(s.watch.changes)], s.applied, nil
}

// CompactRevision is the newest revision whose changes the watch log no
// longer holds (a watch starts after it).
func (s *State) CompactRevision() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.watch.compacted
}

// WatchSnapshot returns the current value of every stream, job and broker
// and the kept events, as changes at the applied index, which it returns
// too: a watch goes on from the revision after it.
func (s *State) WatchSnapshot() (changes []*waldenv1.Change, revision uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, id := range sortedKeys(s.streams) {
		changes = append(changes, &waldenv1.Change{Revision: s.applied, Kind: waldenv1.WatchKind_WATCH_KIND_STREAM, Value: &waldenv1.Change_Stream{Stream: clone(s.streams[id])}})
	}
	for _, id := range sortedKeys(s.jobs) {
		changes = append(changes, &waldenv1.Change{Revision: s.applied, Kind: waldenv1.WatchKind_WATCH_KIND_JOB, Value: &waldenv1.Change_Job{Job: clone(s.jobs[id])}})
	}
	for _, id := range sortedKeys(s.brokers) {
		changes = append(changes, &waldenv1.Change{Revision: s.applied, Kind: waldenv1.WatchKind_WATCH_KIND_BROKER, Value: &waldenv1.Change_Broker{Broker: clone(s.brokers[id])}})
	}
	for _, e := range s.events {
		changes = append(changes, &waldenv1.Change{Revision: s.applied, Kind: waldenv1.WatchKind_WATCH_KIND_EVENT, Value: &waldenv1.Change_Event{Event: clone(e)}})
	}
	return changes, s.applied
}
