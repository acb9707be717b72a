package broker_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/broker"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

func TestNotOwnerNamesTheOwner(t *testing.T) {
	e := newEnv(t)
	b1 := e.start(e.config("b1", 1))
	waitReady(t, b1)
	b2 := e.start(e.config("b2", 1, 2)) // stream 1 is b1's: b2 keeps retrying it
	waitReady(t, b2)
	c2 := client(t, b2.Addr())
	mustAppend(t, c2, 2, "x")
	_, err := appendRecs(t, c2, 1, "y")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("append to a stream of another broker: %v", err)
	}
	reason, md := reasonOf(err)
	if reason != "NOT_OWNER" || md["owner_addr"] != b1.Addr() || md["owner_broker_id"] != "b1" {
		t.Fatalf("reason %q metadata %v (b1 at %s)", reason, md, b1.Addr())
	}
	// b2 serves b1's committed data and names the owner.
	mustAppend(t, client(t, b1.Addr()), 1, "r0", "r1")
	waitCommitted(t, e, 1, 2)
	r, err := c2.Read(context.Background(), &waldenv1.ReadRequest{StreamId: 1})
	if err != nil || len(r.GetRecords()) != 2 || r.GetOwnerAddr() != b1.Addr() || r.GetCommittedEndOffset() != 2 {
		t.Fatalf("read through b2: %v %v", r, err)
	}
}

func TestLeaseInvalidAcknowledgesNothing(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	b := e.start(cfg)
	waitReady(t, b)
	c := client(t, b.Addr())
	mustAppend(t, c, 1, "ok0")

	e.coord.BlockRenewals("b1", true)
	testutil.Eventually(t, 5*time.Second, "lease invalid", func() error {
		if b.Agent().Lease().Valid {
			return fmt.Errorf("still valid")
		}
		return nil
	})
	for i := 0; i < 3; i++ {
		_, err := appendRecs(t, c, 1, "refused")
		if reason, _ := reasonOf(err); status.Code(err) != codes.FailedPrecondition || reason != "LEASE_INVALID" {
			t.Fatalf("append without a lease: %v (reason %q)", err, reason)
		}
	}
	e.coord.BlockRenewals("b1", false)
	testutil.Eventually(t, 5*time.Second, "lease valid again", func() error {
		if !b.Agent().Lease().Valid {
			return fmt.Errorf("not valid")
		}
		return nil
	})
	if off := mustAppend(t, c, 1, "ok1"); off != 1 {
		t.Fatalf("offset after refusals %d, want 1 (a refused append took offsets)", off)
	}
	waitCommitted(t, e, 1, 2)
	equal(t, readAll(t, c, 1), []string{"ok0", "ok1"})
}

func TestRestartRecoversOwnWALTail(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1, 2)
	cfg.UploadInterval, cfg.UploadBytes = time.Hour, 256<<10 // nothing uploads before the crash
	b := e.start(cfg)
	waitReady(t, b)
	c := client(t, b.Addr())
	var want1, want2 []string
	for i := 0; i < 20; i++ {
		r := fmt.Sprintf("s1-%d", i)
		mustAppend(t, c, 1, r)
		want1 = append(want1, r)
		if i%4 == 0 {
			r := fmt.Sprintf("s2-%d", i)
			mustAppend(t, c, 2, r)
			want2 = append(want2, r)
		}
	}
	if committedEnd(e, 1) != 0 {
		t.Fatal("uploaded before the crash")
	}
	epoch := b.Agent().Lease().Epoch
	if err := b.Stop(false); err != nil { // kill -9: the WAL keeps everything
		t.Fatal(err)
	}

	b2 := e.start(cfg)
	waitReady(t, b2)
	if got := b2.Agent().Lease().Epoch; got <= epoch {
		t.Fatalf("epoch %d after restart, was %d", got, epoch)
	}
	if committedEnd(e, 1) != 20 || committedEnd(e, 2) != 5 {
		t.Fatalf("after restart: stream 1 end %d, stream 2 end %d", committedEnd(e, 1), committedEnd(e, 2))
	}
	c2 := client(t, b2.Addr())
	equal(t, readAll(t, c2, 1), want1)
	equal(t, readAll(t, c2, 2), want2)
	if off := mustAppend(t, c2, 1, "after"); off != 20 {
		t.Fatalf("offset after restart %d, want 20", off)
	}
	// A second crash and restart: the recovered records are committed, the
	// new tail comes back, nothing twice.
	if err := b2.Stop(false); err != nil {
		t.Fatal(err)
	}
	b3 := e.start(cfg)
	waitReady(t, b3)
	equal(t, readAll(t, client(t, b3.Addr()), 1), append(want1, "after"))
	if s, _ := e.coord.State().Stream(1); s.GetOwnerBrokerId() != "b1" || s.GetState() != "opened" {
		t.Fatalf("stream 1 %v", s)
	}
}

