package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"walden/broker"
	"walden/broker/brokertest"
	"walden/connlimit"
	"walden/internal/testutil"
	"walden/objstore/s3test"
)

// TestDataAPIHoldsAFlood is finding 2 of the hardening table for the
// broker's data API (the same kind of gRPC server as a coordinator's
// admin port): 20,000 idle connections from one source address take at
// most limits.api.max_conns_per_source of its file descriptors, the rest
// are closed at once and counted, and appends keep being acknowledged
// meanwhile.
func TestDataAPIHoldsAFlood(t *testing.T) {
	const flood, perSource = 20_000, 64
	testutil.SkipFloodUnderRace(t)
	// The production lease (3s): the flood loads a 2-core machine, and a
	// lease lapse would refuse appends for a reason of its own.
	coord, err := brokertest.Start("demo", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Stop)
	e := &env{t: t, coord: coord, s3: s3test.StartFake(t), dir: t.TempDir()}
	cfg := e.config("b1", 1)
	cfg.Limits.API.MaxConnsPerSource = perSource
	cfg.Limits.API.HandshakeTimeout = 2 * time.Second
	m := connlimit.NewMetrics()
	cfg.LeaseSafetyMargin = time.Second
	b, err := broker.New(cfg, broker.Options{Logger: logger(t), ListenerMetrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(false) })
	waitReady(t, b)
	c := client(t, b.Addr())
	mustAppend(t, c, 1, "before")

	stop := make(chan struct{})
	errs := make(chan error, 1000)
	acked := make(chan int, 1)
	go func() {
		n := 0
		defer func() { acked <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := appendRecs(t, c, 1, fmt.Sprintf("under the flood %d", i)); err != nil {
				errs <- err
				continue
			}
			n++
		}
	}()
	f := testutil.NewFlood(t, b.Addr(), "127.0.0.2", flood, time.Minute)
	if f.Held < flood*9/10 {
		t.Fatalf("only %d of %d connections opened (%d failed)", f.Held, flood, f.Failed)
	}
	testutil.Eventually(t, 30*time.Second, "the flood refused", func() error {
		refused, accepted := m.Refused(connlimit.BrokerAPI, "max_conns_per_source"), m.Accepted(connlimit.BrokerAPI)
		if refused+accepted < float64(f.Held) || accepted > refused/4 {
			return fmt.Errorf("%v refused and %v accepted of %d", refused, accepted, f.Held)
		}
		return nil
	})
	if open := m.Open(connlimit.BrokerAPI); open > perSource+4 {
		t.Fatalf("%v connections open under the flood, bound %d", open, perSource)
	}
	mustAppend(t, client(t, b.Addr()), 1, "a new connection under the flood")
	close(stop)
	n := <-acked
	close(errs)
	for err := range errs {
		t.Errorf("append under the flood: %v", err)
	}
	t.Logf("%d idle connections opened in %s: %v refused at once, %v accepted, %v open; %d appends acknowledged meanwhile",
		f.Held, f.Took.Round(time.Millisecond), m.Refused(connlimit.BrokerAPI, "max_conns_per_source"), m.Accepted(connlimit.BrokerAPI), m.Open(connlimit.BrokerAPI), n)
	if n == 0 {
		t.Fatal("no append acknowledged under the flood")
	}
}
