package recovery_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"walden/fsm"
	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// TestUnbackedRangeFailsTheJob is the recovery's part of finding 1 of the
// hardening table: a failover of a broker whose catalog says records are
// committed in an object the store does not hold reported its job
// succeeded, 0 bytes skipped, no gaps, while acknowledged records were in
// no object. The recovery now asks the store for every object holding the
// WAL's committed records, and a range no object backs fails the job,
// naming the stream and the offsets; the streams stay opened.
func TestUnbackedRangeFailsTheJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup leaves the state and the store as the case needs.
		setup func(t *testing.T, c *testCluster, sc *scenario, store recovery.Store)
		want  string
	}{
		{"the issue's commit, left by an older walden", func(t *testing.T, c *testCluster, sc *scenario, store recovery.Store) {
			c.seed(store)
			// [10, 2^64-1) in 10 bytes of an object nobody uploaded,
			// applied as an entry of a walden before the check levels.
			if _, err := c.applyOld(op(&waldenv1.CommitObjectRequest{BrokerId: sc.broker, BrokerEpoch: sc.epoch, Object: &waldenv1.Object{
				ObjectId: "k5", Key: "k5", Size: 100, Ranges: []*waldenv1.ObjectRange{
					{StreamId: 1, StreamEpoch: 1, StartOffset: 10, EndOffset: math.MaxUint64, Position: 0, Length: 10}}}})); err != nil {
				t.Fatal(err)
			}
		}, "stream 1: offsets [10, 18446744073709551615) are committed in object k5 (key k5), which the object store does not hold"},
		{"an object deleted from the store", func(t *testing.T, c *testCluster, sc *scenario, store recovery.Store) {
			// Not seeded: pre/1.obj was committed, never uploaded (or
			// deleted since).
		}, "stream 1: offsets [0, 10) are committed in object pre-1 (key pre/1.obj), which the object store does not hold"},
		{"an object of another size under the key", func(t *testing.T, c *testCluster, sc *scenario, store recovery.Store) {
			if _, err := store.Upload(context.Background(), "pre/1.obj", bytes.NewReader([]byte("short")), 5, nil); err != nil {
				t.Fatal(err)
			}
		}, "bytes, but the object store holds 5 bytes under that key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, "c1")
			sc := newScenario(t, c, t.TempDir(), 2, 64)
			store := newStore(t, s3test.StartFake(t))
			tc.setup(t, c, sc, store)
			before := len(c.s.StreamObjects(2, 0, 0))
			j := c.declare(sc.broker, sc.epoch, "c1")
			exe := recovery.NewExecutor(recovery.ExecutorConfig{Config: testConfig(), NodeID: "c1", State: c.s, Cluster: c.Member("c1"),
				Store: store, Logger: testLogger()})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := exe.Run(ctx, j.GetJobId(), 1)
			if !errors.Is(err, recovery.ErrRecordsMissing) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want ErrRecordsMissing naming %q", err, tc.want)
			}
			j, _ = c.s.Job(j.GetJobId())
			if j.GetJobState() != waldenv1.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetError(), tc.want) ||
				!strings.Contains(j.GetError(), "acknowledged records are missing") {
				t.Fatalf("job %s: %s, error %q; want failed naming %q", j.GetJobId(), j.GetJobState().Name(), j.GetError(), tc.want)
			}
			found := false
			for _, g := range j.GetGaps() {
				found = found || strings.Contains(g, tc.want)
			}
			if !found {
				t.Fatalf("job gaps %q do not name %q", j.GetGaps(), tc.want)
			}
			for id := uint64(1); id <= 3; id++ {
				if st, _ := c.s.Stream(id); st.GetState() != fsm.StreamOpened {
					t.Fatalf("stream %d is %s: a failed job closes nothing", id, st.GetState())
				}
			}
			if n := len(c.s.StreamObjects(2, 0, 0)); n != before {
				t.Fatalf("stream 2 has %d objects, had %d: a failed job commits nothing", n, before)
			}
			if evs := c.s.Events(sc.broker, 0); !strings.Contains(evs[len(evs)-1].GetMessage(), "failed") {
				t.Fatalf("last event %q", evs[len(evs)-1].GetMessage())
			}
		})
	}
}
