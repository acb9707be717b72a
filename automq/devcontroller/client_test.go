package devcontroller

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"testing"
	"time"

	"walden/automq/controller"
	"walden/automq/protocol"
	"walden/internal/testutil/testpki"
)

// walden is walden's own AutoMQ controller client of c's voters.
func walden(t *testing.T, c *Controller, mod func(*controller.Config)) *controller.Client {
	t.Helper()
	cfg := controller.DefaultConfig()
	cfg.Voters = c.Addrs()
	cfg.RequestTimeout = reqTimeout
	cfg.RetryBackoff = 20 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	if mod != nil {
		mod(&cfg)
	}
	cl, err := controller.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 4*reqTimeout)
	t.Cleanup(cancel)
	return ctx
}

// TestWaldenClientFailover plays the reference's failover with walden's
// client against three voters whose active one moves during it, with the
// commit's answer lost once: the new owner's opens get STREAM_NOT_CLOSED
// until the close and succeed after; nothing is committed twice. The
// active voter moves only before calls whose NOT_CONTROLLER is top-level:
// a standby answers it per stream to OpenStreams and CloseStreams.
func TestWaldenClientFailover(t *testing.T) {
	faults := NewFaults()
	c := start(t, Config{Streams: []int64{100, 101}, Faults: faults}, 3)
	if err := c.SetActive(2); err != nil {
		t.Fatal(err)
	}
	cl := walden(t, c, nil)
	ctx := ctxT(t)
	const dead, e1, heir, e2 = int32(1), int64(1_717_000_000_000), int32(2), int64(1_717_000_000_900)

	if _, err := cl.GetOpeningStreams(ctx, dead, e1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.GetOpeningStreams(ctx, heir, e2, false); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.OpenStreams(ctx, dead, e1, []controller.OpenStream{{StreamID: 100, StreamEpoch: 0}, {StreamID: 101, StreamEpoch: 0}}); err != nil {
		t.Fatal(err)
	}
	first, err := cl.PrepareS3Object(ctx, dead, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: dead, NodeEpoch: e1, ObjectID: first, OrderID: first, ObjectSize: 10,
		StreamRanges: []protocol.ObjectStreamRange{{StreamID: 100, StreamEpoch: -1, StartOffset: 0, EndOffset: 40}}}); err != nil {
		t.Fatal(err)
	}

	// Node 1 dies; the new leader cannot open its streams.
	res, err := cl.OpenStreams(ctx, heir, e2, []controller.OpenStream{{StreamID: 100, StreamEpoch: 1}})
	if !errors.Is(err, protocol.ErrStreamNotClosed) {
		t.Fatalf("open before the failover: %+v %v, want STREAM_NOT_CLOSED", res, err)
	}

	// The failover, with the active voter moving under it.
	if err := c.SetActive(3); err != nil {
		t.Fatal(err)
	}
	opening, err := cl.GetOpeningStreams(ctx, dead, e1, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(opening) != 2 || opening[0].EndOffset != 40 || opening[1].EndOffset != 0 {
		t.Fatalf("opening streams %+v", opening)
	}
	id, err := cl.PrepareS3Object(ctx, dead, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	faults.Add(Fault{Kind: FaultCloseAfterApply, APIKey: protocol.KeyCommitStreamSetObject})
	if _, err := cl.CommitStreamSetObject(ctx, controller.CommitRequest{NodeID: dead, NodeEpoch: e1, ObjectID: id, OrderID: id, ObjectSize: 99, FailoverMode: true,
		StreamRanges: []protocol.ObjectStreamRange{
			{StreamID: 100, StreamEpoch: -1, StartOffset: 40, EndOffset: 70},
			{StreamID: 101, StreamEpoch: -1, StartOffset: 0, EndOffset: 5},
		}}); err != nil {
		t.Fatalf("failover commit, its first answer lost: %v", err)
	}
	if faults.Hits() != 1 {
		t.Fatalf("the fault hit %d requests", faults.Hits())
	}
	if err := c.SetActive(1); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.GetNodes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.OpenStreams(ctx, heir, e2, []controller.OpenStream{{StreamID: 100, StreamEpoch: 1}}); !errors.Is(err, protocol.ErrStreamNotClosed) {
		t.Fatalf("open before the close: %v, want STREAM_NOT_CLOSED", err)
	}
	if _, err := cl.CloseStreams(ctx, dead, e1, []controller.CloseStream{{StreamID: 100, StreamEpoch: 0}, {StreamID: 101, StreamEpoch: 0}}); err != nil {
		t.Fatal(err)
	}
	opened, err := cl.OpenStreams(ctx, heir, e2, []controller.OpenStream{{StreamID: 100, StreamEpoch: 1}, {StreamID: 101, StreamEpoch: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if opened[0].NextOffset != 70 || opened[1].NextOffset != 5 {
		t.Fatalf("opened %+v, want next offsets 70 and 5", opened)
	}
	committed := 0
	for _, o := range c.Snapshot().Objects {
		if o.State == ObjectCommitted {
			committed++
		}
	}
	if committed != 2 {
		t.Fatalf("%d objects committed, want 2", committed)
	}
}

// TestWaldenClientSecurity reaches a SASL_SSL controller with walden's
// client (SCRAM-SHA-512 over TLS) and is refused with a wrong password.
func TestWaldenClientSecurity(t *testing.T) {
	pki := testpki.New(t)
	files := pki.Broker(t, "devcontroller")
	cert, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	c := start(t, Config{
		TLS:  &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}},
		SASL: &SASLConfig{Users: map[string]string{"walden": "s3cret"}},
	}, 2)
	for _, mech := range []string{MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512} {
		cl := walden(t, c, func(cfg *controller.Config) {
			cfg.TLS = clientTLS(t, pki.CA)
			cfg.TLS.ServerName = ""
			cfg.SASL = controller.SASL{Mechanism: mech, Username: "walden", Password: "s3cret"}
		})
		if _, err := cl.GetNodes(ctxT(t), nil); err != nil {
			t.Fatalf("%s: %v", mech, err)
		}
	}
	bad := walden(t, c, func(cfg *controller.Config) {
		cfg.TLS = clientTLS(t, pki.CA)
		cfg.SASL = controller.SASL{Mechanism: MechanismSCRAMSHA512, Username: "walden", Password: "wrong"}
		cfg.Attempts = 1
	})
	if _, err := bad.GetNodes(ctxT(t), nil); err == nil {
		t.Fatal("a wrong password got through")
	}
}
