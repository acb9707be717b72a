package server

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"walden/fieldlimit"
	"walden/fsm"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// Watch limits.
const (
	// watchProgressDefault is the progress notice interval when the request
	// names none.
	watchProgressDefault = 5 * time.Second
	// watchProgressMin is the shortest progress interval a request may ask.
	watchProgressMin = 100 * time.Millisecond
	// watchProgressMax is the longest.
	watchProgressMax = time.Hour
	// watchMaxResponseBytes splits a larger batch of changes (a snapshot of
	// a big cluster) into fragments, below gRPC's 4 MiB default.
	watchMaxResponseBytes = 1 << 20
)

// watchState is what the Watch service reads (*fsm.State).
type watchState interface {
	Changed() <-chan struct{}
	Changes(from uint64) ([]*waldenv1.Change, uint64, error)
	CompactRevision() uint64
	WatchSnapshot() ([]*waldenv1.Change, uint64)
}

// watchService implements walden.v1.Watch on every member, from its own
// applied state: the changes of the watch log (fsm), sent as the member
// applies them. A watch from revision 0 starts with a linearizable
// snapshot.
type watchService struct {
	waldenv1.UnimplementedWatchServer
	d      *serviceDeps
	state  watchState
	nodeID string
}

func (s *watchService) Watch(req *waldenv1.WatchRequest, stream grpc.ServerStreamingServer[waldenv1.WatchResponse]) error {
	kinds := map[waldenv1.WatchKind]bool{}
	for i, k := range req.GetKinds() {
		if k <= waldenv1.WatchKind_WATCH_KIND_UNSPECIFIED || k > waldenv1.WatchKind_WATCH_KIND_EVENT {
			return invalidArg(fmt.Sprintf("kinds[%d]", i), fmt.Sprintf("unknown kind %d (stream, job, broker or event)", k))
		}
		kinds[k] = true
	}
	if id := req.GetBrokerId(); id != "" {
		if err := checkBrokerID("broker_id", id); err != nil {
			return err
		}
	}
	progress := watchProgressDefault
	if ms := req.GetProgressIntervalMs(); ms != 0 {
		var err error
		if progress, err = fieldlimit.Millis("progress_interval_ms", int64(ms), watchProgressMin, watchProgressMax); err != nil {
			return fieldErr(err)
		}
	}
	keep := func(c *waldenv1.Change) bool {
		if len(kinds) > 0 && !kinds[c.GetKind()] {
			return false
		}
		id := req.GetBrokerId()
		if id == "" {
			return true
		}
		switch v := c.GetValue().(type) {
		case *waldenv1.Change_Stream:
			return v.Stream.GetOwnerBrokerId() == id
		case *waldenv1.Change_Job:
			return v.Job.GetBrokerId() == id
		case *waldenv1.Change_Broker:
			return v.Broker.GetBrokerId() == id
		case *waldenv1.Change_Event:
			return v.Event.GetBrokerId() == id
		}
		return false
	}
	ctx := stream.Context()
	send := func(resp *waldenv1.WatchResponse, changes []*waldenv1.Change) error {
		resp.CompactRevision = s.state.CompactRevision()
		size := 0
		for _, c := range changes {
			if !keep(c) {
				continue
			}
			n := proto.Size(c)
			if size > 0 && size+n > watchMaxResponseBytes {
				part := &waldenv1.WatchResponse{Revision: resp.GetRevision(), Snapshot: resp.GetSnapshot(), Changes: resp.GetChanges(),
					CompactRevision: resp.GetCompactRevision(), Fragment: true}
				if err := stream.Send(part); err != nil {
					return err
				}
				resp.Changes, size = nil, 0
			}
			resp.Changes = append(resp.Changes, c)
			size += n
		}
		return stream.Send(resp)
	}

	next := req.GetStartRevision()
	if next == 0 {
		if err := s.d.node.LinearizableRead(ctx); err != nil {
			return s.d.stateErr(ctx, err)
		}
		snap, rev := s.state.WatchSnapshot()
		if err := send(&waldenv1.WatchResponse{Revision: rev, Snapshot: true}, snap); err != nil {
			return err
		}
		next = rev + 1
	}
	tick := time.NewTicker(progress)
	defer tick.Stop()
	quiet := false // nothing sent since the last tick
	for {
		changed := s.state.Changed()
		changes, rev, err := s.state.Changes(next)
		if errors.Is(err, fsm.ErrCompacted) {
			return compactedErr(s.nodeID, next, s.state.CompactRevision())
		}
		if rev >= next {
			sent := false
			for _, c := range changes {
				if keep(c) {
					sent = true
					break
				}
			}
			if sent {
				if err := send(&waldenv1.WatchResponse{Revision: rev}, changes); err != nil {
					return err
				}
				quiet = false
			}
			next = rev + 1
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
			if quiet {
				if err := stream.Send(&waldenv1.WatchResponse{Revision: next - 1, CompactRevision: s.state.CompactRevision()}); err != nil {
					return err
				}
			}
			quiet = true
		}
	}
}

// compactedErr is the answer to a watch from a revision the member no
// longer keeps changes of.
func compactedErr(nodeID string, from, compacted uint64) error {
	return rpcerr.New(refusal.Compacted, fmt.Sprintf("revision %d is compacted: coordinator %s keeps the changes after revision %d "+
		"(%d at most, since it started); list again by watching from revision 0", from, nodeID, compacted, fsm.MaxChanges),
		map[string]string{"compact_revision": strconv.FormatUint(compacted, 10)})
}