func TestTakeoverOfClosedStream(t *testing.T) {
	e := newEnv(t)
	b1 := e.start(e.config("b1", 5))
	waitReady(t, b1)
	c1 := client(t, b1.Addr())
	mustAppend(t, c1, 5, "r0", "r1", "r2")
	waitCommitted(t, e, 5, 3)

	cfg2 := e.config("b2")
	cfg2.Takeover = true
	b2 := e.start(cfg2)
	waitReady(t, b2)
	c2 := client(t, b2.Addr())
	if _, err := appendRecs(t, c2, 5, "no"); err == nil {
		t.Fatal("b2 appended to b1's open stream")
	}

	// b1 dies (its tail is committed), the failover closes its stream.
	if err := b1.Stop(false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.coord.FailOver("b1", -1); err != nil {
		t.Fatal(err)
	}
	// b2 opens the closed stream with a higher stream epoch and continues
	// at its end offset.
	var off uint64
	testutil.Eventually(t, 10*time.Second, "b2 takes stream 5 over", func() error {
		r, err := appendRecs(t, c2, 5, "r3")
		if err != nil {
			return err
		}
		off = r.GetBaseOffset()
		if r.GetStreamEpoch() < 2 {
			return fmt.Errorf("stream epoch %d", r.GetStreamEpoch())
		}
		return nil
	})
	if off != 3 {
		t.Fatalf("b2's first offset %d, want 3", off)
	}
	waitCommitted(t, e, 5, 4)
	equal(t, readAll(t, c2, 5), []string{"r0", "r1", "r2", "r3"})
	if s, _ := e.coord.State().Stream(5); s.GetOwnerBrokerId() != "b2" {
		t.Fatalf("owner %q", s.GetOwnerBrokerId())
	}
}

func TestGracefulStopUploadsAndCloses(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	cfg.UploadInterval = time.Hour
	b := e.start(cfg)
	waitReady(t, b)
	mustAppend(t, client(t, b.Addr()), 1, "a", "b")
	if err := b.Stop(true); err != nil {
		t.Fatal(err)
	}
	s, _ := e.coord.State().Stream(1)
	if s.GetState() != "closed" || s.GetEndOffset() != 2 {
		t.Fatalf("after a graceful stop: %v", s)
	}
}

// TestRestartReopensStreamsTakenOver: a stream the broker took over (not in
// its configuration) is still its own after a crash and restart.
func TestRestartReopensStreamsTakenOver(t *testing.T) {
	e := newEnv(t)
	b1 := e.start(e.config("b1", 7))
	waitReady(t, b1)
	if err := b1.Stop(true); err != nil { // closes stream 7
		t.Fatal(err)
	}
	cfg := e.config("b2")
	cfg.Takeover = true
	cfg.UploadInterval = time.Hour
	b2 := e.start(cfg)
	waitReady(t, b2)
	c := client(t, b2.Addr())
	testutil.Eventually(t, 10*time.Second, "b2 owns stream 7", func() error {
		_, err := appendRecs(t, c, 7, "t0")
		return err
	})
	if err := b2.Stop(false); err != nil {
		t.Fatal(err)
	}
	cfg.Takeover = false
	b3 := e.start(cfg)
	waitReady(t, b3)
	if committedEnd(e, 7) != 1 {
		t.Fatalf("stream 7 end %d after restart", committedEnd(e, 7))
	}
	if off := mustAppend(t, client(t, b3.Addr()), 7, "t1"); off != 1 {
		t.Fatalf("offset %d", off)
	}
}

func TestStartRefusesANonWALFile(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	if err := os.WriteFile(cfg.WAL.Path, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(cfg, broker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "wal.path") {
		t.Fatalf("start on a zeroed file: %v", err)
	}
}

// TestFencedBrokerServesAgainAfterReregistering: a failover fences a live
// broker; it refuses appends, its agent registers again, and the broker
// re-opens its stream with a new epoch and continues at the committed end.
func TestFencedBrokerServesAgainAfterReregistering(t *testing.T) {
	e := newEnv(t)
	b := e.start(e.config("b1", 1))
	waitReady(t, b)
	c := client(t, b.Addr())
	mustAppend(t, c, 1, "r0", "r1")
	waitCommitted(t, e, 1, 2)
	epoch := b.Agent().Lease().Epoch
	if _, err := e.coord.FailOver("b1", -1); err != nil {
		t.Fatal(err)
	}
	sawRefusal := false
	var resp *waldenv1.AppendResponse
	testutil.Eventually(t, 10*time.Second, "b1 serves again", func() error {
		r, err := appendRecs(t, c, 1, "r2")
		if err != nil {
			sawRefusal = true
			return err
		}
		resp = r
		return nil
	})
	if !sawRefusal && b.Agent().Lease().Epoch == epoch {
		t.Fatal("no refusal and no new epoch after the failover")
	}
	if resp.GetBrokerEpoch() <= epoch || resp.GetBaseOffset() != 2 || resp.GetStreamEpoch() < 2 {
		t.Fatalf("after re-registering: %v (old epoch %d)", resp, epoch)
	}
	waitCommitted(t, e, 1, 3)
	equal(t, readAll(t, c, 1), []string{"r0", "r1", "r2"})
}

// TestStatusAfterReregisteringIsTruthful polls BrokerStatus while a live
// broker is failed over and registers again: an answer with the new epoch
// never lists the old incarnation's streams, and says serving only once the
// new incarnation serves (an append right after it is accepted). The
// serving loop's own check runs rarely here (takeover_interval 2s), as when
// it is busy: the old epoch must end on the agent's new registration, not
// on that check.
func TestStatusAfterReregisteringIsTruthful(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	cfg.TakeoverInterval = 2 * time.Second
	b := e.start(cfg)
	waitReady(t, b)
	c := client(t, b.Addr())
	mustAppend(t, c, 1, "r0")
	waitCommitted(t, e, 1, 1)
	old := b.Agent().Lease().Epoch

	stop := make(chan struct{})
	var bad []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := c.BrokerStatus(context.Background(), &waldenv1.BrokerStatusRequest{})
			if err == nil && st.GetBrokerEpoch() > old {
				for _, s := range st.GetStreams() {
					if s.GetStreamEpoch() < 2 {
						bad = append(bad, fmt.Sprintf("epoch %d with the old incarnation's stream %v (serving %v)", st.GetBrokerEpoch(), s, st.GetServing()))
					}
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if _, err := e.coord.FailOver("b1", -1); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "b1 serving with a new epoch", func() error {
		st, err := c.BrokerStatus(context.Background(), &waldenv1.BrokerStatusRequest{})
		if err != nil {
			return err
		}
		if !st.GetServing() || st.GetBrokerEpoch() <= old {
			return fmt.Errorf("status %v", st)
		}
		// Serving is the truth: an append now is accepted.
		r, err := appendRecs(t, c, 1, "r1")
		if reason, _ := reasonOf(err); reason == refusal.NodeFenced {
			t.Fatalf("status says serving with epoch %d, the append right after is refused: %v", st.GetBrokerEpoch(), err)
		} else if err != nil {
			return err
		}
		if r.GetBrokerEpoch() != st.GetBrokerEpoch() {
			t.Fatalf("append under epoch %d, status said %d", r.GetBrokerEpoch(), st.GetBrokerEpoch())
		}
		return nil
	})
	close(stop)
	<-done
	if len(bad) > 0 {
		t.Fatalf("%d answers paired the new epoch with the old streams, first: %s", len(bad), bad[0])
	}
}
