package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/broker"
	"walden/internal/testutil"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// appendAs appends recs as producer pid's batch starting at sequence seq.
func appendAs(t testing.TB, c waldenv1.BrokerAPIClient, stream, pid, seq uint64, recs ...string) (*waldenv1.AppendResponse, error) {
	t.Helper()
	var rr [][]byte
	for _, r := range recs {
		rr = append(rr, []byte(r))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Append(ctx, &waldenv1.AppendRequest{StreamId: stream, Records: rr, ProducerId: pid, Sequence: seq})
}

func mustAppendAs(t testing.TB, c waldenv1.BrokerAPIClient, stream, pid, seq uint64, recs ...string) *waldenv1.AppendResponse {
	t.Helper()
	r, err := appendAs(t, c, stream, pid, seq, recs...)
	if err != nil {
		t.Fatalf("append of producer %d sequence %d to stream %d: %v", pid, seq, stream, err)
	}
	return r
}

// TestIdempotentAppend: a retried batch is acknowledged with its original
// offsets and stored once, on the broker that wrote it (in its WAL, then
// committed); a sequence out of order and an unknown producer are refused
// and store nothing.
func TestIdempotentAppend(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	cfg.UploadInterval = time.Hour
	b := e.start(cfg)
	waitReady(t, b)
	c := client(t, b.Addr())

	first := mustAppendAs(t, c, 1, 7, 0, "a", "b")
	if first.GetDuplicate() || first.GetBaseOffset() != 0 || first.GetCount() != 2 {
		t.Fatalf("first batch: %v", first)
	}
	// Its acknowledgement was lost: the retry (in the WAL only) is
	// answered with the same offsets.
	if r := mustAppendAs(t, c, 1, 7, 0, "a", "b"); !r.GetDuplicate() || r.GetBaseOffset() != 0 || r.GetCount() != 2 {
		t.Fatalf("retry of the batch in the WAL: %v", r)
	}
	mustAppend(t, c, 1, "plain") // not idempotent: offset 2
	if r := mustAppendAs(t, c, 1, 7, 2, "c"); r.GetDuplicate() || r.GetBaseOffset() != 3 {
		t.Fatalf("next batch: %v", r)
	}
	for name, c2 := range map[string]struct {
		pid, seq uint64
		recs     []string
		reason   refusal.Reason
	}{
		"gap":                     {7, 9, []string{"x"}, refusal.OutOfOrderSequence},
		"older batch":             {7, 0, []string{"a", "b"}, refusal.OutOfOrderSequence},
		"retry with other count":  {7, 2, []string{"c", "d"}, refusal.OutOfOrderSequence},
		"unknown producer at 5":   {8, 5, []string{"x"}, refusal.UnknownProducer},
		"unknown producer at 5 b": {9, 5, []string{"y"}, refusal.UnknownProducer},
	} {
		_, err := appendAs(t, c, 1, c2.pid, c2.seq, c2.recs...)
		if reason, md := reasonOf(err); status.Code(err) != codes.FailedPrecondition || reason != c2.reason {
			t.Fatalf("%s: %v (reason %q)", name, err, reason)
		} else if reason == refusal.OutOfOrderSequence && md[broker.MetaExpectedSequence] != "3" {
			t.Fatalf("%s: metadata %v", name, md)
		}
	}
	// A retry is acknowledged under the conditions of any acknowledgement:
	// not without a valid lease.
	e.coord.BlockRenewals("b1", true)
	testutil.Eventually(t, 5*time.Second, "lease invalid", func() error {
		if b.Agent().Lease().Valid {
			return fmt.Errorf("still valid")
		}
		return nil
	})
	if _, err := appendAs(t, c, 1, 7, 2, "c"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("retry without a lease: %v", err)
	} else if reason, _ := reasonOf(err); reason != refusal.LeaseInvalid {
		t.Fatalf("retry without a lease: %v", err)
	}
	e.coord.BlockRenewals("b1", false)
	testutil.Eventually(t, 5*time.Second, "lease valid again", func() error {
		if !b.Agent().Lease().Valid {
			return fmt.Errorf("not valid")
		}
		return nil
	})
	// Committed now: the retry is still answered, from the table.
	b.Stop(true)
	b = e.start(cfg)
	waitReady(t, b)
	c = client(t, b.Addr())
	if r := mustAppendAs(t, c, 1, 7, 2, "c"); !r.GetDuplicate() || r.GetBaseOffset() != 3 {
		t.Fatalf("retry of a committed batch after a restart: %v", r)
	}
	waitCommitted(t, e, 1, 4)
	equal(t, readAll(t, c, 1), []string{"a", "b", "plain", "c"})
}

// TestDurableButUnacknowledgedAtACrash: a batch is durable in the WAL when
// the broker is killed, before its acknowledgement. The broker restarts,
// commits its WAL tail, and the producer's retry is answered with the
// stored offsets: stored once.
func TestDurableButUnacknowledgedAtACrash(t *testing.T) {
	e := newEnv(t)
	cfg := e.config("b1", 1)
	cfg.UploadInterval = time.Hour
	hold := newDurableHold()
	b := e.startWith(cfg, hold.Hooks())
	waitReady(t, b)
	c := client(t, b.Addr())
	mustAppendAs(t, c, 1, 7, 0, "a")

	hold.Arm()
	errc := make(chan error, 1)
	go func() {
		_, err := appendAs(t, c, 1, 7, 1, "b", "c")
		errc <- err
	}()
	<-hold.Durable
	stopped := make(chan struct{})
	go func() { _ = b.Stop(false); close(stopped) }() // kill -9 before the acknowledgement
	if err := <-errc; err == nil {
		t.Fatal("the append was acknowledged by a killed broker")
	}
	close(hold.Release)
	<-stopped

	b = e.start(cfg)
	waitReady(t, b)
	c = client(t, b.Addr())
	if r := mustAppendAs(t, c, 1, 7, 1, "b", "c"); !r.GetDuplicate() || r.GetBaseOffset() != 1 {
		t.Fatalf("retry after the restart: %v", r)
	}
	mustAppendAs(t, c, 1, 7, 3, "d")
	if end := committedEnd(e, 1); end != 3 {
		t.Fatalf("committed end %d after the restart, want 3 (the recovered tail)", end)
	}
	equal(t, readAll(t, c, 1), []string{"a", "b", "c", "d"})
}

// TestRetryAcrossTakeover: the stream moves to another broker (a graceful
// stop uploads and closes it, the other takes it over): the new owner
// knows the producers from the catalog and answers a retry of a batch the
// first owner stored.
func TestRetryAcrossTakeover(t *testing.T) {
	e := newEnv(t)
	b1 := e.start(e.config("b1", 1))
	waitReady(t, b1)
	cfg2 := e.config("b2")
	cfg2.Takeover = true
	b2 := e.start(cfg2)
	waitReady(t, b2)
	mustAppendAs(t, client(t, b1.Addr()), 1, 7, 0, "a", "b")
	if err := b1.Stop(true); err != nil {
		t.Fatal(err)
	}
	c2 := client(t, b2.Addr())
	var r *waldenv1.AppendResponse
	testutil.Eventually(t, 10*time.Second, "b2 takes stream 1 over", func() error {
		var err error
		r, err = appendAs(t, c2, 1, 7, 0, "a", "b")
		return err
	})
	if !r.GetDuplicate() || r.GetBaseOffset() != 0 || r.GetStreamEpoch() < 2 {
		t.Fatalf("retry on the new owner: %v", r)
	}
	if r := mustAppendAs(t, c2, 1, 7, 2, "c"); r.GetDuplicate() || r.GetBaseOffset() != 2 {
		t.Fatalf("next batch on the new owner: %v", r)
	}
	waitCommitted(t, e, 1, 3)
	equal(t, readAll(t, c2, 1), []string{"a", "b", "c"})
	if got := fmt.Sprint(e.coord.State().Producers(1)); got == "[]" {
		t.Fatalf("catalog producer table of stream 1: %s", got)
	}
}
