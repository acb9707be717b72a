package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
)

// unbacked is a committed range of a stream that no object in the store
// backs, although the dead broker's WAL holds records of it: acknowledged
// records that exist nowhere but in the WAL, and that the catalog says are
// already in S3.
type unbacked struct {
	stream     uint64
	start, end uint64
	// why says what backs the range instead, for people.
	why string
}

func (u unbacked) String() string {
	return fmt.Sprintf("stream %d: offsets [%d, %d) %s", u.stream, u.start, u.end, u.why)
}

func unbackedText(us []unbacked) string {
	parts := make([]string, len(us))
	for i, u := range us {
		parts[i] = u.String()
	}
	return strings.Join(parts, "; ")
}

// checkBacked checks, for every opening stream, the committed ranges the
// WAL's records below the stream's end offset fall in (from the lowest such
// record up to the end offset: the read step drops those records as already
// in S3): each must be in a committed object that the store holds with the
// size the catalog recorded, and the objects must leave no hole. It returns
// the ranges that are not, by stream and offsets, or an error when the
// store could not say (the step is retried). The store is asked once per
// object, headConcurrency at a time.
func (a *attempt) checkBacked(ctx context.Context, streams []*waldenv1.Stream, below map[uint64]uint64) ([]unbacked, error) {
	type span struct {
		stream     uint64
		start, end uint64
		obj        *waldenv1.Object // nil: in no object
	}
	var spans []span
	keys := map[string]*waldenv1.Object{}
	for _, st := range streams {
		id := st.GetStreamId()
		from, ok := below[id]
		if !ok {
			continue
		}
		if a.e.store == nil {
			return nil, fmt.Errorf("recovery: read: cannot check that the objects holding stream %d's committed offsets from %d exist: %w", id, from, ErrNoS3)
		}
		end, next := st.GetEndOffset(), from
		for _, o := range a.e.state.StreamObjects(id, from, 0) {
			r := rangeOf(o, id)
			if r == nil || r.GetEndOffset() <= next {
				continue
			}
			if r.GetStartOffset() > next {
				spans = append(spans, span{id, next, r.GetStartOffset(), nil})
			}
			spans = append(spans, span{id, max(next, r.GetStartOffset()), r.GetEndOffset(), o})
			keys[o.GetKey()] = o
			next = r.GetEndOffset()
			if next >= end {
				break
			}
		}
		if next < end {
			spans = append(spans, span{id, next, end, nil})
		}
	}
	held, err := a.objectsHeld(ctx, keys)
	if err != nil {
		return nil, err
	}
	var out []unbacked
	for _, sp := range spans {
		switch {
		case sp.obj == nil:
			out = append(out, unbacked{sp.stream, sp.start, sp.end, "are in no committed object (the catalog's objects leave a hole)"})
		case held[sp.obj.GetKey()] != "":
			out = append(out, unbacked{sp.stream, sp.start, sp.end, held[sp.obj.GetKey()]})
		}
	}
	return out, nil
}

// headConcurrency bounds the store requests of checkBacked in flight.
const headConcurrency = 8

// objectsHeld asks the store for every object of objs (by key) and says,
// per key, why the store does not hold it as committed ("" when it does).
func (a *attempt) objectsHeld(ctx context.Context, objs map[string]*waldenv1.Object) (map[string]string, error) {
	held := make(map[string]string, len(objs))
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, headConcurrency)
	var wg sync.WaitGroup
	for key, o := range objs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			why, err := a.objectHeld(ctx, o)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			held[key] = why
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return held, nil
}

// objectHeld says why the store does not hold o as committed ("" when it
// does).
func (a *attempt) objectHeld(ctx context.Context, o *waldenv1.Object) (string, error) {
	info, err := a.e.store.Head(ctx, o.GetKey())
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		return fmt.Sprintf("are committed in object %s (key %s), which the object store does not hold", o.GetObjectId(), o.GetKey()), nil
	case err != nil:
		return "", fmt.Errorf("recovery: read: check committed object %s: %w", o.GetKey(), err)
	case o.GetSize() != 0 && uint64(info.Size) != o.GetSize():
		return fmt.Sprintf("are committed in object %s (key %s) of %d bytes, but the object store holds %d bytes under that key",
			o.GetObjectId(), o.GetKey(), o.GetSize(), info.Size), nil
	}
	return "", nil
}

// rangeOf returns o's range of stream id, or nil.
func rangeOf(o *waldenv1.Object, id uint64) *waldenv1.ObjectRange {
	for _, r := range o.GetRanges() {
		if r.GetStreamId() == id {
			return r
		}
	}
	return nil
}

// fail finishes the job as failed with msg: the job must not say it
// succeeded.
func (a *attempt) fail(ctx context.Context, msg string) error {
	_, err := a.propose(ctx, &waldenv1.Command{Op: &waldenv1.Command_FinishJob{FinishJob: &waldenv1.FinishJob{
		JobId: a.jobID, Attempt: a.attempt, JobState: waldenv1.JobState_JOB_STATE_FAILED, Error: msg, RecoveredWalOffset: -1,
	}}})
	if err != nil {
		return fmt.Errorf("recovery: finish (failed): %w", err)
	}
	return nil
}
